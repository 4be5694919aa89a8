//! Helpers shared by the integration tests: bounded child processes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Kills and reaps the child if the test fails before it exits.
pub(crate) struct ChildGuard(pub(crate) Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `command` to completion or kills it after `limit`, returning its output and
/// how long it ran.
pub(crate) fn run_bounded(mut command: Command, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut guard = ChildGuard(Some(child));
    loop {
        let child = guard.0.as_mut().unwrap();
        if child.try_wait().expect("try_wait").is_some() {
            let output = guard.0.take().unwrap().wait_with_output().expect("output");
            return (output, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "{command:?} still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `switchyard` binary cargo built for these tests.
pub(crate) fn switchyard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// An example built beside the test binaries (`cargo test` builds examples).
pub(crate) fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_switchyard"));
    let path = bin.parent().unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: run the whole suite with `cargo test` (which builds examples) or `cargo build --examples` first",
        path.display()
    );
    path
}

/// `mpirun` commands, shared with the transports crate's MPI tests.
#[path = "../../transports/tests/support/mpirun.rs"]
pub(crate) mod mpirun;
