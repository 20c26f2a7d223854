//! The one glob Ichor matches disk fields with outside the simulator: Talos's, so that what
//! Ichor predicts (a class's `diskModels`, the render check of an install disk selector) is what
//! the node decides.
//!
//! Talos turns a 1.13 `machine.install.diskSelector` field (`model`, `serial`, `wwid`, `uuid`,
//! `modalias`, `busPath`) into `glob("<pattern>", disk.<field>)` in CEL, and `glob` is
//! `github.com/ryanuber/go-glob`'s `Glob` (talos-facts §8.5: `v1alpha1_provider.go`
//! `DiskMatchExpression` and `celenv.go` `DiskLocator`, Talos 1.13 and 1.14). Its semantics:
//! only `*` is special and matches any run of characters, the empty run included; there is no
//! `?`, no class and no escape; the comparison is case-sensitive and byte-wise.
//!
//! The match runs in time linear in the pattern and the text (Knuth–Morris–Pratt for each part
//! between stars), never slices a `str` (so any UTF-8 is safe), and never recurses: a pattern
//! from a user's object or a model reported by a node cannot stall or crash a process.

/// Whether `text` matches `pattern`, where `*` matches any run of characters (go-glob's
/// `Glob`, as Talos matches a disk selector's `model`).
///
/// ```
/// use ichor_api::glob::matches;
///
/// assert!(matches("Samsung SSD 9*", "Samsung SSD 990 PRO"));
/// assert!(matches("*WD40*", "WDC WD40EFRX"));
/// assert!(!matches("a*a", "a"));
/// assert!(!matches("sd[a-z]", "sda"), "only * is special");
/// assert!(matches("Diskø*", "Diskø Ünïcode"));
/// ```
pub fn matches(pattern: &str, text: &str) -> bool {
    matches_counting(pattern, text).0
}

/// As [`matches()`], with the number of steps the match took: at most
/// `2 × (pattern.len() + text.len())` (lengths in bytes). For the tests and the fuzz target
/// that hold the match to that bound.
pub fn matches_counting(pattern: &str, text: &str) -> (bool, u64) {
    let mut steps = 0;
    let matched = run(pattern.as_bytes(), text.as_bytes(), &mut steps);
    (matched, steps)
}

/// go-glob's `Glob` over bytes. `*` is ASCII, so every part between stars is whole UTF-8, and
/// a whole UTF-8 sequence only matches a text at a character boundary: matching bytes is
/// matching characters.
fn run(pattern: &[u8], text: &[u8], steps: &mut u64) -> bool {
    let parts: Vec<&[u8]> = pattern.split(|&b| b == b'*').collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        // No star: equality.
        return equal(pattern, text, steps);
    };
    let Some(mut rest) = strip_prefix(text, first, steps) else {
        return false;
    };
    for part in middle {
        match find(rest, part, steps) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    ends_with(rest, last, steps)
}

fn equal(a: &[u8], b: &[u8], steps: &mut u64) -> bool {
    a.len() == b.len() && strip_prefix(b, a, steps).is_some()
}

/// `text` after `prefix`, if it starts with it (one step a byte compared).
fn strip_prefix<'t>(text: &'t [u8], prefix: &[u8], steps: &mut u64) -> Option<&'t [u8]> {
    if prefix.len() > text.len() {
        return None;
    }
    for (a, b) in prefix.iter().zip(text) {
        *steps += 1;
        if a != b {
            return None;
        }
    }
    Some(&text[prefix.len()..])
}

fn ends_with(text: &[u8], suffix: &[u8], steps: &mut u64) -> bool {
    text.len() >= suffix.len()
        && strip_prefix(&text[text.len() - suffix.len()..], suffix, steps).is_some()
}

/// Where `needle` first occurs in `haystack` (Knuth–Morris–Pratt): at most `2 × needle.len()`
/// steps for the table and `2 × (where it ends)` for the search, or `2 × haystack.len()` when
/// it does not occur.
fn find(haystack: &[u8], needle: &[u8], steps: &mut u64) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    if needle.len() > haystack.len() {
        return None;
    }
    // border[i]: the length of the longest proper prefix of needle[..=i] that is also its suffix.
    let mut border = vec![0usize; needle.len()];
    let mut k = 0;
    for i in 1..needle.len() {
        *steps += 1;
        while k > 0 && needle[i] != needle[k] {
            *steps += 1;
            k = border[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        border[i] = k;
    }
    let mut k = 0;
    for (i, &b) in haystack.iter().enumerate() {
        *steps += 1;
        while k > 0 && b != needle[k] {
            *steps += 1;
            k = border[k - 1];
        }
        if b == needle[k] {
            k += 1;
            if k == needle.len() {
                return Some(i + 1 - k);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// go-glob's own cases (`glob_test.go` of v1.0.0, by their meaning) and Talos's.
    #[test]
    fn matches_as_go_glob_does() {
        for (pattern, text, want) in [
            ("", "", true),
            ("", "a", false),
            ("*", "", true),
            ("*", "anything at all", true),
            ("**", "", true),
            ("WDC*", "WDC WD40", true),
            ("*WD40", "WDC WD40", true),
            ("W*D*0", "WDC WD40", true),
            ("WD40", "WDC WD40", false),
            ("WDC WD40", "WDC WD40", true),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("*a*", "bab", true),
            ("*ab*ab*", "abab", true),
            ("*ab*ab*", "aba", false),
            ("this*is*a*test", "this is a test", true),
            ("this*is*a*test", "this is a tesx", false),
            ("*test", "this is a test", true),
            ("*is a*", "this is a test", true),
            ("sd[a-z]", "sda", false),
            ("sd[a-z]", "sd[a-z]", true),
            ("sd?", "sda", false),
            ("samsung*", "Samsung SSD", false),
            ("/pci-0000:00:1f.2/*", "/pci-0000:00:1f.2/ata1", true),
            // Overlapping parts, where a naive search would skip the match.
            ("*aab", "aaab", true),
            ("*abcabd*", "abcabcabd", true),
            ("x*abab*y", "xababaababy", true),
        ] {
            assert_eq!(matches(pattern, text), want, "{pattern:?} against {text:?}");
        }
    }

    #[test]
    fn non_ascii_models_match_by_character() {
        assert!(matches("Diskø*", "Diskø Ünïcode"));
        assert!(matches("*Ünï*", "Diskø Ünïcode"));
        assert!(matches("*ø*", "ø"));
        assert!(!matches("*ø", "øx"));
        assert!(matches("😀*😀", "😀😀"));
        assert!(!matches("😀*😀", "😀"));
        // A byte of a multi-byte character is never a character of its own.
        assert!(!matches("*\u{b8}*", "ø"));
    }

    /// The old matcher in ichor-render sliced the text by byte (a model with a multi-byte
    /// character panicked) and backtracked over every star (24 stars took longer than 15 s).
    #[test]
    fn hostile_patterns_and_models_are_answered_at_once() {
        assert!(!matches("*a", "ø"));
        assert!(matches("S*", "Sømething"));
        let stars = "*a".repeat(30) + "b";
        let text = "a".repeat(200);
        let (matched, steps) = matches_counting(&stars, &text);
        assert!(!matched);
        assert!(
            steps <= 2 * (stars.len() + text.len()) as u64,
            "{steps} steps"
        );
    }

    #[test]
    fn steps_are_bounded_by_pattern_times_text() {
        let mut cases: Vec<(String, String)> = vec![
            ("*".repeat(24), "a".repeat(100)),
            ("*a".repeat(24), "a".repeat(100)),
            ("*a".repeat(24) + "b", "a".repeat(100)),
            ("a*".repeat(24) + "b", "ab".repeat(60)),
            ("*aaaaaaaab".into(), "a".repeat(500)),
            ("*abababac*".into(), "ab".repeat(300)),
            ("*ø*".repeat(25), "øx".repeat(40)),
            ("Diskø*Ünï*".into(), "Diskø Ünïcode".into()),
            ("*😀*".repeat(24), "😀 ".repeat(30)),
            ("".into(), "".into()),
            ("".into(), "abc".into()),
            ("***".into(), "".into()),
            ("abc".into(), "".into()),
            ("abc".into(), "abc".into()),
        ];
        // Every prefix and suffix of a mixed pattern, against a mixed text.
        let pattern = "*Samsung*SSD*ø*9*".repeat(3);
        let text = "Samsung SSD ø 990 PRO Samsung SSD ø 9".repeat(3);
        for i in 0..=pattern.len() {
            if pattern.is_char_boundary(i) {
                cases.push((pattern[..i].into(), text.clone()));
                cases.push((pattern[i..].into(), text.clone()));
            }
        }
        for (pattern, text) in cases {
            let (p, t) = (pattern.len() as u64, text.len() as u64);
            let (_, steps) = matches_counting(&pattern, &text);
            assert!(
                steps <= (p + 1) * (t + 1),
                "{steps} steps for {pattern:?} against {text:?}"
            );
            assert!(
                steps <= 2 * (p + t),
                "{steps} steps for {pattern:?} against {text:?}"
            );
        }
    }
}
