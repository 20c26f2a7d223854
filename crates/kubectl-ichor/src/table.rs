//! Aligned columns, as kubectl prints them: each column as wide as its widest cell, three
//! spaces between columns, the last column not padded.

/// Lays `rows` out in aligned columns, one line each (no trailing newline on a line).
pub fn columns(rows: &[Vec<String>]) -> Vec<String> {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count() + 3;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line.trim_end().to_owned()
        })
        .collect()
}

/// A table: a header row, then `rows`, each line ended by a newline.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut all = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    all.extend(rows.iter().cloned());
    columns(&all).into_iter().map(|l| l + "\n").collect()
}

/// `n` bytes in decimal units (`100GB`, `1.5TB`), as `talosctl get disks` shows sizes.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    let text = if unit == 0 || value >= 10.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    };
    format!("{}{}", text.trim_end_matches(".0"), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| (*c).to_owned()).collect()
    }

    #[test]
    fn columns_align_on_the_widest_cell_and_the_last_is_not_padded() {
        let out = table(
            &["NAME", "CLUSTER", "ADDRESS"],
            &[
                row(&["lab-5a1a", "lab", "127.0.85.1"]),
                row(&["m", "production", "10.0.0.1"]),
            ],
        );
        assert_eq!(
            out,
            "NAME       CLUSTER      ADDRESS\n\
             lab-5a1a   lab          127.0.85.1\n\
             m          production   10.0.0.1\n"
        );
    }

    #[test]
    fn empty_trailing_cells_leave_no_trailing_spaces() {
        let lines = columns(&[row(&["a", "b", ""]), row(&["ccc", "", ""])]);
        assert_eq!(lines, vec!["a     b", "ccc"]);
    }

    #[test]
    fn sizes_read_like_talosctls() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(999), "999B");
        assert_eq!(bytes(104_857_600), "105MB");
        assert_eq!(bytes(100_000_000_000), "100GB");
        assert_eq!(bytes(1_500_000_000_000), "1.5TB");
        assert_eq!(bytes(2_000_000_000_000), "2TB");
    }
}
