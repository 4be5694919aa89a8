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
//!
//! `--launcher slurm` without a hostfile, inside an allocation (`sbatch`, `salloc`),
//! takes the allocation's nodes and task counts as its hostfile
//! (`SLURM_JOB_NODELIST`, `SLURM_TASKS_PER_NODE`): each process's `srun` step is
//! placed on a node, as `mpirun` places ranks in an allocation, rather than left to
//! Slurm, which fills the first node first.

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

/// The hosts of the Slurm allocation this launcher runs in, one entry per task slot
/// (`SLURM_TASKS_PER_NODE`, one a node when unset); none outside an allocation
/// (`SLURM_JOB_NODELIST` unset). `var` reads a variable.
pub(crate) fn from_slurm_allocation(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Host>, LaunchError> {
    use switchyard_bootstrap::slurm::{expand_node_list, tasks_per_node};
    let Some(list) = var("SLURM_JOB_NODELIST") else {
        return Ok(Vec::new());
    };
    let malformed = |name: &'static str, value: &str, reason: &str| LaunchError::InvalidOption {
        option: name,
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let nodes = expand_node_list(&list).ok_or_else(|| {
        malformed(
            "SLURM_JOB_NODELIST",
            &list,
            "not a Slurm node list (node[01-03],gpu5): pass --hostfile instead",
        )
    })?;
    let counts = match var("SLURM_TASKS_PER_NODE") {
        None => vec![1; nodes.len()],
        Some(text) => tasks_per_node(&text)
            .filter(|c| c.len() == nodes.len())
            .ok_or_else(|| {
                malformed(
                    "SLURM_TASKS_PER_NODE",
                    &text,
                    &format!(
                        "expected a task count (2(x3),1) for each of the {} nodes of SLURM_JOB_NODELIST={list}",
                        nodes.len()
                    ),
                )
            })?,
    };
    let mut hosts = Vec::new();
    for (name, count) in nodes.iter().zip(counts) {
        for _ in 0..count.max(1) {
            hosts.push(Host { name: name.clone() });
        }
    }
    Ok(hosts)
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
    fn a_slurm_allocation_gives_its_nodes_and_task_slots() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let hosts = from_slurm_allocation(&env(&[
            ("SLURM_JOB_NODELIST", "node[0-2]"),
            ("SLURM_TASKS_PER_NODE", "2(x2),1"),
        ]))
        .unwrap();
        assert_eq!(names(&hosts), ["node0", "node0", "node1", "node1", "node2"]);
        let one_each = from_slurm_allocation(&env(&[("SLURM_JOB_NODELIST", "a,b")])).unwrap();
        assert_eq!(names(&one_each), ["a", "b"]);
        assert!(from_slurm_allocation(&env(&[])).unwrap().is_empty());
        let wrong = from_slurm_allocation(&env(&[
            ("SLURM_JOB_NODELIST", "node[0-2]"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ]))
        .unwrap_err();
        assert!(
            wrong.to_string().contains("SLURM_TASKS_PER_NODE"),
            "{wrong}"
        );
        let bad = from_slurm_allocation(&env(&[("SLURM_JOB_NODELIST", "n[1-")])).unwrap_err();
        assert!(bad.to_string().contains("SLURM_JOB_NODELIST"), "{bad}");
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(parse("a\nb cpus=2\n").unwrap_err().0, 2);
        assert!(parse("a slots=0").unwrap_err().1.contains("slots=0"));
        assert!(parse("# nothing\n").unwrap_err().1.contains("no hosts"));
    }
}
