//! switchyard workers under switchyard's own tracker (`switchyard_tracker::Tracker`,
//! in this process): worker processes that find it through the environment
//! (`Tracker::worker_env`, both protocols), and ranks as threads through
//! `Communicator::join` with a tracker bootstrap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::test_name;
use crate::tracker_support::worker;
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, TrackerJoin, TrackerProtocol};
use switchyard_tracker::{Event, Tracker, TrackerConfig};

const LIMIT: Duration = Duration::from_secs(120);

fn processes(n: usize, protocol: &str) {
    let tracker = Tracker::start(TrackerConfig::new(n as u32)).unwrap();
    let events = tracker.events();
    let mut workers: Vec<_> = (0..n)
        .map(|i| {
            let mut env = tracker.worker_env();
            for (k, v) in [
                ("DMLC_TASK_ID", i.to_string()),
                ("SWITCHYARD_TRACKER_PROTOCOL", protocol.into()),
                ("SWITCHYARD_COLLECTIVE_TIMEOUT", "60".into()),
                ("SWITCHYARD_TEST_WORLD", n.to_string()),
            ] {
                env.push((k.into(), v));
            }
            let env: Vec<(&str, String)> =
                env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            worker(&test_name(module_path!(), "worker_process"), &env)
        })
        .collect();
    for (i, w) in workers.iter_mut().enumerate() {
        let status = w.wait_for(LIMIT).expect("worker exits in time");
        assert!(status.success(), "worker {i} exited with {status}");
    }
    let outcome = tracker.wait(Some(LIMIT)).unwrap();
    assert_eq!(outcome.shut_down.len(), n);
    let mut prints = prints(&events, n, LIMIT);
    prints.sort();
    let mut expected: Vec<String> = (0..n).map(|r| format!("rank {r}/{n} ok")).collect();
    expected.sort();
    assert_eq!(prints, expected);
}

/// The first `n` prints among the tracker's events, waiting at most `limit`: the
/// tracker serves connections concurrently, so a worker's `print` may be handled after
/// its `shutdown` ended the job.
fn prints(events: &crossbeam_channel::Receiver<Event>, n: usize, limit: Duration) -> Vec<String> {
    let until = std::time::Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < n {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Print { text, .. }) => out.push(text),
            Ok(_) => {}
            Err(e) => panic!("{} of {n} prints within {limit:?}: {e}", out.len()),
        }
    }
    out
}

#[test]
fn two_and_four_processes_classic() {
    processes(2, "classic");
    processes(4, "classic");
}

#[test]
fn two_and_four_processes_json() {
    processes(2, "json");
    processes(4, "json");
}

#[test]
fn three_threads_of_each_protocol() {
    for protocol in [TrackerProtocol::Classic, TrackerProtocol::Json] {
        let tracker = Tracker::start(TrackerConfig::new(3)).unwrap();
        let port = tracker.addr().port();
        let ranks: Vec<_> = (0..3)
            .map(|i| {
                std::thread::spawn(move || {
                    let spec = TrackerJoin::new("127.0.0.1", port)
                        .with_task_id(format!("t{i}"))
                        .with_protocol(protocol);
                    let options = CommOptions::default().with_timeout(LIMIT);
                    let mut comm =
                        Communicator::join(&Bootstrap::tracker(spec.clone()), options).unwrap();
                    let mut v = [comm.rank() as i64 + 1];
                    comm.allreduce(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v, [6]);
                    comm.finalize().unwrap();
                })
            })
            .collect();
        for r in ranks {
            r.join().unwrap();
        }
        assert_eq!(tracker.wait(Some(LIMIT)).unwrap().shut_down.len(), 3);
    }
}

/// A JSON-protocol worker that panics after setup reports an `error` instead of a
/// `shutdown`, and the job fails at once rather than waiting for it.
#[test]
fn a_panicking_json_worker_fails_the_job() {
    let tracker = Tracker::start(TrackerConfig::new(2)).unwrap();
    let port = tracker.addr().port();
    let ranks: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                let spec = TrackerJoin::new("127.0.0.1", port)
                    .with_task_id(format!("t{i}"))
                    .with_protocol(TrackerProtocol::Json);
                let options = CommOptions::default().with_timeout(LIMIT);
                let comm = Communicator::join(&Bootstrap::tracker(spec.clone()), options).unwrap();
                if comm.rank() == 0 {
                    panic!("rank 0 fails after setup");
                }
                comm.finalize().unwrap();
            })
        })
        .collect();
    let panicked = ranks
        .into_iter()
        .map(|r| r.join().is_err())
        .filter(|&p| p)
        .count();
    assert_eq!(panicked, 1);
    let ended = tracker.wait(Some(LIMIT));
    assert!(
        matches!(
            ended,
            Err(switchyard_tracker::TrackerError::JobFailed { .. })
        ),
        "{ended:?}"
    );
}

/// One worker of a job above (run by `processes`, not on its own).
#[test]
#[ignore = "a worker process of the tracker tests; needs a tracker in its environment"]
fn worker_process() {
    crate::tracker_support::worker_body();
}
