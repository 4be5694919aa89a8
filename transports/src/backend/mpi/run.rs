//! Running closures on the MPI progress thread: how collectives call MPI without
//! racing the sockets.

use super::engine::{self, Command, Engine};
use super::ffi;
use crate::TransportError;

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
/// While `f` runs, the progress thread does nothing else: sockets that make their own
/// MPI calls (under `MPI_THREAD_MULTIPLE`) keep sending and receiving, but their sends
/// that MPI did not finish at once complete only after `f` returns, and so does the
/// traffic of sockets that leave their calls to the progress thread (at a lower
/// thread level). A collective that waits for a rank which is itself waiting for a
/// socket message from this process can therefore deadlock; order socket traffic and
/// collectives the same way on every rank. MPI collectives cannot time out: a rank
/// that dies ends the job through `mpirun` (a failing rank exits without
/// `MPI_Finalize`, see [`ENV_FINALIZE_TIMEOUT`](crate::mpi::ENV_FINALIZE_TIMEOUT)).
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
