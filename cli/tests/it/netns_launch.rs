//! Jobs across hosts by `switchyard launch --launcher ssh`, where the hosts are network
//! namespaces (`netns/`), each running a real sshd (`netns/ssh.rs`), logged in to by
//! address. The launcher itself runs on host 0, as on a cluster's head node, and
//! serves its tracker there; workers join it with `Communicator::join` (a tracker
//! bootstrap) (`examples/netns_worker.rs`, mode `tracker`). These hosts, unlike the
//! test cluster's (`cluster_*.rs`), can have a dead-end interface and be cut off.
//!
//! Needs root: without it every test says why and returns, unless
//! `SWITCHYARD_REQUIRE_NETNS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::netns;
use crate::support;

use netns::Net;
use netns::ssh::SshCluster;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{ChildGuard, example, run_bounded};

/// What a worker said when it joined.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Joined {
    /// The launcher's index for it (its `DMLC_TASK_ID`, the `[t]` prefix).
    task: usize,
    rank: usize,
    world: usize,
    addr: String,
}

/// Parses `[t] joined rank=R world=N addr=A task=T`.
fn parse_joined(line: &str) -> Option<Joined> {
    let rest = line.strip_prefix('[')?;
    let (task, rest) = rest.split_once("] joined ")?;
    let field = |name: &str| -> Option<String> {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    Some(Joined {
        task: task.parse().ok()?,
        rank: field("rank")?.parse().ok()?,
        world: field("world")?.parse().ok()?,
        addr: field("addr")?,
    })
}

/// `switchyard launch -n N --launcher ssh` on host 0 over the hosts of `cluster`,
/// running `netns_worker WORKER_ARGS`.
fn launch(net: &Net, cluster: &SshCluster, n: usize, worker_args: &[&str]) -> Command {
    let mut c = net.command(0, env!("CARGO_BIN_EXE_switchyard"));
    let head = Net::addr(0).to_string();
    c.arg("launch")
        .args(["-n", &n.to_string(), "--launcher", "ssh", "--hostfile"])
        .arg(cluster.hostfile())
        .args(["--launcher-args", &cluster.launcher_args()])
        .args([
            "--host",
            &head,
            "--rendezvous-timeout",
            "30",
            "--timeout",
            "90",
        ])
        .arg("--")
        .arg(example("netns_worker"))
        .args(worker_args);
    c
}

/// Runs a 3-rank job of `netns_worker WORKER_ARGS --iters 20` through the ssh
/// launcher, task `t` on host `order[t]`; checks that it succeeds, that every rank
/// ran on its task's host and finished; returns the joined lines in rank order.
fn three_host_job(net: &Net, order: &[usize], worker_args: &[&str]) -> Vec<Joined> {
    let cluster = SshCluster::new(net, order);
    let mut args = worker_args.to_vec();
    args.extend(["--iters", "20", "--timeout", "20"]);
    let (out, _) = run_bounded(launch(net, &cluster, 3, &args), Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let mut joined: Vec<Joined> = stdout.lines().filter_map(parse_joined).collect();
    joined.sort_by_key(|j| j.rank);
    assert_eq!(joined.len(), 3, "{stdout}\n{stderr}");
    for (rank, j) in joined.iter().enumerate() {
        assert_eq!((j.rank, j.world), (rank, 3), "{joined:?}");
        // It ran on the host its task was given, and is seen there at that address.
        assert_eq!(j.addr, Net::addr(order[j.task]).to_string(), "{j:?}");
        let done = format!("[{}] done iters=20", j.task);
        assert!(
            stdout.lines().any(|l| l == done),
            "no {done:?} in\n{stdout}"
        );
    }
    // The launcher started each task through ssh on its host.
    for (task, &host) in order.iter().enumerate() {
        let on = format!("rank {task} on {} running (ssh pid ", Net::addr(host));
        assert!(
            stderr.lines().any(|l| l.contains(&on)),
            "rank {task} not started on {}: {stderr}",
            Net::addr(host)
        );
    }
    joined
}

#[test]
fn an_ssh_job_on_three_hosts_ranks_them_by_host() {
    let Some(net) = Net::new(3) else { return };
    // Not in address order, so that the tracker's sorting shows.
    let joined = three_host_job(&net, &[2, 0, 1], &["tracker"]);
    for (rank, j) in joined.iter().enumerate() {
        assert_eq!(j.addr, Net::addr(rank).to_string(), "{joined:?}");
    }
}

#[test]
fn an_ssh_job_of_switchyard_programs_meets_at_the_launchers_rendezvous() {
    let Some(net) = Net::new(3) else { return };
    // Communicator::from_env: the launcher's rank (= task) and its rendezvous; each
    // mesh binds the address that routes to the rendezvous on host 0.
    let joined = three_host_job(&net, &[2, 0, 1], &["env"]);
    for j in &joined {
        assert_eq!(j.rank, j.task, "{joined:?}");
    }
}

#[test]
fn a_host_with_a_dead_end_interface_is_reached_on_the_one_that_routes() {
    // Host 2's first interface leads nowhere; its peers reach it only on eth0.
    let Some(net) = Net::with_dead_ends(3, &[(2, "a0", "10.99.0.3/24")]) else {
        return;
    };
    for args in [&["tracker"][..], &["env"], &["env", "--ifname", "eth0"]] {
        // The job succeeds only if host 2's mesh is on an address its peers reach.
        let joined = three_host_job(&net, &[0, 1, 2], args);
        assert_eq!(
            joined[2].addr,
            Net::addr(2).to_string(),
            "{args:?}: {joined:?}"
        );
    }
}

/// A line of the launcher's output and when it arrived.
struct Line {
    at: Instant,
    text: String,
    stderr: bool,
}

/// Sends each line of `from` to `to` as it arrives.
fn forward(from: impl Read + Send + 'static, stderr: bool, to: mpsc::Sender<Line>) {
    std::thread::spawn(move || {
        for text in BufReader::new(from).lines().map_while(Result::ok) {
            let line = Line {
                at: Instant::now(),
                text,
                stderr,
            };
            if to.send(line).is_err() {
                break;
            }
        }
    });
}

#[test]
fn a_partitioned_host_is_named_by_every_survivor_and_ends_the_job() {
    const TIMEOUT_S: u64 = 3;
    let Some(net) = Net::new(3) else { return };
    let cluster = SshCluster::new(&net, &[0, 1, 2]);
    let timeout = TIMEOUT_S.to_string();
    let args = [
        "tracker",
        "--iters",
        "0",
        "--timeout",
        &timeout,
        "--progress",
        "200",
        "--ignore-sigterm",
        "1",
    ];
    let mut cmd = launch(&net, &cluster, 3, &args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard(Some(cmd.spawn().expect("spawn the launcher")));
    let child = guard.0.as_mut().unwrap();
    let (tx, rx) = mpsc::channel();
    forward(child.stdout.take().unwrap(), false, tx.clone());
    forward(child.stderr.take().unwrap(), true, tx);

    // Every rank joins and gets going.
    let mut seen: Vec<Line> = Vec::new();
    let mut joined: Vec<Joined> = Vec::new();
    let mut running = [false; 3];
    let start_by = Instant::now() + Duration::from_secs(60);
    while joined.len() < 3 || running.contains(&false) {
        let left = start_by.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let all: Vec<&str> = seen.iter().map(|l| l.text.as_str()).collect();
            panic!("the job did not get going: {all:#?}");
        };
        if let Some(j) = parse_joined(&line.text) {
            joined.push(j);
        }
        for (t, r) in running.iter_mut().enumerate() {
            *r |= line.text.starts_with(&format!("[{t}] iter "));
        }
        seen.push(line);
    }
    let cut = joined.iter().find(|j| j.task == 2).unwrap().rank;

    net.link_down(2);
    let down = Instant::now();
    let end_by = down + Duration::from_secs(45);
    let status = loop {
        let child = guard.0.as_mut().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < end_by,
            "the job still runs 45 s after the partition"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    guard.0 = None;
    // The readers end at EOF, once every process holding the pipes is gone.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        seen.push(line);
    }
    let all: Vec<&str> = seen.iter().map(|l| l.text.as_str()).collect();
    assert!(!status.success(), "the launcher succeeded: {all:#?}");

    let limit = Duration::from_secs(TIMEOUT_S + 4);
    for survivor in joined.iter().filter(|j| j.task != 2) {
        let prefix = format!("[{}] netns_worker: rank {}: ", survivor.task, survivor.rank);
        let error = seen
            .iter()
            .find(|l| l.stderr && l.text.starts_with(&prefix))
            .unwrap_or_else(|| panic!("rank {} reported no error: {all:#?}", survivor.rank));
        let named = format!("rank {cut}");
        assert!(
            error.text[prefix.len()..].contains(&named),
            "rank {}'s error does not name rank {cut}: {}",
            survivor.rank,
            error.text
        );
        let after = error.at.duration_since(down);
        assert!(
            after < limit,
            "rank {} reported {after:?} after the partition (timeout {TIMEOUT_S} s): {}",
            survivor.rank,
            error.text
        );
    }
    let launcher_said = seen
        .iter()
        .filter(|l| l.stderr && !l.text.starts_with('['))
        .any(|l| l.text.contains("exited with"));
    assert!(launcher_said, "the launcher named no failed rank: {all:#?}");
}
