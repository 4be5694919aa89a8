//! The job secret on ZeroMQ tcp links (PLAIN checked by a ZAP handler): a peer without
//! the secret and one with a wrong secret get no message through, and a peer with it is
//! served. The secret is read once per process, so the checks run in a child process
//! of this test binary started with `SWITCHYARD_JOB_SECRET` set.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Msg};
use switchyard_transports::{
    Dealer, DealerSocket, RecvError, Router, RouterSocket, Socket, SocketOptions,
};

const CHILD: &str = "SWITCHYARD_ZMQ_SECRET_TEST_CHILD";
const WAIT: Duration = Duration::from_secs(10);
/// How long a refused stranger's message is waited for: libzmq refuses at the
/// handshake, so nothing can arrive however long one waits; this bounds the test.
const QUIET: Duration = Duration::from_millis(700);

fn options() -> SocketOptions {
    SocketOptions::default()
        .with_connect_timeout(WAIT)
        .with_send_timeout(WAIT)
        .with_linger(Duration::ZERO)
}

fn request(seq: u64) -> Msg {
    Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Update)
        .with_seq(seq)
        .with_frame(&b"gradient"[..])
}

/// A raw libzmq dealer on its own context, as a stranger's program would make it,
/// sending one well-formed request.
fn stranger(endpoint: &str, password: Option<&str>) -> (zmq::Context, zmq::Socket) {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::DEALER).unwrap();
    socket.set_linger(0).unwrap();
    if let Some(password) = password {
        socket.set_plain_username(Some("switchyard")).unwrap();
        socket.set_plain_password(Some(password)).unwrap();
    }
    socket.connect(endpoint).unwrap();
    let frames: Vec<Vec<u8>> = request(1).to_wire().iter().map(|f| f.to_vec()).collect();
    socket.send_multipart(frames, zmq::DONTWAIT).ok();
    (context, socket)
}

fn nothing_arrives(router: &mut RouterSocket) {
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        match router.recv_from_timeout(Duration::from_millis(50)) {
            Err(RecvError::Timeout) => {}
            other => panic!("a stranger's message got through: {other:?}"),
        }
    }
}

fn child() {
    let mut router = RouterSocket::bind("tcp://127.0.0.1:0", options()).unwrap();
    let endpoint = router.endpoint().to_string();
    let _null = stranger(&endpoint, None);
    nothing_arrives(&mut router);
    let _wrong = stranger(&endpoint, Some(&"0".repeat(64)));
    nothing_arrives(&mut router);

    let client = std::thread::spawn(move || {
        let mut dealer = DealerSocket::connect(&endpoint, options()).expect("good connect");
        dealer.send(request(7)).expect("good send");
        dealer.recv_timeout(WAIT).expect("good reply")
    });
    let deadline = Instant::now() + WAIT;
    let peer = loop {
        assert!(Instant::now() < deadline, "the good request never arrived");
        match router.recv_from_timeout(Duration::from_millis(50)) {
            Ok((peer, msg)) if msg == request(7) => break peer,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => {}
        }
    };
    router.send_to(&peer, request(7).reply(Kind::Put)).unwrap();
    assert_eq!(client.join().unwrap().header.kind, Kind::Put);
    println!("zmq secret child: ok");
}

#[test]
fn zmq_links_refuse_peers_without_the_job_secret() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            support::test_name(
                module_path!(),
                "zmq_links_refuse_peers_without_the_job_secret",
            )
            .as_str(),
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("SWITCHYARD_JOB_SECRET", "0123456789abcdef0123456789abcdef")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: kill the child if it outlives the limit.
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child ran over 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("zmq secret child: ok"),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
