//! The stub and the example application on the MPI backend, unchanged, under
//! `mpirun`: the same binary that launches itself over ZeroMQ runs as
//! `mpirun -np 3 target/release/examples/param_server` when built with `--features mpi`.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{example, mpirun, run_bounded};

#[test]
fn param_server_runs_under_mpirun() {
    let mut cmd = mpirun::command(3);
    cmd.arg(example("param_server"))
        .args(["--steps", "10", "--dim", "512"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in 0..4 {
        assert!(
            stdout.contains(&format!("worker(0,{k}): converged")),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("server(0,1): applied 160 updates"),
        "{stdout}"
    );
}

#[test]
fn the_wrong_number_of_ranks_is_named() {
    let mut cmd = mpirun::command(2);
    cmd.arg(example("param_server"));
    let (out, waited) = run_bounded(cmd, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("this layout needs 3 processes, the job has 2 (mpirun -np 3)"),
        "{stderr}"
    );
    assert!(waited < Duration::from_secs(60), "{waited:?}");
}
