//! Jobs under a real Slurm (Debian's slurmctld, slurmd and munge) on the hosts of the
//! test cluster (`cluster/`, `scripts/test-cluster.sh --slurm`): `sbatch` of
//! `switchyard launch --launcher slurm`, `srun` of workers with no launcher of ours,
//! `scancel`, and a task killed on one node.
//!
//! What the real Slurm showed that the stand-in `srun` had not: a step of
//! `srun --nodes=1 --ntasks=1` takes every CPU the job has on its node, so the
//! launcher's later steps waited ("Requested nodes are busy") until the first ones
//! ended (now `--exact`); left to Slurm, steps fill the first node (the launcher now
//! places them on the allocation's nodes); and `srun` run on a host outside the step
//! sets `SLURM_LAUNCH_NODE_IPADDR` to that host, where rank 0 is not (the bootstrap now
//! takes the step's first node).
//!
//! Needs root, openssh-server and Slurm: without them every test says why and returns,
//! unless `SWITCHYARD_REQUIRE_CLUSTER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::cluster::{Cluster, Joined};
use crate::support::{example, run_bounded, test_accuracy};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The ranks that joined, sorted, checked: `world` of them, rank `r` on the host
/// `host_of(r)`.
fn check_placement(text: &str, world: usize, host_of: impl Fn(usize) -> usize) {
    let seen = Joined::all(text);
    assert_eq!(seen.len(), world, "{text}");
    for (rank, j) in seen.iter().enumerate() {
        assert_eq!((j.rank, j.world), (rank, world), "{seen:?}");
        assert_eq!(
            j.addr,
            Cluster::addr(host_of(rank)).to_string(),
            "rank {rank}: {seen:?}"
        );
    }
}

/// Writes an executable batch script into the cluster's folder.
fn batch_script(cluster: &Cluster, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = cluster.dir().join(name);
    std::fs::write(&path, format!("#!/bin/sh\nset -e\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `sbatch ARGS` on node0; the job id (`--parsable`).
fn sbatch(cluster: &Cluster, args: &[&str], script: &Path) -> (String, Duration) {
    let mut c = cluster.command(0, "sbatch");
    c.arg("--parsable").args(args).arg(script);
    let (out, took) = run_bounded(c, Duration::from_secs(150));
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "sbatch failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        stdout.split(';').next().unwrap_or_default().to_string(),
        took,
    )
}

/// `scontrol show job ID` on node0.
fn job_state(cluster: &Cluster, id: &str) -> String {
    let mut c = cluster.command(0, "scontrol");
    c.args(["show", "job", id]);
    let (out, _) = run_bounded(c, Duration::from_secs(20));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `path` has `count` lines that `pick` accepts, up to `limit`.
fn wait_for_lines(
    path: &Path,
    count: usize,
    pick: impl Fn(&str) -> bool,
    limit: Duration,
) -> String {
    let until = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().filter(|l| pick(l)).count() >= count {
            return text;
        }
        assert!(
            Instant::now() < until,
            "not {count} such lines after {limit:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The launcher, a collective job and a parameter-server job, as a batch script.
fn launch_lines(n: usize, servers: usize, program: &str, args: &str) -> String {
    format!(
        "{} launch -n {n} --servers {servers} --launcher slurm --timeout 90 --rendezvous-timeout 40 -- {} {args}\n",
        env!("CARGO_BIN_EXE_switchyard"),
        example(program).display()
    )
}

#[test]
fn sbatch_of_switchyard_launch_places_ranks_on_the_allocation_and_trains() {
    let Some(cluster) = Cluster::up_with_slurm(3) else {
        return;
    };
    let out = cluster.dir().join("train.out");
    let script = batch_script(
        &cluster,
        "train.sh",
        &format!(
            "{}{}",
            launch_lines(6, 0, "netns_worker", "env --iters 20 --timeout 20"),
            launch_lines(4, 2, "logistic_ps", "--rounds 12"),
        ),
    );
    let out_arg = format!("--output={}", out.display());
    let (id, _) = sbatch(
        &cluster,
        &["--wait", "-N", "3", "--ntasks-per-node=2", &out_arg],
        &script,
    );
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let state = job_state(&cluster, &id);
    assert!(
        state.contains("JobState=COMPLETED") && state.contains("ExitCode=0:0"),
        "{state}\n{text}"
    );
    // sacct from the job completion log (the cluster has no accounting database, so
    // jobs, not steps).
    let mut c = cluster.command(0, "sacct");
    c.args(["--completion", "-j", &id, "-n", "-o", "JobID,State"]);
    let (sacct, _) = run_bounded(c, Duration::from_secs(20));
    let sacct_out = String::from_utf8_lossy(&sacct.stdout);
    assert!(
        sacct_out.contains(&id) && sacct_out.contains("COMPLETED"),
        "sacct: {sacct_out}{}",
        String::from_utf8_lossy(&sacct.stderr)
    );
    // Two task slots a node: ranks 0-1 on node0, 2-3 on node1, 4-5 on node2.
    check_placement(&text, 6, |rank| rank / 2);
    for rank in 0..6 {
        assert!(
            text.lines().any(|l| l == format!("[{rank}] done iters=20")),
            "rank {rank} did not finish:\n{text}"
        );
        let on = format!("rank {rank} on node{} running (srun pid ", rank / 2);
        assert!(
            text.lines().any(|l| l.contains(&on)),
            "rank {rank} not started on node{}:\n{text}",
            rank / 2
        );
    }
    let accuracy = test_accuracy(&text);
    assert!(accuracy >= 90.0, "accuracy {accuracy}%:\n{text}");
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(5));
    assert!(left.is_empty(), "left running (host, pid): {left:?}");
}

#[test]
fn srun_alone_starts_workers_from_slurm_variables() {
    let Some(cluster) = Cluster::up_with_slurm(3) else {
        return;
    };
    let worker = example("netns_worker");
    let run = |args: &[&str], tasks: usize| {
        let mut c = cluster.command(0, "srun");
        c.args(args)
            .arg(&worker)
            .args(["env", "--iters", "20", "--timeout", "20"]);
        let (out, _) = run_bounded(c, Duration::from_secs(90));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "srun {args:?}:\n{stdout}\n{stderr}");
        let done = stdout.lines().filter(|l| *l == "done iters=20").count();
        assert_eq!(done, tasks, "{stdout}");
        stdout
    };
    // Six tasks over three nodes, two a node.
    let text = run(&["-N", "3", "-n", "6", "--ntasks-per-node=2"], 6);
    check_placement(&text, 6, |rank| rank / 2);
    // srun on node0 with the step on node1 and node2, as from a login node outside
    // the allocation: rank 0's host is the step's first node, not the launch node.
    let text = run(
        &[
            "-w",
            "node1,node2",
            "-N",
            "2",
            "-n",
            "4",
            "--ntasks-per-node=2",
        ],
        4,
    );
    check_placement(&text, 4, |rank| 1 + rank / 2);
}

/// A batch job of `switchyard launch` whose six ranks run until stopped; waits until
/// every rank has joined. Returns the job id and its output file.
fn running_batch_job(cluster: &Cluster) -> (String, PathBuf) {
    let out = cluster.dir().join("run.out");
    let script = batch_script(
        cluster,
        "run.sh",
        &launch_lines(
            6,
            0,
            "netns_worker",
            "env --iters 0 --timeout 20 --progress 1000000000000",
        ),
    );
    let out_arg = format!("--output={}", out.display());
    let (id, _) = sbatch(
        cluster,
        &["-N", "3", "--ntasks-per-node=2", &out_arg],
        &script,
    );
    wait_for_lines(
        &out,
        6,
        |l| l.contains("] joined rank="),
        Duration::from_secs(60),
    );
    assert_eq!(cluster.running(&example("netns_worker")).len(), 6);
    (id, out)
}

/// Waits until the job is no longer pending or running; its `scontrol` record.
fn wait_job_end(cluster: &Cluster, id: &str, limit: Duration) -> String {
    let until = Instant::now() + limit;
    loop {
        let state = job_state(cluster, id);
        if !state.contains("JobState=RUNNING")
            && !state.contains("JobState=PENDING")
            && !state.contains("JobState=COMPLETING")
        {
            return state;
        }
        assert!(
            Instant::now() < until,
            "job {id} still running after {limit:?}:\n{state}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn scancel_ends_every_rank_on_every_host() {
    let Some(cluster) = Cluster::up_with_slurm(3) else {
        return;
    };
    let (id, out) = running_batch_job(&cluster);
    let mut c = cluster.command(0, "scancel");
    c.arg(&id);
    let (cancel, _) = run_bounded(c, Duration::from_secs(20));
    assert!(cancel.status.success(), "{cancel:?}");
    let state = wait_job_end(&cluster, &id, Duration::from_secs(30));
    assert!(state.contains("JobState=CANCELLED"), "{state}");
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(15));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        left.is_empty(),
        "left running after scancel (host, pid): {left:?}\n{text}"
    );
    // Slurm signals the batch script (the launcher) and every step at once; a step
    // whose end the launcher sees before its own SIGTERM is the cancellation too,
    // never a rank's failure.
    assert!(text.contains("interrupted by SIGTERM"), "{text}");
    assert!(
        !text.contains("every other process was stopped"),
        "a rank is blamed for scancel:\n{text}"
    );
}

#[test]
fn a_task_killed_on_one_node_ends_the_job_naming_rank_and_host() {
    let Some(cluster) = Cluster::up_with_slurm(3) else {
        return;
    };
    let (id, out) = running_batch_job(&cluster);
    let victims = cluster.running_on(1, &example("netns_worker"));
    assert_eq!(victims.len(), 2, "two ranks on node1: {victims:?}");
    let killed = Command::new("kill")
        .args(["-KILL", &victims[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let state = wait_job_end(&cluster, &id, Duration::from_secs(40));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(state.contains("JobState=FAILED"), "{state}\n{text}");
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with("switchyard: rank"))
        .unwrap_or_default();
    assert!(
        (last.starts_with("switchyard: rank 2 on node1 exited with")
            || last.starts_with("switchyard: rank 3 on node1 exited with"))
            && last.contains("every other process was stopped"),
        "the error does not name the rank and node1: {last:?}\n{text}"
    );
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(15));
    assert!(
        left.is_empty(),
        "left running (host, pid): {left:?}\n{text}"
    );
}

/// Every rank's `RESULT` line of `robust_worker` (the last one a rank printed), as
/// rank -> (model hash, attempt).
fn robust_results(text: &str) -> std::collections::BTreeMap<usize, (String, u64)> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.split("RESULT ").nth(1) else {
            continue;
        };
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        if let (Some(rank), Some(model), Some(attempt)) =
            (field("rank"), field("model"), field("attempt"))
        {
            out.insert(rank.parse().unwrap(), (model, attempt.parse().unwrap()));
        }
    }
    out
}

#[test]
fn robust_mode_under_slurm_restarts_a_killed_step_and_ends_bit_identical() {
    let Some(cluster) = Cluster::up_with_slurm(3) else {
        return;
    };
    let worker = "--iters 20 --len 10000 --pause-ms 100";
    let batch = |name: &str, restarts: u32| {
        let out = cluster.dir().join(format!("{name}.out"));
        let line = format!(
            "{} launch -n 6 --max-restarts {restarts} --launcher slurm --timeout 90 --rendezvous-timeout 40 -- {} {worker}\n",
            env!("CARGO_BIN_EXE_switchyard"),
            example("robust_worker").display()
        );
        let script = batch_script(&cluster, &format!("{name}.sh"), &line);
        let out_arg = format!("--output={}", out.display());
        let (id, _) = sbatch(
            &cluster,
            &["-N", "3", "--ntasks-per-node=2", &out_arg],
            &script,
        );
        (id, out)
    };
    // The failure-free run.
    let (plain_id, plain_out) = batch("plain", 0);
    let state = wait_job_end(&cluster, &plain_id, Duration::from_secs(60));
    let plain_text = std::fs::read_to_string(&plain_out).unwrap_or_default();
    assert!(
        state.contains("JobState=COMPLETED"),
        "{state}\n{plain_text}"
    );
    let want = robust_results(&plain_text);
    assert_eq!(want.len(), 6, "{plain_text}");

    // The same job, one of its steps killed by Slurm once every rank has joined.
    let (id, out) = batch("killed", 1);
    wait_for_lines(
        &out,
        6,
        |l| l.contains(" joined (tracker)"),
        Duration::from_secs(60),
    );
    std::thread::sleep(Duration::from_millis(300));
    let step = format!("{id}.3");
    let mut c = cluster.command(0, "scancel");
    c.args(["--signal=KILL", &step]);
    let (cancel, _) = run_bounded(c, Duration::from_secs(20));
    assert!(cancel.status.success(), "scancel {step}: {cancel:?}");
    let state = wait_job_end(&cluster, &id, Duration::from_secs(90));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(state.contains("JobState=COMPLETED"), "{state}\n{text}");
    assert!(
        text.contains("restarted with DMLC_NUM_ATTEMPT=1"),
        "no restart by a new srun step:\n{text}"
    );
    let got = robust_results(&text);
    assert_eq!(got.len(), 6, "{text}");
    let restarted: Vec<usize> = got
        .iter()
        .filter(|(_, (_, a))| *a == 1)
        .map(|(r, _)| *r)
        .collect();
    assert_eq!(restarted.len(), 1, "one rank restarted: {got:?}\n{text}");
    for (rank, (model, _)) in &got {
        assert_eq!(
            *model, want[rank].0,
            "rank {rank}'s model differs from the failure-free run's\n{text}"
        );
    }
}
