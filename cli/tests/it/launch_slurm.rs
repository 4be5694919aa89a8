//! `switchyard launch --launcher slurm` and what Slurm does around it, with the
//! stand-in `srun` of `launch_remote`: a job cancelled while it runs (`scancel`
//! signals the launcher and every step at once, so a step's end can be seen before
//! the launcher's own SIGTERM), and a job larger than its allocation. The real
//! cluster's side of the same is in `cluster_slurm.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::launch_remote::{Cluster, HOSTS};
use crate::support::{ChildGuard, run_bounded};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `srun --OPTION... PROGRAM ARGS` as under `scancel`: the program runs as a child and
/// its status is srun's, 143 for one ended by SIGTERM, with srun's line for it; with
/// `STANDIN_CANCEL_NOTICE=1`, a program that fails is reported as Slurm reports a
/// cancelled step.
const SRUN: &str = r#"#!/bin/sh
echo "srun $*" >> "$STANDIN_LOG"
while case "$1" in --*) true;; *) false;; esac; do shift; done
"$@"
status=$?
if [ "$status" != 0 ] && [ "$STANDIN_CANCEL_NOTICE" = 1 ]; then
    echo "slurmstepd-nodeA: error: *** STEP 7.$SWITCHYARD_RANK ON nodeA CANCELLED AT 2024-05-01T10:00:00 ***" >&2
fi
[ "$status" = 143 ] && echo "srun: error: nodeA: task 0: Terminated" >&2
exit $status
"#;

/// Each rank prints its PID and runs until stopped.
const WAIT: &str = "echo pid=$$; exec sleep 30";

/// Each rank prints its PID and, stopped by SIGTERM, exits 1 (as a program that
/// handles SIGTERM itself might).
const WAIT_AND_FAIL_ON_SIGTERM: &str =
    "trap 'exit 1' TERM; echo pid=$$; n=0; while [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done";

/// How long after a step's end the launcher gets its own SIGTERM in these tests: far
/// more than the launcher takes to see the step's end, well inside the time it gives
/// the signal to arrive.
const SIGNAL_AFTER: Duration = Duration::from_millis(300);

/// Sends `signal` to `pid` (which may be gone already).
fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) with plain integers.
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    matches!(state, None | Some('Z'))
}

/// Runs two ranks of `program` through the stand-in srun; once both run, ends rank 0
/// with SIGTERM and, [`SIGNAL_AFTER`] later, the launcher too, as `scancel` does
/// when the step's end comes first. Returns the launcher's exit code and stderr, and
/// the ranks' PIDs. With `signal_launcher` false, only rank 0 is ended.
fn cancel(
    name: &str,
    program: &str,
    notice: bool,
    signal_launcher: bool,
) -> (Option<i32>, String, Vec<u32>) {
    let cluster = Cluster::new(name, HOSTS);
    cluster.replace_standin("srun", SRUN);
    let hostfile = cluster.hostfile();
    let args = [
        "-n",
        "2",
        "--launcher",
        "slurm",
        "--host",
        "127.0.0.1",
        "--hostfile",
        hostfile.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        program,
    ];
    let mut cmd = cluster.launch(&args);
    cmd.env("STANDIN_CANCEL_NOTICE", if notice { "1" } else { "0" })
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard(Some(cmd.spawn().unwrap()));
    let launcher = guard.0.as_mut().unwrap();
    let stdout = launcher.stdout.take().unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut pids = [0u32; 2];
    let deadline = Instant::now() + Duration::from_secs(30);
    while pids.contains(&0) {
        let line = rx
            .recv_deadline(deadline)
            .expect("both ranks print their PID within 30 s");
        for (rank, pid) in pids.iter_mut().enumerate() {
            if let Some(value) = line.strip_prefix(&format!("[{rank}] pid=")) {
                *pid = value.trim().parse().unwrap();
            }
        }
    }
    signal(pids[0], libc::SIGTERM);
    if signal_launcher {
        std::thread::sleep(SIGNAL_AFTER);
        signal(launcher.id(), libc::SIGTERM);
    }
    let started = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the launcher still runs 60 s after the cancellation"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr, pids.to_vec())
}

/// The job ended as interrupted by SIGTERM, with no rank named as its cause, and no
/// rank left running.
fn assert_interrupted(code: Option<i32>, stderr: &str, pids: &[u32]) {
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("switchyard: interrupted by SIGTERM; every process was stopped"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("failed (") && !stderr.contains("every other process was stopped"),
        "a rank is blamed for the cancellation:\n{stderr}"
    );
    let limit = Instant::now() + Duration::from_secs(10);
    for &pid in pids {
        while !gone(pid) {
            assert!(
                Instant::now() < limit,
                "rank pid {pid} still runs\n{stderr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `scancel` as the launcher sees it when a step's end comes first: srun exits 143
/// (its task ended by SIGTERM), then the launcher's own SIGTERM arrives.
#[test]
fn a_step_ended_by_sigterm_just_before_the_launchers_sigterm_is_the_interruption() {
    let (code, stderr, pids) = cancel("slurm-cancel-status", WAIT, false, true);
    assert_interrupted(code, &stderr, &pids);
}

/// The same with a program that handles SIGTERM and exits 1: srun's status says
/// nothing, Slurm's notice that the step was cancelled does.
#[test]
fn a_step_slurm_reports_cancelled_just_before_the_launchers_sigterm_is_the_interruption() {
    let (code, stderr, pids) = cancel("slurm-cancel-notice", WAIT_AND_FAIL_ON_SIGTERM, true, true);
    assert_interrupted(code, &stderr, &pids);
}

/// A step ended by SIGTERM while the launcher gets no signal is still the rank's
/// failure, named with its host.
#[test]
fn a_step_ended_by_sigterm_alone_fails_the_job_naming_the_rank() {
    let (code, stderr, pids) = cancel("slurm-sigterm-alone", WAIT, false, false);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "switchyard: rank 0 on nodeA exited with exit status: 143; every other process was stopped"
        ),
        "{stderr}"
    );
    assert!(gone(pids[1]), "rank 1 still runs\n{stderr}");
}

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
