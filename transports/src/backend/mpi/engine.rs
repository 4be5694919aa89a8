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
//! [`SPIN`](super::progress::SPIN) ([`SPIN_WITH_SENDS`](super::progress::SPIN_WITH_SENDS) while sends are in flight, because MPI moves their
//! data only inside MPI calls), yielding the core between polls, then sleeps in
//! growing naps up to [`MAX_NAP`](super::progress::MAX_NAP). A local send wakes it at once; a message from another rank waits at
//! most one nap. So an idle process costs about a thousand short wake-ups a second
//! (measured by `switchyard bench mpi`), not a spinning core as a blocking
//! `MPI_Recv` would.
//!
//! The pieces: this file is the handle sockets hold ([`Engine`]) and the commands they
//! send; `progress` is the loop on the thread (`progress/receive` what it receives);
//! `credits` bounds each socket's sends in flight; `exit` flushes and finalizes (or
//! deliberately does not) when the process exits.

use super::credits::{Credits, MpiInbound};
use super::exit::register_exit_hook;
use super::ffi::{self, ThreadLevel};
use super::progress::Progress;
use super::wire::Encoded;
use crate::{PeerId, TransportError};
use crossbeam_channel::{Sender, unbounded};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::Duration;
use switchyard_msg::{Limits, Msg};

/// Tag of control notes between progress threads.
pub(crate) const CONTROL_TAG: i32 = 0;
/// Tag of messages to a rank's router.
pub(crate) const ROUTER_TAG: i32 = 1;
const FIRST_DEALER_TAG: i32 = 2;
/// The largest tag every MPI implementation accepts (`MPI_TAG_UB` is at least this).
const LAST_DEALER_TAG: i32 = 32767;

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
    pub(super) linger_ms: AtomicU64,
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

    /// The engine, if this process has started one.
    pub(super) fn started() -> Option<&'static Engine> {
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
