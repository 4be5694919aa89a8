//! switchyard's collectives in worker processes joined through XGBoost's own
//! trackers: 1.7.6's `RabitTracker` (classic protocol, environment as its
//! `worker_envs()` gives it) and 3.x's (JSON protocol, `SWITCHYARD_TRACKER_PROTOCOL=json`).
//!
//! Each worker is this test binary re-run on the ignored test `worker_process`; it
//! forms its communicator with `Communicator::from_env`, checks an allreduce on the
//! small and the large path and a broadcast against closed forms, prints through the
//! tracker, and finalizes (the tracker's `shutdown`). The job passes when every worker
//! exits 0, every print reached the tracker, and the tracker ended its job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::test_name;
use crate::tracker_support::{RefTracker, Xgb, worker};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn job(xgb: Xgb, n: usize) {
    let Some(python) = xgb.python() else { return };
    let mut tracker = RefTracker::start(xgb, &python, n);
    let protocol = match xgb {
        Xgb::V17 => "classic",
        Xgb::V3 => "json",
    };
    let mut workers: Vec<_> = (0..n)
        .map(|i| {
            worker(
                &test_name(module_path!(), "worker_process"),
                &[
                    ("DMLC_TRACKER_URI", "127.0.0.1".into()),
                    ("DMLC_TRACKER_PORT", tracker.port.to_string()),
                    ("DMLC_TASK_ID", format!("w{i}")),
                    ("SWITCHYARD_TRACKER_PROTOCOL", protocol.into()),
                    ("SWITCHYARD_COLLECTIVE_TIMEOUT", "60".into()),
                    ("SWITCHYARD_TEST_WORLD", n.to_string()),
                ],
            )
        })
        .collect();
    for (i, w) in workers.iter_mut().enumerate() {
        let status = w.wait_for(LIMIT).expect("worker exits in time");
        assert!(status.success(), "worker w{i} exited with {status}");
    }
    let mut printed: Vec<String> = (0..n)
        .map(|_| {
            let line = tracker.line_matching(LIMIT, |l| l.contains("rank ") && l.ends_with(" ok"));
            line[line.find("rank ").unwrap()..].to_string()
        })
        .collect();
    printed.sort();
    let mut expected: Vec<String> = (0..n).map(|r| format!("rank {r}/{n} ok")).collect();
    expected.sort();
    assert_eq!(printed, expected);
    tracker.finish(LIMIT);
}

#[test]
fn two_workers_under_xgboost_17() {
    job(Xgb::V17, 2);
}

#[test]
fn four_workers_under_xgboost_17() {
    job(Xgb::V17, 4);
}

#[test]
fn two_workers_under_xgboost_3_json() {
    job(Xgb::V3, 2);
}

#[test]
fn four_workers_under_xgboost_3_json() {
    job(Xgb::V3, 4);
}

/// One worker of a job above (run by `job`, not on its own).
#[test]
#[ignore = "a worker process of the tracker tests; needs a tracker in its environment"]
fn worker_process() {
    crate::tracker_support::worker_body();
}
