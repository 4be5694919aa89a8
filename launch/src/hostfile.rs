//! The hostfile of `--launcher ssh|slurm|mpi`: one host per line, `#` comments, and an
//! optional `slots=N` (as in MPI hostfiles) for hosts that take several processes.
//!
//! ```text
//! # two processes on node1, one on node2
//! node1 slots=2
//! node2
//! ```
//!
//! Processes are dealt to the slots in turn: with the file above, process 0 and 1 go to
//! `node1`, 2 to `node2`, 3 and 4 to `node1` again, and so on.

use super::LaunchError;
use std::path::Path;

/// A host to run processes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// The name or address given to `ssh`, `srun --nodelist` or `mpirun --host`.
    pub(crate) name: String,
}

/// Most slots one line may claim; more is surely a typo.
const MAX_SLOTS: u32 = 4096;

/// Reads `path`: one entry per slot, in the order processes are dealt to them.
pub(crate) fn read(path: &Path) -> Result<Vec<Host>, LaunchError> {
    let text = std::fs::read_to_string(path).map_err(|e| LaunchError::Hostfile {
        path: path.display().to_string(),
        line: 0,
        reason: e.to_string(),
    })?;
    parse(&text).map_err(|(line, reason)| LaunchError::Hostfile {
        path: path.display().to_string(),
        line,
        reason,
    })
}

/// Parses hostfile text; an error is `(line number, reason)`.
pub(crate) fn parse(text: &str) -> Result<Vec<Host>, (usize, String)> {
    let mut slots = Vec::new();
    for (number, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let mut count = 1;
        for word in words {
            let value = word
                .strip_prefix("slots=")
                .ok_or_else(|| (number, format!("unknown field {word:?} (only slots=N)")))?;
            count = value
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=MAX_SLOTS).contains(n))
                .ok_or_else(|| (number, format!("slots={value}: expected 1..={MAX_SLOTS}")))?;
        }
        slots.push((name.to_string(), count));
    }
    if slots.is_empty() {
        return Err((0, "no hosts in the file".into()));
    }
    // One entry per slot: process i goes to entry i mod len, so a host's slots fill
    // together.
    let mut hosts = Vec::new();
    for (name, count) in &slots {
        for _ in 0..*count {
            hosts.push(Host { name: name.clone() });
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn names(hosts: &[Host]) -> Vec<&str> {
        hosts.iter().map(|h| h.name.as_str()).collect()
    }

    #[test]
    fn hosts_slots_and_comments() {
        let hosts = parse("# cluster\nnode1 slots=2\n\n  node2   # one slot\n").unwrap();
        assert_eq!(names(&hosts), ["node1", "node1", "node2"]);
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(parse("a\nb cpus=2\n").unwrap_err().0, 2);
        assert!(parse("a slots=0").unwrap_err().1.contains("slots=0"));
        assert!(parse("# nothing\n").unwrap_err().1.contains("no hosts"));
    }
}
