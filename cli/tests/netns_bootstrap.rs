//! Bootstraps without a launcher across hosts that are network namespaces (`netns/`):
//! each rank is started by hand on its host (`ip netns exec`), as a user or a
//! scheduler would, and finds the others through a unique id.
//!
//! Needs root: without it every test says why and returns, unless
//! `SWITCHYARD_REQUIRE_NETNS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod netns;
mod support;

use netns::Net;
use std::io::{BufRead, BufReader};
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{example, ChildGuard};

/// A worker started on one host, its stdout and stderr lines arriving on `lines`.
struct Worker {
    guard: ChildGuard,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Worker {
    /// `netns_worker ARGS` on host `host`.
    fn start(net: &Net, host: usize, args: &[&str]) -> Worker {
        let mut cmd = net.command(host, example("netns_worker"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Nothing of this test process's own starter may leak into the workers.
        for var in [
            "SWITCHYARD_RANK",
            "DMLC_TRACKER_URI",
            "MASTER_ADDR",
            "SWITCHYARD_IFNAME",
        ] {
            cmd.env_remove(var);
        }
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

#[test]
fn a_unique_id_made_on_one_host_brings_up_a_job_on_three() {
    let Some(net) = Net::new(3) else { return };
    let by = Instant::now() + Duration::from_secs(60);
    let common = ["--world", "3", "--iters", "20", "--timeout", "20"];
    let with = |rank: &str, extra: &[&str]| -> Vec<String> {
        let mut a = vec!["uid".to_string(), "--rank".into(), rank.into()];
        a.extend(common.iter().chain(extra).map(|s| s.to_string()));
        a
    };
    let args0 = with("0", &[]);
    let mut root = Worker::start(
        &net,
        0,
        &args0.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let id = root.wait_for("id=", by);
    // The id names host 0's address on the network the others share.
    assert!(id.contains(&format!("@{}:", Net::addr(0))), "{id}");
    let mut workers = vec![root];
    for host in 1..3 {
        let rank = host.to_string();
        let args = with(&rank, &["--id", &id]);
        workers.push(Worker::start(
            &net,
            host,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
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
