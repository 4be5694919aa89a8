//! The progress thread: the one thread of a process that calls MPI.
//!
//! Sockets never call MPI. A send encodes its message on the caller's thread, takes a
//! credit (the high-water mark), and queues a command; the progress thread posts it
//! with `MPI_Isend`, tests it until MPI is done with the buffers, and returns the
//! credit. Receives are `MPI_Improbe` + `MPI_Mrecv` on the tag of a local socket that
//! has room, so a socket at its high-water mark leaves messages in MPI (where large
//! ones stay on the sender: rendezvous) instead of in an unbounded queue here.
//!
//! Why one thread even when MPI grants `MPI_THREAD_MULTIPLE`: it is correct at every
//! thread level (MPI is initialised on this thread, so even `FUNNELED` suffices);
//! OpenMPI serialises concurrent calls behind one lock anyway, so parallel callers
//! would only contend; and one owner keeps each peer's messages in posting order and
//! puts the idle policy in one place. The cost is one thread hand-off per message.
//!
//! Collectives run here too: [`run_on_progress_thread`](super::run_on_progress_thread)
//! hands this thread a closure ([`Command::Run`]), which gets a second duplicate of
//! `MPI_COMM_WORLD`, made at the first such closure. A blocking collective stops the
//! loop while it runs: the process's socket traffic waits (sends already posted keep
//! moving inside MPI's own progress, but nothing new is posted or received).
//!
//! Idle policy: after the last piece of work the thread polls for
//! [`SPIN`] ([`SPIN_WITH_SENDS`] while sends are in flight, because MPI moves their
//! data only inside MPI calls), yielding the core between polls, then sleeps in
//! growing naps up to [`MAX_NAP`]. A local send wakes it at once; a message from another rank waits at
//! most one nap. So an idle process costs about a thousand short wake-ups a second
//! (measured by `switchyard bench mpi`), not a spinning core as a blocking
//! `MPI_Recv` would.

use super::ffi::{self, MpiError, Request, ThreadLevel};
use super::wire::{self, Control, Encoded};
use crate::backend::{Deadline, Inbound};
use crate::{PeerId, TransportError};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};
use switchyard_msg::{Limits, Msg};

/// Tag of control notes between progress threads.
pub(crate) const CONTROL_TAG: i32 = 0;
/// Tag of messages to a rank's router.
pub(crate) const ROUTER_TAG: i32 = 1;
const FIRST_DEALER_TAG: i32 = 2;
/// The largest tag every MPI implementation accepts (`MPI_TAG_UB` is at least this).
const LAST_DEALER_TAG: i32 = 32767;

/// How long the progress thread keeps polling after its last piece of work.
pub(crate) const SPIN: Duration = Duration::from_micros(200);
/// How long it keeps polling while sends are in flight (a receiver that stopped
/// reading holds them; past this the thread naps and the sends wait).
pub(crate) const SPIN_WITH_SENDS: Duration = Duration::from_millis(10);
const FIRST_NAP: Duration = Duration::from_micros(50);
/// The longest the progress thread sleeps between polls when idle.
pub(crate) const MAX_NAP: Duration = Duration::from_millis(1);
/// Messages taken from one socket's tag per loop, so that one busy socket cannot
/// starve the others.
const BATCH: usize = 64;

/// Environment variable: seconds a rank that exits with status 0 waits for the
/// others in `MPI_Finalize` before it gives up (default 60).
pub const ENV_FINALIZE_TIMEOUT: &str = "SWITCHYARD_MPI_FINALIZE_TIMEOUT";

/// The MPI job as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiWorld {
    /// This process's rank in `MPI_COMM_WORLD`.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// The thread support MPI granted.
    pub thread_level: ThreadLevel,
    /// `MPI_Get_processor_name`.
    pub processor_name: String,
}

/// A socket's sends in flight, bounded by its high-water mark.
#[derive(Debug)]
pub(crate) struct Credits {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Credits {
    pub(crate) fn new(limit: usize) -> Arc<Credits> {
        Arc::new(Credits {
            limit: limit.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        })
    }

    /// Takes a credit, waiting until `deadline` for one to be freed.
    pub(crate) fn acquire(&self, deadline: Deadline) -> bool {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *used < self.limit {
                *used += 1;
                return true;
            }
            used = match deadline {
                Deadline::Now => return false,
                Deadline::Forever => self.freed.wait(used).unwrap_or_else(|p| p.into_inner()),
                Deadline::At(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    self.freed
                        .wait_timeout(used, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    fn release(&self) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        self.freed.notify_all();
    }
}

/// How a router reaches one dealer: its rank, its tag, and its own credits.
#[derive(Debug, Clone)]
pub(crate) struct MpiRoute {
    pub(crate) rank: i32,
    pub(crate) tag: i32,
    pub(crate) credits: Arc<Credits>,
}

/// The MPI router's events.
pub(crate) type MpiInbound = Inbound<MpiRoute>;

/// Work for the progress thread: it gets the collectives' communicator (or why that
/// could not be made). Its lifetime is erased; see `run_on_progress_thread` for why
/// that is sound.
pub(crate) type Job = Box<dyn FnOnce(Result<mpi::ffi::MPI_Comm, String>) + Send + 'static>;

pub(crate) enum Command {
    Send {
        dest: i32,
        tag: i32,
        encoded: Encoded,
        credits: Arc<Credits>,
    },
    OpenDealer {
        tag: i32,
        router: i32,
        identity: PeerId,
        inbox: Sender<Msg>,
        hwm: usize,
        limits: Limits,
        connected: Sender<()>,
    },
    CloseDealer {
        tag: i32,
        router: i32,
    },
    BindRouter {
        generation: u64,
        events: Sender<MpiInbound>,
        hwm: usize,
        limits: Limits,
    },
    UnbindRouter {
        generation: u64,
    },
    Shutdown {
        finalize: bool,
        done: Sender<()>,
    },
    /// Runs a closure on this thread (collectives), between two passes of the loop.
    Run(Job),
}

/// The handle sockets use to reach the progress thread.
pub(crate) struct Engine {
    pub(crate) world: MpiWorld,
    commands: Sender<Command>,
    pub(crate) thread: Thread,
    sleeping: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    next_tag: AtomicI32,
    router_bound: AtomicBool,
    router_generation: AtomicU64,
    linger_ms: AtomicU64,
    pub(crate) malformed: Arc<AtomicU64>,
}

static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();

impl Engine {
    /// The process's engine, starting MPI and the progress thread on first use.
    pub(crate) fn get() -> Result<&'static Engine, TransportError> {
        ENGINE
            .get_or_init(start)
            .as_ref()
            .map_err(|reason| TransportError::Backend {
                backend: "mpi",
                endpoint: "mpi://".into(),
                reason: reason.clone(),
            })
    }

    fn started() -> Option<&'static Engine> {
        ENGINE.get().and_then(|e| e.as_ref().ok())
    }

    /// Why the progress thread stopped, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn submit(&self, command: Command) -> Result<(), String> {
        if let Some(reason) = self.failure() {
            return Err(reason);
        }
        self.commands
            .send(command)
            .map_err(|_| "the MPI progress thread has stopped".to_string())?;
        if self.sleeping.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Ok(())
    }

    pub(crate) fn allocate_tag(&self) -> Result<i32, String> {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        if tag > LAST_DEALER_TAG {
            return Err(format!(
                "this process has opened {} mpi dealers, the most MPI's smallest tag range \
                 allows; reuse dealers instead of opening one per message",
                LAST_DEALER_TAG - FIRST_DEALER_TAG + 1
            ));
        }
        Ok(tag)
    }

    /// Claims this rank's router slot; `None` if a router is bound already.
    pub(crate) fn claim_router(&self) -> Option<u64> {
        self.router_bound
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| self.router_generation.fetch_add(1, Ordering::SeqCst) + 1)
    }

    pub(crate) fn release_router(&self, generation: u64) {
        let _ = self.submit(Command::UnbindRouter { generation });
        self.router_bound.store(false, Ordering::SeqCst);
    }

    /// Remembers the longest linger of any socket, for the flush at exit.
    pub(crate) fn note_linger(&self, linger: Duration) {
        let ms = u64::try_from(linger.as_millis()).unwrap_or(u64::MAX);
        self.linger_ms.fetch_max(ms, Ordering::Relaxed);
    }
}

fn start() -> Result<Engine, String> {
    let (commands, inbox) = unbounded();
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    let sleeping = Arc::new(AtomicBool::new(false));
    let failure = Arc::new(Mutex::new(None));
    let malformed = Arc::new(AtomicU64::new(0));
    let shared = (sleeping.clone(), failure.clone(), malformed.clone());
    let handle = thread::Builder::new()
        .name("switchyard-mpi".into())
        .spawn(move || {
            let started = match ffi::init() {
                Ok(s) => s,
                Err(e) => {
                    let _ = started_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let world = MpiWorld {
                rank: started.rank as u32,
                size: started.size as u32,
                thread_level: started.level,
                processor_name: started.processor.clone(),
            };
            let _ = started_tx.send(Ok(world));
            Progress::new(started, inbox, shared).run();
        })
        .map_err(|e| format!("cannot start the MPI progress thread: {e}"))?;
    let world = started_rx
        .recv()
        .map_err(|_| "the MPI progress thread died while initialising MPI".to_string())??;
    register_exit_hook();
    tracing::debug!(rank = world.rank, size = world.size, level = ?world.thread_level, "mpi started");
    Ok(Engine {
        world,
        commands,
        thread: handle.thread().clone(),
        sleeping,
        failure,
        next_tag: AtomicI32::new(FIRST_DEALER_TAG),
        router_bound: AtomicBool::new(false),
        router_generation: AtomicU64::new(0),
        linger_ms: AtomicU64::new(0),
        malformed,
    })
}

/// At exit: a rank that ends well flushes its sends and calls `MPI_Finalize`; a rank
/// that fails skips it, so that `mpirun` sees a process end without finalizing and
/// takes the whole job down naming that rank, instead of every rank waiting in
/// `MPI_Finalize` for one that will never arrive.
fn at_exit(status: i32) {
    let Some(engine) = Engine::started() else {
        return;
    };
    if status != 0 {
        eprintln!(
            "switchyard: mpi rank {} exits with status {status} without MPI_Finalize, \
             so that mpirun ends the job",
            engine.world.rank
        );
        return;
    }
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let linger = Duration::from_millis(engine.linger_ms.load(Ordering::Relaxed));
    let finalize_timeout = std::env::var(ENV_FINALIZE_TIMEOUT)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(60), Duration::from_secs);
    if engine
        .submit(Command::Shutdown {
            finalize: true,
            done: done_tx,
        })
        .is_err()
    {
        return;
    }
    if done_rx.recv_timeout(linger + finalize_timeout).is_err() {
        eprintln!(
            "switchyard: mpi rank {} gave up waiting for the other ranks in MPI_Finalize \
             after {:?} ({ENV_FINALIZE_TIMEOUT})",
            engine.world.rank,
            linger + finalize_timeout
        );
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn register_exit_hook() {
    use std::ffi::{c_int, c_void};
    extern "C" {
        // glibc: like atexit, but the handler learns the exit status.
        fn on_exit(function: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
    }
    extern "C" fn hook(status: c_int, _: *mut c_void) {
        at_exit(status);
    }
    // SAFETY: registers a plain function with no captured state.
    unsafe {
        on_exit(hook, std::ptr::null_mut());
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn register_exit_hook() {
    extern "C" {
        fn atexit(function: extern "C" fn()) -> std::ffi::c_int;
    }
    // Without the exit status, a failing rank still finalizes; the finalize timeout
    // bounds its wait.
    extern "C" fn hook() {
        at_exit(0);
    }
    // SAFETY: registers a plain function with no captured state.
    unsafe {
        atexit(hook);
    }
}

struct InFlight {
    /// Keeps the buffers MPI reads alive until the send completes.
    _encoded: Encoded,
    credits: Option<Arc<Credits>>,
}

struct DealerEnd {
    router: i32,
    inbox: Sender<Msg>,
    hwm: usize,
    limits: Limits,
    connected: Option<Sender<()>>,
}

struct RouterEnd {
    generation: u64,
    events: Sender<MpiInbound>,
    hwm: usize,
    limits: Limits,
}

struct PeerState {
    identity: PeerId,
    readied: bool,
    live: bool,
    credits: Arc<Credits>,
}

struct Progress {
    comm: mpi::ffi::MPI_Comm,
    owns_mpi: bool,
    commands: Receiver<Command>,
    sleeping: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    malformed: Arc<AtomicU64>,
    requests: Vec<Request>,
    in_flight: Vec<InFlight>,
    dealers: HashMap<i32, DealerEnd>,
    router: Option<RouterEnd>,
    peers: HashMap<(i32, i32), PeerState>,
    shutdown: Option<(bool, Sender<()>)>,
    /// The collectives' own duplicate of `MPI_COMM_WORLD`, made at the first
    /// [`Command::Run`] (or why it could not be; never retried, because
    /// `MPI_Comm_dup` is collective and the other ranks would not join a retry).
    collective: Option<Result<mpi::ffi::MPI_Comm, String>>,
}

type Shared = (Arc<AtomicBool>, Arc<Mutex<Option<String>>>, Arc<AtomicU64>);

impl Progress {
    fn new(started: ffi::Started, commands: Receiver<Command>, shared: Shared) -> Progress {
        let (sleeping, failure, malformed) = shared;
        Progress {
            comm: started.comm,
            owns_mpi: started.owns_mpi,
            commands,
            sleeping,
            failure,
            malformed,
            requests: Vec::new(),
            in_flight: Vec::new(),
            dealers: HashMap::new(),
            router: None,
            peers: HashMap::new(),
            shutdown: None,
            collective: None,
        }
    }

    fn run(mut self) {
        let mut last_work = Instant::now();
        let mut nap = FIRST_NAP;
        loop {
            let worked = match self.step() {
                Ok(worked) => worked,
                Err(e) => {
                    tracing::error!("mpi progress thread stops: {e}");
                    *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    return;
                }
            };
            if let Some((finalize, _)) = &self.shutdown {
                if self.requests.is_empty() {
                    let finalize = *finalize && self.owns_mpi;
                    self.finish(finalize);
                    return;
                }
            }
            if worked {
                last_work = Instant::now();
                nap = FIRST_NAP;
                continue;
            }
            // OpenMPI moves a rendezvous send's data only inside MPI calls, so a
            // thread that naps with sends in flight stalls them: poll longer then.
            let spin = if self.requests.is_empty() {
                SPIN
            } else {
                SPIN_WITH_SENDS
            };
            if last_work.elapsed() < spin {
                thread::yield_now();
                continue;
            }
            self.sleeping.store(true, Ordering::SeqCst);
            if self.commands.is_empty() {
                thread::park_timeout(nap);
            }
            self.sleeping.store(false, Ordering::SeqCst);
            nap = (nap * 2).min(MAX_NAP);
        }
    }

    fn finish(&mut self, finalize: bool) {
        if finalize {
            if let Err(e) = ffi::finalize() {
                eprintln!("switchyard: {e}");
            }
        }
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) =
            Some("MPI was finalized at exit".into());
        if let Some((_, done)) = self.shutdown.take() {
            let _ = done.send(());
        }
    }

    /// One pass over everything; `true` if anything happened.
    fn step(&mut self) -> Result<bool, MpiError> {
        let mut worked = self.take_commands()?;
        worked |= self.complete_sends()?;
        worked |= self.receive_control()?;
        worked |= self.receive_for_router()?;
        worked |= self.receive_for_dealers()?;
        Ok(worked)
    }

    fn post(
        &mut self,
        dest: i32,
        tag: i32,
        encoded: Encoded,
        credits: Option<Arc<Credits>>,
    ) -> Result<(), MpiError> {
        // SAFETY: `encoded` moves into `in_flight` next to its request and stays there
        // (its heap buffers unmoved) until MPI_Testsome reports the send complete.
        let request = unsafe { ffi::isend(self.comm, &encoded.blocks(), dest, tag) };
        match request {
            Ok(request) => {
                self.requests.push(request);
                self.in_flight.push(InFlight {
                    _encoded: encoded,
                    credits,
                });
                Ok(())
            }
            Err(e) => {
                if let Some(c) = credits {
                    c.release();
                }
                Err(e)
            }
        }
    }

    fn send_control(&mut self, dest: i32, note: &Control) -> Result<(), MpiError> {
        let encoded = Encoded {
            head: note.encode(),
            frames: Vec::new(),
        };
        self.post(dest, CONTROL_TAG, encoded, None)
    }

    fn take_commands(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        while let Ok(command) = self.commands.try_recv() {
            worked = true;
            match command {
                Command::Send {
                    dest,
                    tag,
                    encoded,
                    credits,
                } => self.post(dest, tag, encoded, Some(credits))?,
                Command::OpenDealer {
                    tag,
                    router,
                    identity,
                    inbox,
                    hwm,
                    limits,
                    connected,
                } => {
                    self.dealers.insert(
                        tag,
                        DealerEnd {
                            router,
                            inbox,
                            hwm,
                            limits,
                            connected: Some(connected),
                        },
                    );
                    self.send_control(
                        router,
                        &Control::Hello {
                            dealer: tag,
                            identity: bytes::Bytes::copy_from_slice(identity.as_bytes()),
                        },
                    )?;
                }
                Command::CloseDealer { tag, router } => {
                    self.dealers.remove(&tag);
                    self.send_control(router, &Control::Bye { dealer: tag })?;
                }
                Command::BindRouter {
                    generation,
                    events,
                    hwm,
                    limits,
                } => self.bind_router(RouterEnd {
                    generation,
                    events,
                    hwm,
                    limits,
                })?,
                Command::UnbindRouter { generation } => {
                    if self.router.as_ref().map(|r| r.generation) == Some(generation) {
                        self.router = None;
                    }
                }
                Command::Shutdown { finalize, done } => {
                    self.shutdown = Some((finalize, done));
                }
                Command::Run(job) => {
                    // Separate from `self.comm`, so that a collective's messages can
                    // never match the sockets' probes, nor theirs the collective's.
                    let comm = self
                        .collective
                        .get_or_insert_with(|| ffi::dup_world().map_err(|e| e.to_string()))
                        .clone();
                    job(comm);
                }
            }
        }
        Ok(worked)
    }

    /// A new router inherits every dealer that said hello, as a restarted ZeroMQ
    /// router is reconnected to by its dealers.
    fn bind_router(&mut self, router: RouterEnd) -> Result<(), MpiError> {
        let mut ready = Vec::new();
        for (&(rank, tag), peer) in self.peers.iter_mut() {
            if !peer.readied {
                peer.readied = true;
                ready.push((rank, tag));
            }
            if peer.live {
                let _ = router.events.send(Inbound::Connect {
                    peer: peer.identity.clone(),
                    route: MpiRoute {
                        rank,
                        tag,
                        credits: peer.credits.clone(),
                    },
                });
            }
        }
        self.router = Some(router);
        for (rank, tag) in ready {
            self.send_control(rank, &Control::Ready { dealer: tag })?;
        }
        Ok(())
    }

    fn complete_sends(&mut self) -> Result<bool, MpiError> {
        let mut done = ffi::test_some(&mut self.requests)?;
        if done.is_empty() {
            return Ok(false);
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        for i in done {
            self.requests.swap_remove(i);
            if let Some(credits) = self.in_flight.swap_remove(i).credits {
                credits.release();
            }
        }
        Ok(true)
    }

    fn drop_malformed(&self, source: i32, reason: &dyn std::fmt::Display) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(source_rank = source, %reason, "mpi: dropped a malformed message");
    }

    fn receive_control(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        while let Some(matched) = ffi::probe(self.comm, None, Some(CONTROL_TAG))? {
            worked = true;
            let source = matched.source;
            let buffer = ffi::receive(matched)?;
            match Control::decode(&buffer) {
                Ok(note) => self.apply(source, note)?,
                Err(reason) => self.drop_malformed(source, &reason),
            }
        }
        Ok(worked)
    }

    fn apply(&mut self, source: i32, note: Control) -> Result<(), MpiError> {
        match note {
            Control::Hello { dealer, identity } => {
                let Some(identity) = PeerId::new(identity) else {
                    self.drop_malformed(source, &"hello with an invalid identity");
                    return Ok(());
                };
                let hwm = self.router.as_ref().map_or(1000, |r| r.hwm);
                let credits = Credits::new(hwm);
                let readied = self.router.is_some();
                if let Some(router) = &self.router {
                    let _ = router.events.send(Inbound::Connect {
                        peer: identity.clone(),
                        route: MpiRoute {
                            rank: source,
                            tag: dealer,
                            credits: credits.clone(),
                        },
                    });
                }
                self.peers.insert(
                    (source, dealer),
                    PeerState {
                        identity,
                        readied,
                        live: true,
                        credits,
                    },
                );
                if readied {
                    self.send_control(source, &Control::Ready { dealer })?;
                }
            }
            Control::Ready { dealer } => {
                if let Some(end) = self.dealers.get_mut(&dealer) {
                    if end.router == source {
                        if let Some(connected) = end.connected.take() {
                            let _ = connected.send(());
                        }
                    }
                }
            }
            Control::Bye { dealer } => {
                let Some(peer) = self.peers.get_mut(&(source, dealer)) else {
                    return Ok(());
                };
                peer.live = false;
                let identity = peer.identity.clone();
                // A dealer that reconnected under the same identity keeps its place.
                let replaced = self
                    .peers
                    .values()
                    .any(|p| p.live && p.identity == identity);
                if let (Some(router), false) = (&self.router, replaced) {
                    let _ = router.events.send(Inbound::Disconnect { peer: identity });
                }
            }
        }
        Ok(())
    }

    fn receive_for_router(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        for _ in 0..BATCH {
            let Some(router) = &self.router else {
                break;
            };
            if router.events.len() >= router.hwm {
                break;
            }
            let Some(matched) = ffi::probe(self.comm, None, Some(ROUTER_TAG))? else {
                break;
            };
            worked = true;
            let source = matched.source;
            let buffer = ffi::receive(matched)?;
            let Some(router) = &self.router else {
                break;
            };
            match wire::decode(buffer, &router.limits) {
                Ok((dealer, msg)) => match self.peers.get(&(source, dealer)) {
                    Some(peer) => {
                        let _ = router.events.send(Inbound::Data {
                            peer: peer.identity.clone(),
                            msg,
                        });
                    }
                    None => self.drop_malformed(
                        source,
                        &format_args!("data from dealer tag {dealer}, which never said hello"),
                    ),
                },
                Err(reason) => self.drop_malformed(source, &reason),
            }
        }
        Ok(worked)
    }

    fn receive_for_dealers(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        let mut malformed = Vec::new();
        for (&tag, end) in &self.dealers {
            for _ in 0..BATCH {
                if end.inbox.len() >= end.hwm {
                    break;
                }
                let Some(matched) = ffi::probe(self.comm, Some(end.router), Some(tag))? else {
                    break;
                };
                worked = true;
                match wire::decode(ffi::receive(matched)?, &end.limits) {
                    Ok((_, msg)) => {
                        let _ = end.inbox.send(msg);
                    }
                    Err(reason) => malformed.push((end.router, reason)),
                }
            }
        }
        for (source, reason) in malformed {
            self.drop_malformed(source, &reason);
        }
        Ok(worked)
    }
}
