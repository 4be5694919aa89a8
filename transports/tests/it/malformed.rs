//! Malformed input over the `zmq` backend: a raw libzmq DEALER (the `zmq` crate, its
//! own context, so tcp only) sends a `RouterSocket` garbage of every kind; the
//! router drops and counts each message
//! (`Router::dropped_malformed`), never hands one to the application, and keeps serving
//! a well-behaved `DealerSocket`. A frame over `Limits::max_frame_bytes` is refused by
//! libzmq itself (`MAXMSGSIZE` disconnects the raw peer), which also leaves the router
//! working. Every wait is bounded.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::thread;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Limits, Msg, Target};
use switchyard_transports::{
    Dealer, DealerSocket, PeerId, RecvError, Router, RouterSocket, Socket, SocketOptions,
};

const WAIT: Duration = Duration::from_secs(10);

fn options() -> SocketOptions {
    SocketOptions::default()
        .with_connect_timeout(WAIT)
        .with_send_timeout(WAIT)
        .with_linger(Duration::ZERO)
}

fn bind(options: SocketOptions) -> RouterSocket {
    RouterSocket::bind("tcp://127.0.0.1:0", options).expect("bind")
}

fn good_msg() -> Msg {
    Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Update)
        .with_target(Target::Param(3))
        .with_seq(77)
        .with_frame(&b"gradient"[..])
}

/// A raw libzmq DEALER on its own context, connected to `endpoint`.
struct RawDealer {
    socket: zmq::Socket,
    context: zmq::Context,
}

impl RawDealer {
    fn connect(endpoint: &str, identity: &[u8]) -> RawDealer {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_sndtimeo(10_000).unwrap();
        socket.set_identity(identity).unwrap();
        socket.connect(endpoint).unwrap();
        RawDealer { socket, context }
    }

    fn send(&self, frames: &[Vec<u8>]) {
        self.socket.send_multipart(frames, 0).unwrap();
    }
}

/// The garbage messages the router must drop, one `Vec` of frames each.
fn garbage() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let header = |frames: usize| {
        Msg::from_parts(good_msg().header, vec![bytes::Bytes::new(); frames])
            .encode_header()
            .to_vec()
    };
    let patched = |at: usize, value: u8| {
        let mut h = header(0);
        h[at] = value;
        vec![h]
    };
    let mut trailing = header(0);
    trailing.extend_from_slice(b"tail");
    let mut many = vec![header(0)];
    many.resize(2001, Vec::new());
    vec![
        ("empty frame", vec![Vec::new()]),
        ("3 random bytes", vec![vec![0x9c, 0x01, 0xfe]]),
        ("wrong magic", patched(0, b'X')),
        ("version 1 (an older peer)", patched(2, 1)),
        ("non-zero flags", patched(3, 0x80)),
        ("role tag 3", patched(12, 3)),
        (
            "declares 2 frames, 1 sent",
            vec![header(2), b"only one".to_vec()],
        ),
        ("trailing bytes", vec![trailing]),
        ("300-byte header frame", vec![vec![b'S'; 300]]),
        ("2000 empty frames", many),
    ]
}

/// Receives on `router` until it has dropped `expected` messages, failing on any
/// message it hands over meanwhile.
fn drain_until_dropped(router: &mut RouterSocket, expected: u64) {
    let deadline = Instant::now() + WAIT;
    while router.dropped_malformed() < expected {
        assert!(
            Instant::now() < deadline,
            "router dropped {} of {expected} malformed messages within {WAIT:?}",
            router.dropped_malformed()
        );
        match router.recv_from_timeout(Duration::from_millis(20)) {
            Err(RecvError::Timeout) => {}
            other => panic!("malformed input reached the application: {other:?}"),
        }
    }
}

/// Connects a switchyard dealer in a thread (its connect waits for the READY that the
/// router sends from `recv`), sends `good_msg()`, and checks the router gets exactly
/// that, then answers it.
fn good_dealer_still_works(router: &mut RouterSocket) {
    let endpoint = router.endpoint().to_string();
    let worker = thread::spawn(move || {
        let mut dealer = DealerSocket::connect(&endpoint, options()).expect("connect");
        dealer.send(good_msg()).expect("send");
        let reply = dealer.recv_timeout(WAIT).expect("reply");
        (dealer.identity().clone(), reply)
    });
    let (peer, msg) = router.recv_from_timeout(WAIT).expect("good message");
    assert_eq!(msg, good_msg());
    router
        .send_to(&peer, msg.reply(Kind::Put).with_frame(&b"ok"[..]))
        .expect("reply");
    let (identity, reply) = worker.join().expect("dealer thread");
    assert_eq!(peer, identity);
    assert_eq!(reply.header.kind, Kind::Put);
    assert_eq!(reply.header.seq, 77);
    assert_eq!(&reply.frames()[0][..], b"ok");
    assert!(router.peers().contains(&peer));
}

#[test]
fn garbage_is_dropped_and_counted_over_tcp() {
    let mut router = bind(options());
    let raw = RawDealer::connect(router.endpoint(), b"raw-garbage");
    let garbage = garbage();
    for (_, frames) in &garbage {
        raw.send(frames);
    }
    let count = garbage.len() as u64;
    drain_until_dropped(&mut router, count);
    good_dealer_still_works(&mut router);
    // The good message was the only one delivered, and nothing else was dropped.
    assert_eq!(
        router.recv_from_timeout(Duration::from_millis(200)),
        Err(RecvError::Timeout)
    );
    assert_eq!(router.dropped_malformed(), count);
    // The raw peer never became a known peer: nothing it sent decoded.
    assert!(
        !router
            .peers()
            .contains(&PeerId::new("raw-garbage").unwrap())
    );

    // Garbage after the good dealer joined is dropped the same way, one at a time.
    for (i, (what, frames)) in garbage.iter().enumerate() {
        raw.send(frames);
        drain_until_dropped(&mut router, count + i as u64 + 1);
        assert_eq!(router.dropped_malformed(), count + i as u64 + 1, "{what}");
    }
}

#[test]
fn well_formed_raw_message_is_delivered() {
    // The converse of the garbage test: the same raw socket sending a correct wire
    // form (header frame, then payload frames) is an ordinary peer.
    let mut router = bind(options());
    let raw = RawDealer::connect(router.endpoint(), b"raw-good");
    let frames: Vec<Vec<u8>> = good_msg().to_wire().iter().map(|f| f.to_vec()).collect();
    raw.send(&frames);
    let (peer, msg) = router.recv_from_timeout(WAIT).expect("recv");
    assert_eq!(peer, PeerId::new("raw-good").unwrap());
    assert_eq!(msg, good_msg());
    assert_eq!(router.dropped_malformed(), 0);
    // The router answers a raw HELLO with READY, src and dst swapped.
    let hello = Msg::new(Addr::worker(2, 5), Addr::stub(1), Kind::Hello).with_seq(9);
    let frames: Vec<Vec<u8>> = hello.to_wire().iter().map(|f| f.to_vec()).collect();
    raw.send(&frames);
    raw.socket.set_rcvtimeo(10_000).unwrap();
    assert_eq!(
        router.recv_from_timeout(Duration::from_millis(200)),
        Err(RecvError::Timeout)
    );
    let ready = raw.socket.recv_multipart(0).expect("READY");
    let ready: Vec<bytes::Bytes> = ready.into_iter().map(bytes::Bytes::from).collect();
    let ready = Msg::from_wire(ready, &Limits::default()).expect("decode READY");
    assert_eq!(ready.header.kind, Kind::Ready);
    assert_eq!(ready.header.src, Addr::stub(1));
    assert_eq!(ready.header.dst, Addr::worker(2, 5));
    assert_eq!(ready.header.seq, 9);
    assert!(ready.frames().is_empty());
}

#[test]
fn frame_over_max_frame_bytes_disconnects_the_raw_peer() {
    let limits = Limits::default().with_max_frame_bytes(1024);
    let mut router = bind(options().with_limits(limits));
    let raw = RawDealer::connect(router.endpoint(), b"raw-oversized");
    let monitor_endpoint = format!("inproc://monitor-{}", std::process::id());
    raw.socket
        .monitor(&monitor_endpoint, zmq::SocketEvent::DISCONNECTED as i32)
        .unwrap();
    let monitor = raw.context.socket(zmq::PAIR).unwrap();
    monitor.set_rcvtimeo(10_000).unwrap();
    monitor.connect(&monitor_endpoint).unwrap();

    let header = Msg::from_parts(good_msg().header, vec![bytes::Bytes::new()])
        .encode_header()
        .to_vec();
    raw.send(&[header, vec![0u8; 4096]]);
    // libzmq (MAXMSGSIZE) closes the connection; the router never sees the message.
    let event = monitor.recv_multipart(0).expect("DISCONNECTED event");
    let code = u16::from_le_bytes([event[0][0], event[0][1]]);
    assert_eq!(code, zmq::SocketEvent::DISCONNECTED as u16);

    good_dealer_still_works(&mut router);
    assert_eq!(
        router.recv_from_timeout(Duration::from_millis(200)),
        Err(RecvError::Timeout)
    );
    assert_eq!(router.dropped_malformed(), 0);
    assert!(
        !router
            .peers()
            .contains(&PeerId::new("raw-oversized").unwrap())
    );
}

#[test]
fn frame_over_max_frame_bytes_but_under_maxmsgsize_is_dropped_by_the_decoder() {
    // MAXMSGSIZE is max(max_frame_bytes, max_header_bytes) = 256 here, so a 200-byte
    // payload frame passes libzmq and is refused by `Msg::from_wire` (FrameTooLarge).
    let limits = Limits::default().with_max_frame_bytes(100);
    let mut router = bind(options().with_limits(limits));
    let raw = RawDealer::connect(router.endpoint(), b"raw-big-frame");
    let header = Msg::from_parts(good_msg().header, vec![bytes::Bytes::new()])
        .encode_header()
        .to_vec();
    raw.send(&[header, vec![0u8; 200]]);
    drain_until_dropped(&mut router, 1);
    good_dealer_still_works(&mut router);
    assert_eq!(router.dropped_malformed(), 1);
}
