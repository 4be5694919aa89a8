//! The JSON machine without sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn hello(task: &str) -> Hello {
    Hello {
        rank: 0,
        task_id: task.into(),
        world_size: -1,
    }
}

fn frames(actions: &[Action]) -> Vec<(ConnId, String, u16, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::PeerFrame {
                conn,
                host,
                port,
                rank,
            } => Some((*conn, host.clone(), *port, *rank)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_full_batch_gets_ring_successors_in_sorted_order() {
    let mut j = Json::new(3, SortBy::Host);
    assert!(
        j.start(1, "h", &hello("10"), 7010, 8010)
            .unwrap()
            .is_empty()
    );
    assert!(j.start(2, "h", &hello("2"), 7002, 8002).unwrap().is_empty());
    let actions = j.start(3, "h", &hello("1"), 7001, 8001).unwrap();
    // Ranks: "1" → 0 (conn 3), "2" → 1 (conn 2), "10" → 2 (conn 1).
    assert_eq!(
        frames(&actions),
        [
            (3, "h".into(), 7002, 1),
            (2, "h".into(), 7010, 2),
            (1, "h".into(), 7001, 0)
        ]
    );
    assert!(
        matches!(actions.last(), Some(Action::Record(Record::JsonBatch { members })) if members.len() == 3)
    );
}

#[test]
fn a_world_of_one_names_itself() {
    let mut j = Json::new(1, SortBy::Task);
    let actions = j.start(1, "h", &hello(""), 7000, 0).unwrap();
    assert_eq!(frames(&actions), [(1, "h".into(), 7000, 0)]);
}

#[test]
fn bad_starts_are_refused_and_a_start_after_the_batch_too() {
    let mut j = Json::new(1, SortBy::Host);
    let mut h = hello("a");
    h.world_size = 5;
    assert!(
        j.start(1, "h", &h, 7000, 0)
            .unwrap_err()
            .contains("world_size 5")
    );
    assert!(
        j.start(1, "h", &hello("a"), 0, 0)
            .unwrap_err()
            .contains("port 0")
    );
    assert!(j.start(1, "h", &hello("a"), 70000, 0).is_err());
    assert!(
        j.start(1, "h", &hello("a"), 7000, -1)
            .unwrap_err()
            .contains("error_port")
    );
    j.start(1, "h", &hello("a"), 7000, 0).unwrap();
    assert!(
        j.start(2, "h", &hello("b"), 7001, 0)
            .unwrap_err()
            .contains("after")
    );
}

#[test]
fn a_vanished_start_leaves_the_batch() {
    let mut j = Json::new(2, SortBy::Host);
    j.start(1, "h", &hello("a"), 7000, 0).unwrap();
    assert!(j.vanish(1));
    assert!(j.start(2, "h", &hello("b"), 7001, 0).unwrap().is_empty());
    assert_eq!(
        frames(&j.start(3, "h", &hello("c"), 7002, 0).unwrap()).len(),
        2
    );
}

#[test]
fn shutdown_counts_distinct_ranks_of_the_batch() {
    let mut j = Json::new(2, SortBy::Host);
    assert!(j.shutdown(0).unwrap_err().contains("before"));
    j.start(1, "h", &hello("a"), 7000, 0).unwrap();
    j.start(2, "h", &hello("b"), 7001, 0).unwrap();
    assert!(j.shutdown(7).unwrap_err().contains("not in 0..2"));
    j.shutdown(1).unwrap();
    assert!(j.shutdown(1).unwrap_err().contains("second"));
    assert!(!j.is_done());
    j.shutdown(0).unwrap();
    assert!(j.is_done());
}

#[test]
fn an_error_signals_every_worker_including_the_reporters_host_and_fails_the_job() {
    let mut j = Json::new(2, SortBy::Host);
    j.start(1, "h", &hello("a"), 7000, 8000).unwrap();
    j.start(2, "h", &hello("b"), 7001, 8001).unwrap();
    let actions = j.error(1, 5, "boom");
    assert_eq!(
        actions,
        [Action::SignalError {
            targets: vec![("h".into(), 8000), ("h".into(), 8001)]
        }]
    );
    assert!(j.failed().unwrap().contains("boom"));
}

#[test]
fn replay_restores_the_batch_and_shutdowns() {
    let mut j = Json::new(2, SortBy::Host);
    j.start(1, "h", &hello("a"), 7000, 0).unwrap();
    let actions = j.start(2, "h", &hello("b"), 7001, 0).unwrap();
    let Some(Action::Record(batch)) = actions.last().cloned() else {
        panic!("no batch record")
    };
    let mut again = Json::new(2, SortBy::Host);
    again.apply(&batch);
    for a in j.shutdown(0).unwrap() {
        if let Action::Record(r) = a {
            again.apply(&r);
        }
    }
    assert!(again.shutdown(0).is_err());
    again.shutdown(1).unwrap();
    assert!(again.is_done());
}
