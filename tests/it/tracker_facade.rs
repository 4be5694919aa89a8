//! `Communicator::join` with a tracker bootstrap against a scripted classic tracker: a world of one
//! (solo engine, prints and the shutdown still go to the tracker) and a world of two
//! ranks as threads (ring allgather of mesh endpoints, then collectives), with the
//! `shutdown` sent once, by `finalize` or by drop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{
    CollectiveError, CommOptions, Communicator, ReduceOp, RobustOptions, TrackerJoin,
    TrackerProtocol,
};

const LIMIT: Duration = Duration::from_secs(30);

struct Conn(TcpStream);

impl Conn {
    fn accept(l: &TcpListener) -> Conn {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        Conn(s)
    }
    fn i32(&mut self) -> i32 {
        let mut b = [0u8; 4];
        self.0.read_exact(&mut b).unwrap();
        i32::from_le_bytes(b)
    }
    fn str(&mut self) -> String {
        let mut b = vec![0u8; self.i32() as usize];
        self.0.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }
    fn put(&mut self, ints: &[i32]) {
        for v in ints {
            self.0.write_all(&v.to_le_bytes()).unwrap();
        }
    }
    fn put_str(&mut self, s: &str) {
        self.put(&[s.len() as i32]);
        self.0.write_all(s.as_bytes()).unwrap();
    }
    /// Magic, then (rank, task, command).
    fn hello(&mut self) -> (i32, String, String) {
        assert_eq!(self.i32(), 0xFF99);
        self.put(&[0xFF99]);
        let rank = self.i32();
        let _world = self.i32();
        (rank, self.str(), self.str())
    }
}

/// After the starts: prints and shutdowns until `n` distinct ranks have shut down;
/// returns (rank, command, text) in arrival order.
fn serve_until_shutdown(l: &TcpListener, n: usize) -> Vec<(i32, String, String)> {
    let mut seen = Vec::new();
    let mut shut = std::collections::BTreeSet::new();
    while shut.len() < n {
        let mut c = Conn::accept(l);
        let (rank, _, cmd) = c.hello();
        let text = if cmd == "print" {
            c.str()
        } else {
            String::new()
        };
        if cmd == "shutdown" {
            assert!(shut.insert(rank), "rank {rank} shut down twice");
        }
        seen.push((rank, cmd, text));
    }
    seen
}

fn options() -> CommOptions {
    CommOptions::default().with_timeout(LIMIT)
}

#[test]
fn a_world_of_one_keeps_its_tracker_session_and_shuts_down_on_drop() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        assert_eq!(c.hello(), (-1, "solo-task".into(), "start".into()));
        c.put(&[0, -1, 1, 0, -1, -1]);
        assert_eq!(c.i32(), 0);
        c.put(&[0, 0]);
        assert_eq!(c.i32(), 0);
        c.i32();
        serve_until_shutdown(&l, 1)
    });
    let spec = TrackerJoin::new("127.0.0.1", port).with_task_id("solo-task");
    let mut comm = Communicator::join(&Bootstrap::tracker(spec.clone()), options()).unwrap();
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    let mut x = [2.5f64];
    comm.allreduce(&mut x, ReduceOp::Sum).unwrap();
    assert_eq!(x, [2.5]);
    comm.tracker_print("alone").unwrap();
    drop(comm);
    let seen = tracker.join().unwrap();
    assert_eq!(
        seen,
        [
            (0, "print".into(), "alone".into()),
            (0, "shutdown".into(), String::new())
        ]
    );
}

fn two_ranks_at(host: &'static str) {
    let l = TcpListener::bind((host, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let tracker = thread::spawn(move || {
        let mut a = Conn::accept(&l);
        let (_, task_a, _) = a.hello();
        let mut b = Conn::accept(&l);
        b.hello();
        let (mut r0, mut r1) = if task_a == "t0" { (a, b) } else { (b, a) };
        r0.put(&[0, -1, 2, 1, 1, 1, 1]);
        assert_eq!(r0.i32(), 0);
        r0.put(&[0, 1]);
        assert_eq!(r0.i32(), 0);
        let port0 = r0.i32();
        r1.put(&[1, 0, 2, 1, 0, 0, 0]);
        assert_eq!(r1.i32(), 0);
        r1.put(&[1, 0]);
        r1.put_str(host);
        r1.put(&[port0, 0]);
        assert_eq!(r1.i32(), 0);
        r1.i32();
        serve_until_shutdown(&l, 2)
    });
    let ranks: Vec<_> = ["t0", "t1"]
        .into_iter()
        .map(|task| {
            thread::spawn(move || {
                let spec = TrackerJoin::new(host, port).with_task_id(task);
                let mut comm =
                    Communicator::join(&Bootstrap::tracker(spec.clone()), options()).unwrap();
                let r = comm.rank();
                let mut v = vec![(r + 1) as u64; 1000];
                comm.allreduce(&mut v, ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|&x| x == 3));
                let mut model = if r == 1 {
                    b"from one".to_vec()
                } else {
                    Vec::new()
                };
                comm.broadcast_bytes(&mut model, 1).unwrap();
                assert_eq!(model, b"from one");
                comm.tracker_print(&format!("{task} is rank {r}")).unwrap();
                comm.finalize().unwrap();
                r
            })
        })
        .collect();
    let got: Vec<usize> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got, [0, 1]);
    let seen = tracker.join().unwrap();
    let mut prints: Vec<&str> = seen
        .iter()
        .filter(|s| s.1 == "print")
        .map(|s| s.2.as_str())
        .collect();
    prints.sort_unstable();
    assert_eq!(prints, ["t0 is rank 0", "t1 is rank 1"]);
    assert_eq!(seen.iter().filter(|s| s.1 == "shutdown").count(), 2);
}

#[test]
fn two_ranks_form_a_mesh_over_the_trackers_ring() {
    two_ranks_at("127.0.0.1");
}

#[test]
fn without_a_tracker_prints_go_to_stderr_and_finalize_is_quiet() {
    let comm = Communicator::solo();
    comm.tracker_print("no tracker here").unwrap();
    comm.finalize().unwrap();
}

#[test]
fn an_unreachable_tracker_fails_setup_with_its_address() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spec = TrackerJoin::new("127.0.0.1", port);
    let start = std::time::Instant::now();
    let err = Communicator::join(
        &Bootstrap::tracker(spec.clone()),
        options().with_timeout(Duration::from_secs(1)),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    // A dead tracker is a set-up failure with its cause, not a bad argument.
    assert!(matches!(err, CollectiveError::Setup { .. }), "{err:?}");
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    // Five tries whose sleeps shrink to fit the 1 s timeout; unshrunk they would
    // sleep 2 + 4 + 6 + 8 = 20 s, which is what the bound tells apart.
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}

/// A communicator dropped while its thread panics sends no `shutdown`: the tracker
/// must not count a failed worker as finished. The drop runs before the thread ends,
/// so once it is joined any `shutdown` connection would already be queued.
#[test]
fn a_panicking_worker_sends_no_shutdown() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let worker = thread::spawn(move || {
        let spec = TrackerJoin::new("127.0.0.1", port);
        let _comm = Communicator::join(&Bootstrap::tracker(spec.clone()), options()).unwrap();
        panic!("the worker fails after joining");
    });
    let mut c = Conn::accept(&l);
    assert_eq!(c.hello().2, "start");
    c.put(&[0, -1, 1, 0, -1, -1]);
    assert_eq!(c.i32(), 0);
    c.put(&[0, 0]);
    assert_eq!(c.i32(), 0);
    c.i32();
    assert!(worker.join().is_err());
    l.set_nonblocking(true).unwrap();
    assert!(
        matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection (shutdown) came from the panicking worker"
    );
}

/// Robust mode is refused before any connection, in words that say why, when the
/// bootstrap cannot give it a classic tracker and a task id: a bad argument, not a
/// failed setup.
#[test]
fn robust_mode_without_a_classic_tracker_and_a_task_id_is_refused() {
    let robust = || options().with_robust(RobustOptions::default());
    let refused = |boot: Bootstrap| {
        let err = Communicator::join(&boot, robust()).unwrap_err();
        assert!(
            matches!(err, CollectiveError::InvalidArgument { .. }),
            "{err:?}"
        );
        err.to_string()
    };
    // Port 9 (discard): nothing may be contacted before the refusal.
    let json = TrackerJoin::new("127.0.0.1", 9)
        .with_task_id("0")
        .with_protocol(TrackerProtocol::Json);
    let text = refused(Bootstrap::tracker(json));
    assert!(text.contains("classic tracker protocol"), "{text}");
    let text = refused(Bootstrap::tracker(TrackerJoin::new("127.0.0.1", 9)));
    assert!(text.contains("needs a task id (DMLC_TASK_ID)"), "{text}");
    let text = refused(Bootstrap::solo());
    assert!(text.contains("robust mode joins a tracker"), "{text}");
}
