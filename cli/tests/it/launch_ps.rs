//! `switchyard launch --servers S`: a parameter-server job, with the scheduler served
//! by the launcher (DMLC_PS_ROOT_URI/PORT) as ps-lite's launcher serves it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{example, run_bounded, switchyard, test_accuracy};

#[test]
fn logistic_regression_trains_under_launch_with_two_servers() {
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "4",
        "--servers",
        "2",
        "--timeout",
        "120",
        "--",
    ])
    .arg(example("logistic_ps"))
    .args(["--rounds", "12"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let accuracy = test_accuracy(&stdout);
    assert!(accuracy >= 90.0, "accuracy {accuracy}%:\n{stdout}");
    // Both servers served and exited cleanly (their reports go to stderr).
    let stderr = String::from_utf8_lossy(&out.stderr);
    for s in ["s0", "s1"] {
        assert!(stderr.contains(&format!("[{s}] server")), "{stderr}");
    }
}

/// With a job secret, the scheduler served by the launcher process derives the same
/// per-job ZeroMQ password as the processes it starts (the launcher fixes its own job
/// id and hands it to them as SWITCHYARD_JOB_ID), so the job runs.
#[test]
fn a_parameter_server_job_with_a_secret_runs_under_launch() {
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_JOB_SECRET", "0123456789abcdef0123456789abcdef")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .env_remove("SWITCHYARD_JOB_ID")
        .args([
            "launch",
            "-n",
            "2",
            "--servers",
            "1",
            "--timeout",
            "60",
            "--",
        ])
        .arg(example("logistic_ps"))
        .args(["--rounds", "3"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("test accuracy "),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With replication on (`SWITCHYARD_PS_REPLICATE=1`), a server process SIGKILLed
/// mid-run is replaced by its replica under the launcher too: the launcher's
/// scheduler runs with the processes' settings, the launcher neither stops the job
/// nor restarts the server (the scheduler would refuse it as late), and the job
/// trains to the end and exits 0.
#[test]
fn a_killed_server_is_replaced_by_its_replica_under_launch() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mark = format!("launch-ps-{}", std::process::id());
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "4",
        "--servers",
        "2",
        "--max-restarts",
        "1",
        "--timeout",
        "120",
        "--",
    ])
    .arg(example("logistic_ps"))
    .args(["--rounds", "60", "--pause-ms", "20"])
    .env("SWITCHYARD_PS_REPLICATE", "1")
    .env("PS_HEARTBEAT_INTERVAL", "0.1")
    .env("PS_HEARTBEAT_TIMEOUT", "1.5")
    .env("SWITCHYARD_TEST_MARK", &mark)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut guard = support::ChildGuard(Some(cmd.spawn().unwrap()));
    let child = guard.0.as_mut().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("round   5") {
                let _ = tx.send(());
            }
            all.push(line);
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(90))
        .expect("training reaches round 5");
    // Server 1 is task 5 (workers are tasks 0..4).
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            vars.contains(&format!("SWITCHYARD_TEST_MARK={mark}").as_bytes())
                && vars.contains(&&b"DMLC_ROLE=server"[..])
                && vars.contains(&&b"DMLC_TASK_ID=5"[..])
        })
        .expect("the process of server 1");
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = guard.0.as_mut().unwrap().try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the job still runs 90 s after the kill"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = lines.join().unwrap().join("\n");
    let stderr = errors.join().unwrap();
    assert!(
        status.success(),
        "{status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("round  59"), "{stdout}");
    assert!(stdout.contains("test accuracy"), "{stdout}");
    assert!(stderr.contains("served by its replica"), "{stderr}");
    assert!(!stderr.contains("restarted with"), "{stderr}");
}
