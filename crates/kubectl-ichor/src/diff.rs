//! A unified line diff (`---`/`+++` headers, `@@` hunks with three lines of context), as
//! `diff -u` prints one. Common leading and trailing lines are set aside first, so a config
//! that changed in a few places costs little; the rest is a longest-common-subsequence diff,
//! replaced by a plain remove-and-add beyond [`MAX_CELLS`].

/// Lines of context around each change.
pub const CONTEXT: usize = 3;

/// The largest LCS table (lines × lines) computed; beyond it the changed middle is shown as
/// removed then added.
pub const MAX_CELLS: usize = 16_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Removed,
    Added,
}

/// The edit script turning `old` into `new`.
fn script<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<(Op, &'a str)> {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let a = &old[prefix..old.len() - suffix];
    let b = &new[prefix..new.len() - suffix];
    let mut ops: Vec<(Op, &str)> = old[..prefix].iter().map(|l| (Op::Same, *l)).collect();
    if a.len().saturating_mul(b.len()) > MAX_CELLS {
        ops.extend(a.iter().map(|l| (Op::Removed, *l)));
        ops.extend(b.iter().map(|l| (Op::Added, *l)));
    } else {
        // lcs[i][j]: the LCS length of a[i..] and b[j..].
        let width = b.len() + 1;
        let mut lcs = vec![0u32; (a.len() + 1) * width];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                lcs[i * width + j] = if a[i] == b[j] {
                    lcs[(i + 1) * width + j + 1] + 1
                } else {
                    lcs[(i + 1) * width + j].max(lcs[i * width + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            if i < a.len() && j < b.len() && a[i] == b[j] {
                ops.push((Op::Same, a[i]));
                i += 1;
                j += 1;
            } else if j < b.len()
                && (i == a.len() || lcs[i * width + j + 1] >= lcs[(i + 1) * width + j])
            {
                ops.push((Op::Added, b[j]));
                j += 1;
            } else {
                ops.push((Op::Removed, a[i]));
                i += 1;
            }
        }
    }
    ops.extend(old[old.len() - suffix..].iter().map(|l| (Op::Same, *l)));
    // Removals before additions inside each run of changes reads best.
    let mut k = 0;
    while k < ops.len() {
        if ops[k].0 == Op::Same {
            k += 1;
            continue;
        }
        let end = ops[k..]
            .iter()
            .position(|(op, _)| *op == Op::Same)
            .map_or(ops.len(), |p| k + p);
        ops[k..end].sort_by_key(|(op, _)| *op == Op::Added);
        k = end;
    }
    ops
}

/// `start,count` of a hunk side, as `diff -u` writes it (an empty side names the line before).
fn range(start: usize, count: usize) -> String {
    let first = if count == 0 { start } else { start + 1 };
    if count == 1 {
        format!("{first}")
    } else {
        format!("{first},{count}")
    }
}

/// The unified diff from `old` to `new`, or `None` when they are the same.
pub fn unified(old: &str, new: &str, old_label: &str, new_label: &str) -> Option<String> {
    if old == new {
        return None;
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = script(&a, &b);
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| *op != Op::Same)
        .map(|(i, _)| i)
        .collect();
    if changed.is_empty() {
        // Only line endings differ (e.g. a final newline).
        return Some(format!(
            "--- {old_label}\n+++ {new_label}\n(the texts differ only in line endings)\n"
        ));
    }
    // Group changes whose contexts touch into hunks of op indices [start, end).
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for &i in &changed {
        let start = i.saturating_sub(CONTEXT);
        let end = (i + 1 + CONTEXT).min(ops.len());
        match hunks.last_mut() {
            Some(last) if start <= last.1 => last.1 = end,
            _ => hunks.push((start, end)),
        }
    }
    let mut out = format!("--- {old_label}\n+++ {new_label}\n");
    // Line numbers before each op.
    let (mut old_at, mut new_at) = (Vec::new(), Vec::new());
    let (mut o, mut n) = (0, 0);
    for (op, _) in &ops {
        old_at.push(o);
        new_at.push(n);
        match op {
            Op::Same => {
                o += 1;
                n += 1;
            }
            Op::Removed => o += 1,
            Op::Added => n += 1,
        }
    }
    for (start, end) in hunks {
        let slice = &ops[start..end];
        let old_count = slice.iter().filter(|(op, _)| *op != Op::Added).count();
        let new_count = slice.iter().filter(|(op, _)| *op != Op::Removed).count();
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            range(old_at[start], old_count),
            range(new_at[start], new_count)
        ));
        for (op, line) in slice {
            out.push(match op {
                Op::Same => ' ',
                Op::Removed => '-',
                Op::Added => '+',
            });
            out.push_str(line);
            out.push('\n');
        }
    }
    Some(out)
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
    fn huge_inputs_fall_back_to_remove_then_add() {
        let old: Vec<String> = (0..5000).map(|i| format!("o{i}")).collect();
        let new: Vec<String> = (0..5000).map(|i| format!("n{i}")).collect();
        let out = unified(&text(&old), &text(&new), "x", "y").expect("a diff");
        assert!(out.starts_with("--- x\n+++ y\n@@ -1,5000 +1,5000 @@\n-o0\n"));
        assert_eq!(out.lines().count(), 3 + 10_000);
    }
}
