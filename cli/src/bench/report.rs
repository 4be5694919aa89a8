use serde::Serialize;

/// One measured figure beside its baseline.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Row {
    pub(crate) suite: String,
    pub(crate) case: String,
    pub(crate) size: u64,
    /// What `size` counts (bytes unless said otherwise); the JSON row keeps the bare
    /// number, the table names the unit.
    #[serde(skip)]
    pub(crate) unit: SizeUnit,
    pub(crate) metric: String,
    pub(crate) ours: f64,
    pub(crate) baseline: f64,
    pub(crate) baseline_name: String,
    /// Above 1 means switchyard is better.
    pub(crate) ratio: f64,
}

impl Row {
    /// A row where a larger value is better (rates, bandwidth).
    pub(crate) fn higher_better(
        suite: &str,
        case: &str,
        size: u64,
        metric: &str,
        ours: f64,
        baseline: f64,
        baseline_name: &str,
    ) -> Row {
        Row {
            suite: suite.into(),
            case: case.into(),
            size,
            unit: SizeUnit::Bytes,
            metric: metric.into(),
            ours,
            baseline,
            baseline_name: baseline_name.into(),
            ratio: ours / baseline,
        }
    }

    /// A row where a smaller value is better (latency).
    pub(crate) fn lower_better(
        suite: &str,
        case: &str,
        size: u64,
        metric: &str,
        ours: f64,
        baseline: f64,
        baseline_name: &str,
    ) -> Row {
        Row {
            ratio: baseline / ours,
            ..Row::higher_better(suite, case, size, metric, ours, baseline, baseline_name)
        }
    }

    /// The same row, its size a number of ranks (workers), not bytes.
    pub(crate) fn in_ranks(self) -> Row {
        Row {
            unit: SizeUnit::Ranks,
            ..self
        }
    }

    /// The size column of the table.
    fn size_text(&self) -> String {
        match self.unit {
            SizeUnit::Bytes => human_size(self.size),
            SizeUnit::Ranks => format!("{} ranks", self.size),
        }
    }

    /// Prints the row as it is measured: JSON, or one table line.
    pub(crate) fn emit(&self, json: bool) {
        if json {
            match serde_json::to_string(self) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("cannot encode row: {e}"),
            }
        } else {
            println!(
                "{:<22} {:>9} {:<10} {:>14.3} {:>14.3}  {:<26} {:>6.2}",
                self.case,
                self.size_text(),
                self.metric,
                self.ours,
                self.baseline,
                self.baseline_name,
                self.ratio
            );
        }
    }
}

/// What a row's size counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SizeUnit {
    /// Bytes (messages, buffers).
    Bytes,
    /// Ranks: the tracker bench's sizes are numbers of workers.
    Ranks,
}

/// The table header matching [`Row::emit`].
pub(crate) fn header() {
    println!(
        "{:<22} {:>9} {:<10} {:>14} {:>14}  {:<26} {:>6}",
        "case", "size", "metric", "switchyard", "baseline", "baseline is", "ratio"
    );
}

pub(crate) fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bench tracker` printed its worker counts as bytes ("16 B").
    #[test]
    fn a_row_counting_ranks_says_ranks_not_bytes() {
        let row = Row::lower_better("tracker", "admit_wire_n16", 16, "time_ms", 1.0, 2.0, "x");
        assert_eq!(row.size_text(), "16 B");
        let row = row.in_ranks();
        assert_eq!(row.size_text(), "16 ranks");
        assert_eq!(row.size, 16);
        assert_eq!(human_size(1 << 20), "1 MiB");
    }
}
