//! Tools for the hostile-peer tests: a ZMTP 3.0 client written by hand over a plain
//! `TcpStream` (so a test can declare frame sizes it never sends, or stream a message
//! far larger than it holds), raw libzmq dealers, and the process's memory figures.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Msg, Target};
use switchyard_transports::{Dealer, DealerSocket, Router, RouterSocket, Socket, SocketOptions};

/// Every wait in these tests.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Options with bounded waits and no linger.
pub(crate) fn options() -> SocketOptions {
    SocketOptions::default()
        .with_connect_timeout(WAIT)
        .with_send_timeout(WAIT)
        .with_linger(Duration::ZERO)
}

/// A router on 127.0.0.1, port chosen by the system.
pub(crate) fn bind(options: SocketOptions) -> RouterSocket {
    RouterSocket::bind("tcp://127.0.0.1:0", options).expect("bind")
}

/// `tcp://127.0.0.1:PORT` -> `127.0.0.1:PORT`.
pub(crate) fn socket_addr(endpoint: &str) -> String {
    endpoint.trim_start_matches("tcp://").to_string()
}

/// A well-formed request with a payload.
pub(crate) fn request(seq: u64) -> Msg {
    Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Update)
        .with_target(Target::Param(3))
        .with_seq(seq)
        .with_frame(&b"gradient"[..])
}

/// The wire frames of `msg` as owned vectors (for raw sockets).
pub(crate) fn wire(msg: &Msg) -> Vec<Vec<u8>> {
    msg.to_wire().iter().map(|f| f.to_vec()).collect()
}

/// A raw libzmq DEALER on its own context (so tcp only), as a hostile peer uses it.
pub(crate) struct RawDealer {
    pub(crate) socket: zmq::Socket,
    pub(crate) context: zmq::Context,
}

impl RawDealer {
    /// Connects with `identity`; `rcvhwm` bounds what it queues unread.
    pub(crate) fn connect(endpoint: &str, identity: &[u8], rcvhwm: i32) -> RawDealer {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_sndtimeo(10_000).unwrap();
        socket.set_rcvtimeo(10_000).unwrap();
        socket.set_rcvhwm(rcvhwm).unwrap();
        socket.set_identity(identity).unwrap();
        socket.connect(endpoint).unwrap();
        RawDealer { socket, context }
    }

    /// Sends one multipart message.
    pub(crate) fn send(&self, frames: &[Vec<u8>]) {
        self.socket.send_multipart(frames, 0).unwrap();
    }
}

/// A switchyard dealer connected from a thread (its connect waits for the READY that
/// the router sends from a receive), then one request and its reply: the good client
/// of every test. Runs the router side here and returns once the reply is in.
pub(crate) fn good_client_is_served(router: &mut RouterSocket, seq: u64) {
    let endpoint = router.endpoint().to_string();
    let client = thread::spawn(move || {
        let mut dealer = DealerSocket::connect(&endpoint, options()).expect("good connect");
        dealer.send(request(seq)).expect("good send");
        let reply = dealer.recv_timeout(WAIT).expect("good reply");
        (dealer.identity().clone(), reply)
    });
    let deadline = Instant::now() + WAIT;
    let peer = loop {
        assert!(Instant::now() < deadline, "the good request never arrived");
        match router.recv_from_timeout(Duration::from_millis(50)) {
            Ok((peer, msg)) if msg == request(seq) => break peer,
            Ok(_) | Err(_) => {}
        }
    };
    router
        .send_to(&peer, request(seq).reply(Kind::Put))
        .expect("reply to the good client");
    let (identity, reply) = client.join().expect("good client thread");
    assert_eq!(identity, peer);
    assert_eq!(reply.header.kind, Kind::Put);
    assert_eq!(reply.header.seq, seq);
}

/// A hand-written ZMTP peer over plain TCP.
pub(crate) struct Zmtp {
    pub(crate) stream: TcpStream,
}

impl Zmtp {
    /// Opens a TCP connection and sends nothing.
    pub(crate) fn open(endpoint: &str) -> Zmtp {
        let stream = TcpStream::connect(socket_addr(endpoint)).expect("tcp connect");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream.set_write_timeout(Some(WAIT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Zmtp { stream }
    }

    /// Opens a connection and completes a ZMTP 3.0 NULL handshake as a DEALER with
    /// `identity`, as libzmq would.
    pub(crate) fn dealer(endpoint: &str, identity: &[u8]) -> Zmtp {
        let mut peer = Zmtp::open(endpoint);
        let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
        let mut mechanism = b"NULL".to_vec();
        mechanism.resize(20, 0);
        greeting.extend_from_slice(&mechanism);
        greeting.push(0); // as-server
        greeting.resize(64, 0); // filler
        peer.stream.write_all(&greeting).unwrap();
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        for (name, value) in [
            (&b"Socket-Type"[..], &b"DEALER"[..]),
            (b"Identity", identity),
        ] {
            body.push(name.len() as u8);
            body.extend_from_slice(name);
            body.extend_from_slice(&(value.len() as u32).to_be_bytes());
            body.extend_from_slice(value);
        }
        peer.command(&body);
        // The router's greeting (64 bytes) and its READY command.
        let mut theirs = [0u8; 64];
        peer.stream
            .read_exact(&mut theirs)
            .expect("router greeting");
        assert_eq!(theirs[0], 0xff, "not a ZMTP 3 greeting");
        assert_eq!(theirs[10], 3, "not ZMTP 3");
        let mut head = [0u8; 2];
        peer.stream.read_exact(&mut head).expect("router READY");
        assert_eq!(head[0], 0x04, "a short command");
        let mut ready = vec![0u8; usize::from(head[1])];
        peer.stream
            .read_exact(&mut ready)
            .expect("router READY body");
        assert!(ready.starts_with(b"\x05READY"));
        peer
    }

    fn command(&mut self, body: &[u8]) {
        let mut frame = vec![0x04, body.len() as u8];
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).unwrap();
    }

    /// Writes the header of one frame declaring `len` bytes (`more`: another follows).
    pub(crate) fn frame_header(&mut self, len: u64, more: bool) -> std::io::Result<()> {
        let more = u8::from(more);
        if len < 256 {
            self.stream.write_all(&[more, len as u8])
        } else {
            let mut head = vec![more | 0x02];
            head.extend_from_slice(&len.to_be_bytes());
            self.stream.write_all(&head)
        }
    }

    /// Writes one whole frame.
    pub(crate) fn frame(&mut self, data: &[u8], more: bool) -> std::io::Result<()> {
        self.frame_header(data.len() as u64, more)?;
        self.stream.write_all(data)
    }

    /// Writes `msg` as one message.
    pub(crate) fn message(&mut self, msg: &Msg) -> std::io::Result<()> {
        let frames = wire(msg);
        let last = frames.len() - 1;
        for (i, f) in frames.iter().enumerate() {
            self.frame(f, i < last)?;
        }
        Ok(())
    }

    /// Reads until the other side closes the connection; `Ok(bytes read)` if it did
    /// within `wait`, `Err` if it was still open.
    pub(crate) fn closed_within(&mut self, wait: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + wait;
        let mut total = 0;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("still open after {wait:?} ({total} bytes read)"));
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(total),
                Ok(n) => total += n,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(total),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }
}

/// `VmRSS` and `VmHWM` (peak) of this process, in bytes.
pub(crate) fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .expect("memory field")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets `VmHWM` to the current RSS (Linux `clear_refs` 5); false where not allowed.
pub(crate) fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
