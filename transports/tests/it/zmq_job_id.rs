//! The ZeroMQ PLAIN password is per job: two processes with the same
//! job secret but different job ids (`SWITCHYARD_JOB_ID`) cannot talk over tcp, so a
//! password recorded in one job logs in to no other; with the same job id they can.
//! The password is fixed once per process, so the server and each client are child
//! processes of this test binary, each started with its own environment.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Msg};
use switchyard_transports::{Dealer, DealerSocket, Router, RouterSocket, Socket, SocketOptions};

const TEST: &str = "the_zmq_password_differs_between_jobs_with_the_same_secret";
/// `server` or `client ENDPOINT` in a child.
const ROLE: &str = "SWITCHYARD_ZMQ_JOB_ID_TEST_ROLE";
const SECRET: &str = "0123456789abcdef0123456789abcdef";
/// How long a client waits for its reply: a refused one never gets it.
const WAIT: Duration = Duration::from_secs(3);
/// How long the server serves: bounds a server the parent failed to kill.
const SERVE: Duration = Duration::from_secs(60);

fn options() -> SocketOptions {
    SocketOptions::default()
        .with_connect_timeout(WAIT)
        .with_send_timeout(WAIT)
        .with_linger(Duration::ZERO)
}

fn request() -> Msg {
    Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Update).with_seq(7)
}

fn server() {
    let mut router = RouterSocket::bind("tcp://127.0.0.1:0", options()).unwrap();
    println!("endpoint {}", router.endpoint());
    let until = Instant::now() + SERVE;
    while Instant::now() < until {
        if let Ok((peer, msg)) = router.recv_from_timeout(Duration::from_millis(50)) {
            router.send_to(&peer, msg.reply(Kind::Put)).unwrap();
        }
    }
}

fn client(endpoint: &str) {
    let outcome = DealerSocket::connect(endpoint, options())
        .map_err(|e| format!("connect: {e}"))
        .and_then(|mut dealer| {
            dealer.send(request()).map_err(|e| format!("send: {e}"))?;
            dealer
                .recv_timeout(WAIT)
                .map_err(|e| format!("recv: {e:?}"))
        });
    match outcome {
        Ok(reply) if reply.header.kind == Kind::Put => println!("outcome: served"),
        Ok(other) => println!("outcome: unexpected {other:?}"),
        Err(e) => println!("outcome: refused ({e})"),
    }
}

/// This test binary as a child in `role`, with the secret and `job_id` (none: unset).
fn spawn(role: &str, job_id: Option<&str>) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .arg(support::test_name(module_path!(), TEST))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env("SWITCHYARD_JOB_SECRET", SECRET)
        .env_remove("SWITCHYARD_JOB_SECRET_FILE");
    // The other sources of a job id, so that the test's own surroundings (a Slurm
    // allocation, torchrun) cannot make the ids agree.
    for var in [
        "SWITCHYARD_JOB_ID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "PMIX_NAMESPACE",
        "OMPI_MCA_orte_ess_jobid",
        "TORCHELASTIC_RUN_ID",
    ] {
        command.env_remove(var);
    }
    if let Some(id) = job_id {
        command.env("SWITCHYARD_JOB_ID", id);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Kills its child when dropped, so that a failed assertion leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The rest of the first stdout line of `child` after `prefix`, within `limit`.
fn line(child: &mut Child, prefix: &'static str, limit: Duration) -> String {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may have begun the line with "test NAME ... ".
            if let Some(at) = line.find(prefix) {
                let _ = tx.send(line[at + prefix.len()..].to_string());
                return;
            }
        }
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no {prefix:?} line from the child within {limit:?}"))
}

/// What a client with `job_id` got from the server at `endpoint`.
fn outcome(endpoint: &str, job_id: Option<&str>) -> String {
    let mut client = Killed(spawn(&format!("client {endpoint}"), job_id));
    line(&mut client.0, "outcome: ", Duration::from_secs(30))
}

#[test]
fn the_zmq_password_differs_between_jobs_with_the_same_secret() {
    match std::env::var(ROLE).ok().as_deref() {
        Some("server") => return server(),
        Some(role) => return client(role.strip_prefix("client ").unwrap()),
        None => {}
    }
    let mut server = Killed(spawn("server", Some("job-a")));
    let endpoint = line(&mut server.0, "endpoint ", Duration::from_secs(30));
    let other_job = outcome(&endpoint, Some("job-b"));
    assert!(
        other_job.starts_with("refused"),
        "a process of another job with the same secret was served: {other_job}"
    );
    let no_job = outcome(&endpoint, None);
    assert!(
        no_job.starts_with("refused"),
        "a process with the secret but no job id was served: {no_job}"
    );
    let same_job = outcome(&endpoint, Some("job-a"));
    assert_eq!(same_job, "served", "a process of the same job");
}
