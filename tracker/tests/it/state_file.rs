//! The state file: a tracker stopped after bootstrap and started again on the same port
//! with the same file finishes the job (the process-level SIGKILL test is
//! `cli/tests/it/tracker_restart.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::PathBuf;
use support::*;
use switchyard_tracker::{Event, Tracker, TrackerConfig, TrackerError};

/// A state file path unique to this test, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        let p =
            std::env::temp_dir().join(format!("sy-tracker-{}-{name}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn with_state(n: u32, port: u16, file: &TempFile) -> Tracker {
    let mut config = TrackerConfig::new(n);
    config.port = port;
    config.state_file = Some(file.0.clone());
    Tracker::start(config).unwrap()
}

#[test]
fn a_classic_job_finishes_on_a_restarted_tracker() {
    let file = TempFile::new("classic");
    let t = with_state(3, 0, &file);
    let addr = t.addr();
    let events = t.events();
    let workers: Vec<_> = (0..3)
        .map(|i| std::thread::spawn(move || start_worker(addr, -1, &format!("t{i}"))))
        .collect();
    let mut workers: Vec<Worker> = workers.into_iter().map(|h| h.join().unwrap()).collect();
    workers.sort_by_key(|w| w.assignment.rank);
    // A worker that accepts no links leaves right after reporting its port, before the
    // tracker has necessarily read and recorded it (the protocol has no acknowledgement).
    // Stopping the tracker then would lose that rank's record, and the restarted tracker
    // would send the new rank 2 to the dead listeners of ranks 0 and 1 until it gives
    // up. "After bootstrap" means after the tracker recorded every rank's links.
    let mut linked = Vec::new();
    while linked.len() < 3 {
        if let Event::Linked { rank } = expect_event(&events, |e| matches!(e, Event::Linked { .. }))
        {
            linked.push(rank);
        }
    }
    linked.sort_unstable();
    assert_eq!(linked, [0, 1, 2]);
    drop(t);

    let t = with_state(3, addr.port(), &file);
    let events = t.events();
    assert_eq!(t.addr(), addr);
    // The process of task t2 restarts and gets rank 2 back from the state file; ranks 0
    // and 1 recover, keeping their other links, and connect to it.
    workers.pop();
    let restarted = std::thread::spawn(move || start_worker(addr, -1, "t2"));
    let recovered: Vec<_> = workers
        .into_iter()
        .map(|w| {
            std::thread::spawn(move || {
                let rank = w.assignment.rank;
                let kept: Vec<_> = w.peers.into_iter().filter(|(r, _)| *r != 2).collect();
                join(addr, rank, 3, &format!("t{rank}"), "recover", kept)
            })
        })
        .collect();
    let restarted = restarted.join().unwrap();
    assert_eq!(restarted.assignment.rank, 2);
    assert_eq!(restarted.peers.len(), restarted.assignment.links().len());
    for h in recovered {
        let w = h.join().unwrap();
        let got: Vec<i32> = w.peers.iter().map(|(r, _)| *r).collect();
        assert_eq!(got, w.assignment.links());
    }
    // Ranks 0 and 1 recover in either order.
    let mut recovered = Vec::new();
    while recovered.len() < 2 {
        if let Event::Recovered { rank } =
            expect_event(&events, |e| matches!(e, Event::Recovered { .. }))
        {
            recovered.push(rank);
        }
    }
    recovered.sort_unstable();
    assert_eq!(recovered, [0, 1]);
    shutdown(addr, 0, 3);
    // A second shutdown of rank 0 does not count.
    shutdown(addr, 0, 3);
    shutdown(addr, 1, 3);
    t.wait(Some(std::time::Duration::from_millis(100)))
        .unwrap_err();
    shutdown(addr, 2, 3);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1, 2]);

    // A third tracker on the file knows the job is over, and refuses to start on it
    // (see `a_state_file_of_a_finished_job_is_refused`).
    drop(t);
    let mut config = TrackerConfig::new(3);
    config.state_file = Some(file.0.clone());
    assert!(matches!(
        Tracker::start(config),
        Err(TrackerError::FinishedState { shut_down, .. }) if shut_down == [0, 1, 2]
    ));
}

#[test]
fn a_json_job_finishes_on_a_restarted_tracker() {
    let file = TempFile::new("json");
    let t = with_state(2, 0, &file);
    let addr = t.addr();
    let h: Vec<_> = (0..2u16)
        .map(|i| {
            std::thread::spawn(move || {
                read_frame(&mut json_start(addr, &format!("w{i}"), 7000 + i, 0))
            })
        })
        .collect();
    for h in h {
        h.join().unwrap();
    }
    let events = t.events();
    json_shutdown(addr, 0, 2);
    // The shutdown must be on file before the stop, or "kept" below proves nothing.
    expect_event(&events, |e| *e == Event::Shutdown { rank: 0 });
    t.wait(Some(std::time::Duration::from_millis(100)))
        .unwrap_err();
    drop(t);
    let t = with_state(2, addr.port(), &file);
    // Rank 0's shutdown was kept: its second one does not count.
    json_shutdown(addr, 0, 2);
    t.wait(Some(std::time::Duration::from_millis(100)))
        .unwrap_err();
    json_shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

#[test]
fn a_state_file_of_another_job_size_is_refused() {
    let file = TempFile::new("other");
    drop(with_state(2, 0, &file));
    let mut config = TrackerConfig::new(3);
    config.state_file = Some(file.0.clone());
    match Tracker::start(config) {
        Err(TrackerError::StateFile(e)) => assert!(e.to_string().contains("for 2 workers"), "{e}"),
        other => panic!("expected a state file error, got {other:?}"),
    }
}

/// A job script with a fixed state path starts the next job on the old job's file: the
/// tracker must refuse it, naming the file, instead of replaying the old job's shutdowns
/// and reporting success before any worker connects.
#[test]
fn a_state_file_of_a_finished_job_is_refused() {
    let file = TempFile::new("finished");
    let t = with_state(1, 0, &file);
    let addr = t.addr();
    let events = t.events();
    let w = start_worker(addr, -1, "t0");
    assert_eq!(w.assignment.rank, 0);
    expect_event(&events, |e| matches!(e, Event::Linked { rank: 0 }));
    shutdown(addr, 0, 1);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0]);
    drop(t);

    let mut config = TrackerConfig::new(1);
    config.state_file = Some(file.0.clone());
    match Tracker::start(config) {
        Err(e @ TrackerError::FinishedState { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&file.0.display().to_string()), "{text}");
            assert!(text.contains("already finished"), "{text}");
            assert!(text.contains("delete"), "{text}");
        }
        Ok(t) => panic!(
            "a finished job's state file was accepted; wait says {:?}",
            t.wait(Some(std::time::Duration::ZERO))
        ),
        Err(other) => panic!("expected FinishedState, got {other}"),
    }
}
