//! The JSON join's checks and a whole ring bootstrap, run without sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn at() -> SocketAddr {
    "127.0.0.1:9091".parse().unwrap()
}

/// Worker `r` of `n` listening on port `7000 + r`, its successor on host `h{r+1}`.
fn worker(r: u32, n: u32) -> RingBootstrap {
    let next = (r + 1) % n;
    let place = place(
        at(),
        n,
        format!("h{next}"),
        7000 + i64::from(next),
        next.into(),
    )
    .unwrap();
    assert_eq!(place.rank, r);
    RingBootstrap::new(&place, n, 7000 + r as u16)
}

/// Runs the bootstrap of every worker in lockstep, each receiving what its
/// predecessor sent in the same exchange; the exchanges each made.
fn run(ring: &mut [RingBootstrap]) -> usize {
    let n = ring.len();
    let mut exchanges = 0;
    while let Some(first) = ring[0].next() {
        let sent: Vec<Exchange> = ring.iter().map(|w| w.next().unwrap()).collect();
        assert!(
            sent.iter()
                .all(|x| x.what == first.what && x.len == x.send.len())
        );
        for (r, w) in ring.iter_mut().enumerate() {
            w.on_received(&sent[(r + n - 1) % n].send);
        }
        exchanges += 1;
    }
    assert!(ring.iter().all(|w| w.next().is_none()));
    exchanges
}

#[test]
fn every_worker_of_a_ring_learns_every_slot() {
    let n = 4;
    let mut ring: Vec<RingBootstrap> = (0..n).map(|r| worker(r, n)).collect();
    assert_eq!(run(&mut ring), 2 * n as usize);
    for w in &ring {
        w.finish(at()).unwrap();
        for s in 0..n as usize {
            let next = (s + 1) % n as usize;
            let host = format!("h{next}");
            assert_eq!(&w.hosts[s][..host.len()], host.as_bytes());
            assert!(w.hosts[s][host.len()..].iter().all(|&b| b == 0));
            assert_eq!(i32::from_le_bytes(w.ports[s]), 7000 + next as i32);
        }
    }
}

#[test]
fn host_slots_go_first_then_port_slots() {
    let w = worker(1, 3);
    let x = w.next().unwrap();
    assert_eq!((x.what, x.len), ("host slot", HOST_SLOT));
    // The first slot sent is this worker's own: its successor's host.
    assert_eq!(&x.send[..2], b"h2");
    let mut w = w;
    for _ in 0..3 {
        w.on_received(&[0; HOST_SLOT]);
    }
    let x = w.next().unwrap();
    assert_eq!((x.what, x.len), ("port slot", 4));
    assert_eq!(x.send, 7002i32.to_le_bytes());
}

#[test]
fn a_world_of_one_is_its_own_successor() {
    let mut ring = [worker(0, 1)];
    assert_eq!(ring[0].predecessor(), 0);
    assert_eq!(run(&mut ring), 2);
    ring[0].finish(at()).unwrap();
}

#[test]
fn a_slot_that_names_another_port_for_this_worker_fails_the_bootstrap() {
    let n = 3;
    let mut ring: Vec<RingBootstrap> = (0..n).map(|r| worker(r, n)).collect();
    // Rank 0 was told a wrong port for its successor, rank 1.
    ring[0] = RingBootstrap::new(&place(at(), n, "h1".into(), 7100, 1).unwrap(), n, 7000);
    run(&mut ring);
    ring[0].finish(at()).unwrap();
    ring[2].finish(at()).unwrap();
    let err = ring[1].finish(at()).unwrap_err().to_string();
    assert_eq!(
        err,
        "tracker 127.0.0.1:9091 sent a bad ring bootstrap: \
         this worker's slot says port 7100, it listens on 7001"
    );
}

#[test]
fn a_short_slot_is_not_taken() {
    let mut w = worker(0, 2);
    w.on_received(&[1, 2, 3]);
    assert_eq!(w.next().unwrap().what, "host slot");
    assert_eq!(w.done, 0);
}

#[test]
fn the_trackers_frames_are_checked() {
    assert_eq!(world(at(), 3).unwrap(), 3);
    for bad in [0, -1, i64::from(u32::MAX) + 1] {
        let err = world(at(), bad).unwrap_err().to_string();
        assert!(err.ends_with(&format!("bad world size: {bad}")), "{err}");
    }
    // The successor of the last rank is rank 0.
    assert_eq!(place(at(), 3, "h".into(), 1, 0).unwrap().rank, 2);
    let bad = |host: String, port, rank| place(at(), 3, host, port, rank).unwrap_err().to_string();
    assert!(bad("h".into(), 1, 3).ends_with("bad peer frame: rank 3 of 3"));
    assert!(bad("h".into(), 1, -1).ends_with("bad peer frame: rank -1 of 3"));
    assert!(bad("h".into(), 0, 1).ends_with("bad peer frame: port 0"));
    assert!(bad("h".into(), 65536, 1).ends_with("bad peer frame: port 65536"));
    // A bad rank is reported before a bad port.
    assert!(bad("h".into(), 0, 9).ends_with("rank 9 of 3"));
    assert!(bad("x".repeat(HOST_SLOT), 1, 1).ends_with("host text of 64 bytes"));
    assert!(place(at(), 3, "x".repeat(HOST_SLOT - 1), 1, 1).is_ok());
}
