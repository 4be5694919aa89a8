//! Forming a [`Communicator`] through a rabit/XGBoost tracker.
//!
//! The tracker only assigns ranks and links each worker to a few others (a tree and a
//! ring in the classic protocol, the ring alone in the JSON one). switchyard's
//! collectives need a full mesh, so, as NCCL's bootstrap does, the workers use the
//! tracker's **ring** once: each binds its mesh endpoint on the address it used to
//! reach the tracker (the address the tracker hands to peers; the interface named by
//! `SWITCHYARD_IFNAME` when that is set), the endpoints go round
//! the ring (an allgather of length-prefixed strings, each with the identity of its
//! rank's attempt, once more round than an allgather needs so that each rank sees its
//! own come back: `ring`), and then `MeshBuilder::connect` (`setup.rs`)
//! wires the mesh as for any other start. The tracker links are closed afterwards.
//!
//! The communicator keeps its tracker session: [`Communicator::tracker_print`] sends
//! to the tracker's log, and `shutdown` is sent exactly once, by
//! [`Communicator::finalize`] or, failing that, when the communicator is dropped.
//!
//! The ring allgather on the tracker links is switchyard's own: every worker of a
//! job must be a switchyard process (XGBoost workers cannot share a job with them).
//!
//! Recovery forms a whole new mesh the same way ([`tracker_mesh`]): after a rank
//! died, every survivor drops its mesh and rejoins with rabit's `recover` (its rank,
//! no good links), the restarted process joins with `start` and its task id (the
//! tracker gives its rank back), and each binds a fresh endpoint; the tracker never
//! hands out a listener of an earlier generation.

use super::Communicator;
use super::engine::{Engine, Solo};
use super::error::{Call, CollectiveError};
use super::options::CommOptions;
use std::net::{IpAddr, TcpStream};
use std::time::Instant;
use switchyard_tracker::client::classic::{ClassicClient, ClassicSession, WatchedLinks};
use switchyard_tracker::client::json::{JsonClient, JsonSession};
use switchyard_tracker::client::{ClientConfig, ClientError};

mod ring;
mod ring_steps;
use ring::TrackerRing;

// Defined with the bootstrap, which reads them (the tracker a `Bootstrap` names, the
// protocol it speaks); the collectives keep their public paths to them.
pub use crate::bootstrap::{ENV_TRACKER_PROTOCOL, TrackerJoin, TrackerProtocol};

/// Points of [`tracker_mesh`] where a test can stop a thread-ranked worker (a panic
/// unwinds it and drops its sockets, as a killed process's close).
#[cfg(test)]
pub(crate) mod hook {
    use std::cell::RefCell;

    /// Where in forming a mesh.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Point {
        /// Before the tracker's `start` or `recover`.
        Join,
        /// The tracker links stand; before the endpoint exchange.
        Linked,
        /// Before step `k` of the ring allgather of the mesh endpoints.
        Ring(usize),
        /// Every endpoint known; before the mesh connects.
        Connect,
        /// The mesh stands.
        Formed,
    }

    type Hook = Box<dyn FnMut(Point)>;

    thread_local! {
        static AT: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    /// Runs this thread's hook (if any) at `point`.
    pub(crate) fn at(point: Point) {
        let hook = AT.with(|h| h.borrow_mut().take());
        if let Some(mut hook) = hook {
            // Put back before it runs: a hook that panics stays set for the thread's
            // next worker only if the test sets it again.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(point)));
            match result {
                Ok(()) => AT.with(|h| *h.borrow_mut() = Some(hook)),
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
    }

    /// Sets (or clears) this thread's hook.
    pub(crate) fn set(hook: Option<Hook>) {
        AT.with(|h| *h.borrow_mut() = hook);
    }
}

/// A communicator's tracker session: `print`s, and one `shutdown`, sent when it is
/// dropped (unless the thread panics) if no `shutdown` went out before.
#[derive(Debug)]
pub(crate) struct TrackerLink {
    session: Session,
    shut: bool,
    /// Whether dropping the link sends `shutdown` (robust mode: only `finalize`
    /// does, so that a worker that failed can be restarted and rejoin).
    shutdown_on_drop: bool,
}

/// The session of either protocol.
#[derive(Debug)]
enum Session {
    Classic(ClassicSession),
    Json(JsonSession),
}

impl TrackerLink {
    /// Makes dropping the link leave the tracker's count alone: only an explicit
    /// `shutdown` (`finalize`) tells the tracker this worker is done.
    pub(crate) fn keep_rank_on_drop(&mut self) {
        self.shutdown_on_drop = false;
    }

    /// Sends `text` to the tracker's log.
    pub(crate) fn print(&self, text: &str) -> Result<(), ClientError> {
        match &self.session {
            Session::Classic(s) => s.print(text),
            Session::Json(s) => s.print(text),
        }
    }

    /// Sends `shutdown`, the first time only.
    pub(crate) fn shutdown(&mut self) -> Result<(), ClientError> {
        if std::mem::replace(&mut self.shut, true) {
            return Ok(());
        }
        match &self.session {
            Session::Classic(s) => s.shutdown(),
            Session::Json(s) => s.shutdown(),
        }
    }
}

impl Drop for TrackerLink {
    /// A communicator dropped while its thread panics did not finish its work: no
    /// `shutdown` then, so the tracker does not count the job as done; a JSON-protocol
    /// tracker is sent an `error` instead, which fails the job at once.
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::warn!("communicator dropped during a panic: no shutdown sent to the tracker");
            if let Session::Json(s) = &self.session {
                if !self.shut {
                    let _ = s.signal_error(1, "a switchyard worker panicked");
                }
            }
            return;
        }
        if !self.shutdown_on_drop {
            return;
        }
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "shutdown to the tracker failed");
        }
    }
}

/// What either protocol yields: rank, world, the ring links, the session.
struct Joined {
    rank: u32,
    world: u32,
    /// Stream to the ring successor (send side) and from the predecessor (receive
    /// side); the same stream in a world of two.
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    /// The ring predecessor's rank (classic joins), whose link the exchange reads.
    prev_rank: Option<u32>,
    /// Every link of a classic join, held open and watched until the endpoint exchange
    /// is over: a peer still accepting its links takes a closed one for a failed join
    /// ([`ClientConfig::watch_links`]), only the end of the exchange proves that every
    /// rank finished joining, and a peer that leaves during the exchange must fail it
    /// at once ([`WatchedLinks`]).
    links: WatchedLinks,
    local_ip: IpAddr,
    session: Session,
}

/// How a worker joins the tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinAs {
    /// `start`: a new worker, or a restarted process, which the tracker gives back the
    /// rank of its task id (`TrackerJoin::task_id`).
    Start,
    /// rabit's `recover`, classic protocol only: a surviving worker that keeps `rank`
    /// and forms all its links afresh (a new generation of the mesh after a failure).
    Recover {
        /// The rank it holds.
        rank: u32,
    },
}

/// Joins the tracker as `how` says; the caller has refused JSON with `Recover`.
fn join(spec: &TrackerJoin, config: ClientConfig, how: JoinAs) -> Result<Joined, ClientError> {
    match spec.protocol {
        TrackerProtocol::Classic => {
            let client = ClassicClient::new(&spec.host, spec.port, spec.task_id.clone(), config)?;
            let j = match how {
                JoinAs::Start => client.start(None, None)?,
                JoinAs::Recover { rank } => client.recover(rank, None)?,
            };
            // Only the ring links are used; in a world of two both name one stream.
            let ring = |r: Option<u32>| -> Option<TcpStream> {
                r.and_then(|r| j.links.get(&r).and_then(|s| s.try_clone().ok()))
            };
            let (next, prev) = (ring(j.ring_next), ring(j.ring_prev));
            Ok(Joined {
                rank: j.rank,
                world: j.world,
                next,
                prev,
                prev_rank: j.ring_prev,
                links: WatchedLinks::new(j.links),
                local_ip: j.local_ip,
                session: Session::Classic(j.session),
            })
        }
        TrackerProtocol::Json => {
            let client = JsonClient::new(&spec.host, spec.port, spec.task_id.clone(), config)?;
            let j = client.start()?;
            Ok(Joined {
                rank: j.rank,
                world: j.world,
                next: Some(j.successor),
                prev: Some(j.predecessor),
                prev_rank: None,
                links: WatchedLinks::default(),
                local_ip: j.local_ip,
                session: Session::Json(j.session),
            })
        }
    }
}

/// A mesh formed through the tracker: its engine (the caller wraps it in a
/// [`Communicator`] or another engine), the tracker session (`None` when
/// `keep_session` was false), rank and world.
pub(crate) struct TrackerMesh {
    /// The mesh engine (the solo engine in a world of one).
    pub engine: Box<dyn Engine>,
    /// The tracker session, armed: dropping it sends `shutdown`.
    pub link: Option<TrackerLink>,
    /// This worker's rank.
    pub rank: usize,
    /// Number of workers.
    pub world: usize,
    /// This host's name, for [`Communicator::processor_name`].
    pub processor_name: String,
}

impl std::fmt::Debug for TrackerMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackerMesh")
            .field("engine", &self.engine.name())
            .field("link", &self.link)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

/// Joins the tracker `spec` as `how` says and forms a mesh with the other workers of
/// its job: [`Communicator::join`] with `Start`, and each new generation of a
/// recovering job (survivors with `Recover`, a restarted process with `Start` and its
/// task id). Every worker binds a fresh mesh endpoint, so nothing of an earlier
/// generation is reused.
///
/// With `keep_session` false the tracker session is closed without a `shutdown`:
/// a recovering worker keeps the session of its first generation for its `print`s and
/// its one `shutdown` (the tracker counts ranks, not sessions), and a `shutdown` per
/// generation would be refused. A failure never sends `shutdown` either, so that a
/// worker that could not join does not look finished to the tracker.
pub(crate) fn tracker_mesh(
    spec: &TrackerJoin,
    options: &CommOptions,
    how: JoinAs,
    keep_session: bool,
) -> Result<TrackerMesh, CollectiveError> {
    let at = format!("tracker {}:{}", spec.host, spec.port);
    if let (TrackerProtocol::Json, JoinAs::Recover { rank }) = (spec.protocol, how) {
        return Err(CollectiveError::InvalidArgument {
            call: Call::Setup,
            reason: format!(
                "rank {rank} cannot rejoin the {at} with `recover`: XGBoost's JSON tracker \
                 protocol has no recover command (use the classic protocol, \
                 {ENV_TRACKER_PROTOCOL}=classic, for recovery)"
            ),
        });
    }
    let began = Instant::now();
    // The wait for the whole batch of workers to arrive may take the whole timeout;
    // everything else, the setup limit (robust mode's attempts).
    let mut config = ClientConfig::default().with_timeout(options.setup_timeout());
    config.batch_timeout = options.timeout;
    // A join fails as soon as one of its links closes (a peer's join failed, or it
    // died), so that it stops drawing peers into links that cannot all form; the links
    // stay open until the endpoint exchange below is over.
    config.watch_links = true;
    #[cfg(test)]
    hook::at(hook::Point::Join);
    let joined = join(spec, config, how)
        .map_err(|e| CollectiveError::setup(format!("joining the {at}"), e))?;
    #[cfg(test)]
    hook::at(hook::Point::Linked);
    // Until the mesh stands, a failure must not look like a finished worker to the
    // tracker: the link sends its `shutdown` only once it is armed.
    let mut link = TrackerLink {
        session: joined.session,
        shut: true,
        shutdown_on_drop: true,
    };
    let (rank, world) = (joined.rank as usize, joined.world as usize);
    let (engine, processor_name): (Box<dyn Engine>, String) =
        if joined.world == 1 {
            (Box::new(Solo), super::setup::this_host())
        } else {
            let (Some(next), Some(prev)) = (joined.next, joined.prev) else {
                return Err(CollectiveError::setup(
                    format!("joining the {at}"),
                    format!("it gave rank {rank} of {world} no ring neighbours"),
                ));
            };
            // SWITCHYARD_IFNAME wins over the address of the tracker connection.
            let local_ip = crate::bootstrap::ifname_address()
                .map_err(|e| CollectiveError::setup("choosing the mesh address", e))?
                .unwrap_or(joined.local_ip);
            tracing::debug!(ip = %local_ip, "mesh address for the {at} job");
            let endpoint = crate::bootstrap::tcp_any_port(local_ip);
            let builder = Communicator::bind_mesh(rank, world, &endpoint, options.clone())
                .map_err(|e| match local_ip {
                    // The zmq backend does not enable IPv6 on its sockets.
                    IpAddr::V6(_) => CollectiveError::setup(
                        format!(
                            "binding the mesh on {local_ip}: the {at} was reached over IPv6 \
                             and the mesh needs IPv4 (give the tracker's IPv4 address, \
                             DMLC_TRACKER_URI)"
                        ),
                        e,
                    ),
                    IpAddr::V4(_) => e,
                })?;
            let mut ring = TrackerRing::new(next, prev, joined.prev_rank, joined.links);
            let endpoints = builder.exchange(
                &mut ring,
                || format!("mesh endpoint exchange over the {at} ring"),
                options.setup_timeout(),
            )?;
            drop(ring);
            #[cfg(test)]
            hook::at(hook::Point::Connect);
            let (engine, _, processor_name, _) = builder.connect(&endpoints)?.into_parts();
            #[cfg(test)]
            hook::at(hook::Point::Formed);
            (engine, processor_name)
        };
    tracing::debug!(?how, rank, world, took = ?began.elapsed(), "mesh formed through the {at}");
    link.shut = !keep_session;
    Ok(TrackerMesh {
        engine,
        link: keep_session.then_some(link),
        rank,
        world,
        processor_name,
    })
}

impl Communicator {
    /// Takes a communicator apart: its engine, options, processor name and tracker
    /// session, for a caller that wraps the engine in another (recovery) or rebuilds
    /// the communicator around it.
    pub(crate) fn into_parts(self) -> (Box<dyn Engine>, CommOptions, String, Option<TrackerLink>) {
        (self.engine, self.options, self.processor_name, self.tracker)
    }

    /// Joins the tracker `spec` and forms a mesh with the other workers of its job:
    /// [`Communicator::join`] with [`Bootstrap::tracker`](crate::bootstrap::Bootstrap::tracker).
    pub(super) fn join_tracker(
        spec: &TrackerJoin,
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        let mesh = tracker_mesh(spec, &options, JoinAs::Start, true)?;
        let mut comm = Communicator::with_engine(mesh.engine, options, mesh.processor_name);
        comm.tracker = mesh.link;
        Ok(comm)
    }

    /// Sends `text` to the tracker's log (the tracker prints it), or to stderr when
    /// this communicator was not formed through a tracker.
    pub fn tracker_print(&self, text: &str) -> Result<(), CollectiveError> {
        match &self.tracker {
            Some(link) => link
                .print(text)
                .map_err(|e| CollectiveError::setup("tracker print", e)),
            None => {
                eprintln!("{text}");
                Ok(())
            }
        }
    }

    /// Closes the communicator: the mesh first, then (when formed through a tracker)
    /// the `shutdown` to the tracker, whose failure is returned. Dropping a
    /// communicator does the same but can only log a failed `shutdown`. A
    /// communicator made unusable by a failed call closes without robust mode's last
    /// agreement (its peers are no longer in step with it).
    pub fn finalize(mut self) -> Result<(), CollectiveError> {
        // Robust mode's last agreement: a survivor must not leave while a restarted
        // rank still needs results it kept.
        if !self.is_poisoned() {
            self.engine.finish()?;
        }
        let link = self.tracker.take();
        drop(self);
        match link {
            Some(mut link) => link
                .shutdown()
                .map_err(|e| CollectiveError::setup("tracker shutdown", e)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::collective::ReduceOp;
    use std::sync::{Arc, Barrier};
    use std::time::Duration;
    use switchyard_tracker::{Tracker, TrackerConfig};

    /// Every wait of a worker is bounded by this.
    const LIMIT: Duration = Duration::from_secs(30);

    fn options() -> CommOptions {
        CommOptions::default().with_timeout(LIMIT)
    }

    /// An allreduce of `[(rank + 1) * scale]` on `mesh`, wrapped as a communicator
    /// (keeping the session, if any); every rank must see the sum.
    fn allreduce_on(mesh: TrackerMesh, world: usize, scale: u64) -> Communicator {
        let mut comm = Communicator::with_engine(mesh.engine, options(), mesh.processor_name);
        comm.tracker = mesh.link;
        assert_eq!((comm.rank(), comm.world_size()), (mesh.rank, world));
        let mut v = [(mesh.rank as u64 + 1) * scale];
        comm.allreduce(&mut v, ReduceOp::Sum).unwrap();
        let n = world as u64;
        assert_eq!(v[0], n * (n + 1) / 2 * scale, "rank {}", mesh.rank);
        comm
    }

    /// Three ranks form a mesh with `start`; rank 1 "dies" (its process would send no
    /// `shutdown`); all three form generation 2 (ranks 0 and 2 with `recover`, rank 1's
    /// restarted process with `start` and the same task id), and collectives work
    /// again. The survivors keep their first session, as a recovering worker does, and
    /// the job ends with one `shutdown` per rank.
    #[test]
    fn a_second_generation_with_recover_and_a_restarted_start_runs_collectives() {
        let n = 3;
        let tracker = Tracker::start(TrackerConfig::new(n as u32)).unwrap();
        let port = tracker.addr().port();
        let between = Arc::new(Barrier::new(n));
        let workers: Vec<_> = (0..n)
            .map(|task| {
                let between = Arc::clone(&between);
                std::thread::spawn(move || {
                    let spec = TrackerJoin::new("127.0.0.1", port).with_task_id(task.to_string());
                    let dies = task == 1;
                    let first = tracker_mesh(&spec, &options(), JoinAs::Start, !dies).unwrap();
                    assert_eq!(first.rank, task, "task ids 0..3 are ranks 0..3");
                    let comm = allreduce_on(first, n, 1);
                    // Everyone is done with generation 1 before any mesh goes away.
                    between.wait();
                    let (_, _, _, session) = comm.into_parts();
                    let began = Instant::now();
                    let (how, keep) = if dies {
                        (JoinAs::Start, true)
                    } else {
                        (JoinAs::Recover { rank: task as u32 }, false)
                    };
                    let second = tracker_mesh(&spec, &options(), how, keep).unwrap();
                    let took = began.elapsed();
                    assert_eq!(second.rank, task, "{how:?} gives the rank back");
                    assert_eq!(second.link.is_some(), keep);
                    let mut comm = allreduce_on(second, n, 10);
                    if let Some(first) = session {
                        comm.tracker = Some(first);
                    }
                    comm.finalize().unwrap();
                    took
                })
            })
            .collect();
        for (rank, w) in workers.into_iter().enumerate() {
            let took = w.join().unwrap();
            eprintln!("rank {rank} formed generation 2 in {took:?}");
        }
        let outcome = tracker.wait(Some(LIMIT)).unwrap();
        assert_eq!(outcome.shut_down, [0, 1, 2]);
    }

    /// Rank 1's restarted process dies inside recovery (after its tracker links are
    /// made, before the endpoint exchange): the survivors' `tracker_mesh` fails, and a
    /// retry with `recover` forms the generation with rank 1's next process. This is
    /// how a recovering engine gets past a death during recovery.
    #[test]
    fn a_generation_that_fails_inside_recovery_forms_on_retry() {
        let n = 3;
        let tracker = Tracker::start(TrackerConfig::new(n as u32)).unwrap();
        let port = tracker.addr().port();
        let between = Arc::new(Barrier::new(n));
        let workers: Vec<_> = (0..n)
            .map(|task| {
                let between = Arc::clone(&between);
                std::thread::spawn(move || {
                    let spec = TrackerJoin::new("127.0.0.1", port).with_task_id(task.to_string());
                    let first = tracker_mesh(&spec, &options(), JoinAs::Start, false).unwrap();
                    drop(allreduce_on(first, n, 1));
                    between.wait();
                    if task == 1 {
                        // A restarted process that dies once its tracker links stand.
                        let config = ClientConfig::default().with_timeout(LIMIT);
                        let client =
                            ClassicClient::new("127.0.0.1", port, Some("1".into()), config)
                                .unwrap();
                        drop(client.start(None, None).unwrap());
                        // The next process. Until the tracker has seen the dead one's
                        // connection close, rank 1 is still taken and the start is
                        // refused (rank -1): on a loaded machine the new start can get
                        // there first, so it tries again, as a launcher's restart would.
                        for attempt in 1..=3 {
                            match tracker_mesh(&spec, &options(), JoinAs::Start, false) {
                                Ok(mesh) => return (allreduce_on(mesh, n, 10), attempt),
                                Err(e) => {
                                    eprintln!("rank 1's next process, attempt {attempt}: {e}")
                                }
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        panic!("rank 1's next process did not join in 3 attempts");
                    }
                    let how = JoinAs::Recover { rank: task as u32 };
                    // The first attempt fails with rank 1's dead process; the next
                    // can fail too while rank 1's next process is refused (its rank
                    // still taken) and pauses before it tries again, so the
                    // survivors pause between attempts as robust mode does.
                    for attempt in 1..=5 {
                        match tracker_mesh(&spec, &options(), how, false) {
                            Ok(mesh) => return (allreduce_on(mesh, n, 10), attempt),
                            Err(e) => eprintln!("rank {task}, attempt {attempt}: {e}"),
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    panic!("rank {task} did not rejoin in 5 attempts");
                })
            })
            .collect();
        for (rank, w) in workers.into_iter().enumerate() {
            let (_, attempts) = w.join().unwrap();
            if rank != 1 {
                assert!(
                    attempts >= 2,
                    "rank {rank} rejoined a generation that failed"
                );
            }
        }
        tracker.stop();
    }

    /// XGBoost's JSON protocol has no `recover`: refused before any connection.
    #[test]
    fn recover_with_the_json_protocol_is_refused_naming_why() {
        let spec = TrackerJoin::new("127.0.0.1", 9).with_protocol(TrackerProtocol::Json);
        let err = tracker_mesh(&spec, &options(), JoinAs::Recover { rank: 0 }, true).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("no recover command"), "{text}");
        assert!(
            matches!(err, CollectiveError::InvalidArgument { .. }),
            "{err}"
        );
    }
}
