use serde::Serialize;

/// One measured figure beside its baseline.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Row {
    pub(crate) suite: String,
    pub(crate) case: String,
    pub(crate) size: u64,
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
                human_size(self.size),
                self.metric,
                self.ours,
                self.baseline,
                self.baseline_name,
                self.ratio
            );
        }
    }
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
