//! The engine: MPI, the progress thread that owns it, and the handle sockets hold.
//!
//! When MPI grants `MPI_THREAD_MULTIPLE` (and [`ENV_MPI_DIRECT`] does not say
//! otherwise), a socket makes its own data calls on its own thread (`here`): a send
//! takes a credit (the high-water mark), posts `MPI_Isend` and tests it once; a send
//! MPI has not finished goes to the progress thread, which completes it and returns
//! the credit. A receive that finds its inbox empty probes MPI for the socket's tag
//! itself, for up to [`RECEIVE_SPIN`](super::here::RECEIVE_SPIN), before it blocks.
//! No message then crosses a thread on its way, as with a raw `MPI_Send`/`MPI_Recv`.
//!
//! The progress thread does the rest: the control notes between ranks (hello, ready,
//! bye), the completion of sends, the collectives, and the receives for every socket
//! nobody is waiting in (so that a poller sees its inbox fill). Its receives are
//! `MPI_Improbe` + `MPI_Mrecv` on the tag of a socket that has room, so a socket at
//! its high-water mark leaves messages in MPI (where large ones stay on the sender:
//! rendezvous) instead of in an unbounded queue here. At a lower thread level it
//! makes every MPI call, and sockets only queue commands (one hand-off per message
//! each way); MPI is initialised on this thread, so even `FUNNELED` suffices.
//!
//! Collectives run here too: [`run_on_progress_thread`](super::run_on_progress_thread)
//! hands this thread a closure ([`Command::Run`]), which gets a second duplicate of
//! `MPI_COMM_WORLD`, made at the first such closure. A blocking collective stops the
//! loop while it runs: sockets that call MPI themselves go on, but what the loop does
//! for them (completing sends, receiving for sockets nobody waits in, connects) waits.
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

use super::comms::Comms;
use super::credits::{Credits, MpiInbound};
use super::exit::register_exit_hook;
use super::ffi::{self, ThreadLevel};
use super::here::{Posted, Turn};
use super::progress::{Progress, Sending};
use super::shared::Shared;
use super::wire::Encoded;
use crate::{PeerId, TransportError};
use crossbeam_channel::{Sender, unbounded};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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

/// Environment variable: `0` (or `false`) makes the progress thread post and receive
/// every socket message even when MPI grants `MPI_THREAD_MULTIPLE`, as before sockets
/// made their own calls (for comparison, and for an MPI whose multi-threaded mode
/// misbehaves); `1` (or `true`, the default) lets sockets call MPI themselves when
/// MPI grants it.
pub const ENV_MPI_DIRECT: &str = "SWITCHYARD_MPI_DIRECT";

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
        source_tag: i32,
        encoded: Encoded,
        credits: Arc<Credits>,
    },
    /// Sends a socket posted on its own thread and MPI has not finished: the
    /// progress thread completes them, then frees the buffers and returns the credit.
    Track {
        posted: Posted,
        sending: Arc<Sending>,
    },
    OpenDealer {
        tag: i32,
        router: i32,
        identity: PeerId,
        inbox: Sender<Msg>,
        hwm: usize,
        limits: Limits,
        connected: Sender<()>,
        turn: Arc<Turn>,
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
        turn: Arc<Turn>,
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
    pub(crate) shared: Arc<Shared>,
    /// The sockets' communicators, when sockets make their own MPI calls.
    pub(crate) here: Option<Comms>,
    next_tag: AtomicI32,
    router_bound: AtomicBool,
    router_generation: AtomicU64,
    pub(super) linger_ms: AtomicU64,
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
        self.shared.failure()
    }

    pub(crate) fn submit(&self, command: Command) -> Result<(), String> {
        self.submit_or_return(command).map_err(|(reason, _)| reason)
    }

    /// Queues `command`, or hands it back with why it cannot run.
    pub(crate) fn submit_or_return(&self, command: Command) -> Result<(), (String, Command)> {
        if let Some(reason) = self.failure() {
            return Err((reason, command));
        }
        if let Err(refused) = self.commands.send(command) {
            return Err((
                "the MPI progress thread has stopped".into(),
                refused.into_inner(),
            ));
        }
        self.wake();
        Ok(())
    }

    /// Wakes the progress thread if it naps, so that it polls at once.
    pub(crate) fn wake(&self) {
        if self.shared.sleeping.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
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

/// Whether sockets may make their own MPI calls, by [`ENV_MPI_DIRECT`].
fn direct_allowed() -> Result<bool, String> {
    parse_direct(std::env::var(ENV_MPI_DIRECT).ok().as_deref())
}

fn parse_direct(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("" | "1" | "true") => Ok(true),
        Some("0" | "false") => Ok(false),
        Some(other) => Err(format!(
            "{ENV_MPI_DIRECT}={other:?}: expected 1, 0, true or false"
        )),
    }
}

fn start() -> Result<Engine, String> {
    let direct = direct_allowed()?;
    let (commands, inbox) = unbounded();
    let (started_tx, started_rx) = crossbeam_channel::bounded(1);
    let shared = Arc::new(Shared::new());
    let for_progress = shared.clone();
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
            let comms = match Comms::with_data(started.comm) {
                Ok(comms) => comms,
                Err(e) => {
                    let _ = started_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = started_tx.send(Ok((world, comms)));
            Progress::new(started, comms, inbox, for_progress).run();
        })
        .map_err(|e| format!("cannot start the MPI progress thread: {e}"))?;
    let (world, comms) = started_rx
        .recv()
        .map_err(|_| "the MPI progress thread died while initialising MPI".to_string())??;
    let here = (direct && world.thread_level == ThreadLevel::Multiple).then_some(comms);
    register_exit_hook();
    tracing::debug!(
        rank = world.rank,
        size = world.size,
        level = ?world.thread_level,
        sockets_call_mpi = here.is_some(),
        "mpi started"
    );
    Ok(Engine {
        world,
        commands,
        thread: handle.thread().clone(),
        shared,
        here,
        next_tag: AtomicI32::new(FIRST_DEALER_TAG),
        router_bound: AtomicBool::new(false),
        router_generation: AtomicU64::new(0),
        linger_ms: AtomicU64::new(0),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_direct_variable_takes_four_words_and_names_itself_otherwise() {
        assert_eq!(parse_direct(None), Ok(true));
        assert_eq!(parse_direct(Some(" true ")), Ok(true));
        assert_eq!(parse_direct(Some("0")), Ok(false));
        assert_eq!(parse_direct(Some("false")), Ok(false));
        let refused = parse_direct(Some("no")).unwrap_err();
        assert!(
            refused.contains("SWITCHYARD_MPI_DIRECT=\"no\""),
            "{refused}"
        );
    }
}
