//! A unified line diff (`---`/`+++` headers, `@@` hunks with three lines of context), as
//! `diff -u` prints one, made by the `similar` crate. Lines are compared without their line
//! endings, and a run of changes lists its removals before its additions.

use similar::TextDiff;

/// Lines of context around each change.
pub const CONTEXT: usize = 3;

/// The unified diff from `old` to `new`, or `None` when they are the same.
pub fn unified(old: &str, new: &str, old_label: &str, new_label: &str) -> Option<String> {
    if old == new {
        return None;
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a == b {
        // Only line endings differ (e.g. a final newline).
        return Some(format!(
            "--- {old_label}\n+++ {new_label}\n(the texts differ only in line endings)\n"
        ));
    }
    // Lines without their endings: the diff writes each with a `\n` of its own, and never a
    // "\ No newline at end of file" marker.
    let diff = TextDiff::from_slices(&a, &b);
    Some(
        diff.unified_diff()
            .context_radius(CONTEXT)
            .header(old_label, new_label)
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("line {i}")).collect()
    }

    fn text(lines: &[String]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    #[test]
    fn the_same_text_has_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "applied", "now"), None);
    }

    #[test]
    fn one_changed_line_shows_three_lines_of_context() {
        let old = lines(10);
        let mut new = old.clone();
        new[4] = "line five".into();
        let out = unified(&text(&old), &text(&new), "applied", "now").expect("a diff");
        assert_eq!(
            out,
            "--- applied\n+++ now\n@@ -2,7 +2,7 @@\n line 2\n line 3\n line 4\n-line 5\n+line five\n line 6\n line 7\n line 8\n"
        );
    }

    #[test]
    fn distant_changes_make_separate_hunks_with_their_own_line_numbers() {
        let old = lines(30);
        let mut new = old.clone();
        new.remove(2);
        new.insert(25, "inserted".into());
        let out = unified(&text(&old), &text(&new), "a", "b").expect("a diff");
        let headers: Vec<&str> = out.lines().filter(|l| l.starts_with("@@")).collect();
        assert_eq!(headers, ["@@ -1,6 +1,5 @@", "@@ -24,6 +23,7 @@"], "{out}");
        assert!(out.contains("-line 3\n"));
        assert!(out.contains(" line 26\n+inserted\n line 27\n"), "{out}");
    }

    #[test]
    fn additions_at_the_start_and_removals_at_the_end() {
        let out = unified("b\nc\n", "a\nb\nc\n", "x", "y").expect("a diff");
        assert_eq!(out, "--- x\n+++ y\n@@ -1,2 +1,3 @@\n+a\n b\n c\n");
        let out = unified("a\nb\nc\n", "a\nb\n", "x", "y").expect("a diff");
        assert_eq!(out, "--- x\n+++ y\n@@ -1,3 +1,2 @@\n a\n b\n-c\n");
        let out = unified("", "a\n", "x", "y").expect("a diff");
        assert_eq!(out, "--- x\n+++ y\n@@ -0,0 +1 @@\n+a\n");
    }

    #[test]
    fn a_replaced_block_lists_removals_before_additions() {
        let out = unified("a\nb\nc\nd\n", "a\nB\nC\nd\n", "x", "y").expect("a diff");
        assert_eq!(
            out,
            "--- x\n+++ y\n@@ -1,4 +1,4 @@\n a\n-b\n-c\n+B\n+C\n d\n"
        );
    }

    #[test]
    fn line_endings_are_not_compared() {
        let out = unified("a\r\nb", "a\nc\n", "x", "y").expect("a diff");
        assert_eq!(out, "--- x\n+++ y\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n");
        let out = unified("a\r\nb\r\n", "a\nb", "x", "y").expect("a diff");
        assert_eq!(
            out,
            "--- x\n+++ y\n(the texts differ only in line endings)\n"
        );
    }

    #[test]
    fn huge_inputs_fall_back_to_remove_then_add() {
        let old: Vec<String> = (0..5000).map(|i| format!("o{i}")).collect();
        let new: Vec<String> = (0..5000).map(|i| format!("n{i}")).collect();
        let out = unified(&text(&old), &text(&new), "x", "y").expect("a diff");
        assert!(out.starts_with("--- x\n+++ y\n@@ -1,5000 +1,5000 @@\n-o0\n"));
        assert_eq!(out.lines().count(), 3 + 10_000);
    }
}
