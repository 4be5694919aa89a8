//! A second death while the mesh re-forms after a first one, through a real tracker
//! with ranks as threads: rank [`FIRST`]'s process was replaced (its new thread
//! joins with `start` and its task id), the survivors rejoin with `recover`, and rank
//! [`SECOND`] dies at one point of that recovery (a hook in `tracker_mesh` unwinds its
//! thread, which drops its sockets as a killed process's close; or it speaks the
//! tracker protocol by hand and stops half-way), while rank [`FIRST`]'s new process
//! is at the same point. Its own new process then joins with `start`. Every rank
//! must be in one mesh again within [`MAX_ATTEMPTS`] attempts, with correct sums.
//!
//! In [`second_death_while_peers_accept`] the order is sequenced on the tracker's
//! events rather than on time: rank [`SECOND`] dies with its links made while every
//! other survivor still waits in its join for rank [`FIRST`]'s new process. Those
//! survivors must see the closed links and start again at once, not after waiting out
//! an attempt's limit for links that can no longer form (nor draw rank [`FIRST`]'s new
//! process into their failed attempt).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::form_counted;
use crate::collective::tracked::JoinAs;
use crate::collective::tracked::hook::{self, Point};
use crate::collective::{CommOptions, Communicator, ReduceOp, TrackerJoin};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};
use switchyard_tracker::wire::{self, Deadline};
use switchyard_tracker::{Event, Tracker, TrackerConfig};

/// Ranks in the job.
const N: usize = 5;
/// The rank whose process died after the first mesh formed.
const FIRST: usize = 1;
/// The rank that dies inside the recovery from the first death.
const SECOND: usize = 3;
/// Each rank's [`CommOptions::timeout`]: an attempt waits at most a quarter of it for
/// a peer (2 s).
const TIMEOUT: Duration = Duration::from_secs(8);
/// The most attempts any rank may take to form the mesh after the second death.
const MAX_ATTEMPTS: u32 = 4;
/// How long the second rank waits, at its point, for the first rank's new process
/// to reach that point too (it may need the second rank to get there: then the
/// second rank dies without it).
const LAG: Duration = Duration::from_secs(1);

/// Where the second rank dies.
#[derive(Clone, Copy, Debug)]
enum Death {
    /// At a point of `tracker_mesh` in its first attempt.
    At(Point),
    /// Holding its turn at the tracker: `recover` sent, the assignment received,
    /// nothing negotiated.
    Negotiating,
    /// Right after its negotiation: it connected to the peers it was sent to (each
    /// handshake answered), told the tracker so, reported a port, and accepted
    /// nothing.
    Reported,
}

/// The points rank [`FIRST`]'s new process reached.
#[derive(Default)]
struct Progress {
    reached: Mutex<Vec<Point>>,
    changed: Condvar,
}

impl Progress {
    fn reach(&self, point: Point) {
        self.reached.lock().unwrap().push(point);
        self.changed.notify_all();
    }

    /// Waits (at most [`LAG`]) for `point`; whether it was reached.
    fn wait_for(&self, point: Point) -> bool {
        let reached = self.reached.lock().unwrap();
        let (reached, _) = self
            .changed
            .wait_timeout_while(reached, LAG, |r| !r.contains(&point))
            .unwrap();
        reached.contains(&point)
    }
}

/// The tracker's events as they come, for a rank to wait on.
#[derive(Default)]
struct Heard {
    linked: Mutex<Vec<usize>>,
    changed: Condvar,
}

impl Heard {
    /// Collects `tracker`'s events until it stops.
    fn listen(tracker: &Tracker) -> Arc<Heard> {
        let heard = Arc::new(Heard::default());
        let (events, into) = (tracker.events(), Arc::clone(&heard));
        std::thread::spawn(move || {
            while let Ok(event) = events.recv() {
                if let Event::Linked { rank } = event {
                    into.linked.lock().unwrap().push(rank as usize);
                    into.changed.notify_all();
                }
            }
        });
        heard
    }

    /// Whether each of `ranks` has finished `times` negotiations.
    fn has_linked(&self, ranks: &[usize], times: usize) -> bool {
        let linked = self.linked.lock().unwrap();
        ranks
            .iter()
            .all(|r| linked.iter().filter(|l| *l == r).count() >= times)
    }

    /// Waits (at most [`TIMEOUT`]) until each of `ranks` has finished `times`
    /// negotiations; whether they have.
    fn wait_linked(&self, ranks: &[usize], times: usize) -> bool {
        let linked = self.linked.lock().unwrap();
        let count = |l: &Vec<usize>, r: &usize| l.iter().filter(|x| *x == r).count();
        let (linked, _) = self
            .changed
            .wait_timeout_while(linked, TIMEOUT, |l| {
                ranks.iter().any(|r| count(l, r) < times)
            })
            .unwrap();
        ranks.iter().all(|r| count(&linked, r) >= times)
    }
}

/// What a mock kill unwinds with.
struct Killed;

fn options() -> CommOptions {
    CommOptions::default().with_timeout(TIMEOUT)
}

/// With `RUST_LOG` set, the ranks' and the tracker's logs go to each test's output
/// (shown for a test that fails).
fn trace() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .with_thread_ids(true)
            .with_ansi(false)
            .try_init();
    });
}

fn spec(port: u16, rank: usize) -> TrackerJoin {
    TrackerJoin::new("127.0.0.1", port).with_task_id(rank.to_string())
}

/// Forms the mesh as `how` says and checks an allreduce of `(rank + 1) * scale` on
/// it; the attempts it took.
fn form_and_check(port: u16, rank: usize, how: JoinAs, scale: u64) -> Result<u32, String> {
    let (mut mesh, attempts) =
        form_counted(&spec(port, rank), &options(), how).map_err(|e| e.to_string())?;
    // A dropped session must not tell the tracker this rank is done.
    if let Some(link) = mesh.link.as_mut() {
        link.keep_rank_on_drop();
    }
    let mut comm = Communicator::with_engine(mesh.engine, options(), mesh.processor_name);
    comm.tracker = mesh.link;
    if comm.rank() != rank || comm.world_size() != N {
        return Err(format!(
            "task {rank} got rank {} of {}",
            comm.rank(),
            comm.world_size()
        ));
    }
    let mut v = [(rank as u64 + 1) * scale];
    comm.allreduce(&mut v, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let n = N as u64;
    let want = n * (n + 1) / 2 * scale;
    if v[0] != want {
        return Err(format!("rank {rank} summed {} instead of {want}", v[0]));
    }
    Ok(attempts)
}

/// Rank `rank`'s `recover` by hand, dying as `death` says ([`Death::Negotiating`] or
/// [`Death::Reported`]).
fn recover_and_die(port: u16, rank: usize, death: Death) {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let limit = TIMEOUT;
    let mut buf = Vec::new();
    wire::put_i32(&mut buf, wire::MAGIC);
    wire::write_all_within(&stream, &buf, limit, "magic").unwrap();
    Deadline::new(&stream, limit).magic().unwrap();
    let mut hello = Vec::new();
    wire::put_i32(&mut hello, rank as i32);
    wire::put_i32(&mut hello, -1);
    wire::put_str(&mut hello, &rank.to_string());
    wire::put_str(&mut hello, "recover");
    wire::write_all_within(&stream, &hello, limit, "hello").unwrap();
    let mut r = Deadline::new(&stream, limit);
    assert_eq!(r.i32("rank").unwrap(), rank as i32, "recover refused");
    let _parent = r.i32("parent").unwrap();
    let _world = r.i32("world").unwrap();
    let tree = r.length("tree", 64).unwrap();
    for _ in 0..tree + 2 {
        r.i32("neighbour").unwrap();
    }
    if matches!(death, Death::Negotiating) {
        return;
    }
    let mut good = Vec::new();
    wire::put_i32(&mut good, 0);
    wire::write_all_within(&stream, &good, limit, "good links").unwrap();
    let mut r = Deadline::new(&stream, limit);
    let connect = r.length("num_conn", 64).unwrap();
    let _accept = r.i32("num_accept").unwrap();
    let mut links = Vec::new();
    for _ in 0..connect {
        let _host = r.str("host", 256).unwrap();
        let peer = r.i32("port").unwrap();
        let _rank = r.i32("rank").unwrap();
        links.push(shake_hands(
            TcpStream::connect(("127.0.0.1", peer as u16)).unwrap(),
            rank,
        ));
    }
    // Every link made, and a port nobody listens on any more.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut end = Vec::new();
    wire::put_i32(&mut end, 0);
    wire::put_i32(&mut end, i32::from(closed));
    wire::write_all_within(&stream, &end, limit, "port").unwrap();
}

/// The peer handshake (send our rank, read the peer's) on `stream`.
fn shake_hands(stream: TcpStream, rank: usize) -> TcpStream {
    let mut me = Vec::new();
    wire::put_i32(&mut me, rank as i32);
    wire::write_all_within(&stream, &me, TIMEOUT, "handshake").unwrap();
    Deadline::new(&stream, TIMEOUT).i32("peer rank").unwrap();
    stream
}

/// The job: every rank forms the first mesh; all drop it (rank [`FIRST`]'s process
/// died); then the recovery with rank [`SECOND`]'s `death`. The attempts each rank
/// took for the mesh after the deaths, and how long.
fn second_death(death: Death) -> Vec<(u32, Duration)> {
    trace();
    let tracker = Tracker::start(TrackerConfig::new(N as u32)).unwrap();
    let port = tracker.addr().port();
    let between = Arc::new(Barrier::new(N));
    let progress = Arc::new(Progress::default());
    let (tx, rx) = mpsc::channel();
    for rank in 0..N {
        let (between, progress, tx) = (Arc::clone(&between), Arc::clone(&progress), tx.clone());
        std::thread::spawn(move || {
            let outcome = (|| -> Result<(u32, Duration), String> {
                form_and_check(port, rank, JoinAs::Start, 1)?;
                between.wait();
                let began = Instant::now();
                let survivor = JoinAs::Recover { rank: rank as u32 };
                let attempts = match rank {
                    FIRST => {
                        let seen = Arc::clone(&progress);
                        hook::set(Some(Box::new(move |point| seen.reach(point))));
                        form_and_check(port, rank, JoinAs::Start, 10)?
                    }
                    SECOND => {
                        match death {
                            Death::At(at) => {
                                let mut armed = true;
                                let seen = Arc::clone(&progress);
                                hook::set(Some(Box::new(move |point| {
                                    if armed && point == at {
                                        armed = false;
                                        seen.wait_for(at);
                                        std::panic::panic_any(Killed);
                                    }
                                })));
                                let died = std::panic::catch_unwind(|| {
                                    form_and_check(port, rank, survivor, 10)
                                });
                                hook::set(None);
                                match died {
                                    Err(payload) if payload.is::<Killed>() => {}
                                    other => {
                                        return Err(format!("rank {rank} did not die: {other:?}"));
                                    }
                                }
                            }
                            Death::Negotiating | Death::Reported => {
                                progress.wait_for(Point::Join);
                                recover_and_die(port, rank, death);
                            }
                        }
                        // The launcher restarts the process.
                        form_and_check(port, rank, JoinAs::Start, 10)?
                    }
                    _ => form_and_check(port, rank, survivor, 10)?,
                };
                Ok((attempts, began.elapsed()))
            })();
            let _ = tx.send((rank, outcome));
        });
    }
    drop(tx);
    collect(&format!("{death:?}"), &tracker, &rx)
}

#[test]
fn a_second_death_before_the_recover_is_sent() {
    second_death(Death::At(Point::Join));
}

#[test]
fn a_second_death_while_negotiating_with_the_tracker() {
    second_death(Death::Negotiating);
}

#[test]
fn a_second_death_after_reporting_its_port() {
    second_death(Death::Reported);
}

#[test]
fn a_second_death_with_the_tracker_links_made() {
    second_death(Death::At(Point::Linked));
}

#[test]
fn a_second_death_during_the_endpoint_exchange() {
    second_death(Death::At(Point::Ring(1)));
    second_death(Death::At(Point::Ring(N - 2)));
}

#[test]
fn a_second_death_before_the_mesh_connects() {
    second_death(Death::At(Point::Connect));
}

/// Rank [`SECOND`]'s `recover` by hand, as a worker does it (connecting to the peers
/// the tracker names, reporting a listener, accepting the peers that negotiate after
/// it), until every other survivor has finished its negotiation and waits for rank
/// [`FIRST`]'s new process to connect: then it dies.
fn link_and_die_while_peers_accept(port: u16, heard: &Heard) {
    let rank = SECOND;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mine = listener.local_addr().unwrap().port();
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut buf = Vec::new();
    wire::put_i32(&mut buf, wire::MAGIC);
    wire::write_all_within(&stream, &buf, TIMEOUT, "magic").unwrap();
    Deadline::new(&stream, TIMEOUT).magic().unwrap();
    let mut hello = Vec::new();
    wire::put_i32(&mut hello, rank as i32);
    wire::put_i32(&mut hello, -1);
    wire::put_str(&mut hello, &rank.to_string());
    wire::put_str(&mut hello, "recover");
    wire::write_all_within(&stream, &hello, TIMEOUT, "hello").unwrap();
    let mut r = Deadline::new(&stream, TIMEOUT);
    assert_eq!(r.i32("rank").unwrap(), rank as i32, "recover refused");
    let _parent = r.i32("parent").unwrap();
    let _world = r.i32("world").unwrap();
    let tree = r.length("tree", 64).unwrap();
    for _ in 0..tree + 2 {
        r.i32("neighbour").unwrap();
    }
    let mut good = Vec::new();
    wire::put_i32(&mut good, 0);
    wire::write_all_within(&stream, &good, TIMEOUT, "good links").unwrap();
    let mut r = Deadline::new(&stream, TIMEOUT);
    let connect = r.length("num_conn", 64).unwrap();
    let _accept = r.i32("num_accept").unwrap();
    let mut links = Vec::new();
    for _ in 0..connect {
        let _host = r.str("host", 256).unwrap();
        let peer = r.i32("port").unwrap();
        let _rank = r.i32("rank").unwrap();
        links.push(shake_hands(
            TcpStream::connect(("127.0.0.1", peer as u16)).unwrap(),
            rank,
        ));
    }
    let mut end = Vec::new();
    wire::put_i32(&mut end, 0);
    wire::put_i32(&mut end, i32::from(mine));
    wire::write_all_within(&stream, &end, TIMEOUT, "port").unwrap();
    // The survivors' second negotiations (their first formed the first mesh).
    let survivors: Vec<usize> = (0..N).filter(|r| ![FIRST, SECOND].contains(r)).collect();
    listener.set_nonblocking(true).unwrap();
    let until = Instant::now() + TIMEOUT;
    while !heard.has_linked(&survivors, 2) {
        assert!(Instant::now() < until, "the survivors never negotiated");
        match listener.accept() {
            Ok((peer, _)) => {
                peer.set_nonblocking(false).unwrap();
                links.push(shake_hands(peer, rank));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Rank [`SECOND`] dies once its links are made and every other survivor waits, in
/// its join, for rank [`FIRST`]'s new process, which starts only then; rank
/// [`SECOND`]'s own new process starts once rank [`FIRST`]'s has negotiated. The
/// attempts each rank took for the mesh after the deaths, and how long.
fn second_death_while_peers_accept() -> Vec<(u32, Duration)> {
    trace();
    let tracker = Tracker::start(TrackerConfig::new(N as u32)).unwrap();
    let port = tracker.addr().port();
    let heard = Heard::listen(&tracker);
    let between = Arc::new(Barrier::new(N));
    let died = Arc::new(Progress::default());
    let (tx, rx) = mpsc::channel();
    for rank in 0..N {
        let (between, died, heard, tx) = (
            Arc::clone(&between),
            Arc::clone(&died),
            Arc::clone(&heard),
            tx.clone(),
        );
        std::thread::spawn(move || {
            let outcome = (|| -> Result<(u32, Duration), String> {
                form_and_check(port, rank, JoinAs::Start, 1)?;
                between.wait();
                let began = Instant::now();
                let attempts = match rank {
                    FIRST => {
                        if !died.wait_for(Point::Formed) {
                            return Err("rank {SECOND} never died".into());
                        }
                        form_and_check(port, rank, JoinAs::Start, 10)?
                    }
                    SECOND => {
                        link_and_die_while_peers_accept(port, &heard);
                        died.reach(Point::Formed);
                        // The launcher restarts the process, after rank FIRST's new
                        // one negotiated (or a while).
                        heard.wait_linked(&[FIRST], 2);
                        form_and_check(port, rank, JoinAs::Start, 10)?
                    }
                    _ => form_and_check(port, rank, JoinAs::Recover { rank: rank as u32 }, 10)?,
                };
                Ok((attempts, began.elapsed()))
            })();
            let _ = tx.send((rank, outcome));
        });
    }
    drop(tx);
    let results = collect("peers accept", &tracker, &rx);
    // No rank waited out an attempt's limit for a link that could not form.
    let limit = TIMEOUT / 4;
    for (rank, (_, took)) in results.iter().enumerate() {
        assert!(
            *took < limit,
            "rank {rank} took {took:?} to form the mesh again (an attempt's limit is \
             {limit:?}): {results:?}"
        );
    }
    results
}

/// A rank's attempts and time to the new mesh, or why it has none.
type Outcome = Result<(u32, Duration), String>;

/// Each rank's outcome from `rx`, within three timeouts; checked: every rank formed
/// the mesh within [`MAX_ATTEMPTS`] attempts.
fn collect(
    what: &str,
    tracker: &Tracker,
    rx: &mpsc::Receiver<(usize, Outcome)>,
) -> Vec<(u32, Duration)> {
    let mut results = vec![None; N];
    let until = Instant::now() + 3 * TIMEOUT;
    for _ in 0..N {
        let left = until.saturating_duration_since(Instant::now());
        let Ok((rank, outcome)) = rx.recv_timeout(left) else {
            tracker.stop();
            panic!("{what}: ranks {results:?} after {:?}", 3 * TIMEOUT);
        };
        results[rank] = Some(outcome);
    }
    tracker.stop();
    let results: Vec<(u32, Duration)> = results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| match r.unwrap() {
            Ok(r) => r,
            Err(e) => panic!("{what}: rank {rank}: {e}"),
        })
        .collect();
    eprintln!("{what}: (attempts, time) per rank {results:?}");
    for (rank, (attempts, _)) in results.iter().enumerate() {
        assert!(
            *attempts <= MAX_ATTEMPTS,
            "{what}: rank {rank} took {attempts} attempts (at most {MAX_ATTEMPTS}): {results:?}"
        );
    }
    results
}

#[test]
fn a_second_death_while_its_peers_wait_for_the_first_ranks_new_process() {
    second_death_while_peers_accept();
}
