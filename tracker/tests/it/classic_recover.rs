//! Whole new generations of links through switchyard's tracker, as rabit-style
//! recovery forms them: a rank's process dies, the survivors drop every link and
//! rejoin with `recover` (their rank, no good links), the restarted process joins with
//! `start` and its task id; in any arrival order, everybody gets its rank back and a
//! working ring, and the tracker never sends anybody to a listener of an earlier
//! generation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crossbeam_channel::Receiver;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use switchyard_tracker::client::ClientConfig;
use switchyard_tracker::client::classic::{ClassicClient, Joined};
use switchyard_tracker::testing::link_maps;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

/// Every wait of a worker or of the test is bounded by this.
const LIMIT: Duration = Duration::from_secs(30);
const N: u32 = 4;
/// The rank whose process dies before each new generation.
const DEAD: u32 = 2;

fn client(port: u16, task: u32) -> ClassicClient {
    let config = ClientConfig::default().with_timeout(LIMIT);
    ClassicClient::new("127.0.0.1", port, Some(task.to_string()), config).unwrap()
}

/// How a worker joins a generation.
#[derive(Clone, Copy, Debug)]
enum How {
    Start,
    Recover,
}

/// Waits for the tracker's event that `rank` got its turn's assignment decided
/// (`Assigned` for a `start`, `Recovered` for a `recover`), so that the next worker
/// arrives after it: the order of arrival is the order of the test.
fn await_decided(events: &Receiver<Event>, rank: u32, how: How) {
    let until = Instant::now() + LIMIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let event = events
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no decision for rank {rank} ({how:?}) in {LIMIT:?}: {e}"));
        match (how, event) {
            (How::Start, Event::Assigned { rank: r, .. })
            | (How::Recover, Event::Recovered { rank: r })
                if r == rank =>
            {
                return;
            }
            _ => {}
        }
    }
}

/// Joins `rank` (whose task id is its rank) the way `how` says, on its own thread.
fn join(port: u16, rank: u32, how: How) -> JoinHandle<Joined> {
    thread::spawn(move || {
        let c = client(port, rank);
        let joined = match how {
            How::Start => c.start(None, None),
            How::Recover => c.recover(rank, Some(N)),
        };
        joined.unwrap_or_else(|e| panic!("rank {rank} ({how:?}): {e}"))
    })
}

/// When the next worker of a generation arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    /// All at once: a first batch of `start`s is decided only once all of it arrived.
    Batch,
    /// Once the tracker decided the one before (it may still be negotiating).
    Decided,
    /// Once the one before finished negotiating.
    Linked,
}

/// One generation: the workers arrive in `order`, at `pace`. Returns them by rank,
/// each checked against the reference maps, and how long the generation took to form.
fn generation(
    port: u16,
    events: &Receiver<Event>,
    order: &[(u32, How)],
    pace: Pace,
) -> (Vec<Joined>, Duration) {
    let began = Instant::now();
    let mut handles = Vec::new();
    for &(rank, how) in order {
        handles.push(join(port, rank, how));
        if pace != Pace::Batch {
            await_decided(events, rank, how);
        }
        if pace == Pace::Linked {
            await_linked(events, rank);
        }
    }
    let mut joined: Vec<Joined> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let took = began.elapsed();
    joined.sort_by_key(|j| j.rank);
    let maps = link_maps(N as usize);
    for (r, j) in joined.iter().enumerate() {
        assert_eq!((j.rank, j.world), (r as u32, N));
        let m = &maps[r];
        assert_eq!(j.links.keys().copied().collect::<Vec<_>>(), m.link_set());
    }
    (joined, took)
}

/// A byte round the ring (each rank sends its rank to its successor), then every link
/// carries a word both ways: the links reach the right live processes.
fn check_links(joined: &mut [Joined]) {
    for j in joined.iter() {
        let next = j.ring_next.unwrap();
        (&j.links[&next]).write_all(&[j.rank as u8]).unwrap();
    }
    for j in joined.iter_mut() {
        let prev = j.ring_prev.unwrap();
        assert_eq!(prev, (j.rank + N - 1) % N);
        let s = j.links.get_mut(&prev).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        assert_eq!(
            u32::from(b[0]),
            prev,
            "rank {} heard round the ring",
            j.rank
        );
    }
    for j in joined.iter() {
        for s in j.links.values() {
            (&*s).write_all(&j.rank.to_le_bytes()).unwrap();
        }
    }
    for j in joined.iter_mut() {
        for (&peer, s) in j.links.iter_mut() {
            s.set_read_timeout(Some(LIMIT)).unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            assert_eq!(u32::from_le_bytes(b), peer, "rank {}'s link", j.rank);
        }
    }
}

/// Generation 1 with `start`, then one new generation per order, rank 2 dying before
/// each; every rank shuts down at the end and the job is done (the dead processes
/// never sent a `shutdown`).
fn run_generations(orders: &[&[(u32, How)]]) {
    let tracker = Tracker::start(TrackerConfig::new(N)).unwrap();
    let events = tracker.events();
    let port = tracker.addr().port();
    let first: Vec<(u32, How)> = (0..N).map(|r| (r, How::Start)).collect();
    let (mut joined, _) = generation(port, &events, &first, Pace::Batch);
    check_links(&mut joined);
    for order in orders {
        // Rank 2's process dies, and every survivor drops its links: the new
        // generation is made from scratch.
        drop(joined);
        let (again, took) = generation(port, &events, order, Pace::Decided);
        eprintln!("generation {order:?} formed in {took:?}");
        joined = again;
        check_links(&mut joined);
    }
    for j in &joined {
        j.session.shutdown().unwrap();
    }
    let outcome = tracker.wait(Some(LIMIT)).unwrap();
    assert_eq!(outcome.shut_down, (0..N).collect::<Vec<_>>());
}

use How::{Recover as R, Start as S};

#[test]
fn survivors_recover_first_then_the_restarted_rank_starts_twice_in_a_row() {
    let order: &[(u32, How)] = &[(0, R), (1, R), (3, R), (DEAD, S)];
    run_generations(&[order, order]);
}

#[test]
fn the_restarted_rank_starts_first_then_the_survivors_recover_twice_in_a_row() {
    let order: &[(u32, How)] = &[(DEAD, S), (3, R), (1, R), (0, R)];
    run_generations(&[order, order]);
}

#[test]
fn recovers_and_the_restart_interleave_in_several_orders() {
    run_generations(&[
        &[(1, R), (DEAD, S), (3, R), (0, R)],
        &[(3, R), (0, R), (DEAD, S), (1, R)],
        &[(0, R), (1, R), (3, R), (DEAD, S)],
    ]);
}

/// A worker that rejoins with `recover`, negotiates, reports `port` (where nothing
/// listens) and dies: raw bytes of the classic rabit protocol.
fn recover_and_die(port: u16, rank: u32, dead_port: u16) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let read_i32 = |s: &mut TcpStream| {
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        i32::from_le_bytes(b)
    };
    let put = |s: &mut TcpStream, ints: &[i32]| {
        let bytes: Vec<u8> = ints.iter().flat_map(|v| v.to_le_bytes()).collect();
        s.write_all(&bytes).unwrap();
    };
    s.write_all(&[0x99, 0xff, 0, 0]).unwrap();
    assert_eq!(read_i32(&mut s), 0xff99);
    let task = rank.to_string();
    put(&mut s, &[rank as i32, N as i32, task.len() as i32]);
    s.write_all(task.as_bytes()).unwrap();
    put(&mut s, &["recover".len() as i32]);
    s.write_all(b"recover").unwrap();
    assert_eq!(read_i32(&mut s), rank as i32, "assigned rank");
    let _parent = read_i32(&mut s);
    assert_eq!(read_i32(&mut s), N as i32);
    let tree = read_i32(&mut s);
    for _ in 0..tree + 2 {
        read_i32(&mut s); // tree neighbours, ring prev and next
    }
    put(&mut s, &[0]); // no good links
    let (num_conn, _num_accept) = (read_i32(&mut s), read_i32(&mut s));
    assert_eq!(num_conn, 0, "the first to rejoin connects to nobody");
    put(&mut s, &[0, i32::from(dead_port)]); // no failed connects; the port
}

/// Waits for the tracker to say that `rank` finished negotiating.
fn await_linked(events: &Receiver<Event>, rank: u32) {
    let until = Instant::now() + LIMIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match events.recv_timeout(left).expect("a Linked event in time") {
            Event::Linked { rank: r } if r == rank => return,
            _ => {}
        }
    }
}

/// Rank 0 rejoins a new generation first, negotiates, and dies before anybody links
/// to it: its port is dead. Rank 1 cannot reach it, accepts the link instead (the
/// tracker forgets the dead port), and once rank 0's restarted process joins, the
/// generation completes with working links.
#[test]
fn a_rank_that_dies_after_negotiating_a_new_generation_is_worked_around() {
    let tracker = Tracker::start(TrackerConfig::new(N)).unwrap();
    let events = tracker.events();
    let port = tracker.addr().port();
    let first: Vec<(u32, How)> = (0..N).map(|r| (r, How::Start)).collect();
    let (joined, _) = generation(port, &events, &first, Pace::Batch);
    drop(joined);
    let dead_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // bound then dropped: nothing listens there
    recover_and_die(port, 0, dead_port);
    await_linked(&events, 0);
    // Each arrives once the one before finished negotiating: rank 1 is done before
    // rank 0's restarted process could replace the dead port.
    let order: &[(u32, How)] = &[(1, R), (3, R), (0, S), (2, R)];
    let (mut joined, took) = generation(port, &events, order, Pace::Linked);
    eprintln!("generation {order:?} formed in {took:?}");
    check_links(&mut joined);
    for j in &joined {
        j.session.shutdown().unwrap();
    }
    let outcome = tracker.wait(Some(LIMIT)).unwrap();
    assert_eq!(outcome.shut_down, (0..N).collect::<Vec<_>>());
}

/// A recover for a rank that never joined, or with a rank outside the world, is the
/// protocol's refusal, not a hang.
#[test]
fn a_recover_before_the_first_generation_is_refused() {
    let tracker = Tracker::start(TrackerConfig::new(N)).unwrap();
    let port = tracker.addr().port();
    let err = client(port, 0).recover(0, Some(N)).unwrap_err();
    assert!(err.to_string().contains("rank -1"), "{err}");
    let err = client(port, 9).recover(9, Some(N)).unwrap_err();
    assert!(err.to_string().contains("rank -1"), "{err}");
    tracker.stop();
}
