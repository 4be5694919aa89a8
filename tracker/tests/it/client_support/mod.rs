//! Shared by the client tests: XGBoost 1.7.6's own `RabitTracker` in a child process.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// The Python with XGBoost 1.7.6, from `SWITCHYARD_XGB17_PYTHON`; `None` (with a line
/// saying why) when unset, a panic when unset and `SWITCHYARD_REQUIRE_XGBOOST=1`.
pub(crate) fn xgb17_python() -> Option<String> {
    match std::env::var("SWITCHYARD_XGB17_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            assert!(
                std::env::var("SWITCHYARD_REQUIRE_XGBOOST").as_deref() != Ok("1"),
                "SWITCHYARD_REQUIRE_XGBOOST=1 but SWITCHYARD_XGB17_PYTHON is not set"
            );
            eprintln!("skipped: SWITCHYARD_XGB17_PYTHON is not set (a Python with xgboost==1.7.6)");
            None
        }
    }
}

/// The reference tracker: serves `n` workers on 127.0.0.1, prints its port, then
/// every worker `print`, then `JOINED` once `n` workers have shut down.
const REF_TRACKER: &str = r#"
import sys
from xgboost.tracker import RabitTracker
n = int(sys.argv[1])
t = RabitTracker(host_ip="127.0.0.1", n_workers=n, port=0)
print("PORT", t.worker_envs()["DMLC_TRACKER_PORT"], flush=True)
t.start(n)
t.join()
print("JOINED", flush=True)
"#;

/// XGBoost's `RabitTracker` in a child process, killed when dropped.
pub(crate) struct RefTracker {
    child: Child,
    /// The port it listens on (127.0.0.1).
    pub(crate) port: u16,
    lines: Receiver<String>,
}

impl RefTracker {
    /// Starts it for `n` workers and waits (at most 60 s) for its port.
    pub(crate) fn start(python: &str, n: u32) -> RefTracker {
        let mut child = Command::new(python)
            .args(["-u", "-c", REF_TRACKER, &n.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the reference tracker");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut tracker = RefTracker {
            child,
            port: 0,
            lines,
        };
        let first = tracker.line_matching(Duration::from_secs(60), |l| l.starts_with("PORT "));
        tracker.port = first[5..].trim().parse().expect("a port number");
        tracker
    }

    /// Waits for a line of its stdout for which `want` holds, failing after `limit`.
    pub(crate) fn line_matching(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if want(&line) => return line,
                Ok(_) => {}
                Err(e) => panic!("reference tracker: no expected line within {limit:?} ({e})"),
            }
        }
    }

    /// Waits (at most `limit`) for the job to end: `JOINED` and a zero exit.
    pub(crate) fn finish(mut self, limit: Duration) {
        self.line_matching(limit, |l| l == "JOINED");
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the tracker") {
                assert!(status.success(), "reference tracker exited with {status}");
                return;
            }
            assert!(Instant::now() < until, "reference tracker did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RefTracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
