//! The classic machine without sockets: batches, refusals, negotiation bookkeeping,
//! shutdown accounting and replay.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const H: &str = "127.0.0.1";

fn start(rank: i32, task: Option<&str>) -> Hello {
    Hello {
        rank,
        world: -1,
        task_id: task.map(str::to_string),
        command: Command::Start,
    }
}

fn turns(actions: &[Action]) -> Vec<(ConnId, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Turn { conn, rank } => Some((*conn, *rank)),
            _ => None,
        })
        .collect()
}

fn assigned(actions: &[Action]) -> Vec<(u32, Option<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Record(Record::Assigned { rank, task_id, .. }) => {
                Some((*rank, task_id.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Runs `conn`'s whole turn as a worker that reaches everyone it is told to; returns
/// the next turn, if one was given.
fn negotiate(
    c: &mut Classic,
    conn: ConnId,
    rank: u32,
    port: i32,
) -> (Round, Option<(ConnId, u32)>) {
    let (a, mut neg) = c.begin(conn, rank).unwrap();
    assert_eq!(a.rank, rank);
    let round = c.round(&mut neg, &[]).unwrap();
    let actions = c.finish(neg, port).unwrap();
    (round, turns(&actions).first().copied())
}

/// A full job of `n` through the machine: every worker starts, negotiates in turn.
fn bootstrap(n: u32) -> Classic {
    let mut c = Classic::new(n, SortBy::Host);
    let mut next = None;
    for i in 0..n {
        let actions = c
            .start(u64::from(i), H, &start(-1, Some(&i.to_string())))
            .unwrap();
        if let Some(t) = turns(&actions).first() {
            next = Some(*t);
        }
    }
    while let Some((conn, rank)) = next {
        next = negotiate(&mut c, conn, rank, 1000 + rank as i32).1;
    }
    c
}

#[test]
fn nobody_hears_anything_until_the_batch_is_full_then_turns_go_in_rank_order() {
    let mut c = Classic::new(3, SortBy::Host);
    assert!(c.start(1, H, &start(-1, Some("2"))).unwrap().is_empty());
    assert!(c.start(2, H, &start(-1, Some("10"))).unwrap().is_empty());
    assert_eq!(c.pending(), 2);
    let actions = c.start(3, H, &start(-1, Some("1"))).unwrap();
    assert_eq!(
        assigned(&actions),
        [
            (0, Some("1".into())),
            (1, Some("2".into())),
            (2, Some("10".into()))
        ]
    );
    // One turn at a time: only rank 0 (connection 3) now.
    assert_eq!(turns(&actions), [(3, 0)]);
    let (round, next) = negotiate(&mut c, 3, 0, 1000);
    assert_eq!(round.connect, []);
    assert_eq!(round.accept, 2, "rank 0 of 3 accepts both its links");
    assert_eq!(next, Some((1, 1)));
    let (round, next) = negotiate(&mut c, 1, 1, 1001);
    assert_eq!(round.connect, [(H.to_string(), 1000, 0)]);
    assert_eq!(next, Some((2, 2)));
    let (round, next) = negotiate(&mut c, 2, 2, 1002);
    assert_eq!(round.connect.len(), 2);
    assert_eq!(round.accept, 0);
    assert_eq!(next, None);
    assert!(c.wait_conn.is_empty(), "every expected link arrived");
}

#[test]
fn assignments_carry_the_reference_maps() {
    let mut c = Classic::new(5, SortBy::Host);
    for i in 0..5 {
        c.start(i, H, &start(-1, None)).unwrap();
    }
    let (a, _) = c.begin(0, 0).unwrap();
    assert_eq!(a.world, 5);
    assert_eq!(a.links, crate::maps::link_maps(5)[0]);
    assert!(c.begin(1, 1).is_err(), "not rank 1's turn yet");
}

#[test]
fn refusals_name_what_was_wrong() {
    let mut c = Classic::new(2, SortBy::Host);
    let mut h = start(-1, None);
    h.world = 3;
    assert!(c.start(1, H, &h).unwrap_err().contains("world size 3"));
    let mut h = start(-1, None);
    h.command = Command::Recover;
    assert!(
        c.start(1, H, &h)
            .unwrap_err()
            .contains("recover with rank -1")
    );
    assert!(
        c.start(1, H, &start(2, None))
            .unwrap_err()
            .contains("not below the world size 2")
    );
    // Rank 0 explicitly, held while it negotiates: a second claim is refused
    // (docs/rabit-protocol.md, *Trusted task ids*).
    assert_eq!(
        turns(&c.start(1, H, &start(0, Some("a"))).unwrap()),
        [(1, 0)]
    );
    assert!(c.start(2, H, &start(0, None)).unwrap_err().contains("held"));
    assert!(
        c.start(2, H, &start(-1, Some("a")))
            .unwrap_err()
            .contains("held")
    );
    // Rank 1 goes to the batch of one that is left; after that every rank is out.
    assert_eq!(
        assigned(&c.start(3, H, &start(-1, Some("b"))).unwrap()),
        [(1, Some("b".into()))]
    );
    assert!(
        c.start(4, H, &start(-1, Some("c")))
            .unwrap_err()
            .contains("every rank")
    );
}

#[test]
fn an_explicit_rank_leaves_the_batch_so_no_rank_is_given_twice() {
    let mut c = Classic::new(3, SortBy::Host);
    c.start(1, H, &start(1, None)).unwrap();
    c.start(2, H, &start(-1, None)).unwrap();
    let actions = c.start(3, H, &start(-1, None)).unwrap();
    let mut ranks: Vec<u32> = assigned(&actions).into_iter().map(|a| a.0).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 2]);
}

#[test]
fn a_vanished_pending_worker_leaves_the_batch_and_a_replacement_completes_it() {
    let mut c = Classic::new(2, SortBy::Host);
    c.start(1, H, &start(-1, None)).unwrap();
    assert!(c.vanish(1));
    assert!(!c.vanish(1));
    assert!(c.start(2, H, &start(-1, None)).unwrap().is_empty());
    assert_eq!(turns(&c.start(3, H, &start(-1, None)).unwrap()), [(2, 0)]);
}

#[test]
fn an_abandoned_turn_passes_on_and_its_rank_goes_back_to_the_batch() {
    let mut c = Classic::new(2, SortBy::Host);
    c.start(1, H, &start(-1, Some("x"))).unwrap();
    c.start(2, H, &start(-1, Some("y"))).unwrap();
    let mut actions = Vec::new();
    c.abandon(1, 0, &mut actions);
    assert_eq!(turns(&actions), [(2, 1)]);
    negotiate(&mut c, 2, 1, 2000);
    // A newcomer takes rank 0; the task id "x" is forgotten with it.
    assert!(!c.job_map.contains_key("x"));
    let actions = c.start(3, H, &start(-1, Some("z"))).unwrap();
    assert_eq!(turns(&actions), [(3, 0)]);
    let (round, _) = negotiate(&mut c, 3, 0, 2001);
    assert_eq!(
        round.connect,
        [(H.to_string(), 2000, 1)],
        "rank 1 waits for it"
    );
}

/// docs/rabit-protocol.md, *Links reached in earlier rounds*: the peer reached in
/// round 1 must lose its expected link too.
#[test]
fn every_round_counts_towards_the_peers_expected_links() {
    let mut c = Classic::new(3, SortBy::Host);
    for i in 0..3 {
        c.start(i, H, &start(-1, Some(&i.to_string()))).unwrap();
    }
    negotiate(&mut c, 0, 0, 1000);
    negotiate(&mut c, 1, 1, 1001);
    let (_, mut neg) = c.begin(2, 2).unwrap();
    let r1 = c.round(&mut neg, &[]).unwrap();
    assert_eq!(r1.connect.len(), 2);
    // Reached the first, failed the second: the second round asks only for it.
    let reached = r1.connect[0].2 as i32;
    let r2 = c.round(&mut neg, &[reached]).unwrap();
    assert_eq!(r2.connect.len(), 1);
    c.finish(neg, 1002).unwrap();
    assert!(c.wait_conn.is_empty(), "{:?}", c.wait_conn);
    for r in 0..3 {
        c.shutdown(r).unwrap();
    }
    assert!(c.is_done());
}

#[test]
fn a_good_link_outside_the_link_set_and_endless_rounds_are_errors() {
    let mut c = Classic::new(4, SortBy::Host);
    for i in 0..4 {
        c.start(i, H, &start(-1, None)).unwrap();
    }
    let (a, mut neg) = c.begin(0, 0).unwrap();
    let not_linked = (0..4)
        .find(|r| *r != 0 && !a.links.link_set().contains(r))
        .unwrap();
    assert!(
        c.round(&mut neg, &[not_linked as i32])
            .unwrap_err()
            .contains("not one of its links")
    );
    for _ in 1..MAX_ROUNDS {
        c.round(&mut neg, &[]).unwrap();
    }
    assert!(c.round(&mut neg, &[]).unwrap_err().contains("rounds"));
    assert!(
        c.finish(neg, 0).unwrap_err().contains("port 0"),
        "rank 0 accepts links"
    );
}

#[test]
fn shutdown_counts_distinct_linked_ranks_only() {
    let mut c = bootstrap(2);
    assert!(c.shutdown(7).unwrap_err().contains("never finished"));
    assert!(c.shutdown(-1).is_err());
    c.shutdown(1).unwrap();
    assert!(c.shutdown(1).unwrap_err().contains("second"));
    assert!(!c.is_done());
    c.shutdown(0).unwrap();
    assert!(c.is_done());
    assert_eq!(c.shut_down(), [0, 1]);
    // A shut-down rank cannot start again.
    assert!(
        c.start(9, H, &start(0, None))
            .unwrap_err()
            .contains("already shut down")
    );
}

#[test]
fn a_restarted_process_gets_its_rank_back_by_task_id_and_recover_repairs_links() {
    let mut c = bootstrap(3);
    // The process of task "1" died and comes back with start and no rank.
    let actions = c.start(10, H, &start(-1, Some("1"))).unwrap();
    assert_eq!(turns(&actions), [(10, 1)]);
    let (_, mut neg) = c.begin(10, 1).unwrap();
    let round = c.round(&mut neg, &[]).unwrap();
    assert_eq!(round.connect, [], "its peers are not waiting: it accepts");
    assert_eq!(round.accept, 2);
    c.finish(neg, 3001).unwrap();
    // Its neighbours recover, each keeping its other links.
    for peer in [0u32, 2] {
        let h = Hello {
            rank: peer as i32,
            world: 3,
            task_id: Some(peer.to_string()),
            command: Command::Recover,
        };
        let actions = c.start(20 + u64::from(peer), H, &h).unwrap();
        assert!(matches!(
            actions.first(),
            Some(Action::Record(Record::Assigned { recover: true, .. }))
        ));
        let (a, mut neg) = c.begin(20 + u64::from(peer), peer).unwrap();
        let good: Vec<i32> = a
            .links
            .link_set()
            .into_iter()
            .filter(|&r| r != 1)
            .map(|r| r as i32)
            .collect();
        let round = c.round(&mut neg, &good).unwrap();
        assert_eq!(round.connect, [(H.to_string(), 3001, 1)]);
        assert_eq!(round.accept, 0);
        c.finish(neg, 0).unwrap();
    }
    assert!(c.wait_conn.is_empty());
}

#[test]
fn replaying_durable_records_restores_what_shutdown_and_recover_need() {
    let mut c = Classic::new(2, SortBy::Host);
    let mut records = Vec::new();
    let keep = |actions: Vec<Action>, records: &mut Vec<Record>| {
        for a in actions {
            if let Action::Record(r) = a {
                if r.is_durable() {
                    records.push(r);
                }
            }
        }
    };
    c.start(1, H, &start(-1, Some("a"))).unwrap();
    c.start(2, H, &start(-1, Some("b"))).unwrap();
    for (conn, rank) in [(1, 0), (2, 1)] {
        let (_, mut neg) = c.begin(conn, rank).unwrap();
        c.round(&mut neg, &[]).unwrap();
        keep(c.finish(neg, 5000 + rank as i32).unwrap(), &mut records);
    }
    keep(c.shutdown(0).unwrap(), &mut records);
    let mut again = Classic::new(2, SortBy::Host);
    for r in &records {
        again.apply(r);
    }
    assert!(again.shutdown(0).unwrap_err().contains("second"));
    // Task "b" still owns rank 1.
    assert_eq!(
        turns(&again.start(3, H, &start(-1, Some("b"))).unwrap()),
        [(3, 1)]
    );
    let mut actions = Vec::new();
    again.abandon(3, 1, &mut actions);
    again.shutdown(1).unwrap();
    assert!(again.is_done());
}

#[test]
fn replayed_records_outside_the_world_are_ignored() {
    let mut c = Classic::new(2, SortBy::Host);
    c.apply(&Record::Linked {
        rank: 99,
        task_id: Some("x".into()),
        host: H.into(),
        port: 1,
        accept: 0,
        reached: vec![],
    });
    c.apply(&Record::ShutDown {
        protocol: Protocol::Classic,
        rank: 5,
    });
    assert!(c.shut_down().is_empty());
    // Task "x" is not known: it waits in the batch like any newcomer.
    assert!(c.start(1, H, &start(-1, Some("x"))).unwrap().is_empty());
}

/// A whole new generation of links: every rank rejoins (survivors with `recover`,
/// a restarted one with `start` and its task id) and reports no good links.
#[test]
fn a_rank_that_rejoins_forgets_the_port_of_its_earlier_generation() {
    let mut c = bootstrap(3);
    let recover = |rank: i32| Hello {
        rank,
        world: 3,
        task_id: Some(rank.to_string()),
        command: Command::Recover,
    };
    // Generation 2: rank 0 rejoins first, accepts both links on port 4000, then dies
    // before its peers link to it.
    assert_eq!(turns(&c.start(30, H, &recover(0)).unwrap()), [(30, 0)]);
    let (round, _) = negotiate(&mut c, 30, 0, 4000);
    assert_eq!((round.connect.len(), round.accept), (0, 2));
    // Its restarted process joins by task id and fails during its negotiation.
    assert_eq!(
        turns(&c.start(31, H, &start(-1, Some("0"))).unwrap()),
        [(31, 0)]
    );
    let mut actions = Vec::new();
    c.abandon(31, 0, &mut actions);
    // Rank 1 must not be sent to port 4000, whose listener is gone: it accepts.
    assert_eq!(turns(&c.start(32, H, &recover(1)).unwrap()), [(32, 1)]);
    let (round, _) = negotiate(&mut c, 32, 1, 4001);
    assert_eq!(round.connect, [], "no port of an earlier generation");
    assert_eq!(round.accept, 2);
    // The next process of task "0" links to rank 1 and waits for rank 2.
    assert_eq!(
        turns(&c.start(33, H, &start(-1, Some("0"))).unwrap()),
        [(33, 0)]
    );
    let (round, _) = negotiate(&mut c, 33, 0, 4002);
    assert_eq!(round.connect, [(H.to_string(), 4001, 1)]);
    assert_eq!(turns(&c.start(34, H, &recover(2)).unwrap()), [(34, 2)]);
    let (round, _) = negotiate(&mut c, 34, 2, 0);
    let mut ports: Vec<u16> = round.connect.iter().map(|c| c.1).collect();
    ports.sort_unstable();
    assert_eq!(ports, [4001, 4002]);
    assert!(c.wait_conn.is_empty(), "{:?}", c.wait_conn);
}

/// A rank that died after its negotiation of a new generation left a port nobody
/// listens on: a peer that fails to reach it [`STALE_AFTER`] rounds in a row accepts
/// the link instead, and the restarted rank connects to it.
#[test]
fn a_peer_unreachable_for_several_rounds_is_forgotten_and_the_link_accepted() {
    let mut c = bootstrap(3);
    let recover = |rank: i32| Hello {
        rank,
        world: 3,
        task_id: Some(rank.to_string()),
        command: Command::Recover,
    };
    assert_eq!(turns(&c.start(40, H, &recover(0)).unwrap()), [(40, 0)]);
    negotiate(&mut c, 40, 0, 4000);
    // Rank 0 dies now. Rank 1 recovers and cannot reach port 4000.
    assert_eq!(turns(&c.start(41, H, &recover(1)).unwrap()), [(41, 1)]);
    let (_, mut neg) = c.begin(41, 1).unwrap();
    for round in 1..=STALE_AFTER {
        let r = c.round(&mut neg, &[]).unwrap();
        assert_eq!(r.connect, [(H.to_string(), 4000, 0)], "round {round}");
        assert_eq!(r.accept, 1);
    }
    let r = c.round(&mut neg, &[]).unwrap();
    assert_eq!((r.connect.len(), r.accept), (0, 2), "rank 0 is forgotten");
    c.finish(neg, 4001).unwrap();
    assert!(!c.wait_conn.contains_key(&0));
    assert_eq!(c.wait_conn[&1].remaining, 2);
    // The restarted rank 0 links to rank 1; rank 2 to both.
    assert_eq!(
        turns(&c.start(42, H, &start(-1, Some("0"))).unwrap()),
        [(42, 0)]
    );
    let (round, _) = negotiate(&mut c, 42, 0, 4002);
    assert_eq!(round.connect, [(H.to_string(), 4001, 1)]);
    assert_eq!(turns(&c.start(43, H, &recover(2)).unwrap()), [(43, 2)]);
    let (round, _) = negotiate(&mut c, 43, 2, 0);
    assert_eq!(round.connect.len(), 2);
    assert!(c.wait_conn.is_empty(), "{:?}", c.wait_conn);
}

/// A peer reached in a later round is not forgotten: only failures in a row count.
#[test]
fn a_peer_reached_after_a_failure_keeps_its_port() {
    let mut c = bootstrap(2);
    let recover = |rank: i32| Hello {
        rank,
        world: 2,
        task_id: None,
        command: Command::Recover,
    };
    c.start(50, H, &recover(0)).unwrap();
    negotiate(&mut c, 50, 0, 5000);
    c.start(51, H, &recover(1)).unwrap();
    let (_, mut neg) = c.begin(51, 1).unwrap();
    for _ in 1..STALE_AFTER {
        assert_eq!(c.round(&mut neg, &[]).unwrap().connect.len(), 1);
    }
    let r = c.round(&mut neg, &[0]).unwrap();
    assert_eq!((r.connect.len(), r.accept), (0, 0));
    c.finish(neg, 0).unwrap();
    assert!(c.wait_conn.is_empty(), "rank 0's expected link arrived");
}
