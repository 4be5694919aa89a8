//! The job secret on the unique-id bootstrap: with `SWITCHYARD_JOB_SECRET` set, a
//! stranger without the secret and one with a wrong secret are refused (and logged) at
//! the root while a job with the secret finishes. The job runs in a child process (this
//! test binary again), so the secret is set in its environment only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard::bootstrap::UniqueId;
use switchyard::bootstrap::unique_id::exchange;
use switchyard_secret::JobSecret;

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const SECRET: &str = "0123456789abcdef0123456789abcdef";
/// Set in the child's environment: only then does `child_job` run.
const CHILD: &str = "SWITCHYARD_TEST_SECRET_CHILD";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Kills the child if the test fails before it ended.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn strangers_are_refused_and_a_job_with_the_secret_finishes() {
    let child = Command::new(std::env::current_exe().unwrap())
        .arg(support::test_name(module_path!(), "child_job"))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", SECRET)
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while guard.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the child job did not end in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut out, mut err) = (String::new(), String::new());
    guard
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    guard
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = guard.0.wait().unwrap();
    assert!(status.success(), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("unique-id job done"),
        "stdout:\n{out}\nstderr:\n{err}"
    );
    let refused = err.matches("job secret not proven").count();
    assert_eq!(refused, 2, "stderr:\n{err}");
    assert!(!out.contains(SECRET) && !err.contains(SECRET));
}

/// The job, in the child: rank 0 serves the root; two strangers claiming rank 1 are
/// refused; then ranks 1 and 2 join and every rank gets every endpoint.
#[test]
fn child_job() {
    if std::env::var_os(CHILD).is_none() {
        return; // Only meaningful in the child process started above.
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    let id = UniqueId::new_on(LO).unwrap();
    let rank =
        |r: u32| std::thread::spawn(move || exchange(&id, r, 3, LO, &format!("ep{r}"), TIMEOUT));
    let zero = rank(0);

    // Without the secret: a well-formed check-in, which the root must never answer.
    let mut bare = TcpStream::connect(id.root()).unwrap();
    bare.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut check_in = b"SYUI".to_vec();
    check_in.extend_from_slice(&id.tag().to_le_bytes());
    check_in.extend_from_slice(&1u32.to_le_bytes());
    check_in.extend_from_slice(&3u32.to_le_bytes());
    let ring = "127.0.0.1:9";
    check_in.extend_from_slice(&(ring.len() as u32).to_le_bytes());
    check_in.extend_from_slice(ring.as_bytes());
    bare.write_all(&check_in).unwrap();
    bare.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    bare.read_to_end(&mut got)
        .expect("the root closes the stranger");
    assert!(
        switchyard_secret::looks_like_challenge(&got) && !got.windows(4).any(|w| w == b"SYUI"),
        "the root answered a stranger: {got:?}"
    );

    // A wrong secret: its proof fails.
    let wrong = JobSecret::new(b"not-the-job-secret-not-the-secret".to_vec(), "test").unwrap();
    let mut liar = TcpStream::connect(id.root()).unwrap();
    let until = Instant::now() + TIMEOUT;
    assert!(
        switchyard_secret::connect(&mut liar, &wrong, "unique-id-root", 1, until).is_err(),
        "a wrong secret was accepted"
    );
    drop(liar);

    let others = [rank(1), rank(2)];
    let want: Vec<String> = (0..3).map(|r| format!("ep{r}")).collect();
    assert_eq!(zero.join().unwrap().unwrap(), want);
    for r in others {
        assert_eq!(r.join().unwrap().unwrap(), want);
    }
    println!("unique-id job done");
}

/// A rank without the secret (this test process has none) meeting a root that demands
/// it gets an error saying so, not a bare protocol error or a hang.
#[test]
fn a_rank_without_the_secret_is_told_the_root_expects_one() {
    if std::env::var_os("SWITCHYARD_JOB_SECRET").is_some()
        || std::env::var_os("SWITCHYARD_JOB_SECRET_FILE").is_some()
    {
        eprintln!("skipped: this test needs a process without a job secret");
        return;
    }
    let listener = std::net::TcpListener::bind((LO, 0)).unwrap();
    let root = listener.local_addr().unwrap();
    let fake_root = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let secret = JobSecret::new(SECRET.as_bytes().to_vec(), "test").unwrap();
        let until = Instant::now() + TIMEOUT;
        switchyard_secret::accept(&mut s, &secret, "unique-id-root", until).unwrap_err();
    });
    let id = UniqueId::at(root, 7);
    let err = exchange(&id, 1, 2, LO, "ep1", TIMEOUT).unwrap_err();
    assert!(err.to_string().contains("expects a job secret"), "{err}");
    fake_root.join().unwrap();
}
