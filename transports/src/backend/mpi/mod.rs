//! The `mpi` backend: Dealer/Router sockets between the ranks of an `mpirun` job.
//!
//! `mpi://R` names rank `R`'s router: a router binds its own rank, a dealer connects
//! to any rank. `mpirun` has already wired the processes, so there is no address to
//! resolve; `connect` only exchanges a HELLO/READY with the remote rank's progress
//! thread (so that, as with ZeroMQ, a dealer's first message cannot race the router's
//! bind). Threads of one process normally talk over `local://` (the stub does this by
//! itself); an `mpi://` dealer of a rank's own router works too, through MPI's
//! self-loopback.
//!
//! How it works and why is in [`engine`]'s documentation: one progress thread per
//! process makes every MPI call.

#[cfg(feature = "mpi")]
mod collective;
mod engine;
mod ffi;
mod wire;

#[cfg(feature = "mpi")]
pub use collective::{with_collectives, CallError, Collectives, Datatype, Operation};
pub use engine::{MpiWorld, ENV_FINALIZE_TIMEOUT};
pub use ffi::ThreadLevel;

use super::inbox::{Inbound, RouterInbox};
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{unbounded, Receiver};
use engine::{Command, Credits, Engine, ROUTER_TAG};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

pub(crate) use engine::MpiInbound;

/// Starts MPI (if this process has not yet) and describes the job. Every rank of an
/// `mpirun` job must start MPI, because `MPI_Init` waits for all of them.
pub fn world() -> Result<MpiWorld, TransportError> {
    Ok(Engine::get()?.world.clone())
}

/// Runs `f` on the MPI progress thread, the one thread of this process that calls MPI,
/// and returns what it returns; blocks until it has run. `f` gets a communicator for
/// collectives: a duplicate of `MPI_COMM_WORLD` with `MPI_ERRORS_RETURN`, separate
/// from the one the sockets use, so that collective traffic never mixes with theirs.
///
/// This is how collectives call MPI without racing the sockets, whatever thread
/// level MPI granted: `f` may make any MPI call (through `mpi::ffi`) on that
/// communicator, but must not start MPI, finalize it, or call this function (that
/// fails at once rather than wait for itself).
///
/// The communicator is made by the first call, with `MPI_Comm_dup`, which is collective
/// over `MPI_COMM_WORLD`: every rank must make its first call, and make it in the same
/// order relative to its other collectives. If that fails, every call returns the
/// error.
///
/// While `f` runs, this process's socket traffic waits: nothing new is posted and
/// nothing is received until `f` returns (sends already posted keep moving inside
/// MPI). A collective that waits for a rank which is itself waiting for a socket
/// message from this process therefore deadlocks; order socket traffic and
/// collectives the same way on every rank. MPI collectives cannot time out: a rank
/// that dies ends the job through `mpirun` (a failing rank exits without
/// `MPI_Finalize`, see [`ENV_FINALIZE_TIMEOUT`]).
///
/// A panic in `f` is caught on the progress thread (which goes on serving the
/// sockets) and resumed here.
///
/// # Errors
///
/// [`TransportError::Backend`] if MPI cannot start, the progress thread has stopped,
/// or the collectives' communicator cannot be made.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), switchyard_transports::TransportError> {
/// // Under mpirun: this rank's number, asked of the collectives' communicator.
/// let (code, rank) = switchyard_transports::mpi::run_on_progress_thread(|comm| {
///     let mut rank = 0;
///     // SAFETY: a plain MPI call on the thread that may make it.
///     let code = unsafe { mpi::ffi::MPI_Comm_rank(comm, &mut rank) };
///     (code, rank)
/// })?;
/// println!("rank {rank} (MPI_Comm_rank returned {code})");
/// # Ok(())
/// # }
/// ```
pub fn run_on_progress_thread<R, F>(f: F) -> Result<R, TransportError>
where
    F: FnOnce(mpi::ffi::MPI_Comm) -> R + Send,
    R: Send,
{
    let engine = Engine::get()?;
    let backend = |reason: String| TransportError::Backend {
        backend: "mpi",
        endpoint: "mpi://".into(),
        reason,
    };
    if std::thread::current().id() == engine.thread.id() {
        return Err(backend(
            "run_on_progress_thread was called on the progress thread (inside another \
             closure), where it would wait for itself"
                .into(),
        ));
    }
    let (reply, replied) = crossbeam_channel::bounded(1);
    let task = Task { f, reply };
    let job: Box<dyn FnOnce(Result<mpi::ffi::MPI_Comm, String>) + Send + '_> =
        Box::new(move |comm| task.run(comm));
    // SAFETY: only the lifetime changes: `f` and `R` may borrow from the caller's
    // stack, and the progress thread may hold the job for longer than that borrow
    // would allow. It never uses a borrow after this function returns, because this
    // function returns only once the reply channel resolves (nothing between
    // `submit` and `recv` can return or unwind early), and the channel resolves
    // only after `f` is gone:
    // - `Task::run` sends the reply after `f` has run (or unwound) and been dropped;
    //   what remains of the job (the sender, the box's allocation) borrows nothing;
    // - a job that never runs (the progress thread stopped; `submit` failed; the
    //   command queue was dropped) is dropped whole, and `Task` drops `f` before
    //   `reply`, so the channel disconnects only after `f` is gone.
    // `R` travels through the channel to this thread, to the caller who lent it its
    // borrows.
    let job: engine::Job = unsafe {
        std::mem::transmute::<
            Box<dyn FnOnce(Result<mpi::ffi::MPI_Comm, String>) + Send + '_>,
            Box<dyn FnOnce(Result<mpi::ffi::MPI_Comm, String>) + Send + 'static>,
        >(job)
    };
    if let Err(reason) = engine.submit(Command::Run(job)) {
        // `submit` dropped the job before returning.
        return Err(backend(reason));
    }
    match replied.recv() {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(reason))) => Err(backend(format!(
            "no communicator for collectives: {reason}"
        ))),
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => Err(backend(engine.failure().unwrap_or_else(|| {
            "the MPI progress thread stopped before running the closure".into()
        }))),
    }
}

/// The MPI library's text for an error code that an MPI call returned
/// (`MPI_Error_string`), or the bare number if the library does not know it.
///
/// # Safety
///
/// Call it where MPI calls may be made: inside [`run_on_progress_thread`]'s closure.
pub unsafe fn error_string(code: std::ffi::c_int) -> String {
    ffi::error_string(code)
}

/// A closure for the progress thread and where its result goes.
struct Task<F, R> {
    // Declared before `reply` so that it is dropped first: a waiter never sees the
    // channel disconnect while `f` (and what it borrows) is still alive.
    f: F,
    reply: crossbeam_channel::Sender<std::thread::Result<Result<R, String>>>,
}

impl<F: FnOnce(mpi::ffi::MPI_Comm) -> R, R> Task<F, R> {
    fn run(self, comm: Result<mpi::ffi::MPI_Comm, String>) {
        let Task { f, reply } = self;
        // `f` is consumed (or dropped, unwinding) inside the guarded call, before the
        // reply goes out; the progress thread survives a panic in it.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || comm.map(f)));
        let _ = reply.send(outcome);
    }
}

fn send_error(msg: Msg, kind: SendErrorKind, endpoint: &str) -> SendError {
    SendError {
        msg,
        kind,
        endpoint: endpoint.to_string(),
    }
}

/// Where a send goes: the destination rank and socket tag, and the sender's own tag.
struct Hop {
    rank: i32,
    tag: i32,
    source_tag: i32,
}

/// Encodes, takes a credit (waiting until `deadline`, or not at all), and queues.
fn queue_send(
    engine: &Engine,
    msg: Msg,
    hop: Hop,
    credits: &Arc<Credits>,
    deadline: Option<Instant>,
    endpoint: &str,
) -> Result<(), SendError> {
    let encoded = match wire::encode(&msg, hop.source_tag) {
        Ok(encoded) => encoded,
        Err(reason) => return Err(send_error(msg, SendErrorKind::Backend(reason), endpoint)),
    };
    if !credits.acquire(deadline) {
        let kind = if deadline.is_some() {
            SendErrorKind::Timeout
        } else {
            SendErrorKind::Full
        };
        return Err(send_error(msg, kind, endpoint));
    }
    let command = Command::Send {
        dest: hop.rank,
        tag: hop.tag,
        encoded,
        credits: credits.clone(),
    };
    engine
        .submit(command)
        .map_err(|reason| send_error(msg, SendErrorKind::Backend(reason), endpoint))
}

fn target_rank(engine: &Engine, rank: u32, endpoint: &str) -> Result<i32, TransportError> {
    if rank >= engine.world.size {
        return Err(TransportError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: format!(
                "rank {rank} is outside this MPI job of {} ranks",
                engine.world.size
            ),
        });
    }
    Ok(rank as i32)
}

/// A dealer talking to one rank's router over MPI.
pub(crate) struct MpiDealer {
    engine: &'static Engine,
    endpoint: String,
    identity: PeerId,
    options: SocketOptions,
    router: i32,
    tag: i32,
    credits: Arc<Credits>,
    inbox: Receiver<Msg>,
}

impl std::fmt::Debug for MpiDealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiDealer")
            .field("endpoint", &self.endpoint)
            .field("identity", &self.identity)
            .field("tag", &self.tag)
            .finish()
    }
}

impl MpiDealer {
    pub(crate) fn connect(rank: u32, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("mpi://{rank}");
        let engine = Engine::get()?;
        let router = target_rank(engine, rank, &endpoint)?;
        let backend = |reason: String| TransportError::Backend {
            backend: "mpi",
            endpoint: endpoint.clone(),
            reason,
        };
        let tag = engine.allocate_tag().map_err(backend)?;
        let identity = options
            .identity
            .clone()
            .unwrap_or_else(super::fresh_identity);
        let (inbox_tx, inbox) = unbounded();
        let (connected_tx, connected) = crossbeam_channel::bounded(1);
        let started = Instant::now();
        engine
            .submit(Command::OpenDealer {
                tag,
                router,
                identity: identity.clone(),
                inbox: inbox_tx,
                hwm: options.hwm,
                limits: options.limits,
                connected: connected_tx,
            })
            .map_err(backend)?;
        engine.note_linger(options.linger);
        let dealer = MpiDealer {
            engine,
            endpoint: endpoint.clone(),
            identity,
            credits: Credits::new(options.hwm),
            router,
            tag,
            inbox,
            options,
        };
        if connected
            .recv_timeout(dealer.options.connect_timeout)
            .is_err()
        {
            if let Some(reason) = engine.failure() {
                return Err(backend(reason));
            }
            // Dropping the dealer says goodbye, so a router bound later forgets it.
            return Err(TransportError::Unreachable {
                endpoint,
                waited: started.elapsed(),
            });
        }
        Ok(dealer)
    }

    pub(crate) fn identity(&self) -> &PeerId {
        &self.identity
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn send_deadline(
        &mut self,
        msg: Msg,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        queue_send(
            self.engine,
            msg,
            Hop {
                rank: self.router,
                tag: ROUTER_TAG,
                source_tag: self.tag,
            },
            &self.credits,
            deadline,
            &self.endpoint,
        )
    }

    fn closed(&self) -> RecvError {
        match self.engine.failure() {
            Some(reason) => RecvError::Backend {
                endpoint: self.endpoint.clone(),
                reason,
            },
            None => RecvError::Disconnected {
                endpoint: self.endpoint.clone(),
            },
        }
    }

    pub(crate) fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        let received = match deadline {
            Some(deadline) => self.inbox.recv_deadline(deadline).map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => RecvError::Timeout,
                crossbeam_channel::RecvTimeoutError::Disconnected => self.closed(),
            }),
            None => self.inbox.recv().map_err(|_| self.closed()),
        };
        // A dead progress thread never fills the inbox again: say why, not "timeout".
        match received {
            Err(RecvError::Timeout) => {
                Err(self
                    .engine
                    .failure()
                    .map_or(RecvError::Timeout, |reason| RecvError::Backend {
                        endpoint: self.endpoint.clone(),
                        reason,
                    }))
            }
            other => other,
        }
    }

    pub(crate) fn try_recv(&mut self) -> Result<Msg, RecvError> {
        self.inbox.try_recv().map_err(|_| RecvError::Empty)
    }

    pub(crate) fn receiver(&self) -> &Receiver<Msg> {
        &self.inbox
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.inbox.is_empty()
    }
}

impl Drop for MpiDealer {
    fn drop(&mut self) {
        let _ = self.engine.submit(Command::CloseDealer {
            tag: self.tag,
            router: self.router,
        });
    }
}

/// This rank's router.
pub(crate) struct MpiRouter {
    engine: &'static Engine,
    generation: u64,
    options: SocketOptions,
    inbox: RouterInbox<engine::MpiRoute>,
}

impl std::fmt::Debug for MpiRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRouter")
            .field("endpoint", &self.inbox.endpoint())
            .field("peers", &self.inbox.peers().len())
            .finish()
    }
}

impl MpiRouter {
    pub(crate) fn bind(rank: u32, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("mpi://{rank}");
        let engine = Engine::get()?;
        target_rank(engine, rank, &endpoint)?;
        if rank != engine.world.rank {
            return Err(TransportError::InvalidEndpoint {
                endpoint,
                reason: format!(
                    "this process is rank {}; a router binds its own rank's endpoint",
                    engine.world.rank
                ),
            });
        }
        let Some(generation) = engine.claim_router() else {
            return Err(TransportError::AddrInUse {
                endpoint,
                reason: "this rank already has an mpi router".into(),
            });
        };
        let (events, inbound) = unbounded();
        if let Err(reason) = engine.submit(Command::BindRouter {
            generation,
            events,
            hwm: options.hwm,
            limits: options.limits,
        }) {
            engine.release_router(generation);
            return Err(TransportError::Backend {
                backend: "mpi",
                endpoint,
                reason,
            });
        }
        engine.note_linger(options.linger);
        Ok(MpiRouter {
            engine,
            generation,
            inbox: RouterInbox::new(endpoint, options.hwm, inbound),
            options,
        })
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        self.inbox.endpoint()
    }

    pub(crate) fn await_peers(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        self.inbox.await_peers(expected, timeout)
    }

    pub(crate) fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        match self.inbox.recv_from_deadline(deadline) {
            Err(RecvError::Timeout) => {
                Err(self
                    .engine
                    .failure()
                    .map_or(RecvError::Timeout, |reason| RecvError::Backend {
                        endpoint: self.inbox.endpoint().to_string(),
                        reason,
                    }))
            }
            other => other,
        }
    }

    pub(crate) fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        self.inbox.try_recv_from()
    }

    pub(crate) fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let Some(route) = self.inbox.route(peer).cloned() else {
            return Err(send_error(
                msg,
                SendErrorKind::UnknownPeer(peer.clone()),
                self.inbox.endpoint(),
            ));
        };
        queue_send(
            self.engine,
            msg,
            Hop {
                rank: route.rank,
                tag: route.tag,
                source_tag: ROUTER_TAG,
            },
            &route.credits,
            deadline,
            self.inbox.endpoint(),
        )
    }

    pub(crate) fn peers(&self) -> Vec<PeerId> {
        self.inbox.peers()
    }

    /// Malformed messages this process's progress thread dropped (all mpi sockets).
    pub(crate) fn dropped_malformed(&self) -> u64 {
        self.engine.malformed.load(Ordering::Relaxed)
    }

    pub(crate) fn receiver(&self) -> &Receiver<Inbound<engine::MpiRoute>> {
        self.inbox.receiver()
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.inbox.has_pending()
    }
}

impl Drop for MpiRouter {
    fn drop(&mut self) {
        self.engine.release_router(self.generation);
    }
}
