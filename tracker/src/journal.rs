//! The state file: one JSON [`Record`] per line, appended as facts become durable and
//! replayed when a tracker starts, so that a tracker killed after bootstrap and started
//! again on the same port with the same file serves the workers' remaining calls
//! (`print`, `shutdown`, `recover`) and finishes the job.
//!
//! The first line is [`Record::Job`]; a file for another world size is refused. A last
//! line cut short by a kill is ignored; any other line that does not parse is an error.

use crate::record::Record;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Reading or writing failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A line is not a record.
    #[error("state file {path}, line {line}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// The file belongs to a job of another size.
    #[error("state file {path} is for {found} workers, this tracker has {expected}")]
    OtherJob {
        /// The file.
        path: PathBuf,
        /// Its world size.
        found: u32,
        /// Ours.
        expected: u32,
    },
}

/// An open state file.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
}

impl Journal {
    /// Opens (or creates) the state file of a job of `workers`; returns it and the
    /// records to replay, oldest first.
    pub(crate) fn open(path: &Path, workers: u32) -> Result<(Journal, Vec<Record>), JournalError> {
        let io_err = |source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (records, valid_len) = match std::fs::read(path) {
            Ok(bytes) => read_records(path, &bytes, workers)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), 0),
            Err(e) => return Err(io_err(e)),
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err)?;
        // Cut a torn last line, so that the next record starts a line of its own.
        file.set_len(valid_len).map_err(io_err)?;
        let mut journal = Journal {
            path: path.to_path_buf(),
            file,
        };
        if records.is_empty() {
            journal.append(&Record::Job { workers })?;
        }
        Ok((journal, records))
    }

    /// Appends one record as a line, written in one call so that a kill leaves at most
    /// the last line incomplete.
    pub(crate) fn append(&mut self, record: &Record) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(record).map_err(|e| JournalError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        line.push(b'\n');
        self.file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .map_err(|source| JournalError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

/// The records of `bytes`, and the length of its complete lines.
fn read_records(
    path: &Path,
    bytes: &[u8],
    workers: u32,
) -> Result<(Vec<Record>, u64), JournalError> {
    let mut records = Vec::new();
    let mut at = 0;
    let mut line_no = 0;
    while at < bytes.len() {
        line_no += 1;
        let Some(len) = bytes[at..].iter().position(|&b| b == b'\n') else {
            // A kill in the middle of a write: the last line has no end.
            break;
        };
        let line = &bytes[at..at + len];
        at += len + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let record = serde_json::from_slice::<Record>(line).map_err(|e| JournalError::Corrupt {
            path: path.to_path_buf(),
            line: line_no,
            reason: e.to_string(),
        })?;
        records.push(record);
    }
    let valid_len = at as u64;
    match records.first() {
        Some(Record::Job { workers: w }) if *w != workers => Err(JournalError::OtherJob {
            path: path.to_path_buf(),
            found: *w,
            expected: workers,
        }),
        Some(Record::Job { .. }) | None => Ok((records, valid_len)),
        Some(_) => Err(JournalError::Corrupt {
            path: path.to_path_buf(),
            line: 1,
            reason: "the first record is not the job's".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::record::Protocol;

    fn temp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("sy-journal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_last_line_is_ignored() {
        let p = temp("reopen");
        let (mut j, r) = Journal::open(&p, 2).unwrap();
        assert!(r.is_empty());
        let rec = Record::ShutDown {
            protocol: Protocol::Classic,
            rank: 1,
        };
        j.append(&rec).unwrap();
        drop(j);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"kind\":\"shut_do").unwrap();
        let (mut j, r) = Journal::open(&p, 2).unwrap();
        assert_eq!(r, vec![Record::Job { workers: 2 }, rec.clone()]);
        j.append(&rec).unwrap();
        drop(j);
        let (_, r) = Journal::open(&p, 2).unwrap();
        assert_eq!(r.len(), 3, "the torn line was cut before the next append");
        assert!(matches!(
            Journal::open(&p, 3),
            Err(JournalError::OtherJob {
                found: 2,
                expected: 3,
                ..
            })
        ));
        let _ = std::fs::remove_file(&p);
    }
}
