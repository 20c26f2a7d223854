//! The dry-run answer of `ApplyConfiguration` (talos-facts §11.1): Talos's summary text and a
//! unified diff between the config the node runs and the one applied ("No changes." when
//! they are the same).
//!
//! Talos diffs its own re-encoding of both configs; the simulator diffs its canonical form
//! of them (the documents in order, as it serializes them), so the diff lines can differ in
//! layout from Talos's while the header, hunk format and "No changes." are Talos's.

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Edit {
    Equal,
    Delete,
    Insert,
}

/// A unified diff with three lines of context and `--- a` / `+++ b` headers.
pub(crate) fn unified_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence, then the edit script.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut edits: Vec<(Edit, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            edits.push((Edit::Equal, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            edits.push((Edit::Delete, a[i]));
            i += 1;
        } else {
            edits.push((Edit::Insert, b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = edits
        .iter()
        .enumerate()
        .filter(|(_, (e, _))| *e != Edit::Equal)
        .map(|(i, _)| i)
        .collect();
    let mut out = String::from("--- a\n+++ b\n");
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = (changed[k] + CONTEXT + 1).min(edits.len());
        while k + 1 < changed.len() && changed[k + 1] <= end + CONTEXT {
            k += 1;
            end = (changed[k] + CONTEXT + 1).min(edits.len());
        }
        let (mut a_line, mut b_line) = (1, 1);
        for (e, _) in &edits[..start] {
            match e {
                Edit::Equal => {
                    a_line += 1;
                    b_line += 1;
                }
                Edit::Delete => a_line += 1,
                Edit::Insert => b_line += 1,
            }
        }
        let a_len = edits[start..end]
            .iter()
            .filter(|(e, _)| *e != Edit::Insert)
            .count();
        let b_len = edits[start..end]
            .iter()
            .filter(|(e, _)| *e != Edit::Delete)
            .count();
        let a_start = if a_len == 0 { a_line - 1 } else { a_line };
        let b_start = if b_len == 0 { b_line - 1 } else { b_line };
        out.push_str(&format!("@@ -{a_start},{a_len} +{b_start},{b_len} @@\n"));
        for (e, text) in &edits[start..end] {
            out.push(match e {
                Edit::Equal => ' ',
                Edit::Delete => '-',
                Edit::Insert => '+',
            });
            out.push_str(text);
            out.push('\n');
        }
        k += 1;
    }
    out
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
}
