//! How `docs/tuning.md` is read by the checks that compare it with the code: the manager's
//! (its library's defaults, its flags and the chart) and the webhook's. One reader, for every
//! crate's tests.

use std::time::Duration;

/// A duration as `docs/tuning.md` writes it: in the largest of `d`, `h`, `min`, `s` and
/// `ms` that divides it.
pub fn shown(duration: Duration) -> String {
    let millis = duration.as_millis();
    let units = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("min", 60_000),
        ("s", 1000),
    ];
    let (unit, size) = units
        .into_iter()
        .find(|(_, size)| millis >= *size && millis.is_multiple_of(*size))
        .unwrap_or(("ms", 1));
    format!("{} {unit}", millis / size)
}

/// The rows of `docs/tuning.md`'s tables, as (flag, code, default), backticks dropped.
pub fn tuning_rows() -> Vec<[&'static str; 3]> {
    let doc = include_str!("../../../docs/tuning.md");
    let rows = doc
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"));
    rows.filter(|l| !l.starts_with("| Setting |"))
        .map(|line| {
            let cells: Vec<&str> = line
                .split('|')
                .map(|c| c.trim().trim_matches('`'))
                .collect();
            assert_eq!(
                cells.len(),
                8,
                "a row of docs/tuning.md without six cells: {line}"
            );
            [cells[2], cells[3], cells[4]]
        })
        .collect()
}

/// Asserts that `docs/tuning.md` gives each item of `code` (its path, as the page's Code column
/// names it, and its value, as the page writes it) that value, and that every item the page
/// names for which `checked_here` holds is among `code`: a default changed on one side alone,
/// or a row no test reads, fails.
pub fn assert_code_rows(code: &[(&str, String)], checked_here: impl Fn(&str) -> bool) {
    let rows = tuning_rows();
    for (item, value) in code {
        let [_, _, stated] = rows
            .iter()
            .find(|[_, named, _]| named == item)
            .unwrap_or_else(|| panic!("docs/tuning.md has no row for `{item}`"));
        assert_eq!(
            stated, value,
            "docs/tuning.md gives `{item}` as {stated}, the code {value}"
        );
    }
    for [_, named, _] in &rows {
        if checked_here(named) {
            assert!(
                code.iter().any(|(item, _)| item == named),
                "docs/tuning.md names `{named}`, which no test checks"
            );
        }
    }
}
