//! The disk glob (`ichor_api::glob`), as a class's `diskModels` or a 1.13 install disk
//! selector meets the model a node reported, and the simulator's own copy of Go's glob
//! (`ichor-sim/src/apply/glob.rs`, included as it is).
//!
//! Input: the pattern, a newline, the text (UTF-8). Invariants: nothing panics; Ichor's match
//! takes at most 2 × (pattern + text) steps (bytes); it answers as the simulator's go-glob
//! does, and, on small inputs, as a plain dynamic-programming matcher of `*`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/ichor-sim/src/apply/glob.rs"]
mod sim;

/// Whether `text` matches `pattern` where `*` matches any run of characters: the textbook
/// table over (pattern prefix, text prefix), quadratic, for small inputs only.
fn reference(pattern: &[char], text: &[char]) -> bool {
    let mut row = vec![false; text.len() + 1];
    row[0] = true;
    for &p in pattern {
        let mut next = vec![false; text.len() + 1];
        if p == '*' {
            let mut any = false;
            for j in 0..=text.len() {
                any |= row[j];
                next[j] = any;
            }
        } else {
            for j in 1..=text.len() {
                next[j] = row[j - 1] && text[j - 1] == p;
            }
        }
        row = next;
    }
    row[text.len()]
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let (pattern, text) = input.split_once('\n').unwrap_or((input, ""));
    let (matched, steps) = ichor_api::glob::matches_counting(pattern, text);
    let bound = 2 * (pattern.len() + text.len()) as u64;
    assert!(
        steps <= bound,
        "{steps} steps > {bound} for {pattern:?} against {text:?}"
    );
    assert_eq!(
        matched,
        sim::glob(pattern, text),
        "{pattern:?} against {text:?}: Ichor and the simulator disagree"
    );
    if pattern.len() + text.len() <= 256 {
        let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
        assert_eq!(matched, reference(&p, &t), "{pattern:?} against {text:?}");
    }
});
