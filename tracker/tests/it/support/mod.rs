//! Hand-written byte clients for the tracker tests: every byte written here follows
//! the classic rabit protocol and XGBoost's JSON tracker protocol as XGBoost 1.7.6 and
//! 3.x exchanged them on the wire, independent of the crate's own codec.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

/// Every test read waits at most this long.
pub const WAIT: Duration = Duration::from_secs(20);

pub fn tracker(n: u32) -> Tracker {
    Tracker::start(TrackerConfig::new(n)).unwrap()
}

pub fn le(v: i32) -> [u8; 4] {
    v.to_le_bytes()
}

pub fn s(text: &str) -> Vec<u8> {
    let mut b = le(text.len() as i32).to_vec();
    b.extend_from_slice(text.as_bytes());
    b
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let st = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    st.set_read_timeout(Some(WAIT)).unwrap();
    st.set_write_timeout(Some(WAIT)).unwrap();
    st
}

pub fn read_i32(st: &mut TcpStream) -> i32 {
    let mut b = [0u8; 4];
    st.read_exact(&mut b).unwrap();
    i32::from_le_bytes(b)
}

pub fn read_str(st: &mut TcpStream) -> String {
    let n = read_i32(st);
    let mut b = vec![0u8; n as usize];
    st.read_exact(&mut b).unwrap();
    String::from_utf8(b).unwrap()
}

/// Magic both ways (the worker sends first, then checks the tracker's).
pub fn magic(addr: SocketAddr) -> TcpStream {
    let mut st = connect(addr);
    st.write_all(&[0x99, 0xff, 0, 0]).unwrap();
    let mut m = [0u8; 4];
    st.read_exact(&mut m).unwrap();
    assert_eq!(m, [0x99, 0xff, 0, 0]);
    st
}

/// A classic hello on a new connection.
pub fn hello(addr: SocketAddr, rank: i32, world: i32, task: &str, cmd: &str) -> TcpStream {
    let mut st = magic(addr);
    let mut b = Vec::new();
    b.extend(le(rank));
    b.extend(le(world));
    b.extend(s(task));
    b.extend(s(cmd));
    st.write_all(&b).unwrap();
    st
}

pub fn print(addr: SocketAddr, rank: i32, text: &str) {
    let mut st = hello(addr, rank, -1, "NULL", "print");
    st.write_all(&s(text)).unwrap();
}

pub fn shutdown(addr: SocketAddr, rank: i32, world: i32) {
    let _ = hello(addr, rank, world, "NULL", "shutdown");
}

/// The assignment message (docs/rabit-protocol.md, *The assignment message*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub rank: i32,
    pub parent: i32,
    pub world: i32,
    pub tree: Vec<i32>,
    pub prev: i32,
    pub next: i32,
}

impl Assignment {
    pub fn links(&self) -> Vec<i32> {
        let mut l = self.tree.clone();
        l.extend([self.prev, self.next].into_iter().filter(|&r| r >= 0));
        l.sort_unstable();
        l.dedup();
        l
    }
}

pub fn read_assignment(st: &mut TcpStream) -> Assignment {
    let rank = read_i32(st);
    let parent = read_i32(st);
    let world = read_i32(st);
    let k = read_i32(st);
    let tree = (0..k).map(|_| read_i32(st)).collect();
    Assignment {
        rank,
        parent,
        world,
        tree,
        prev: read_i32(st),
        next: read_i32(st),
    }
}

/// Accepts one connection, failing the test after [`WAIT`].
pub fn accept_within(listener: &TcpListener) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match listener.accept() {
            Ok((p, _)) => {
                p.set_nonblocking(false).unwrap();
                p.set_read_timeout(Some(WAIT)).unwrap();
                return p;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no peer connected within {WAIT:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// A well-behaved classic worker: `start`, negotiation with real peer links
/// (docs/rabit-protocol.md, *Link negotiation* and *The peer handshake*).
/// Returns its assignment and its links by peer rank.
pub struct Worker {
    pub assignment: Assignment,
    pub peers: Vec<(i32, TcpStream)>,
}

pub fn start_worker(addr: SocketAddr, rank: i32, task: &str) -> Worker {
    join(addr, rank, -1, task, "start", Vec::new())
}

/// `start` or `recover` with links `kept` still healthy; accepts with a deadline.
pub fn join(
    addr: SocketAddr,
    rank: i32,
    world: i32,
    task: &str,
    cmd: &str,
    kept: Vec<(i32, TcpStream)>,
) -> Worker {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let st = hello(addr, rank, world, task, cmd);
    finish_join(st, &listener, kept)
}

/// The rest of [`join`] after the hello was sent on `st`: the assignment, the
/// negotiation, and the peers' connections on `listener`.
pub fn finish_join(
    mut st: TcpStream,
    listener: &TcpListener,
    kept: Vec<(i32, TcpStream)>,
) -> Worker {
    let assignment = read_assignment(&mut st);
    assert!(assignment.rank >= 0, "refused: {assignment:?}");
    let me = assignment.rank;
    let mut peers = kept;
    let accept = loop {
        let good: Vec<i32> = peers.iter().map(|(r, _)| *r).collect();
        let mut b = le(good.len() as i32).to_vec();
        for g in &good {
            b.extend(le(*g));
        }
        st.write_all(&b).unwrap();
        let num_conn = read_i32(&mut st);
        let num_accept = read_i32(&mut st);
        let mut errors = 0;
        for _ in 0..num_conn {
            let host = read_str(&mut st);
            let port = read_i32(&mut st);
            let rank = read_i32(&mut st);
            match TcpStream::connect_timeout(&format!("{host}:{port}").parse().unwrap(), WAIT) {
                Ok(mut p) => {
                    p.set_read_timeout(Some(WAIT)).unwrap();
                    p.write_all(&le(me)).unwrap();
                    assert_eq!(read_i32(&mut p), rank, "peer handshake");
                    peers.push((rank, p));
                }
                Err(_) => errors += 1,
            }
        }
        st.write_all(&le(errors)).unwrap();
        if errors == 0 {
            break num_accept;
        }
    };
    let port = listener.local_addr().unwrap().port();
    st.write_all(&le(i32::from(port))).unwrap();
    drop(st);
    for _ in 0..accept {
        let mut p = accept_within(listener);
        p.write_all(&le(me)).unwrap();
        let r = read_i32(&mut p);
        peers.push((r, p));
    }
    peers.sort_by_key(|(r, _)| *r);
    Worker { assignment, peers }
}

/// `n` good classic workers in threads, then each shuts down; returns the assignments
/// by rank.
pub fn run_classic_job(
    addr: SocketAddr,
    n: usize,
    task: impl Fn(usize) -> String,
) -> Vec<Assignment> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let t = task(i);
            std::thread::spawn(move || start_worker(addr, -1, &t))
        })
        .collect();
    let mut workers: Vec<Worker> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    workers.sort_by_key(|w| w.assignment.rank);
    for w in &workers {
        let got: Vec<i32> = w.peers.iter().map(|(r, _)| *r).collect();
        assert_eq!(
            got,
            w.assignment.links(),
            "rank {} links",
            w.assignment.rank
        );
    }
    for w in &workers {
        shutdown(addr, w.assignment.rank, n as i32);
    }
    workers.into_iter().map(|w| w.assignment).collect()
}

/// A JSON frame (i32 length, then the text).
pub fn frame(text: &str) -> Vec<u8> {
    s(text)
}

pub fn read_frame(st: &mut TcpStream) -> serde_json::Value {
    let text = read_str(st);
    serde_json::from_str(&text).unwrap()
}

/// A JSON hello and command on a new connection.
pub fn json_cmd(addr: SocketAddr, hello: &str, cmd: &str) -> TcpStream {
    let mut st = magic(addr);
    let mut b = frame(hello);
    b.extend(frame(cmd));
    st.write_all(&b).unwrap();
    st
}

/// A JSON `start`: returns the connection after `{"world_size"}` was read.
pub fn json_start(addr: SocketAddr, task: &str, port: u16, error_port: u16) -> TcpStream {
    let mut st = json_cmd(
        addr,
        &format!(r#"{{"rank":0,"task_id":"{task}","world_size":-1}}"#),
        &format!(r#"{{"cmd":1,"error_port":{error_port},"port":{port}}}"#),
    );
    let w = read_frame(&mut st);
    assert!(w["world_size"].as_i64().unwrap() > 0, "{w}");
    st
}

pub fn json_shutdown(addr: SocketAddr, rank: u32, world: u32) {
    let _ = json_cmd(
        addr,
        &format!(r#"{{"rank":{rank},"task_id":"","world_size":{world}}}"#),
        r#"{"cmd":2}"#,
    );
}

/// A JSON job of `n` good workers (ports are fake: the tracker never connects to
/// them); returns each task's rank, derived from its peer frame as a worker does.
pub fn run_json_job(addr: SocketAddr, n: u32, task: impl Fn(u32) -> String) -> Vec<(String, u32)> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let t = task(i);
            std::thread::spawn(move || {
                let mut st = json_start(addr, &t, 40000 + i as u16, 0);
                let peer = read_frame(&mut st);
                let pr = peer["rank"].as_u64().unwrap() as u32;
                (t, (pr + n - 1) % n)
            })
        })
        .collect();
    let mut ranks: Vec<(String, u32)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    ranks.sort_by_key(|(_, r)| *r);
    for (_, r) in &ranks {
        json_shutdown(addr, *r, n);
    }
    ranks
}

/// Waits for an event matching `f`.
pub fn expect_event(rx: &crossbeam_channel::Receiver<Event>, f: impl Fn(&Event) -> bool) -> Event {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let e = rx.recv_timeout(left).expect("expected event did not come");
        if f(&e) {
            return e;
        }
    }
}

/// The name the test harness gives test `name` of the module at `module` (pass
/// `module_path!()`): its path without the binary's own name. A test that re-runs this
/// binary as a child with `--exact` must name itself so, since every test file is a
/// module of one binary.
pub(crate) fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}
