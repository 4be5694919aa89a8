//! The job secret on the tracker, its clients and the peer links it negotiates: with
//! `SWITCHYARD_JOB_SECRET` set, strangers without it or with a wrong one are refused
//! and logged while a classic job and a JSON job (rings of 3) finish. The secret is
//! read from the environment, so the checks run in a child process of this test
//! binary started with the variable set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use switchyard_secret::{JobSecret, MAGIC};
use switchyard_tracker::client::ClientConfig;
use switchyard_tracker::client::classic::ClassicClient;
use switchyard_tracker::client::json::JsonClient;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

const CHILD: &str = "SWITCHYARD_TRACKER_SECRET_TEST_CHILD";
const SECRET: &str = "0123456789abcdef0123456789abcdef";
const LIMIT: Duration = Duration::from_secs(20);

fn config() -> ClientConfig {
    ClientConfig::default().with_timeout(LIMIT)
}

/// Two strangers: one speaking rabit without a secret (it gets the challenge, not the
/// tracker's magic), one with a wrong secret (closed during the handshake). The
/// tracker reports (and logs) both as dropped for failed authentication.
fn strangers(tracker: &Tracker) {
    let events = tracker.events();
    let port = tracker.addr().port();
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(LIMIT)).unwrap();
    plain.write_all(&[0x99, 0xff, 0, 0]).unwrap();
    let mut opening = [0u8; 8];
    plain.read_exact(&mut opening).unwrap();
    assert_eq!(
        opening, MAGIC,
        "a worker without the secret was not challenged"
    );
    drop(plain);
    let wrong = JobSecret::new(b"fedcba9876543210fedcba9876543210".to_vec(), "test").unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let err =
        switchyard_secret::connect(&mut s, &wrong, "tracker", u32::MAX, Instant::now() + LIMIT)
            .unwrap_err();
    assert_eq!(err.reason, switchyard_secret::AuthFailure::Closed, "{err}");
    let mut refused = 0;
    while refused < 2 {
        match events
            .recv_timeout(LIMIT)
            .expect("the tracker reports each stranger")
        {
            Event::Dropped { reason, .. } if reason.contains("authentication failed") => {
                refused += 1
            }
            Event::Dropped { reason, .. } => panic!("dropped for another reason: {reason}"),
            _ => {}
        }
    }
}

fn classic_job() {
    let tracker = Tracker::start(TrackerConfig::new(3)).unwrap();
    let port = tracker.addr().port();
    strangers(&tracker);
    let workers: Vec<_> = (0..3)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    ClassicClient::new("127.0.0.1", port, Some(format!("c{i}")), config()).unwrap();
                let joined = client.start(None, None).unwrap();
                joined.session.shutdown().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    tracker.wait(Some(LIMIT)).unwrap();
}

fn json_job() {
    let tracker = Tracker::start(TrackerConfig::new(3)).unwrap();
    let port = tracker.addr().port();
    strangers(&tracker);
    let workers: Vec<_> = (0..3)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    JsonClient::new("127.0.0.1", port, Some(format!("j{i}")), config()).unwrap();
                let joined = client.start().unwrap();
                joined.session.shutdown().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    tracker.wait(Some(LIMIT)).unwrap();
}

#[test]
fn with_a_job_secret_strangers_are_refused_and_jobs_finish() {
    if std::env::var_os(CHILD).is_some() {
        classic_job();
        json_job();
        println!("tracker secret child: ok");
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            support::test_name(
                module_path!(),
                "with_a_job_secret_strangers_are_refused_and_jobs_finish",
            )
            .as_str(),
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", SECRET)
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child ran over 90 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("tracker secret child: ok"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const SHORT_CHILD: &str = "SWITCHYARD_TRACKER_SHORT_SECRET_TEST_CHILD";

/// A secret shorter than `MIN_SECRET_LEN` stops the tracker at start, with an error
/// naming the variable and the minimum, instead of a tracker that listens and then
/// drops every connection.
#[test]
fn a_too_short_job_secret_stops_the_tracker_at_start() {
    if std::env::var_os(SHORT_CHILD).is_some() {
        match Tracker::start(TrackerConfig::new(1)) {
            Err(e @ switchyard_tracker::TrackerError::Secret(_)) => {
                println!("refused: {e}");
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(t) => panic!("the tracker started on {} with a short secret", t.addr()),
        }
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            support::test_name(
                module_path!(),
                "a_too_short_job_secret_stops_the_tracker_at_start",
            )
            .as_str(),
            "--nocapture",
        ])
        .env(SHORT_CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", "short")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child ran over {LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let refusal = stdout.lines().find(|l| l.starts_with("refused: "));
    assert!(
        out.status.success() && refusal.is_some(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refusal = refusal.unwrap_or_default();
    for needle in ["SWITCHYARD_JOB_SECRET", "5 bytes", "at least 16"] {
        assert!(refusal.contains(needle), "no {needle:?} in {refusal}");
    }
}

const SERVE_CHILD: &str = "SWITCHYARD_TRACKER_SECRET_SERVE_CHILD";

/// A worker without the secret against a tracker with one is told that the tracker
/// requires the job secret, naming the variable, instead of "wrong magic 0x55415953"
/// (the first bytes of the challenge read as a magic). The tracker runs in a child
/// process with the secret; the clients run here, without it.
#[test]
fn a_worker_without_the_secret_is_told_that_the_tracker_requires_it() {
    if std::env::var_os(SERVE_CHILD).is_some() {
        let tracker = Tracker::start(TrackerConfig::new(1)).unwrap();
        println!("port={}", tracker.addr().port());
        // Serve until the parent closes standard input (or kills this process).
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        return;
    }
    assert!(
        std::env::var_os("SWITCHYARD_JOB_SECRET").is_none()
            && std::env::var_os("SWITCHYARD_JOB_SECRET_FILE").is_none(),
        "this test needs an environment without a job secret"
    );
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            support::test_name(
                module_path!(),
                "a_worker_without_the_secret_is_told_that_the_tracker_requires_it",
            )
            .as_str(),
            "--nocapture",
        ])
        .env(SERVE_CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", SECRET)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let stdout = guard.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let port: u16 = loop {
        let line = rx.recv_timeout(LIMIT).expect("the child printed no port");
        if let Some(p) = line.strip_prefix("port=") {
            break p.parse().unwrap();
        }
    };
    let mut quick = ClientConfig::default().with_timeout(LIMIT);
    quick.connect_attempts = 1;
    let classic = ClassicClient::new("127.0.0.1", port, Some("c0".into()), quick.clone())
        .unwrap()
        .start(None, None)
        .unwrap_err()
        .to_string();
    let json = JsonClient::new("127.0.0.1", port, Some("j0".into()), quick)
        .unwrap()
        .start()
        .unwrap_err()
        .to_string();
    for err in [classic, json] {
        assert!(err.contains("requires the job secret"), "{err}");
        assert!(err.contains("SWITCHYARD_JOB_SECRET"), "{err}");
        assert!(!err.contains("wrong magic"), "{err}");
    }
    drop(guard.0.stdin.take());
}

/// Kills and reaps the child if the test fails before it ends.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const SHORT_CLIENT_CHILD: &str = "SWITCHYARD_TRACKER_SHORT_SECRET_CLIENT_CHILD";

/// Runs both clients against `port` with the child's short secret; each must fail at
/// once with the secret error, having connected to nothing.
fn short_secret_clients(port: u16, config: &ClientConfig) {
    let started = Instant::now();
    let classic = ClassicClient::new("127.0.0.1", port, Some("c0".into()), config.clone())
        .unwrap()
        .start(None, None)
        .unwrap_err();
    let json = JsonClient::new("127.0.0.1", port, Some("j0".into()), config.clone())
        .unwrap()
        .start()
        .unwrap_err();
    for err in [classic, json] {
        let text = err.to_string();
        assert!(
            matches!(err, switchyard_tracker::client::ClientError::Secret(_)),
            "not a secret error: {text}"
        );
        for needle in [
            "job secret",
            "SWITCHYARD_JOB_SECRET",
            "5 bytes",
            "at least 16",
        ] {
            assert!(text.contains(needle), "no {needle:?} in {text}");
        }
    }
    // Before, a closed port cost every connect retry and a listener got connections.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the clients took {:?}",
        started.elapsed()
    );
}

/// A library client with a too short secret is told so before anything connects
/// (as the README promises): with no tracker it no longer retries for the connect
/// schedule first, and with something listening it connects to nothing and does not
/// blame the tracker ("tracker ... refused this worker").
#[test]
fn a_too_short_job_secret_stops_a_client_before_it_connects() {
    if std::env::var_os(SHORT_CLIENT_CHILD).is_some() {
        // Five tries over about 5 s against a closed port before the fix.
        let config = ClientConfig::default().with_timeout(Duration::from_secs(5));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        short_secret_clients(closed, &config);
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        short_secret_clients(listening.local_addr().unwrap().port(), &config);
        listening.set_nonblocking(true).unwrap();
        match listening.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept failed: {e}"),
            Ok((_, peer)) => panic!("a client connected from {peer} with an unusable secret"),
        }
        println!("short secret clients: ok");
        return;
    }
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            support::test_name(
                module_path!(),
                "a_too_short_job_secret_stops_a_client_before_it_connects",
            )
            .as_str(),
            "--nocapture",
        ])
        .env(SHORT_CLIENT_CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", "short")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let started = Instant::now();
    while guard.0.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the child ran over 60 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = String::new();
    let mut stderr = String::new();
    guard
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    guard
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = guard.0.wait().unwrap();
    assert!(
        status.success() && stdout.contains("short secret clients: ok"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
