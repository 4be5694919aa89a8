//! The tracker `switchyard launch` serves for its workers, and the bridge from its
//! events to the supervision loop.
//!
//! A worker counts as joined when the tracker assigns it a rank: its `task_id` is the
//! `DMLC_TASK_ID` the launcher gave it, which is the worker's index. Tracker `print`s
//! and dropped connections become log lines; only the tracker's silent-rank reports
//! ([`watchdog`]) become kills.

use super::LaunchError;
use super::supervise::Notice;
use crossbeam_channel::{RecvTimeoutError, Sender};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use switchyard_bootstrap::watchdog;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

/// Starts a tracker for `workers` workers bound to `bind`, and a thread that forwards
/// its events as notices until `done` is set.
pub(crate) fn start(
    workers: u32,
    bind: &str,
    notices: Sender<Notice>,
    done: Arc<AtomicBool>,
) -> Result<Tracker, LaunchError> {
    let mut config = TrackerConfig::new(workers);
    config.host = bind.to_string();
    let tracker = Tracker::start(config).map_err(|e| LaunchError::Tracker {
        reason: e.to_string(),
    })?;
    let events = tracker.events();
    let mut indices = HashMap::new();
    std::thread::spawn(move || {
        loop {
            let notice = match events.recv_timeout(Duration::from_millis(100)) {
                Ok(event) => notice_for(event, &mut indices),
                Err(RecvTimeoutError::Timeout) if done.load(Ordering::SeqCst) => return,
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if let Some(notice) = notice {
                if notices.send(notice).is_err() {
                    return;
                }
            }
        }
    });
    Ok(tracker)
}

/// What the supervision loop should hear of `event`; `indices` maps the ranks
/// assigned so far to worker indices.
fn notice_for(event: Event, indices: &mut HashMap<u32, u32>) -> Option<Notice> {
    match event {
        Event::Assigned { rank, task_id, .. } => {
            // The launcher's task ids are worker indices; a worker that set its own
            // (or none) is matched by rank, which equals the index on one host.
            let index = task_id
                .and_then(|t| t.trim().parse::<u32>().ok())
                .unwrap_or(rank);
            indices.insert(rank, index);
            Some(Notice::Joined {
                index,
                via: "tracker",
            })
        }
        // A print is the worker's text: only ever logged, whatever it says.
        Event::Print { text, .. } => Some(Notice::Log(format!("[tracker] {text}"))),
        // Only a report from a rank this job assigned is acted on.
        Event::Silent {
            reporter,
            rank,
            attempt,
            reason,
        } if !u32::try_from(reporter).is_ok_and(|r| indices.contains_key(&r)) => {
            Some(Notice::Log(format!(
                "[tracker] ignored a silent-rank report from unassigned rank {reporter}: {}",
                watchdog::describe(rank, attempt, &reason)
            )))
        }
        Event::Silent {
            rank,
            attempt,
            reason,
            ..
        } => Some(Notice::Silent {
            index: indices.get(&rank).copied().unwrap_or(rank),
            attempt,
            text: watchdog::describe(rank, attempt, &reason),
        }),
        Event::Dropped { peer, reason } => {
            Some(Notice::Log(format!("[tracker] dropped {peer}: {reason}")))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_become_joins_of_the_task_index() {
        let mut indices = HashMap::new();
        let mut joined = |task_id: Option<&str>, rank| {
            notice_for(
                Event::Assigned {
                    rank,
                    task_id: task_id.map(str::to_string),
                    host: "127.0.0.1".into(),
                },
                &mut indices,
            )
        };
        let notice = |index| {
            Some(Notice::Joined {
                index,
                via: "tracker",
            })
        };
        assert_eq!(joined(Some("3"), 0), notice(3));
        // A task id of the program's own choosing: matched by rank.
        assert_eq!(joined(Some("worker-a"), 2), notice(2));
        assert_eq!(joined(None, 1), notice(1));
        let print = |text: &str| Event::Print {
            rank: 0,
            text: text.into(),
        };
        let mut indices = HashMap::from([(1, 5), (0, 0)]);
        assert_eq!(
            notice_for(print("hi"), &mut indices),
            Some(Notice::Log("[tracker] hi".into()))
        );
        // A robust survivor's report on rank 1 names worker 5's start 2.
        let report = Event::Silent {
            reporter: 0,
            rank: 1,
            attempt: 2,
            reason: "no heartbeat".into(),
        };
        assert_eq!(
            notice_for(report, &mut indices),
            Some(Notice::Silent {
                index: 5,
                attempt: 2,
                text: watchdog::describe(1, 2, "no heartbeat"),
            })
        );
        // From a rank the job never assigned: logged, not acted on.
        let stranger = Event::Silent {
            reporter: 7,
            rank: 1,
            attempt: 2,
            reason: "no heartbeat".into(),
        };
        assert!(matches!(
            notice_for(stranger, &mut indices),
            Some(Notice::Log(_))
        ));
        // A print of the same words is a log line, never a kill.
        let forged = watchdog::describe(1, 0, "forged");
        assert_eq!(
            notice_for(print(&forged), &mut indices),
            Some(Notice::Log(format!("[tracker] {forged}")))
        );
    }
}
