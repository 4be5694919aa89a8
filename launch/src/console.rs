//! Everything the launcher prints: children's lines prefixed by rank, progress, and the
//! summary at the end.
//!
//! Progress goes to stderr. On a terminal it is one status line, redrawn in place
//! (`\r` + erase line) and lifted out of the way whenever a child's line is printed; to
//! anything else (a file, a CI log) it is one plain line per event, so that logs stay
//! readable and greppable. All writes go through one lock, so a child's line is never
//! cut by the status line or by another child's line.

use super::remote::{RemoteReport, is_cancel_notice, split_status};
use crossbeam_channel::Sender;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The launcher's output, shared by the supervision loop and the output threads.
#[derive(Debug)]
pub(crate) struct Console {
    /// Progress and summary wanted at all.
    progress: bool,
    /// stderr is a terminal: progress is a status line, not log lines.
    tty: bool,
    /// The status line now on screen (terminal only).
    status: Mutex<Option<String>>,
}

/// Erases the current terminal line.
const ERASE: &str = "\r\x1b[K";

impl Console {
    /// A console; `progress` false prints only the children's lines.
    pub(crate) fn new(progress: bool) -> Arc<Console> {
        Arc::new(Console {
            progress,
            tty: std::io::stderr().is_terminal(),
            status: Mutex::new(None),
        })
    }

    /// Prints one line of a child's output, on stdout or stderr as the child wrote it.
    pub(crate) fn child_line(&self, to_stderr: bool, line: &str) {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        if status.is_some() {
            let _ = write!(err, "{ERASE}");
        }
        if to_stderr {
            let _ = writeln!(err, "{line}");
        } else {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        if let Some(s) = status.as_ref() {
            let _ = write!(err, "{s}");
        }
        let _ = err.flush();
    }

    /// Reports one event: a log line when stderr is not a terminal (the terminal shows
    /// the status line instead).
    pub(crate) fn event(&self, text: &str) {
        if self.progress && !self.tty {
            self.child_line(true, &format!("switchyard: {text}"));
        }
    }

    /// Replaces the status line (terminal only).
    pub(crate) fn status(&self, text: String) {
        if !(self.progress && self.tty) {
            return;
        }
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.as_deref() == Some(text.as_str()) {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{ERASE}{text}");
        let _ = err.flush();
        *status = Some(text);
    }

    /// Prints the summary (and takes the status line away first).
    pub(crate) fn summary(&self, rows: &[SummaryRow]) {
        if !self.progress {
            return;
        }
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let mut err = std::io::stderr().lock();
        if status.take().is_some() {
            let _ = write!(err, "{ERASE}");
        }
        let _ = write!(err, "{}", format_summary(rows));
        let _ = err.flush();
    }
}

/// One process's line in the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SummaryRow {
    /// `rank 3` or `server 0`.
    pub(crate) process: String,
    /// How many times it was started.
    pub(crate) starts: u32,
    /// How it ended.
    pub(crate) status: String,
    /// From its first start to its last exit.
    pub(crate) wall: Duration,
}

/// The summary table.
pub(crate) fn format_summary(rows: &[SummaryRow]) -> String {
    let width = rows
        .iter()
        .map(|r| r.process.len())
        .max()
        .unwrap_or(0)
        .max(7);
    let mut text = format!(
        "switchyard: summary\n  {:width$}  starts  wall       status\n",
        "process"
    );
    for row in rows {
        text += &format!(
            "  {:width$}  {:>6}  {:>8.2}s  {}\n",
            row.process,
            row.starts,
            row.wall.as_secs_f64(),
            row.status
        );
    }
    text
}

/// Copies a child's output line by line, each prefixed with `prefix` (`[3] `); sends on
/// `done` when the stream closes. With `report` (the stderr of an ssh or srun
/// process), the remote shell's status report is taken out of the output and handed
/// to `report`, and so is srun's word that Slurm cancelled the step (which stays in
/// the output).
pub(crate) fn forward_output(
    console: Arc<Console>,
    prefix: String,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    done: Sender<()>,
    report: Option<Arc<RemoteReport>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let text = match &report {
                Some(report) => match split_status(&line) {
                    (before, Some(status)) => {
                        report.report(status);
                        if before.is_empty() {
                            continue;
                        }
                        before
                    }
                    (line, None) => {
                        if is_cancel_notice(line) {
                            report.cancelled();
                        }
                        line
                    }
                },
                None => &line,
            };
            console.child_line(to_stderr, &format!("{prefix}{text}"));
        }
        if let Some(report) = &report {
            report.close();
        }
        let _ = done.send(());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_a_row_per_process() {
        let rows = [
            SummaryRow {
                process: "rank 0".into(),
                starts: 1,
                status: "exit status: 0".into(),
                wall: Duration::from_millis(1500),
            },
            SummaryRow {
                process: "server 10".into(),
                starts: 3,
                status: "exit status: 1".into(),
                wall: Duration::from_secs(12),
            },
        ];
        let text = format_summary(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[2], "  rank 0          1      1.50s  exit status: 0");
        assert_eq!(lines[3], "  server 10       3     12.00s  exit status: 1");
    }
}
