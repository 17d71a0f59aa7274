//! A plain text table with aligned columns, for `gpuslice status`; every cell is escaped
//! with the registry's [`printable`].

use gpuslice_registry::printable;

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Align {
    Left,
    Right,
}

/// Rows of cells under a header; rendered with two spaces between columns.
pub(super) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; control characters in cells are escaped (see [`printable`]).
    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows
            .push(cells.into_iter().map(|c| printable(&c)).collect());
    }

    /// The table, one line per row, each ending in a newline; no trailing spaces.
    pub(super) fn render(&self) -> String {
        let mut widths: Vec<usize> = self
            .columns
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|(h, _)| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (width, (_, align))) in widths.iter().zip(&self.columns).enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                let pad = width - cell.chars().count();
                if i > 0 {
                    line.push_str("  ");
                }
                match align {
                    Align::Left => {
                        line.push_str(cell);
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_left_and_right() {
        let mut t = Table::new(&[
            ("A", Align::Left),
            ("NUM", Align::Right),
            ("Z", Align::Left),
        ]);
        t.row(vec!["long".into(), "5".into(), "x".into()]);
        t.row(vec!["s".into(), "12345".into(), "".into()]);
        assert_eq!(t.render(), "A       NUM  Z\nlong      5  x\ns     12345\n");
    }

    #[test]
    fn cells_are_escaped() {
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        t.row(vec!["x\ny".into(), "z".into()]);
        assert_eq!(t.render(), "A     B\nx\\ny  z\n");
    }
}
