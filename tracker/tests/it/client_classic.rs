//! The classic client against scripted fake trackers (exact bytes of
//! the classic rabit protocol) and against XGBoost 1.7.6's own `RabitTracker`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::client_support;

use client_support::{RefTracker, xgb17_python};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};
use switchyard_tracker::client::classic::ClassicClient;
use switchyard_tracker::client::{ClientConfig, ClientError};
use switchyard_tracker::testing::link_maps;

const LIMIT: Duration = Duration::from_secs(20);

fn config() -> ClientConfig {
    ClientConfig::default().with_timeout(LIMIT)
}

/// A fake tracker's view of one connection: exact reads, raw writes, all bounded.
struct Conn(TcpStream);

impl Conn {
    fn accept(l: &TcpListener) -> Conn {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        Conn(s)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.0.read_exact(&mut b).unwrap();
        b
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.bytes(4).try_into().unwrap())
    }
    fn str(&mut self) -> String {
        let n = self.i32() as usize;
        String::from_utf8(self.bytes(n)).unwrap()
    }
    /// One write for all of `ints`: a client that gives up after the first field
    /// (rank −1) must not turn the rest into a broken pipe here.
    fn put(&mut self, ints: &[i32]) {
        let bytes: Vec<u8> = ints.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.0.write_all(&bytes).unwrap();
    }
    fn put_str(&mut self, s: &str) {
        self.put(&[s.len() as i32]);
        self.0.write_all(s.as_bytes()).unwrap();
    }
    /// Magic both ways, then the hello: (rank, world, task, command).
    fn hello(&mut self) -> (i32, i32, String, String) {
        assert_eq!(self.bytes(4), [0x99, 0xff, 0, 0]);
        self.put(&[0xFF99]);
        (self.i32(), self.i32(), self.str(), self.str())
    }
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

#[test]
fn a_world_of_one_speaks_the_reference_bytes() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        assert_eq!(c.hello(), (-1, -1, "T0".into(), "start".into()));
        c.put(&[0, -1, 1, 0, -1, -1]);
        assert_eq!(c.i32(), 0, "good links");
        c.put(&[0, 0]);
        assert_eq!(c.i32(), 0, "failed connects");
        let listen_port = c.i32();
        assert!(listen_port > 0);
        let mut c = Conn::accept(&l);
        assert_eq!(c.hello(), (0, 1, "T0".into(), "print".into()));
        assert_eq!(c.str(), "hello tracker");
        let mut c = Conn::accept(&l);
        assert_eq!(c.hello(), (0, 1, "T0".into(), "shutdown".into()));
        let mut rest = Vec::new();
        c.0.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "nothing after a shutdown hello");
    });
    let client = ClassicClient::new("127.0.0.1", port, Some("T0".into()), config()).unwrap();
    let joined = client.start(None, None).unwrap();
    assert_eq!((joined.rank, joined.world, joined.parent), (0, 1, None));
    assert_eq!((joined.ring_prev, joined.ring_next), (None, None));
    assert!(joined.links.is_empty());
    assert_eq!(joined.local_ip.to_string(), "127.0.0.1");
    joined.session.print("hello tracker").unwrap();
    joined.session.shutdown().unwrap();
    tracker.join().unwrap();
}

/// Two workers; rank 1 is first sent to a dead port, reports the failure, and is sent
/// again (docs/rabit-protocol.md, *Link negotiation*). The links carry bytes both ways
/// afterwards.
fn two_workers_at(host: &'static str) {
    let l = TcpListener::bind((host, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let dead_port = TcpListener::bind((host, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // bound then dropped: nothing listens there
    let tracker = thread::spawn(move || {
        let mut a = Conn::accept(&l);
        let (_, _, task_a, _) = a.hello();
        let mut b = Conn::accept(&l);
        let (_, _, task_b, _) = b.hello();
        // Rank 0 to task w0, whoever came first.
        let (mut r0, mut r1) = if task_a == "w0" { (a, b) } else { (b, a) };
        assert_eq!(task_b.len() + task_a.len(), 4);
        r0.put(&[0, -1, 2, 1, 1, 1, 1]);
        assert_eq!(r0.i32(), 0);
        r0.put(&[0, 1]);
        assert_eq!(r0.i32(), 0);
        let port0 = r0.i32();
        r1.put(&[1, 0, 2, 1, 0, 0, 0]);
        assert_eq!(r1.i32(), 0, "no good links on the first round");
        r1.put(&[1, 0]);
        r1.put_str(host);
        r1.put(&[i32::from(dead_port), 0]);
        assert_eq!(r1.i32(), 1, "one failed connect");
        assert_eq!(r1.i32(), 0, "still no good links");
        r1.put(&[1, 0]);
        r1.put_str(host);
        r1.put(&[port0, 0]);
        assert_eq!(r1.i32(), 0, "no failed connects");
        assert!(r1.i32() > 0, "a listening port");
    });
    let workers: Vec<_> = ["w0", "w1"]
        .into_iter()
        .map(|task| {
            thread::spawn(move || {
                let client = ClassicClient::new(host, port, Some(task.into()), config()).unwrap();
                client.start(None, None).unwrap()
            })
        })
        .collect();
    let mut joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    tracker.join().unwrap();
    joined.sort_by_key(|j| j.rank);
    for (r, j) in joined.iter_mut().enumerate() {
        let other = 1 - r as u32;
        assert_eq!((j.rank, j.world), (r as u32, 2));
        assert_eq!(j.local_ip.is_ipv6(), host.contains(':'));
        assert_eq!((j.ring_prev, j.ring_next), (Some(other), Some(other)));
        assert_eq!(j.links.keys().copied().collect::<Vec<_>>(), [other]);
        (&j.links[&other]).write_all(&[r as u8 + 10]).unwrap();
    }
    for (r, j) in joined.iter_mut().enumerate() {
        let mut b = [0u8];
        let s = j.links.get_mut(&(1 - r as u32)).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(b[0], 11 - r as u8);
    }
}

#[test]
fn two_workers_link_after_a_failed_first_round() {
    two_workers_at("127.0.0.1");
}

/// The listener and the links follow the tracker's address family.
#[test]
fn two_workers_over_ipv6() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback on this machine");
        return;
    }
    two_workers_at("::1");
}

#[test]
fn rank_minus_one_is_a_refusal() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        c.hello();
        c.put(&[-1, -1, -1]);
    });
    let client = ClassicClient::new("127.0.0.1", port, None, config()).unwrap();
    let err = client.start(None, None).unwrap_err();
    assert!(matches!(err, ClientError::Refused { .. }), "{err}");
    tracker.join().unwrap();
}

#[test]
fn bad_assignments_and_magic_are_typed_errors() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        c.hello();
        c.put(&[5, -1, 2, 0, -1, -1]); // rank 5 of 2
        let mut c = Conn::accept(&l);
        c.bytes(4);
        c.put(&[0x1234]);
    });
    let client = ClassicClient::new("127.0.0.1", port, None, config()).unwrap();
    let err = client.start(None, None).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::BadReply {
                what: "assignment",
                ..
            }
        ),
        "{err}"
    );
    let err = client.start(None, None).unwrap_err();
    assert!(err.to_string().contains("wrong magic"), "{err}");
    tracker.join().unwrap();
}

#[test]
fn a_silent_tracker_times_out_within_the_batch_timeout() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        c.hello();
        // Hold the connection without answering until the client gives up.
        let mut rest = Vec::new();
        let _ = c.0.read_to_end(&mut rest);
    });
    let config = ClientConfig::default().with_timeout(Duration::from_millis(300));
    let client = ClassicClient::new("127.0.0.1", port, None, config).unwrap();
    let started = Instant::now();
    let err = client.start(None, None).unwrap_err();
    assert!(err.to_string().contains("no assigned rank within"), "{err}");
    // Given up at the 300 ms timeout, while the tracker still holds the connection;
    // the bound leaves a loaded runner room.
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(client);
    tracker.join().unwrap();
}

#[test]
fn a_missing_tracker_fails_after_the_retry_schedule() {
    let port = listener().1;
    let mut config = ClientConfig::default().with_timeout(LIMIT);
    config.connect_attempts = 3;
    config.connect_backoff = Duration::from_millis(20);
    let client = ClassicClient::new("127.0.0.1", port, None, config).unwrap();
    let started = Instant::now();
    let err = client.start(None, None).unwrap_err();
    assert!(
        matches!(err, ClientError::Connect { attempts: 3, .. }),
        "{err}"
    );
    // Sleeps of 20 and 40 ms between the three tries.
    assert!(started.elapsed() >= Duration::from_millis(60));
}

/// `n` switchyard workers (threads) under XGBoost 1.7.6's `RabitTracker`: ranks
/// 0..n-1, the reference's link maps, links that reach the right peers, prints that
/// reach the tracker, and a job that ends after the shutdowns.
fn under_xgboost_17(n: u32) {
    let Some(python) = xgb17_python() else { return };
    let mut tracker = RefTracker::start(&python, n);
    let port = tracker.port;
    let workers: Vec<_> = (0..n)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    ClassicClient::new("127.0.0.1", port, Some(format!("w{i}")), config()).unwrap();
                let mut joined = client.start(None, None).unwrap();
                let me = joined.rank;
                for s in joined.links.values_mut() {
                    s.write_all(&me.to_le_bytes()).unwrap();
                }
                for (&peer, s) in joined.links.iter_mut() {
                    s.set_read_timeout(Some(LIMIT)).unwrap();
                    let mut b = [0u8; 4];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(u32::from_le_bytes(b), peer, "link {me}-{peer}");
                }
                joined.session.print(&format!("rank {me} linked")).unwrap();
                joined
            })
        })
        .collect();
    let joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let maps = link_maps(n as usize);
    let mut ranks: Vec<u32> = joined.iter().map(|j| j.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>());
    for j in &joined {
        let m = &maps[j.rank as usize];
        assert_eq!(j.world, n);
        assert_eq!(j.parent.map_or(-1, |p| p as i32), m.parent);
        assert_eq!(j.tree, m.tree);
        let links: Vec<u32> = j.links.keys().copied().collect();
        assert_eq!(links, m.link_set(), "rank {}", j.rank);
    }
    let mut printed: Vec<String> = (0..n)
        .map(|_| tracker.line_matching(LIMIT, |l| l.ends_with(" linked")))
        .collect();
    printed.sort();
    let expected: Vec<String> = (0..n).map(|r| format!("rank {r} linked")).collect();
    assert_eq!(printed, expected);
    // Every link is closed before the shutdowns, as XGBoost's workers do.
    let sessions: Vec<_> = joined.into_iter().map(|j| j.session).collect();
    for s in sessions {
        s.shutdown().unwrap();
    }
    tracker.finish(LIMIT);
}

#[test]
fn two_workers_under_xgboost_17_rabit_tracker() {
    under_xgboost_17(2);
}

#[test]
fn four_workers_under_xgboost_17_rabit_tracker() {
    under_xgboost_17(4);
}

#[test]
fn five_workers_under_xgboost_17_rabit_tracker() {
    under_xgboost_17(5);
}
