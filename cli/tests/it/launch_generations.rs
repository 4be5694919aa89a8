//! The launcher's rendezvous, from its ranks' side: one process may form several
//! communicators (each `Communicator::from_env` after the first is gathered with the
//! other ranks' of the same number: it neither waits out its timeout nor gets the first
//! ones' endpoints), and idle connections to the rendezvous delay no rank. The ranks are
//! this test binary again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{run_bounded, switchyard};
use switchyard::collective::{Communicator, ReduceOp};

/// Set in the launched ranks: they run [`rank_case`]'s body.
const CHILD: &str = "SWITCHYARD_TEST_GENERATIONS_CHILD";
/// Set in the launched ranks of the idle-connections case.
const IDLE: &str = "SWITCHYARD_TEST_GENERATIONS_IDLE";
/// Set in the launched ranks of the exited-rank case: rank 1 forms one communicator
/// and exits, rank 0 asks for a second one.
const ONLY_SOME: &str = "SWITCHYARD_TEST_GENERATIONS_ONLY_SOME";
/// Communicators each rank forms, one after another.
const ROUNDS: u64 = 3;

/// The body of a launched rank; outside one it has nothing to check.
#[test]
fn rank_case() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    if std::env::var_os(IDLE).is_some() && std::env::var("SWITCHYARD_RANK").unwrap() == "0" {
        // Strangers that connect to the rendezvous and say nothing, before this
        // rank checks in; kept open until it is done.
        let addr = std::env::var("SWITCHYARD_RENDEZVOUS").unwrap();
        let idle: Vec<std::net::TcpStream> = (0..6)
            .map(|_| std::net::TcpStream::connect(&addr).unwrap())
            .collect();
        let mut comm = Communicator::from_env().unwrap();
        comm.barrier().unwrap();
        drop(idle);
        println!("rank done: past idle connections");
        return;
    }
    if std::env::var_os(ONLY_SOME).is_some() {
        let mut comm = Communicator::from_env().unwrap();
        comm.barrier().unwrap();
        let rank = comm.rank();
        drop(comm);
        if rank == 0 {
            // Rank 1 exits without this one: the launcher refuses it, naming rank 1.
            match Communicator::from_env() {
                Ok(_) => println!("rank done: a second communicator formed alone"),
                Err(e) => println!("rank done: second communicator refused: {e}"),
            }
        }
        return;
    }
    if std::env::var_os(IDLE).is_some() {
        let mut comm = Communicator::from_env().unwrap();
        comm.barrier().unwrap();
        println!("rank done: past idle connections");
        return;
    }
    for round in 0..ROUNDS {
        let mut comm = Communicator::from_env().unwrap();
        let n = comm.world_size() as u64;
        let mut x = [comm.rank() as u64 + round];
        comm.allreduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x[0], n * (n - 1) / 2 + n * round);
        // Dropped here: the next round forms a new communicator.
    }
    println!("rank done: {ROUNDS} communicators");
}

#[test]
fn later_communicators_under_the_launcher_form_at_once() {
    let mut cmd = switchyard();
    cmd.env(CHILD, "1")
        .env("SWITCHYARD_COLLECTIVE_TIMEOUT", "60")
        .args(["launch", "-n", "3", "--timeout", "120", "--"])
        .arg(std::env::current_exe().unwrap())
        .arg(support::test_name(module_path!(), "rank_case"))
        .args(["--exact", "--nocapture", "--test-threads=1"]);
    let (out, took) = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("rank done: 3 communicators").count(),
        3,
        "{stdout}"
    );
    // Each communicator forms in well under a second; one that waited for peers
    // that never came would take the 60 s timeout, which no loaded runner reaches.
    assert!(took < Duration::from_secs(60), "the job took {took:?}");
}

/// With the job secret on, six idle connections to the rendezvous (three made
/// `switchyard launch` exit 1 before: each held the rendezvous for 5 s) cost the job
/// nothing.
#[test]
fn idle_connections_to_the_rendezvous_delay_no_rank() {
    let mut cmd = switchyard();
    cmd.env(CHILD, "1")
        .env(IDLE, "1")
        .env("SWITCHYARD_JOB_SECRET", "0123456789abcdef0123456789abcdef")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .env("SWITCHYARD_COLLECTIVE_TIMEOUT", "20")
        .args(["launch", "-n", "2", "--timeout", "60", "--"])
        .arg(std::env::current_exe().unwrap())
        .arg(support::test_name(module_path!(), "rank_case"))
        .args(["--exact", "--nocapture", "--test-threads=1"]);
    let (out, took) = run_bounded(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("rank done: past idle connections").count(),
        2,
        "{stdout}"
    );
    // Held one after another for 5 s each, as before, the six would cost 30 s; the job
    // takes about a second, and a loaded runner does not stretch that to 30.
    assert!(took < Duration::from_secs(30), "the job took {took:?}");
}

/// A later communicator that only rank 0 asks for, after rank 1 has exited, is refused
/// at once naming rank 1. Before, rank 0 waited its whole timeout (30 s here) and then
/// failed "no magic within 30.30s".
#[test]
fn a_communicator_only_some_ranks_ask_for_is_refused_naming_the_exited_ones() {
    let mut cmd = switchyard();
    cmd.env(CHILD, "1")
        .env(ONLY_SOME, "1")
        .env("SWITCHYARD_COLLECTIVE_TIMEOUT", "30")
        .args(["launch", "-n", "2", "--timeout", "90", "--"])
        .arg(std::env::current_exe().unwrap())
        .arg(support::test_name(module_path!(), "rank_case"))
        .args(["--exact", "--nocapture", "--test-threads=1"]);
    let (out, took) = run_bounded(cmd, Duration::from_secs(150));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let refusal = stdout
        .lines()
        .find(|l| l.contains("second communicator refused"))
        .unwrap_or_else(|| panic!("no refusal in\n{stdout}\nstderr:\n{stderr}"));
    for needle in ["ranks [1] exited", "rank 1 finished"] {
        assert!(refusal.contains(needle), "no {needle:?} in {refusal}");
    }
    // Refused at once: waiting out the 30 s timeout is what failed before.
    assert!(took < Duration::from_secs(25), "the job took {took:?}");
}
