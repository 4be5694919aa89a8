//! The parameter server over processes: `examples/logistic_ps` trains to its
//! threshold, and a server SIGKILLed mid-run ends every process with an error naming
//! it instead of a hang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use switchyard::ps::{PsConfig, PsError, Scheduler, Sharding};

/// The example, built once per test binary with this test's profile (`cargo test
/// --test it` does not build examples by itself).
fn example() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
        if let Some(cargo) = std::env::var_os("CARGO") {
            let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "dev".to_string(),
                Some(other) => other.to_string(),
                None => panic!("odd profile folder {}", profile_dir.display()),
            };
            // This test's own features, so that the build reuses its artifacts (CI
            // runs the tests again with `--features mpi`).
            let features: Vec<&str> = [
                ("zmq", cfg!(feature = "zmq")),
                ("mpi", cfg!(feature = "mpi")),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            let status = Command::new(cargo)
                .args([
                    "build",
                    "-q",
                    "-p",
                    "switchyard",
                    "--example",
                    "logistic_ps",
                    "--profile",
                    &profile,
                ])
                .arg("--no-default-features")
                .arg(format!("--features={}", features.join(",")))
                .arg("--manifest-path")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
                .arg("--target-dir")
                .arg(profile_dir.parent().unwrap())
                .status()
                .unwrap();
            assert!(status.success(), "building examples/logistic_ps failed");
        }
        profile_dir.join("examples").join("logistic_ps")
    })
    .clone()
}

/// Kills every child still running when dropped (a failing assertion included).
struct Guard(Vec<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn logistic_example_trains_over_seven_processes() {
    let child = Command::new(example())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = Guard(vec![child]);
    let status = wait_bounded(&mut guard.0[0], Duration::from_secs(120)).expect("the example ends");
    let mut out = String::new();
    guard.0[0]
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    guard.0[0]
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    let losses: Vec<f32> = out
        .lines()
        .filter_map(|l| l.split("loss ").nth(1)?.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(losses.len(), 30, "{out}");
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the loss falls every round: {losses:?}"
    );
    assert!(out.contains("test accuracy"), "{out}");
    // Every server ended well: the example exits non-zero otherwise. (Their report
    // lines share one stderr pipe and may interleave, so they are not matched here.)
}

/// Scheduler in this process, two servers and four workers as example processes;
/// server process 1 is SIGKILLed once training runs.
#[test]
fn killed_server_ends_every_process_with_its_name() {
    let config = PsConfig::new(4, 2).with_sharding(Sharding::Range { key_space: Some(9) });
    let dead_timeout = config.dead_timeout;
    let scheduler = Scheduler::bind("tcp://127.0.0.1:0", &config).unwrap();
    let port = scheduler.endpoint().rsplit(':').next().unwrap().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let spawn = |role: &str| {
        Command::new(example())
            .args(["--rounds", "1000", "--pause-ms", "50"])
            .env("DMLC_ROLE", role)
            .env("DMLC_NUM_WORKER", "4")
            .env("DMLC_NUM_SERVER", "2")
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", &port)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut guard = Guard(Vec::new());
    for _ in 0..2 {
        guard.0.push(spawn("server"));
    }
    for _ in 0..4 {
        guard.0.push(spawn("worker"));
    }
    // Wait until worker 0 (whichever process it is) reports round 3.
    let (tx, rx) = std::sync::mpsc::channel();
    for child in &mut guard.0[2..] {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("round   3") {
                    let _ = tx.send(());
                }
            }
        });
    }
    rx.recv_timeout(Duration::from_secs(60))
        .expect("training reaches round 3");
    // Which process got server rank 1 is up to arrival order; kill the second one
    // and read which rank it was from what the others report.
    guard.0[1].kill().unwrap();
    let killed_at = Instant::now();
    let err = sched.join().unwrap().unwrap_err();
    let PsError::NodeSilent { node, .. } = &err else {
        panic!("{err}")
    };
    assert!(node.starts_with("server "), "{node}");
    let name = node.split(" at ").next().unwrap().to_string();
    for (i, child) in guard.0.iter_mut().enumerate().skip(2) {
        let status =
            wait_bounded(child, dead_timeout + Duration::from_secs(10)).expect("worker exits");
        let mut text = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert!(!status.success(), "worker process {i} succeeded");
        assert!(text.contains(&name), "worker process {i}: {text}");
    }
    let status = wait_bounded(&mut guard.0[0], dead_timeout + Duration::from_secs(10))
        .expect("server exits");
    assert!(!status.success());
    assert!(killed_at.elapsed() < dead_timeout + Duration::from_secs(10));
}

/// With replication on (`SWITCHYARD_PS_REPLICATE=1`), a server process SIGKILLed
/// mid-run is replaced by the other: every worker finishes its 60 rounds, the loss
/// keeps falling, and the job ends well.
#[test]
fn killed_server_is_replaced_when_replicated() {
    let dead_timeout = Duration::from_millis(1500);
    let config = PsConfig::new(4, 2)
        .with_sharding(Sharding::Range { key_space: Some(9) })
        .with_replication(true)
        .with_liveness(Duration::from_millis(100), dead_timeout);
    let scheduler = Scheduler::bind("tcp://127.0.0.1:0", &config).unwrap();
    let port = scheduler.endpoint().rsplit(':').next().unwrap().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let spawn = |role: &str| {
        Command::new(example())
            .args(["--rounds", "60", "--pause-ms", "20"])
            .env("DMLC_ROLE", role)
            .env("DMLC_NUM_WORKER", "4")
            .env("DMLC_NUM_SERVER", "2")
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", &port)
            .env("SWITCHYARD_PS_REPLICATE", "1")
            .env("PS_HEARTBEAT_INTERVAL", "0.1")
            .env("PS_HEARTBEAT_TIMEOUT", "1.5")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut guard = Guard(Vec::new());
    for _ in 0..2 {
        guard.0.push(spawn("server"));
    }
    for _ in 0..4 {
        guard.0.push(spawn("worker"));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let mut readers = Vec::new();
    for child in &mut guard.0[2..] {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("round   5") {
                    let _ = tx.send(());
                }
                lines.push(line);
            }
            lines
        }));
    }
    rx.recv_timeout(Duration::from_secs(60))
        .expect("training reaches round 5");
    guard.0[1].kill().unwrap();
    let report = sched.join().unwrap().expect("the job ends well");
    assert_eq!(report.failovers, 1);
    for (i, child) in guard.0.iter_mut().enumerate().skip(2) {
        let status = wait_bounded(child, Duration::from_secs(30)).expect("worker exits");
        let mut text = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert!(status.success(), "worker process {i}: {status}\n{text}");
    }
    let status = wait_bounded(&mut guard.0[0], Duration::from_secs(30)).expect("server exits");
    assert!(status.success(), "the surviving server: {status}");
    let out: Vec<String> = readers
        .into_iter()
        .flat_map(|r| r.join().unwrap())
        .collect();
    let losses: Vec<f32> = out
        .iter()
        .filter_map(|l| l.split("loss ").nth(1)?.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(losses.len(), 60, "{out:?}");
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "the loss falls every round: {losses:?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("test accuracy")),
        "{out:?}"
    );
}

/// Every role its own process, the scheduler included (the ps-lite layout, and how the
/// example runs by hand): the job ends with every process exiting 0. The scheduler
/// used to return, and its process exit, with the servers' shutdown still queued in
/// ZeroMQ: the servers then reported it silent and exited 1 (6 runs of 8 by hand).
/// Three jobs, since the loss was a matter of timing.
#[test]
fn every_process_ends_well_with_the_scheduler_in_its_own() {
    for job in 0..3 {
        // A port that this test's other processes cannot be handed meanwhile: below
        // Linux's ephemeral range, checked free.
        let port = (0..100)
            .map(|i| 20000 + (std::process::id() as u16 % 500) * 16 + job * 100 + i)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port");
        let spawn = |role: &str| {
            Command::new(example())
                .args(["--rounds", "3"])
                .env("DMLC_ROLE", role)
                .env("DMLC_NUM_WORKER", "2")
                .env("DMLC_NUM_SERVER", "2")
                .env("DMLC_PS_ROOT_URI", "127.0.0.1")
                .env("DMLC_PS_ROOT_PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let mut guard = Guard(vec![spawn("scheduler")]);
        for role in ["server", "server", "worker", "worker"] {
            guard.0.push(spawn(role));
        }
        let roles = ["scheduler", "server", "server", "worker", "worker"];
        for (child, role) in guard.0.iter_mut().zip(roles) {
            let status = wait_bounded(child, Duration::from_secs(60)).expect("every role ends");
            let mut text = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            assert!(status.success(), "job {job}: the {role} {status}: {text}");
        }
    }
}
