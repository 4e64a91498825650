//! Plain output as a table: one header line and one line per row, columns
//! padded to their widest cell; with `--json`, each row's JSON object on its
//! own line instead. A command's plain table and its JSON come from the same
//! rows, so neither shows what the other hides.

/// Rows waiting to be printed.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<(Vec<String>, serde_json::Value)>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// One row: its cells (as many as headers) and its JSON object.
    pub fn row(&mut self, cells: Vec<String>, json: serde_json::Value) {
        assert_eq!(cells.len(), self.headers.len(), "one cell per column");
        self.rows.push((cells, json));
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The plain table's lines (no trailing spaces), header first.
    pub fn lines(&self) -> Vec<String> {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for (cells, _) in &self.rows {
            for (width, cell) in widths.iter_mut().zip(cells) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
            let padded: Vec<String> = cells
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut lines = vec![line(&mut self.headers.iter().copied())];
        for (cells, _) in &self.rows {
            lines.push(line(&mut cells.iter().map(String::as_str)));
        }
        lines
    }

    /// Prints the table, or the JSON lines with `json`.
    pub fn print(&self, json: bool) {
        if json {
            for (_, object) in &self.rows {
                println!("{object}");
            }
        } else {
            for line in self.lines() {
                println!("{line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_are_padded_to_their_widest_cell() {
        let mut table = Table::new(&["NAME", "SETUP"]);
        table.row(
            vec!["a-long-name".into(), "ready".into()],
            serde_json::json!({}),
        );
        table.row(vec!["b".into(), "failed".into()], serde_json::json!({}));
        assert_eq!(
            table.lines(),
            [
                "NAME         SETUP",
                "a-long-name  ready",
                "b            failed"
            ]
        );
    }
}
