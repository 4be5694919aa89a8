//! Bootstraps without a launcher across hosts that are network namespaces (`netns/`):
//! each rank is started by hand on its host (`ip netns exec`), as a user or a
//! scheduler would, and finds the others through a unique id.
//!
//! Needs root: without it every test says why and returns, unless
//! `SWITCHYARD_REQUIRE_NETNS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::netns;
use crate::support;

use netns::Net;
use std::io::{BufRead, BufReader};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{ChildGuard, example};

/// Variables by which some starter could have marked this test process.
const LAUNCH_VARS: [&str; 17] = [
    "SWITCHYARD_RANK",
    "SWITCHYARD_WORLD_SIZE",
    "SWITCHYARD_RENDEZVOUS",
    "SWITCHYARD_IFNAME",
    "DMLC_TRACKER_URI",
    "DMLC_TRACKER_PORT",
    "DMLC_TASK_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
];

/// Builds the worker (when stale) before a test starts its clocks.
fn ready() {
    example("netns_worker");
}

/// A worker started on one host, its stdout and stderr lines arriving on `lines`.
struct Worker {
    guard: ChildGuard,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    /// `netns_worker ARGS` on host `host`.
    fn start(net: &Net, host: usize, args: &[&str]) -> Worker {
        Worker::start_with(net, host, args, &[])
    }

    /// `netns_worker ARGS` on host `host` with the variables `env`.
    fn start_with(net: &Net, host: usize, args: &[&str], env: &[(String, String)]) -> Worker {
        let mut cmd = net.command(host, example("netns_worker"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Nothing of this test process's own starter may leak into the workers.
        for var in LAUNCH_VARS {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("spawn a worker");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for stream in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Worker {
            guard: ChildGuard(Some(child)),
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most until `by`) for a line starting with `prefix` and returns the
    /// rest of it.
    fn wait_for(&mut self, prefix: &str, by: Instant) -> String {
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.starts_with(prefix)) {
                return l[prefix.len()..].to_string();
            }
            let left = by.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {prefix:?} line in time: {:#?}", self.seen),
            }
        }
    }

    /// Waits (at most until `by`) for the worker to exit; returns its status and
    /// every line it wrote.
    fn finish(mut self, by: Instant) -> (ExitStatus, Vec<String>) {
        let child = self.guard.0.as_mut().unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < by,
                "worker still running: {:#?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.guard.0 = None;
        // Both readers end at EOF now that the process is gone.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, self.seen)
    }
}

/// Rank 0 makes a unique id on host 0; ranks 1 and 2 get it on hosts 1 and 2; checks
/// that the id names host 0's bridge address and that every rank finishes at its
/// host's address.
fn unique_id_job(net: &Net) {
    ready();
    let by = Instant::now() + Duration::from_secs(60);
    let common = ["--iters", "20", "--timeout", "20"];
    let mut root = Worker::start(net, 0, &strs(&uid_args(0, 3, &common)));
    let id = root.wait_for("id=", by);
    // The id names host 0's address on the network the others share.
    assert!(id.contains(&format!("@{}:", Net::addr(0))), "{id}");
    let mut workers = vec![root];
    for host in 1..3 {
        let mut extra = common.to_vec();
        extra.extend(["--id", &id]);
        workers.push(Worker::start(net, host, &strs(&uid_args(host, 3, &extra))));
    }
    for (host, worker) in workers.into_iter().enumerate() {
        let (status, lines) = worker.finish(by);
        assert!(status.success(), "host {host}: {lines:#?}");
        let joined = format!("joined rank={host} world=3 addr={} ", Net::addr(host));
        assert!(
            lines.iter().any(|l| l.starts_with(&joined)),
            "{joined:?} not in {lines:#?}"
        );
        assert!(lines.iter().any(|l| l == "done iters=20"), "{lines:#?}");
    }
}

#[test]
fn a_unique_id_made_on_one_host_brings_up_a_job_on_three() {
    let Some(net) = Net::new(3) else { return };
    unique_id_job(&net);
}

#[test]
fn a_unique_id_made_where_the_first_interface_leads_nowhere_names_the_routed_one() {
    let Some(net) = Net::with_dead_ends(3, &[(0, "a0", "10.99.0.1/24")]) else {
        return;
    };
    unique_id_job(&net);
}

/// `netns_worker uid --rank RANK --world WORLD` plus `extra`, as owned strings.
fn uid_args(rank: usize, world: usize, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "uid",
        "--rank",
        &rank.to_string(),
        "--world",
        &world.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn a_root_that_is_not_there_is_named_within_the_timeout() {
    let Some(net) = Net::new(2) else { return };
    // Nobody has 10.77.0.9: no RST comes back, only silence.
    let id = "syid:00000000000000ff@10.77.0.9:29500";
    ready();
    let started = Instant::now();
    let args = uid_args(1, 2, &["--id", id, "--timeout", "3"]);
    let worker = Worker::start(&net, 1, &strs(&args));
    let (status, lines) = worker.finish(started + Duration::from_secs(60));
    let took = started.elapsed();
    assert!(!status.success(), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("netns_worker: ") && l.contains("10.77.0.9:29500")),
        "the error does not name the root: {lines:#?}"
    );
    // The 3 s timeout and a margin for starting a worker in a namespace on a loaded
    // runner; one that ignored its timeout would wait on the silence until killed.
    assert!(
        took < Duration::from_secs(3 + 27),
        "gave up after {took:?}: {lines:#?}"
    );
}

#[test]
fn switchyard_ifname_is_obeyed_even_when_it_names_a_dead_end() {
    // Host 1 is told to use a0, which its peer cannot reach: the job fails, and says
    // at which address, rather than silently using eth0.
    let Some(net) = Net::with_dead_ends(2, &[(1, "a0", "10.99.0.2/24")]) else {
        return;
    };
    ready();
    let by = Instant::now() + Duration::from_secs(40);
    let args0 = uid_args(0, 2, &["--timeout", "4"]);
    let mut root = Worker::start(&net, 0, &strs(&args0));
    let id = root.wait_for("id=", by);
    let args1 = uid_args(1, 2, &["--id", &id, "--timeout", "4", "--ifname", "a0"]);
    let other = Worker::start(&net, 1, &strs(&args1));
    let (s0, lines0) = root.finish(by);
    let (s1, lines1) = other.finish(by);
    assert!(!s0.success() && !s1.success(), "{lines0:#?}\n{lines1:#?}");
    let all: Vec<&String> = lines0.iter().chain(&lines1).collect();
    assert!(
        all.iter()
            .any(|l| l.starts_with("netns_worker: ") && l.contains("10.99.0.2")),
        "no error names host 1's a0 address: {all:#?}"
    );
}

/// Starts rank `r` of 3 on host `r` with `env(r)`, highest rank first (the others
/// must wait for rank 0 to bind the root), in mode `env`; checks that every rank
/// finishes at its host's address.
fn three_ranks_from_env(net: &Net, env: impl Fn(usize) -> Vec<(&'static str, String)>) {
    ranks_from_env(net, &[0, 1, 2], &[], env);
}

/// Starts rank `r` on host `hosts[r]` with `env(r)` and the worker's `extra`
/// arguments, highest rank first, in mode `env`; checks that every rank finishes its
/// allreduces (checked against their closed form) at its host's address.
fn ranks_from_env(
    net: &Net,
    hosts: &[usize],
    extra: &[&str],
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) {
    ready();
    let by = Instant::now() + Duration::from_secs(60);
    let mut args = vec!["env", "--iters", "20", "--timeout", "20"];
    args.extend(extra);
    let n = hosts.len();
    let mut workers: Vec<(usize, Worker)> = (0..n)
        .rev()
        .map(|r| {
            let vars: Vec<(String, String)> = env(r)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            (r, Worker::start_with(net, hosts[r], &args, &vars))
        })
        .collect();
    workers.sort_by_key(|w| w.0);
    for (rank, worker) in workers {
        let (status, lines) = worker.finish(by);
        assert!(status.success(), "rank {rank}: {lines:#?}");
        let joined = format!(
            "joined rank={rank} world={n} addr={} ",
            Net::addr(hosts[rank])
        );
        assert!(
            lines.iter().any(|l| l.starts_with(&joined)),
            "{joined:?} not in {lines:#?}"
        );
        assert!(lines.iter().any(|l| l == "done iters=20"), "{lines:#?}");
    }
}

/// Two hosts of two ranks, then one of three beside one of one: the ranks of a
/// namespace share its host identity (boot id and network namespace), so they talk
/// through shared memory and share a host board, the hosts over TCP, and allreduces
/// run hierarchically (within the host, among leaders, back to the host), broadcasts
/// too (among one rank per host, then within each host). Each rank checks every sum
/// and every broadcast (roots in turn), at 1024 elements (8 KiB, one board call a
/// phase) and 262144 (2 MiB: eight board pieces, the direct exchange between leaders).
#[test]
fn ranks_sharing_hosts_allreduce_within_and_across_them() {
    let Some(net) = Net::new(2) else { return };
    for (port, hosts) in [(29510, [0, 0, 1, 1]), (29511, [0, 0, 0, 1])] {
        for len in ["1024", "262144"] {
            ranks_from_env(&net, &hosts, &["--len", len], |r| {
                vec![
                    ("MASTER_ADDR", Net::addr(0).to_string()),
                    ("MASTER_PORT", port.to_string()),
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "4".into()),
                ]
            });
        }
    }
}

/// Two hosts of two ranks that all announce one `SWITCHYARD_HOST_ID`: the ranks of
/// one host cannot reach the other host's shared-memory sockets. Every rank fails and
/// says why (the ranks that tried to connect, and through their notices the ranks
/// that waited for them, which saw only closed connections before).
#[test]
fn one_host_id_across_two_namespaces_is_explained_to_every_rank() {
    let Some(net) = Net::new(2) else { return };
    ready();
    let by = Instant::now() + Duration::from_secs(60);
    let hosts = [0, 0, 1, 1];
    let args = ["env", "--iters", "2", "--timeout", "10"];
    let workers: Vec<Worker> = (0..hosts.len())
        .rev()
        .map(|r| {
            let vars = [
                ("MASTER_ADDR", Net::addr(0).to_string()),
                ("MASTER_PORT", "29512".into()),
                ("RANK", r.to_string()),
                ("WORLD_SIZE", hosts.len().to_string()),
                ("SWITCHYARD_HOST_ID", "one-for-all".into()),
            ]
            .map(|(k, v)| (k.to_string(), v));
            Worker::start_with(&net, hosts[r], &args, &vars)
        })
        .collect();
    for (rank, worker) in workers.into_iter().rev().enumerate() {
        let (status, lines) = worker.finish(by);
        assert!(!status.success(), "rank {rank}: {lines:#?}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("netns_worker: ")
                    && l.contains("must share a network namespace")),
            "rank {rank}: {lines:#?}"
        );
    }
}

#[test]
fn torchrun_variables_bring_up_a_job_on_three_hosts() {
    let Some(net) = Net::new(3) else { return };
    // Ports belong to the namespaces: a fixed MASTER_PORT collides with nothing.
    three_ranks_from_env(&net, |r| {
        vec![
            ("MASTER_ADDR", Net::addr(0).to_string()),
            ("MASTER_PORT", "29500".into()),
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
        ]
    });
}

#[test]
fn srun_variables_bring_up_a_job_on_three_hosts() {
    let Some(net) = Net::new(3) else { return };
    // srun ran on host 0, where rank 0 is; the port comes from the job id.
    three_ranks_from_env(&net, |r| {
        vec![
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_JOB_ID", "4242".into()),
            ("SLURM_LAUNCH_NODE_IPADDR", Net::addr(0).to_string()),
        ]
    });
}
