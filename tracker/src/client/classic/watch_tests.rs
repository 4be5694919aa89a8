#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::net::TcpListener;

/// A connected pair: (this worker's end, the peer's end).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mine = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (theirs, _) = listener.accept().unwrap();
    (mine, theirs)
}

/// Links to ranks 3 (read from) and 4 (watched), and the peers' ends.
fn links() -> (WatchedLinks, TcpStream, TcpStream, TcpStream) {
    let (three, three_peer) = pair();
    let (four, four_peer) = pair();
    let reading = three.try_clone().unwrap();
    let links = WatchedLinks::new(BTreeMap::from([(3, three), (4, four)]));
    (links, reading, three_peer, four_peer)
}

/// Far enough away that a test which reaches it has waited wrongly.
fn later() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// The ring successor's process dies while this worker waits for its predecessor,
/// which stays silent (it waits upstream): the wait ends at once, naming the rank
/// that left. Without the watch it lasted the whole limit.
#[test]
fn a_watched_link_that_closes_ends_the_wait_at_once() {
    let (mut links, reading, _three_peer, four_peer) = links();
    drop(four_peer);
    let began = Instant::now();
    let err = links.wait_readable(&reading, Some(3), later()).unwrap_err();
    assert!(
        matches!(err, ClientError::LinkClosed { rank: 4, .. }),
        "{err}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
}

/// A peer that leaves with bytes of ours unread resets the connection: a failure too.
#[test]
fn a_reset_link_is_a_peer_that_left() {
    let (mut links, reading, _three_peer, four_peer) = links();
    links.links[&4]
        .try_clone()
        .unwrap()
        .write_all(b"unread")
        .unwrap();
    // Let the bytes arrive, so that the close below resets.
    let mut b = [0u8; 1];
    four_peer.peek(&mut b).unwrap();
    drop(four_peer);
    let err = links.wait_readable(&reading, Some(3), later()).unwrap_err();
    assert!(
        matches!(err, ClientError::LinkClosed { rank: 4, .. }),
        "{err}"
    );
}

/// A peer whose exchange is over says so before it closes: not a failure, and the
/// wait goes on until the link read from has something.
#[test]
fn a_peer_that_said_done_may_close() {
    let (mut links, reading, mut three_peer, mut four_peer) = links();
    four_peer.write_all(&[DONE]).unwrap();
    drop(four_peer);
    // Taken as finished, however often it is looked at.
    let until = Instant::now() + Duration::from_millis(30);
    links.wait_readable(&reading, Some(3), until).unwrap();
    links.check(Some(3)).unwrap();
    three_peer.write_all(b"frame").unwrap();
    links.wait_readable(&reading, Some(3), later()).unwrap();
    let mut got = [0u8; 5];
    (&reading).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"frame");
}

/// The link read from is not watched: its end is the caller's read to report.
#[test]
fn the_link_read_from_is_left_to_the_caller() {
    let (mut links, reading, three_peer, _four_peer) = links();
    drop(three_peer);
    links.wait_readable(&reading, Some(3), later()).unwrap();
    let mut b = [0u8; 1];
    assert_eq!((&reading).read(&mut b).unwrap(), 0);
}

/// Nothing but the done mark may come on a watched link.
#[test]
fn another_byte_on_a_watched_link_is_refused() {
    let (mut links, reading, _three_peer, mut four_peer) = links();
    four_peer.write_all(&[7]).unwrap();
    let err = links.wait_readable(&reading, Some(3), later()).unwrap_err();
    assert!(err.to_string().contains("rank 4 sent byte 0x07"), "{err}");
}

/// `finish` sends the done mark on every link, then closes them.
#[test]
fn finish_says_done_on_every_link_then_closes() {
    let (mut links, reading, mut three_peer, mut four_peer) = links();
    drop(reading);
    links.finish();
    for peer in [&mut three_peer, &mut four_peer] {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got, [DONE]);
    }
}

/// The wait ends when its deadline passes, for the caller's read to report.
#[test]
fn the_wait_ends_at_its_deadline() {
    let (mut links, reading, _three_peer, _four_peer) = links();
    let began = Instant::now();
    links
        .wait_readable(&reading, Some(3), began + Duration::from_millis(50))
        .unwrap();
    let took = began.elapsed();
    assert!(took >= Duration::from_millis(50), "{took:?}");
}
