//! Shared by the tracker tests: XGBoost's own trackers in child processes, and this
//! test binary re-run as worker processes.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};
use switchyard::collective::{Communicator, ReduceOp};

/// Which XGBoost.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Xgb {
    /// 1.7.6: classic protocol.
    V17,
    /// 3.x: JSON protocol.
    V3,
}

impl Xgb {
    fn var(self) -> &'static str {
        match self {
            Xgb::V17 => "SWITCHYARD_XGB17_PYTHON",
            Xgb::V3 => "SWITCHYARD_XGB3_PYTHON",
        }
    }

    /// The Python with this XGBoost; `None` (saying why) when its variable is unset,
    /// a panic when unset and `SWITCHYARD_REQUIRE_XGBOOST=1`.
    pub(crate) fn python(self) -> Option<String> {
        match std::env::var(self.var()) {
            Ok(p) if !p.is_empty() => Some(p),
            _ => {
                assert!(
                    std::env::var("SWITCHYARD_REQUIRE_XGBOOST").as_deref() != Ok("1"),
                    "SWITCHYARD_REQUIRE_XGBOOST=1 but {} is not set",
                    self.var()
                );
                eprintln!("skipped: {} is not set", self.var());
                None
            }
        }
    }

    fn script(self) -> &'static str {
        match self {
            Xgb::V17 => {
                r#"
import sys
from xgboost.tracker import RabitTracker
n = int(sys.argv[1])
t = RabitTracker(host_ip="127.0.0.1", n_workers=n, port=0)
print("PORT", t.worker_envs()["DMLC_TRACKER_PORT"], flush=True)
t.start(n)
t.join()
print("JOINED", flush=True)
"#
            }
            Xgb::V3 => {
                r#"
import sys
from xgboost.tracker import RabitTracker
n = int(sys.argv[1])
t = RabitTracker(n_workers=n, host_ip="127.0.0.1", port=0)
t.start()
print("PORT", t.worker_args()["dmlc_tracker_port"], flush=True)
t.wait_for()
print("JOINED", flush=True)
"#
            }
        }
    }
}

/// A child process killed (and reaped) when dropped.
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Guard {
    /// Waits at most `limit` for the exit; `None` if it is still running.
    pub(crate) fn wait_for(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sends every line of `from` (invalid UTF-8 replaced, so that nothing ends the
/// stream early) until it ends.
fn forward(from: impl Read + Send + 'static, to: Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n') {
            match line {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes).trim_end().to_string();
                    if to.send(text).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    eprintln!("reading the reference tracker's output: {e}");
                    break;
                }
            }
        }
    });
}

/// XGBoost's tracker in a child process; its stdout and stderr lines on a channel.
pub(crate) struct RefTracker {
    child: Guard,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    lines: Receiver<String>,
    /// Whether `JOINED` went by while another line was awaited (stdout and stderr
    /// are read by two threads, so their lines interleave in any order).
    joined: bool,
}

impl RefTracker {
    /// Starts it for `n` workers and waits (at most 60 s) for its port.
    pub(crate) fn start(xgb: Xgb, python: &str, n: usize) -> RefTracker {
        let mut child = Command::new(python)
            .args(["-u", "-c", xgb.script(), &n.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the reference tracker");
        let (tx, lines) = channel();
        forward(child.stdout.take().expect("stdout"), tx.clone());
        forward(child.stderr.take().expect("stderr"), tx);
        let mut t = RefTracker {
            child: Guard(child),
            port: 0,
            lines,
            joined: false,
        };
        let first = t.line_matching(Duration::from_secs(60), |l| l.starts_with("PORT "));
        t.port = first[5..].trim().parse().expect("a port number");
        t
    }

    /// The next line for which `want` holds, within `limit` (a panic otherwise).
    pub(crate) fn line_matching(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if want(&line) => return line,
                Ok(line) => {
                    self.joined |= line == "JOINED";
                    eprintln!("tracker: {line}");
                }
                Err(e) => panic!("reference tracker: no expected line within {limit:?} ({e})"),
            }
        }
    }

    /// Waits (at most `limit`) for `JOINED` and the tracker's exit.
    pub(crate) fn finish(mut self, limit: Duration) {
        if !self.joined {
            self.line_matching(limit, |l| l == "JOINED");
        }
        let status = self.child.wait_for(limit).expect("tracker exits");
        assert!(status.success(), "reference tracker exited with {status}");
    }
}

/// This test binary, re-run to execute the ignored test `name` as a worker process
/// with `env` added (launcher variables of an enclosing run removed).
pub(crate) fn worker(name: &str, env: &[(&str, String)]) -> Guard {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
    ]);
    for v in [
        "SWITCHYARD_RANK",
        "SWITCHYARD_WORLD_SIZE",
        "SWITCHYARD_RENDEZVOUS",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "DMLC_NUM_WORKER",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Guard(cmd.stdin(Stdio::null()).spawn().expect("start a worker"))
}

/// The body of a worker process: `Communicator::from_env` (world size expected in
/// `SWITCHYARD_TEST_WORLD`), an allreduce on the small and on the large path and a
/// broadcast checked against closed forms, a print through the tracker, finalize.
pub(crate) fn worker_body() {
    let n: usize = std::env::var("SWITCHYARD_TEST_WORLD")
        .expect("SWITCHYARD_TEST_WORLD")
        .parse()
        .expect("a number");
    let mut comm = Communicator::from_env().expect("a communicator");
    assert_eq!(comm.world_size(), n);
    let r = comm.rank();
    let mut small = vec![(r + 1) as f64; 7];
    comm.allreduce(&mut small, ReduceOp::Sum)
        .expect("small allreduce");
    assert!(
        small.iter().all(|&x| x == (n * (n + 1) / 2) as f64),
        "{small:?}"
    );
    let mut large = vec![1.0f32; 100_000];
    comm.allreduce(&mut large, ReduceOp::Sum)
        .expect("large allreduce");
    assert!(large.iter().all(|&x| x == n as f32));
    let root = n - 1;
    let mut model = if r == root {
        b"weights".to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(&mut model, root).expect("broadcast");
    assert_eq!(model, b"weights");
    comm.tracker_print(&format!("rank {r}/{n} ok"))
        .expect("print");
    comm.finalize().expect("finalize");
}
