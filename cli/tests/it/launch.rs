//! `switchyard launch`: a real multi-process job, and the failure paths: a rank that fails stops the job, a rank that never checks in
//! is named, and no child outlives the launcher.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{example, run_bounded, switchyard};

#[test]
fn param_server_example_runs_across_three_processes() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "3", "--timeout", "120", "--"])
        .arg(example("param_server"))
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
        stdout.contains("[2] server(0,0): applied 160 updates"),
        "{stdout}"
    );
}

#[test]
fn example_launches_itself_with_no_setup() {
    let mut cmd = std::process::Command::new(example("param_server"));
    cmd.args([
        "--workers",
        "2",
        "--servers",
        "1",
        "--steps",
        "5",
        "--dim",
        "64",
    ]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("every worker matched the closed form"));
}

#[test]
fn a_failing_rank_stops_the_job_and_is_named() {
    let mut cmd = switchyard();
    // Rank 1 fails at once; rank 0 would sleep for a minute.
    cmd.args([
        "launch",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        r#"if [ "$SWITCHYARD_RANK" = 1 ]; then exit 3; else sleep 60; fi"#,
    ]);
    let (out, took) = run_bounded(cmd, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank 1 exited with exit status: 3"),
        "{stderr}"
    );
    // Before the sleeping rank's minute was up: it was stopped, not waited for.
    assert!(
        took < Duration::from_secs(60),
        "the sleeping rank was not stopped: {took:?}"
    );
}

#[test]
fn ranks_that_never_check_in_are_named() {
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "2",
        "--rendezvous-timeout",
        "1",
        "--",
        "sleep",
        "60",
    ]);
    let (out, took) = run_bounded(cmd, Duration::from_secs(90));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("ranks [0, 1] never checked in"), "{stderr}");
    // Named at the rendezvous timeout, not when the ranks' sleep ended.
    assert!(took < Duration::from_secs(60), "{took:?}");
}

#[test]
fn output_is_prefixed_by_rank() {
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "echo hello from $SWITCHYARD_RANK of $SWITCHYARD_WORLD_SIZE",
    ]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains("[0] hello from 0 of 2") && stdout.contains("[1] hello from 1 of 2"),
        "{stdout}"
    );
}

/// Every process of a job gets the same fresh `SWITCHYARD_JOB_ID`, and the next job
/// another: the ZeroMQ PLAIN password derives from it.
#[test]
fn each_job_gets_its_own_job_id_shared_by_its_processes() {
    let ids = || {
        let mut cmd = switchyard();
        cmd.env_remove("SWITCHYARD_JOB_ID").args([
            "launch",
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "echo job id: $SWITCHYARD_JOB_ID.",
        ]);
        let (out, _) = run_bounded(cmd, Duration::from_secs(30));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        let ids: Vec<String> = stdout
            .lines()
            .filter_map(|l| l.split_once("job id: ").map(|(_, id)| id.to_string()))
            .collect();
        assert_eq!(ids.len(), 2, "{stdout}");
        assert_eq!(ids[0], ids[1], "the processes of one job: {stdout}");
        assert!(ids[0].len() > 17, "a random id: {stdout}");
        ids[0].clone()
    };
    assert_ne!(ids(), ids(), "two jobs");
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "1", "--", "/nonexistent/program"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot start /nonexistent/program"),
        "{stderr}"
    );
}

/// A program built without the `mpi` feature but started by mpirun says so instead of
/// waiting for a launcher that is not there.
#[cfg(not(feature = "mpi"))]
#[test]
fn mpirun_without_the_mpi_feature_is_a_clear_error() {
    let mut cmd = std::process::Command::new(example("param_server"));
    cmd.env("OMPI_COMM_WORLD_RANK", "0")
        .env_remove("SWITCHYARD_RANK");
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rebuild with `--features mpi`"), "{stderr}");
}

/// `-n 0` is refused by the command line itself, naming the option,
/// not a variable the user never set.
#[test]
fn launch_of_zero_processes_names_the_option() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "0", "--", "true"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--processes"), "{stderr}");
    assert!(!stderr.contains("SWITCHYARD_WORLD_SIZE"), "{stderr}");
}
