//! The dry-run answer of `ApplyConfiguration` (talos-facts §11.1): Talos's summary text and a
//! unified diff between the config the node runs and the one applied ("No changes." when
//! they are the same).
//!
//! Talos diffs its own re-encoding of both configs; the simulator diffs its canonical form
//! of them (the documents in order, as it serializes them), so the diff lines can differ in
//! layout from Talos's while the header, hunk format and "No changes." are Talos's.

use similar::TextDiff;

use super::decode::Container;

/// The documents of a container in Talos's order (v1alpha1 first), separated by `---`.
pub(crate) fn encode(container: &Container) -> String {
    let mut docs: Vec<serde_json::Value> = Vec::new();
    if let Some(v1) = &container.v1alpha1 {
        docs.push(v1.to_json());
    }
    docs.extend(container.documents.iter().map(|d| d.node.to_json()));
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// `Dry run summary:` as machined writes it.
pub(crate) fn summary(mode_details: &str, old: Option<&Container>, new: &Container) -> String {
    let before = old.map(encode).unwrap_or_default();
    let after = encode(new);
    let diff = if before == after {
        "No changes.".to_owned()
    } else {
        unified_diff(&before, &after)
    };
    format!("Dry run summary:\n{mode_details} (skipped in dry-run).\nConfig diff:\n\n{diff}")
}

/// Lines of context around each change, as Talos writes them.
const CONTEXT: usize = 3;

/// A unified diff with three lines of context and `--- a` / `+++ b` headers. The `similar`
/// crate finds the changes and groups them into hunks; each hunk header always gives both
/// counts (`@@ -2,1 +2,1 @@`), as Talos's differ writes them, where `diff -u` would leave out a
/// count of one.
pub(crate) fn unified_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let diff = TextDiff::from_slices(&a, &b);
    let mut out = String::from("--- a\n+++ b\n");
    for hunk in diff.grouped_ops(CONTEXT) {
        let (Some(first), Some(last)) = (hunk.first(), hunk.last()) else {
            continue;
        };
        let old = first.old_range().start..last.old_range().end;
        let new = first.new_range().start..last.new_range().end;
        out.push_str(&format!("@@ -{} +{} @@\n", range(&old), range(&new)));
        for change in hunk.iter().flat_map(|op| diff.iter_changes(op)) {
            out.push_str(&format!("{}{}\n", change.tag(), change.value()));
        }
    }
    out
}

/// `start,count` of a hunk side, 1-based; an empty side names the line before it.
fn range(lines: &std::ops::Range<usize>) -> String {
    let start = if lines.is_empty() {
        lines.start
    } else {
        lines.start + 1
    };
    format!("{start},{}", lines.len())
}

#[cfg(test)]
mod tests {
    use super::unified_diff;

    #[test]
    fn a_new_config_is_all_additions() {
        assert_eq!(
            unified_diff("", "a: 1\nb: 2\n"),
            "--- a\n+++ b\n@@ -0,0 +1,2 @@\n+a: 1\n+b: 2\n"
        );
    }

    #[test]
    fn a_change_shows_its_context() {
        let before = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let after = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            unified_diff(before, after),
            "--- a\n+++ b\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }

    #[test]
    fn a_hunk_header_gives_a_count_of_one_as_talos_does() {
        assert_eq!(
            unified_diff("a: 1\n", "a: 2\n"),
            "--- a\n+++ b\n@@ -1,1 +1,1 @@\n-a: 1\n+a: 2\n"
        );
        assert_eq!(
            unified_diff("a: 1\nb: 2\n", "a: 1\n"),
            "--- a\n+++ b\n@@ -1,2 +1,1 @@\n a: 1\n-b: 2\n"
        );
    }
}
