//! Hostile peers against a live `RouterSocket` over tcp:
//! peers that never read, oversized frames, floods, garbage, identity takeover. Each
//! test ends with a well-behaved client still served. The memory figures of the same attacks are measured in
//! `hostile_memory.rs`, alone in its process.
//!
//! Everything listens on 127.0.0.1 with a port chosen by the system, and every wait is
//! bounded.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostile_support;

use hostile_support::{RawDealer, WAIT, Zmtp, bind, good_client_is_served, options, request, wire};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Limits, Msg};
use switchyard_transports::{
    Dealer, DealerSocket, PeerId, RecvError, Router, RouterSocket, SendErrorKind, Socket,
};

/// Longer than any send that does not wait can take, even on a loaded machine, and
/// half the 20 s `send_timeout` a waiting send would take.
const PROMPT: Duration = Duration::from_secs(10);

/// Receives on `router` until it has dropped `expected` malformed messages; nothing
/// may reach the application meanwhile.
fn drain_until_dropped(router: &mut RouterSocket, expected: u64) {
    let deadline = Instant::now() + WAIT;
    while router.dropped_malformed() < expected {
        assert!(
            Instant::now() < deadline,
            "dropped {} of {expected} within {WAIT:?}",
            router.dropped_malformed()
        );
        match router.recv_from_timeout(Duration::from_millis(20)) {
            Err(RecvError::Timeout) => {}
            other => panic!("malformed input reached the application: {other:?}"),
        }
    }
}

/// A frame header declaring 2^40 bytes, under the default limits (1 GiB a frame): libzmq
/// (`MAXMSGSIZE`) closes the connection on reading the size, before allocating or
/// reading anything of the frame.
#[test]
fn declared_frame_over_the_limit_closes_the_connection() {
    let mut router = bind(options());
    let mut peer = Zmtp::dealer(router.endpoint(), b"liar");
    peer.frame(&request(1).encode_header(), true).unwrap();
    peer.frame_header(1 << 40, false).unwrap();
    peer.closed_within(WAIT)
        .expect("the router closes the liar's connection");
    good_client_is_served(&mut router, 7);
    assert_eq!(
        router.dropped_malformed(),
        0,
        "libzmq refused it, not the decoder"
    );
    assert!(!router.peers().contains(&PeerId::new("liar").unwrap()));
}

/// One message with far more parts than any valid one (50,000 x 100 B): it is buffered
/// by libzmq, then read part by part, dropped as `TooManyFrames` and counted once.
#[test]
fn huge_multipart_message_is_dropped_and_counted_once() {
    let mut router = bind(options());
    let raw = RawDealer::connect(router.endpoint(), b"many-parts", 1000);
    let mut frames = wire(&request(1));
    frames.resize(50_000, vec![0xab; 100]);
    raw.send(&frames);
    drain_until_dropped(&mut router, 1);
    good_client_is_served(&mut router, 8);
    assert_eq!(router.dropped_malformed(), 1);
    assert!(!router.peers().contains(&PeerId::new("many-parts").unwrap()));
}

/// Scenario 10 with two clients: a peer that sends requests and never reads its
/// replies fills its queue; the router's sends to it then come back at once as `Full`
/// with the message (never after `send_timeout`, set to 20 s here), and the other
/// client's round trips stay prompt throughout.
#[test]
fn a_peer_that_never_reads_does_not_stall_the_others() {
    let slow_send = Duration::from_secs(20);
    let mut router = bind(options().with_hwm(8).with_send_timeout(slow_send));
    let hostile = RawDealer::connect(router.endpoint(), b"never-reads", 1);
    let hostile_id = PeerId::new("never-reads").unwrap();
    hostile.send(&wire(&request(0)));
    let (peer, _) = router.recv_from_timeout(WAIT).expect("hostile request");
    assert_eq!(peer, hostile_id);

    // Fill the hostile peer: replies of 256 KiB until the router says Full.
    let big = bytes::Bytes::from(vec![0x5au8; 256 * 1024]);
    let deadline = Instant::now() + WAIT;
    let mut accepted = 0u64;
    loop {
        assert!(
            Instant::now() < deadline,
            "the hostile peer never filled up"
        );
        let reply = request(accepted).reply(Kind::Put).with_frame(big.clone());
        let started = Instant::now();
        match router.send_to(&hostile_id, reply) {
            Ok(()) => accepted += 1,
            Err(e) => {
                assert_eq!(e.kind, SendErrorKind::Full, "{e}");
                assert_eq!(e.msg.header.seq, accepted, "the message comes back");
                assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
                break;
            }
        }
    }

    // The good client makes 20 round trips while the hostile peer keeps asking.
    let endpoint = router.endpoint().to_string();
    let good = thread::spawn(move || {
        let mut dealer = DealerSocket::connect(&endpoint, options()).expect("connect");
        let mut slowest = Duration::ZERO;
        for seq in 100..120 {
            let started = Instant::now();
            dealer.send(request(seq)).expect("good send");
            let reply = dealer.recv_timeout(WAIT).expect("good reply");
            assert_eq!(reply.header.seq, seq);
            slowest = slowest.max(started.elapsed());
        }
        slowest
    });
    let (mut served, mut asked, mut refused) = (0, 0u64, 0);
    let deadline = Instant::now() + 2 * WAIT;
    while served < 20 {
        assert!(Instant::now() < deadline, "served {served} of 20");
        if asked < 50 {
            hostile.send(&wire(&request(1000 + asked)));
        }
        let Ok((peer, msg)) = router.recv_from_timeout(Duration::from_millis(50)) else {
            continue;
        };
        let started = Instant::now();
        let result = router.send_to(&peer, msg.reply(Kind::Put).with_frame(big.clone()));
        assert!(
            started.elapsed() < PROMPT,
            "a send waited {:?}",
            started.elapsed()
        );
        if peer == hostile_id {
            // libzmq keeps moving what it queued into the kernel's buffers, so now and
            // then a reply fits again; any that does not comes back as Full.
            asked += 1;
            if let Err(e) = result {
                assert_eq!(e.kind, SendErrorKind::Full, "{e}");
                refused += 1;
            }
        } else {
            result.expect("reply to the good client");
            served += 1;
        }
    }
    let slowest = good.join().expect("good client");
    assert!(slowest < slow_send / 2, "slowest round trip {slowest:?}");
    assert!(refused > 0, "the hostile peer kept asking meanwhile");
    good_client_is_served(&mut router, 9);
}

/// A peer that floods HELLOs and never reads: each READY that does not fit is dropped
/// (the HELLO's sender is not waited for), so the router's receives stay prompt.
#[test]
fn hello_flood_from_a_peer_that_never_reads_does_not_stall_receives() {
    let mut router = bind(
        options()
            .with_hwm(2)
            .with_send_timeout(Duration::from_secs(20)),
    );
    let endpoint = router.endpoint().to_string();
    let hostile = thread::spawn(move || {
        let hostile = RawDealer::connect(&endpoint, b"hello-flood", 1);
        let hello = wire(&Msg::new(Addr::stub(0), Addr::stub(0), Kind::Hello));
        // Enough READYs (48 bytes each) to fill the router's queue, the kernel's
        // buffers and the raw dealer's, several times over.
        for _ in 0..100_000 {
            hostile.send(&hello);
        }
        hostile.send(&wire(&request(5)));
        hostile
    });
    let started = Instant::now();
    let (peer, msg) = router
        .recv_from_timeout(3 * WAIT)
        .expect("the request after the HELLOs");
    assert_eq!(peer, PeerId::new("hello-flood").unwrap());
    assert_eq!(msg, request(5));
    // A router that waited on the full peer would take 20 s per READY from here on.
    assert!(started.elapsed() < 3 * WAIT, "took {:?}", started.elapsed());
    let _hostile = hostile.join().expect("hostile thread");
    good_client_is_served(&mut router, 10);
}

/// `ROUTER_HANDOVER`: without authentication, a peer that presents another dealer's
/// identity takes over its connection and receives what the router sends to that
/// identity; the victim gets nothing, and what it sends is lost. This test records the
/// behaviour without a job secret; with one, only a peer that presents the PLAIN password
/// can connect at all (see WIRE.md, "Security, trust and resource bounds").
#[test]
fn identity_takeover_without_authentication() {
    let mut router = bind(options());
    let endpoint = router.endpoint().to_string();
    let victim_id = PeerId::new("0/worker(0,1)").unwrap();
    let opts = options().with_identity(victim_id.clone());
    let connecting = thread::spawn(move || DealerSocket::connect(&endpoint, opts));
    router.await_peers(1, WAIT).expect("victim connects");
    let mut victim = connecting.join().unwrap().expect("victim");

    let impostor = RawDealer::connect(router.endpoint(), victim_id.as_bytes(), 1000);
    impostor.send(&wire(&request(66)));
    let (peer, msg) = router.recv_from_timeout(WAIT).expect("impostor's request");
    assert_eq!(peer, victim_id, "the router cannot tell them apart");
    assert_eq!(msg, request(66));

    router
        .send_to(&victim_id, request(67).reply(Kind::Put))
        .expect("send to the identity");
    let stolen = impostor
        .socket
        .recv_multipart(0)
        .expect("the impostor gets it");
    let stolen: Vec<bytes::Bytes> = stolen.into_iter().map(bytes::Bytes::from).collect();
    let stolen = Msg::from_wire(stolen, &Limits::default()).unwrap();
    assert_eq!(stolen.header.seq, 67);
    assert_eq!(
        victim.recv_timeout(Duration::from_millis(500)),
        Err(RecvError::Timeout),
        "the victim got nothing"
    );
    // The victim is cut off both ways, and neither side is told: what it sends now is
    // lost.
    victim
        .send(request(68))
        .expect("the victim's send is accepted locally");
    assert_eq!(
        router.recv_from_timeout(Duration::from_millis(500)),
        Err(RecvError::Timeout),
        "the victim's message arrived"
    );
    good_client_is_served(&mut router, 11);
}

/// Bytes that are not a ZMTP 3 greeting: libzmq would take them for a ZMTP 1.0 peer and
/// turn them into messages from made-up identities; with a ZAP domain set it refuses
/// the legacy protocols and closes the connection instead.
#[test]
fn raw_garbage_and_legacy_greetings_are_refused() {
    let mut router = bind(options());
    let cases: [(&str, &[u8]); 4] = [
        ("http request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        (
            "zmtp 1.0 identity frame",
            &[0x01, 0x00, 0x05, 0x00, b'h', b'i', b'!', b'!'],
        ),
        (
            "zmtp 2.0 greeting",
            &[0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 0x01, 0x05],
        ),
        (
            "random bytes",
            &[0x9c, 0x01, 0xfe, 0x33, 0x00, 0x10, 0x80, 0x7f, 0x00, 0x00],
        ),
    ];
    for (what, bytes) in cases {
        let mut peer = Zmtp::open(router.endpoint());
        use std::io::Write;
        peer.stream.write_all(bytes).unwrap();
        // Some garbage needs a few more bytes before libzmq decides; give it a frame's worth.
        let _ = peer.stream.write_all(&[0u8; 64]);
        if let Err(e) = peer.closed_within(WAIT) {
            panic!("{what}: {e}");
        }
        assert_eq!(
            router.recv_from_timeout(Duration::from_millis(100)),
            Err(RecvError::Timeout),
            "{what} became a message"
        );
    }
    assert_eq!(
        router.dropped_malformed(),
        0,
        "nothing got as far as the decoder"
    );
    // The hand-written ZMTP 3.0 client is right: the same code with a real greeting is
    // an ordinary peer.
    let mut honest = Zmtp::dealer(router.endpoint(), b"by-hand");
    honest.message(&request(3)).unwrap();
    let (peer, msg) = router.recv_from_timeout(WAIT).expect("hand-made message");
    assert_eq!(peer, PeerId::new("by-hand").unwrap());
    assert_eq!(msg, request(3));
    good_client_is_served(&mut router, 12);
}

/// What a test subscriber saw: the message of every `warn` event and, for summaries,
/// the count they carry.
#[derive(Default)]
struct Seen {
    dropped_lines: u64,
    summaries: Vec<u64>,
}

/// A minimal `tracing` subscriber that records `warn` events into `Seen`.
struct Recorder(Arc<Mutex<Seen>>);

#[derive(Default)]
struct Fields {
    message: String,
    suppressed: Option<u64>,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "suppressed" {
            self.suppressed = Some(value);
        }
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() == tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut seen = self.0.lock().unwrap();
        if fields.message == "dropped malformed message" {
            seen.dropped_lines += 1;
        } else if let Some(n) = fields.suppressed {
            seen.summaries.push(n);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A flood of malformed messages from one peer writes a handful of warn lines and a
/// summary with the count, while `dropped_malformed` counts every message.
#[test]
fn malformed_flood_warnings_are_rate_limited_and_counts_exact() {
    const FLOOD: u64 = 3000;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let started = Instant::now();
    {
        let _guard = tracing::subscriber::set_default(Recorder(seen.clone()));
        let mut router = bind(options());
        let raw = RawDealer::connect(router.endpoint(), b"flooder", 1000);
        for i in 0..FLOOD {
            raw.send(&[vec![0x9c, (i % 251) as u8, 0xfe]]);
        }
        drain_until_dropped(&mut router, FLOOD);
        good_client_is_served(&mut router, 13);
        assert_eq!(router.dropped_malformed(), FLOOD);
        // Dropping the router logs the summary of the window still open.
    }
    let windows = 1 + started.elapsed().as_secs() / 10;
    let seen = seen.lock().unwrap();
    let summarised: u64 = seen.summaries.iter().sum();
    assert_eq!(
        seen.dropped_lines + summarised,
        FLOOD,
        "every drop is logged or counted"
    );
    assert!(
        seen.dropped_lines <= 5 * windows,
        "{} full lines in {windows} windows",
        seen.dropped_lines
    );
    assert!(seen.dropped_lines >= 5, "the first ones are logged in full");
    assert!(
        seen.summaries.len() as u64 <= windows,
        "{:?}",
        seen.summaries
    );
}
