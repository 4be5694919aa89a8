//! `switchyard launch --launcher slurm` and what Slurm does around it, with the
//! stand-in `srun` of `launch_remote`: a job larger than its allocation. The real
//! cluster's side is in `cluster_slurm.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::launch_remote::{Cluster, HOSTS};
use crate::support::run_bounded;
use std::time::Duration;

/// The launcher inside an allocation of `nodes` and `tasks` (stand-in srun),
/// launching `args`.
fn in_allocation(
    cluster: &Cluster,
    nodes: &str,
    tasks: &str,
    args: &[&str],
) -> std::process::Command {
    let mut all = vec!["--launcher", "slurm", "--host", "127.0.0.1"];
    all.extend(args);
    let mut cmd = cluster.launch(&all);
    cmd.env("SLURM_JOB_NODELIST", nodes)
        .env("SLURM_TASKS_PER_NODE", tasks);
    cmd
}

/// More processes than the allocation has tasks are refused before any starts,
/// naming both numbers, rather than waiting out the rendezvous timeout for steps
/// that Slurm cannot place.
#[test]
fn more_processes_than_the_allocation_has_tasks_are_refused_at_once() {
    let cluster = Cluster::new("slurm-allocation", HOSTS);
    for (args, wanted) in [
        (&["-n", "4", "--", "true"][..], "needs 4 processes,"),
        (
            &["-n", "2", "--servers", "2", "--", "true"][..],
            "needs 4 processes (2 workers and 2 servers),",
        ),
    ] {
        let cmd = in_allocation(&cluster, "nodeA,nodeB", "2,1", args);
        let (out, took) = run_bounded(cmd, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the Slurm allocation has 3 tasks (SLURM_JOB_NODELIST=nodeA,nodeB, SLURM_TASKS_PER_NODE=2,1)"),
            "{args:?}: {stderr}"
        );
        assert!(cluster.log().is_empty(), "{args:?}: a step started");
        assert!(took < Duration::from_secs(10), "{args:?}: took {took:?}");
    }
    // As many as it has run, one a task.
    let cmd = in_allocation(&cluster, "nodeA,nodeB", "2,1", &["-n", "3", "--", "true"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cluster.log().len(), 3);
}
