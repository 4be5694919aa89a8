//! The job secret end to end: `switchyard launch` with `SWITCHYARD_JOB_SECRET` (or a
//! secret file) in its environment runs a job whose rendezvous and TCP data links all
//! authenticate (the processes inherit the variable), and an unusable secret stops the
//! job before it starts (fail closed). Strangers refused mid-job are tested next to
//! each link (src/launch/rendezvous_server.rs, link/src/setup.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{example, run_bounded, switchyard};

const SECRET: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e75e";

fn assert_ran(out: &std::process::Output, n: usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for r in 0..n {
        assert!(
            stdout.contains(&format!("[{r}] rank {r} of {n}: 5 steps")),
            "{stdout}"
        );
    }
    // The secret itself is never printed.
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
}

#[test]
fn a_job_with_a_secret_runs_over_authenticated_links() {
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_JOB_SECRET", SECRET)
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .args(["launch", "-n", "3", "--timeout", "60", "--"])
        .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    assert_ran(&out, 3);
}

/// Before the real rank 0 starts, two strangers try its place at the launcher's
/// rendezvous: one without the secret, one with a wrong one. Both are refused (each
/// exits with an error saying why), and the job then finishes.
#[test]
fn strangers_without_the_secret_are_refused_and_the_job_finishes() {
    let strangers_first = r#"[ "$SWITCHYARD_RANK" != 0 ] || { ! env -u SWITCHYARD_JOB_SECRET "$0" && ! SWITCHYARD_JOB_SECRET=wrong-secret-wrong-secret "$0"; } || exit 9; exec "$0""#;
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_JOB_SECRET", SECRET)
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .args([
            "launch",
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            strangers_first,
        ])
        .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    assert_ran(&out, 2);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("the launcher expects a job secret"), "{all}");
    assert!(all.contains("during authentication"), "{all}");
}

#[test]
fn a_secret_file_works_the_same() {
    let dir = std::env::temp_dir().join(format!("switchyard-secret-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("job.secret");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_JOB_SECRET_FILE", &path)
        .env_remove("SWITCHYARD_JOB_SECRET")
        .args(["launch", "-n", "2", "--timeout", "60", "--"])
        .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_ran(&out, 2);
}

#[test]
fn an_unusable_secret_stops_the_job_naming_the_variable() {
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_JOB_SECRET", "short")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .args(["launch", "-n", "2", "--timeout", "30", "--"])
        .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("SWITCHYARD_JOB_SECRET"), "{stderr}");
    assert!(!stderr.contains("5 steps"));
}
