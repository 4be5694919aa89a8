//! The Poller over ZeroMQ sockets and over a mix of backends: it wakes for the socket
//! that has a message, and times out when none has.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Msg};
use switchyard_transports::{
    Dealer, DealerSocket, Poller, Router, RouterSocket, Socket, SocketOptions,
};

const WAIT: Duration = Duration::from_secs(10);

fn connected(router: &mut RouterSocket) -> DealerSocket {
    let endpoint = router.endpoint().to_string();
    let t = std::thread::spawn(move || {
        DealerSocket::connect(&endpoint, SocketOptions::default()).unwrap()
    });
    router.await_peers(1, WAIT).unwrap();
    t.join().unwrap()
}

fn get() -> Msg {
    Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get)
}

#[test]
fn zmq_sockets_wake_the_poller() {
    let mut a = RouterSocket::bind("tcp://127.0.0.1:0", SocketOptions::default()).unwrap();
    let mut b = RouterSocket::bind("tcp://127.0.0.1:0", SocketOptions::default()).unwrap();
    let _da = connected(&mut a);
    let mut db = connected(&mut b);
    let mut poller = Poller::new();
    let started = Instant::now();
    assert_eq!(
        poller.poll(&[&a, &b], Duration::from_millis(100)).unwrap(),
        None
    );
    assert!(started.elapsed() >= Duration::from_millis(90));
    db.send(get()).unwrap();
    assert_eq!(poller.poll(&[&a, &b], WAIT).unwrap(), Some(1));
    assert_eq!(b.recv_timeout(WAIT).unwrap().header.kind, Kind::Get);
}

#[test]
fn mixed_backends_wake_the_poller() {
    let mut zmq_router = RouterSocket::bind("tcp://127.0.0.1:0", SocketOptions::default()).unwrap();
    let local_router =
        RouterSocket::bind("local://poller-mixed", SocketOptions::default()).unwrap();
    let mut dealer = connected(&mut zmq_router);
    let mut poller = Poller::new();
    assert_eq!(
        poller
            .poll(&[&local_router, &zmq_router], Duration::from_millis(50))
            .unwrap(),
        None
    );
    dealer.send(get()).unwrap();
    assert_eq!(
        poller.poll(&[&local_router, &zmq_router], WAIT).unwrap(),
        Some(1)
    );
    assert_eq!(
        zmq_router.recv_timeout(WAIT).unwrap().header.kind,
        Kind::Get
    );
}
