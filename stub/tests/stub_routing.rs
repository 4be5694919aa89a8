//! The stub: address table, thread sockets, forwarding between processes (two stubs
//! in one test process, linked over tcp loopback as separate processes would be).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;
use switchyard_msg::{Addr, Kind, Msg, Target};
use switchyard_stub::{AddressTable, ClusterLayout, Stub, StubError};
use switchyard_transports::{Dealer, DealerSocket, SendErrorKind, Socket, SocketOptions};

const WAIT: Duration = Duration::from_secs(10);

/// Where each test stub binds: tcp loopback when ZeroMQ is built, else local queues
/// (the stub's logic is the same over both).
fn bind_endpoint() -> String {
    if cfg!(feature = "zmq") {
        "tcp://127.0.0.1:0".into()
    } else {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        format!("local://stub-test-{}", N.fetch_add(1, Ordering::Relaxed))
    }
}

fn two_stubs(layout: ClusterLayout) -> (Stub, Stub) {
    let a = Stub::bind(
        layout.clone(),
        0,
        &bind_endpoint(),
        SocketOptions::default(),
    )
    .unwrap();
    let b = Stub::bind(layout, 1, &bind_endpoint(), SocketOptions::default()).unwrap();
    let endpoints = vec![a.endpoint().to_string(), b.endpoint().to_string()];
    (
        a.start(endpoints.clone()).unwrap(),
        b.start(endpoints).unwrap(),
    )
}

#[test]
fn routes_between_processes_and_back() {
    let (a, b) = two_stubs(ClusterLayout::new(1, 1, 1, 1));
    let mut worker = a.worker(0, 0).unwrap();
    let mut server = b.server(0, 0).unwrap();
    for seq in 0..100u64 {
        let get = Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get)
            .with_target(Target::Param(seq as u32))
            .with_seq(seq)
            .with_frame(vec![seq as u8; 100_000]);
        worker.send(get.clone()).unwrap();
        let got = server.recv_timeout(WAIT).unwrap();
        assert_eq!(got, get, "header and frames arrive unchanged");
        server.send(got.reply(Kind::Put)).unwrap();
        let put = worker.recv_timeout(WAIT).unwrap();
        assert_eq!((put.header.kind, put.header.seq), (Kind::Put, seq));
    }
    assert_eq!(a.misrouted() + b.misrouted(), 0);
}

#[test]
fn local_delivery_shares_frames() {
    let layout = ClusterLayout::new(1, 2, 0, 0).with_workers_per_process(2);
    let stub = Stub::bind(layout, 0, "local://stub-share", SocketOptions::default()).unwrap();
    let endpoints = vec![stub.endpoint().to_string()];
    let stub = stub.start(endpoints).unwrap();
    let mut w0 = stub.worker(0, 0).unwrap();
    let mut w1 = stub.worker(0, 1).unwrap();
    let frame = bytes::Bytes::from(vec![7u8; 4096]);
    let ptr = frame.as_ptr();
    w0.send(Msg::new(Addr::worker(0, 0), Addr::worker(0, 1), Kind::FeaBlob).with_frame(frame))
        .unwrap();
    let got = w1.recv_timeout(WAIT).unwrap();
    assert_eq!(
        got.frames()[0].as_ptr(),
        ptr,
        "forwarding must not copy frames"
    );
}

#[test]
fn unknown_address_comes_back_to_sender() {
    let (a, _b) = two_stubs(ClusterLayout::new(1, 1, 1, 1));
    let mut worker = a.worker(0, 0).unwrap();
    let lost = Msg::new(Addr::worker(0, 0), Addr::server(0, 9), Kind::Get).with_seq(3);
    let err = worker.send(lost).unwrap_err();
    assert_eq!(err.kind, SendErrorKind::UnknownAddress(Addr::server(0, 9)));
    assert_eq!(err.msg.header.seq, 3);
}

#[test]
fn socket_handout_errors() {
    let (a, _b) = two_stubs(ClusterLayout::new(1, 1, 1, 1));
    assert!(matches!(
        a.server(0, 0),
        Err(StubError::NotLocal {
            process: 1,
            rank: 0,
            ..
        })
    ));
    assert!(matches!(
        a.worker(3, 0),
        Err(StubError::UnknownAddress { .. })
    ));
    let _w = a.worker(0, 0).unwrap();
    assert!(matches!(
        a.worker(0, 0),
        Err(StubError::AlreadyTaken { .. })
    ));
}

#[test]
fn messages_wait_for_late_threads() {
    let (a, b) = two_stubs(ClusterLayout::new(1, 1, 1, 1));
    let mut worker = a.worker(0, 0).unwrap();
    for seq in 0..5 {
        worker
            .send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Put).with_seq(seq))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let mut server = b.server(0, 0).unwrap();
    for seq in 0..5 {
        assert_eq!(server.recv_timeout(WAIT).unwrap().header.seq, seq);
    }
}

#[test]
fn stray_dealer_cannot_disturb_forwarding() {
    let layout = ClusterLayout::new(1, 1, 1, 1);
    let a = Stub::bind(
        layout.clone(),
        0,
        &bind_endpoint(),
        SocketOptions::default(),
    )
    .unwrap();
    let b = Stub::bind(layout, 1, &bind_endpoint(), SocketOptions::default()).unwrap();
    let b_endpoint = b.endpoint().to_string();
    let endpoints = vec![a.endpoint().to_string(), b_endpoint.clone()];
    let a = a.start(endpoints.clone()).unwrap();
    let b = b.start(endpoints).unwrap();
    let mut stray = DealerSocket::connect(&b_endpoint, SocketOptions::default()).unwrap();
    stray
        .send(Msg::new(Addr::worker(0, 0), Addr::worker(0, 0), Kind::Put))
        .unwrap();
    let mut worker = a.worker(0, 0).unwrap();
    let mut server = b.server(0, 0).unwrap();
    worker
        .send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get).with_seq(8))
        .unwrap();
    assert_eq!(server.recv_timeout(WAIT).unwrap().header.seq, 8);
    assert_eq!(
        b.misrouted(),
        1,
        "the message for a thread of process 0 was dropped"
    );
}

#[test]
fn table_is_a_pure_function_of_the_layout() {
    let layout = ClusterLayout::new(3, 4, 2, 3)
        .with_workers_per_process(5)
        .with_servers_per_process(2)
        .with_separate_servers(true);
    let t1 = AddressTable::new(&layout).unwrap();
    let t2 = AddressTable::new(&layout.clone()).unwrap();
    // 12 workers in processes of 5 -> 3; 6 servers in processes of 2 -> 3.
    assert_eq!(t1.num_processes(), 6);
    let mut seen = 0;
    for p in 0..t1.num_processes() {
        assert_eq!(t1.hosted_by(p), t2.hosted_by(p));
        for (slot, addr) in t1.hosted_by(p).iter().enumerate() {
            let loc = t1.locate(*addr).unwrap();
            assert_eq!((loc.process, loc.slot), (p, slot));
            seen += 1;
        }
    }
    assert_eq!(seen, 18);
    let shared = ClusterLayout::new(1, 4, 1, 2)
        .with_workers_per_process(2)
        .with_separate_servers(false);
    let t = AddressTable::new(&shared).unwrap();
    assert_eq!(t.num_processes(), 2);
    assert_eq!(
        t.hosted_by(0),
        &[Addr::worker(0, 0), Addr::worker(0, 1), Addr::server(0, 0)]
    );
}

#[test]
fn bad_layouts_and_endpoint_lists_are_errors() {
    assert!(matches!(
        ClusterLayout::new(0, 0, 0, 0).num_processes(),
        Err(StubError::Layout { .. })
    ));
    let zero = ClusterLayout::new(1, 2, 0, 0).with_workers_per_process(0);
    assert!(matches!(
        zero.num_processes(),
        Err(StubError::Layout { .. })
    ));
    let layout = ClusterLayout::new(1, 1, 1, 1);
    assert!(matches!(
        Stub::bind(
            layout.clone(),
            2,
            "local://bad-rank",
            SocketOptions::default()
        ),
        Err(StubError::RankOutOfRange {
            rank: 2,
            processes: 2
        })
    ));
    let bound = Stub::bind(layout, 0, "local://bad-count", SocketOptions::default()).unwrap();
    assert!(matches!(
        bound.start(vec!["local://bad-count".into()]),
        Err(StubError::EndpointCount {
            expected: 2,
            got: 1
        })
    ));
}
