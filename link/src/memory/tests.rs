//! The in-memory link on its own: ordering, deadlocks, aborts, determinism.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::time::Duration;

/// How long a test lets a wait run before calling it a hang.
const DEADLINE: Duration = Duration::from_secs(20);

fn tag(call: u64, step: u32) -> Tag {
    Tag { call, step }
}

fn frame(text: &'static str) -> Vec<Bytes> {
    vec![Bytes::from_static(text.as_bytes())]
}

/// Runs `body` for every link of `links` on a thread of its own; results in rank order.
fn run<R: Send + 'static>(
    links: Vec<MemoryLink>,
    body: impl Fn(&mut MemoryLink) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let handles: Vec<_> = links
        .into_iter()
        .map(|mut link| {
            let body = body.clone();
            std::thread::spawn(move || body(&mut link))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn messages_keep_their_order_per_sender_and_tag_and_other_tags_wait() {
    let results = run(MemoryLink::world(2), |link| {
        let deadline = Instant::now() + DEADLINE;
        if link.rank() == 0 {
            link.send(1, tag(1, 0), frame("a"), deadline)?;
            link.send(1, tag(1, 1), frame("other"), deadline)?;
            link.send(1, tag(1, 0), frame("b"), deadline)?;
            Ok(Vec::new())
        } else {
            let mut got = Vec::new();
            for step in [0, 0, 1] {
                got.extend(link.recv(0, tag(1, step), deadline)?);
            }
            Ok::<_, LinkError>(got)
        }
    });
    assert_eq!(
        results[1],
        Ok([frame("a"), frame("b"), frame("other")].concat())
    );
}

#[test]
fn a_world_where_everyone_waits_times_out_at_once_naming_the_peer() {
    let started = Instant::now();
    let results = run(MemoryLink::world(3), |link| {
        let from = (link.rank() + 1) % 3;
        link.recv(from, tag(1, 0), Instant::now() + DEADLINE)
    });
    assert!(started.elapsed() < DEADLINE / 4, "{:?}", started.elapsed());
    // Rank 0 waits first and is the one the round-robin schedule wakes; as nobody
    // tells the others, each in turn is found stuck.
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(LinkError::Timeout { rank: peer, .. }) => assert_eq!(*peer, (rank + 1) % 3),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn an_abort_ends_the_others_waits_with_its_reason() {
    let results = run(MemoryLink::world(3), |link| {
        let deadline = Instant::now() + DEADLINE;
        if link.rank() == 2 {
            link.abort(1, "rank 2 gave up");
            return Ok(Vec::new());
        }
        link.recv(2, tag(1, 0), deadline)
    });
    for result in &results[..2] {
        assert_eq!(
            result,
            &Err(LinkError::Aborted {
                rank: 2,
                reason: "rank 2 gave up".into()
            })
        );
    }
}

#[test]
fn a_rank_that_keeps_the_turn_holds_the_others_up_to_their_deadline_only() {
    let results = run(MemoryLink::world(2), |link| {
        if link.rank() == 0 {
            std::thread::sleep(Duration::from_millis(2000));
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_millis(200);
        link.recv(0, tag(1, 0), deadline).map(drop)
    });
    match &results[1] {
        Err(LinkError::Timeout { rank: 0, waited }) => {
            assert!(*waited >= Duration::from_millis(200), "{waited:?}");
            // Not until rank 0 leaves, 2 s in (room for a loaded runner).
            assert!(*waited < Duration::from_millis(1900), "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sends_to_itself_or_outside_the_world_are_refused() {
    let mut links = MemoryLink::world(2);
    let deadline = Instant::now() + DEADLINE;
    for to in [0, 2] {
        assert!(matches!(
            links[0].send(to, tag(1, 0), Vec::new(), deadline),
            Err(LinkError::Transport { .. })
        ));
    }
}

/// Every rank sends to every other, then receives from every other in an order of
/// its own, several calls in a row. Returns the world's fingerprint as each rank saw
/// it after its last receive, while it still held the turn.
fn all_to_all(schedule: MemorySchedule) -> Vec<u64> {
    let n = 5;
    let links = MemoryLink::world_with(n, schedule);
    let results = run(links, move |link| {
        let (me, deadline) = (link.rank(), Instant::now() + DEADLINE);
        for call in 1..4 {
            for k in 1..n {
                let to = (me + k) % n;
                let text = format!("{me}->{to}@{call}");
                link.send(to, tag(call, 0), vec![Bytes::from(text)], deadline)?;
            }
            for k in 1..n {
                let from = (me + n - k) % n;
                let got = link.recv(from, tag(call, 0), deadline)?;
                assert_eq!(got, vec![Bytes::from(format!("{from}->{me}@{call}"))]);
            }
        }
        Ok::<_, LinkError>(link.fingerprint())
    });
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn the_same_schedule_runs_the_same_way_every_time() {
    for schedule in [
        MemorySchedule::RoundRobin,
        MemorySchedule::Seeded(7),
        MemorySchedule::Seeded(8),
    ] {
        let first = all_to_all(schedule);
        for _ in 0..3 {
            assert_eq!(all_to_all(schedule), first, "{schedule:?}");
        }
    }
    assert_ne!(
        all_to_all(MemorySchedule::Seeded(7)),
        all_to_all(MemorySchedule::RoundRobin)
    );
}

#[test]
fn in_a_bounded_world_a_full_queue_holds_the_sender_until_the_receiver_takes_one() {
    let links = MemoryLink::world_bounded(2, MemorySchedule::RoundRobin, Some(1));
    let results = run(links, |link| {
        let deadline = Instant::now() + DEADLINE;
        if link.rank() == 0 {
            for text in ["a", "b", "c"] {
                link.send(1, tag(1, 0), frame(text), deadline)?;
            }
            return Ok(Vec::new());
        }
        let mut got = Vec::new();
        for _ in 0..3 {
            got.extend(link.recv(0, tag(1, 0), deadline)?);
        }
        Ok::<_, LinkError>(got)
    });
    assert_eq!(results[0], Ok(Vec::new()));
    assert_eq!(
        results[1],
        Ok([frame("a"), frame("b"), frame("c")].concat())
    );

    // Two ranks that both send twice before receiving, with room for one message
    // each: a deadlock, found at once.
    let started = Instant::now();
    let links = MemoryLink::world_bounded(2, MemorySchedule::RoundRobin, Some(1));
    let results = run(links, |link| {
        let (peer, deadline) = (1 - link.rank(), Instant::now() + DEADLINE);
        link.send(peer, tag(1, 0), frame("x"), deadline)?;
        link.send(peer, tag(1, 0), frame("y"), deadline)?;
        link.recv(peer, tag(1, 0), deadline)
    });
    assert!(started.elapsed() < DEADLINE / 4, "{:?}", started.elapsed());
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(LinkError::Timeout { .. }))),
        "{results:?}"
    );
}
