#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use switchyard_tracker::client::classic::DONE;

/// Long enough that a test which waits it out has failed.
const LIMIT: Duration = Duration::from_secs(5);

/// A connected pair: (one end, the other end).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}

/// Rank `r` of `n`'s ring over `next` (to rank r + 1) and `prev` (from rank r − 1),
/// watching both links.
fn ring(r: usize, n: usize, next: TcpStream, prev: TcpStream) -> TrackerRing {
    let (to, from) = (((r + 1) % n) as u32, ((r + n - 1) % n) as u32);
    let links = BTreeMap::from([
        (to, next.try_clone().unwrap()),
        (from, prev.try_clone().unwrap()),
    ]);
    TrackerRing::new(next, prev, Some(from), WatchedLinks::new(links))
}

/// An entry as it goes on the wire.
fn frame(attempt: u64, endpoint: &str) -> Vec<u8> {
    let mut f = attempt.to_le_bytes().to_vec();
    wire::put_str(&mut f, endpoint);
    f
}

#[test]
fn three_ranks_get_every_endpoint_in_rank_order() {
    let n = 3;
    // Edge r joins rank r (its first end) to rank r + 1 (its second).
    let edges: Vec<_> = (0..n).map(|_| pair()).collect();
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            let next = edges[r].0.try_clone().unwrap();
            let prev = edges[(r + n - 1) % n].1.try_clone().unwrap();
            let mut ring = ring(r, n, next, prev);
            std::thread::spawn(move || {
                ring.exchange(r as u32, n as u32, &format!("tcp://h:{r}"), LIMIT)
            })
        })
        .collect();
    for rank in ranks {
        let all = rank.join().unwrap().unwrap();
        assert_eq!(all, ["tcp://h:0", "tcp://h:1", "tcp://h:2"]);
    }
}

/// Rank 1 of 3 with scripted neighbours: the predecessor's end (to write entries to
/// it) and the successor's (to read what it sends).
fn scripted() -> (TrackerRing, TcpStream, TcpStream) {
    let (next, successor) = pair();
    let (predecessor, prev) = pair();
    (ring(1, 3, next, prev), predecessor, successor)
}

/// Rank 1's first frame: its own entry, as the successor receives it.
fn first_frame(successor: &mut TcpStream, endpoint: &str) -> Vec<u8> {
    let mut got = vec![0u8; 8 + 4 + endpoint.len()];
    successor.read_exact(&mut got).unwrap();
    got
}

/// A ring whose last step brings back another attempt's entry than this rank's (the
/// links behind it lead to an attempt of its own rank that has left) fails, naming
/// why, instead of handing out endpoints that cannot all form one mesh.
#[test]
fn an_entry_that_does_not_come_back_fails_the_exchange() {
    let (mut ring, mut predecessor, mut successor) = scripted();
    let rank1 = std::thread::spawn(move || ring.exchange(1, 3, "tcp://h:1", LIMIT));
    let mine = first_frame(&mut successor, "tcp://h:1");
    assert_eq!(&mine[8..], &frame(0, "tcp://h:1")[8..]);
    predecessor.write_all(&frame(7, "tcp://h:0")).unwrap();
    predecessor.write_all(&frame(9, "tcp://h:2")).unwrap();
    // Rank 1's endpoint, from an earlier attempt.
    predecessor.write_all(&frame(3, "tcp://h:1")).unwrap();
    let err = rank1.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("did not come back round the ring"), "{err}");
}

/// The same ring, closed through this rank: its own entry comes back, and the
/// exchange tells every peer it is done.
#[test]
fn an_entry_that_comes_back_completes_the_exchange() {
    let (mut ring, mut predecessor, mut successor) = scripted();
    let rank1 = std::thread::spawn(move || ring.exchange(1, 3, "tcp://h:1", LIMIT));
    let mine = first_frame(&mut successor, "tcp://h:1");
    predecessor.write_all(&frame(7, "tcp://h:0")).unwrap();
    predecessor.write_all(&frame(9, "tcp://h:2")).unwrap();
    predecessor.write_all(&mine).unwrap();
    let all = rank1.join().unwrap().unwrap();
    assert_eq!(all, ["tcp://h:0", "tcp://h:1", "tcp://h:2"]);
    let mut rest = Vec::new();
    predecessor.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, [DONE], "the predecessor is told");
}

/// Rank 1's successor leaves while rank 1 waits for its predecessor, which is alive
/// but silent (it waits for its own predecessor, say a new process of rank 2 that
/// the tracker told to accept a link from rank 1's next attempt). Before the links
/// were watched, rank 1 waited out its whole limit here, and the new process with
/// it; now it fails at once, naming the successor.
#[test]
fn a_successor_that_leaves_fails_the_exchange_at_once() {
    let (mut ring, _predecessor, mut successor) = scripted();
    let began = Instant::now();
    let rank1 = std::thread::spawn(move || ring.exchange(1, 3, "tcp://h:1", LIMIT));
    first_frame(&mut successor, "tcp://h:1");
    drop(successor);
    let err = rank1.join().unwrap().unwrap_err().to_string();
    let took = began.elapsed();
    assert!(err.contains("the link to rank 2 closed"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}: {err}");
}

/// A successor whose exchange is over (it had every frame it needed) says so and
/// closes while rank 1 still waits for its predecessor's last frame: not a failure,
/// rank 1 goes on to the end of its own exchange.
#[test]
fn a_successor_that_finished_first_is_not_a_failure() {
    let (mut ring, mut predecessor, mut successor) = scripted();
    let rank1 = std::thread::spawn(move || ring.exchange(1, 3, "tcp://h:1", LIMIT));
    let mine = first_frame(&mut successor, "tcp://h:1");
    predecessor.write_all(&frame(7, "tcp://h:0")).unwrap();
    predecessor.write_all(&frame(9, "tcp://h:2")).unwrap();
    // The two entries rank 1 passes on: the successor has all it needs.
    let mut forwarded = vec![0u8; 2 * (8 + 4 + 9)];
    successor.read_exact(&mut forwarded).unwrap();
    successor.write_all(&[DONE]).unwrap();
    drop(successor);
    // Time for rank 1 to look at the closed link (the test passes either way if it
    // does not, but then it proves less).
    std::thread::sleep(Duration::from_millis(50));
    predecessor.write_all(&mine).unwrap();
    let all = rank1.join().unwrap().unwrap();
    assert_eq!(all, ["tcp://h:0", "tcp://h:1", "tcp://h:2"]);
}
