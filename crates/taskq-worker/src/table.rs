//! Columns of text aligned for a terminal: the one table printer behind
//! `taskq stats`, `taskq tubes`, `taskq top --once`, the demo's report and the
//! worker's summary.

use std::fmt;

/// A table of text cells: the first column left-aligned, the others
/// right-aligned (numbers) unless made [`left`](Table::left); columns two
/// spaces apart; rows may be shorter than others; no trailing spaces.
#[derive(Debug, Clone, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
    left: Vec<usize>,
    indent: usize,
}

impl Table {
    /// An empty table.
    pub fn new() -> Table {
        Table {
            left: vec![0],
            ..Table::default()
        }
    }

    /// Makes column `col` (0-based) left-aligned.
    pub fn left(mut self, col: usize) -> Table {
        self.left.push(col);
        self
    }

    /// Starts every line with `n` spaces.
    pub fn indent(mut self, n: usize) -> Table {
        self.indent = n;
        self
    }

    /// Adds a row. A control character in a cell is shown escaped
    /// (`\u{1b}`): a cell may hold what anyone could publish (a tube name,
    /// a subject), and a terminal must not take it as a command.
    pub fn row<I, C>(&mut self, cells: I) -> &mut Table
    where
        I: IntoIterator<Item = C>,
        C: fmt::Display,
    {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| printable(&c.to_string()))
                .collect(),
        );
        self
    }
}

/// `s` with its control characters escaped.
fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    taskq_proto::push_printable(&mut out, s.as_bytes(), false, usize::MAX);
    out
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut line = String::new();
        for row in &self.rows {
            line.clear();
            line.extend(std::iter::repeat_n(' ', self.indent));
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = widths[c] - cell.chars().count();
                if self.left.contains(&c) {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                } else {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_and_trims_short_rows() {
        let mut t = Table::new().indent(1).left(2);
        t.row(["TUBE", "READY", "NOTE"]);
        t.row(["default", "7", ""]);
        t.row(["emails", "1200", "paused"]);
        t.row(["x"]);
        assert_eq!(
            t.to_string(),
            " TUBE     READY  NOTE\n default      7\n emails    1200  paused\n x\n"
        );
        let mut kv = Table::new().left(1);
        kv.row(["current-jobs-ready", "12"]);
        kv.row(["rusage-utime", "0.004000"]);
        assert_eq!(
            kv.to_string(),
            "current-jobs-ready  12\nrusage-utime        0.004000\n"
        );
    }

    #[test]
    fn a_control_character_in_a_cell_is_shown_escaped_never_sent_to_the_terminal() {
        let mut t = Table::new();
        t.row(["q\u{1b}]0;owned\u{7}\r\nx", "1"]);
        let shown = t.to_string();
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{shown:?}"
        );
        assert_eq!(shown, "q\\u{1b}]0;owned\\u{7}\\r\\nx  1\n");
    }
}
