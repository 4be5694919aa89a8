//! MPI calls a socket makes on its own thread, when MPI granted
//! `MPI_THREAD_MULTIPLE`: a send is posted by the sending thread, and a receive
//! matched by the receiving thread, with no hand-off to the progress thread and back.
//!
//! A send is `MPI_Isend` then one `MPI_Test`: a small message (MPI's eager protocol)
//! is usually done there, and its credit and buffers are freed at once; one that is
//! not (a large message waits for its receiver) goes to the progress thread, which
//! completes it ([`Command::Track`]).
//!
//! A receive probes the socket's own tag. The progress thread receives for a socket
//! too when nobody is waiting in it (so that a poller sees the inbox fill), so each
//! socket has a [`Turn`]: whoever holds it receives for that socket, and a thread
//! that takes it looks at the inbox before it probes MPI, which keeps every socket's
//! messages in order.

use super::credits::Credits;
use super::engine::{Command, Engine};
use super::ffi::{self, Request};
use super::pool;
use super::wire::Encoded;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// How long a receiving thread polls MPI itself before it blocks on the socket's
/// inbox (and leaves the polling to the progress thread's naps). A reply within this
/// window costs no wake-up; a longer wait costs at most this much CPU.
pub(crate) const RECEIVE_SPIN: Duration = Duration::from_micros(200);

/// The communicator the sockets use. Under `MPI_THREAD_MULTIPLE` an MPI handle may be
/// used from any thread.
#[derive(Clone, Copy)]
pub(crate) struct Comm(pub(crate) mpi::ffi::MPI_Comm);

// SAFETY: see the type's documentation: the handle is only used on other threads
// when MPI granted MPI_THREAD_MULTIPLE (`Engine::here` is `None` otherwise).
unsafe impl Send for Comm {}
// SAFETY: as above; MPI serialises what it must inside the calls.
unsafe impl Sync for Comm {}

/// A send posted on a socket's thread, for the progress thread to complete.
pub(crate) struct Posted(pub(crate) Request);

// SAFETY: under MPI_THREAD_MULTIPLE a request may be completed on any thread, and
// only one thread holds it at a time (it moves with this value).
unsafe impl Send for Posted {}

/// How long after a socket's thread left a receive the progress thread still leaves
/// that socket's messages alone: long enough for a reply to be sent and the next
/// receive to begin, short beside the progress thread's naps.
pub(crate) const HOLD_OFF: Duration = Duration::from_micros(50);

/// Whose turn it is to receive for one socket: the socket's thread or the progress
/// thread. The progress thread keeps out while the socket's thread waits in a
/// receive and for [`HOLD_OFF`] after, rather than take its messages and hand them
/// over through the inbox (a wake-up per message on a busy machine).
#[derive(Debug)]
pub(crate) struct Turn {
    receiving: Mutex<()>,
    waiting: AtomicBool,
    /// Set by the progress thread once it serves the socket (a router: once bound,
    /// and the peers it inherits announced); until then the socket's thread does not
    /// receive itself, so that no message overtakes its sender's connect event.
    served: AtomicBool,
    /// When the socket's thread last left a receive, in nanoseconds since `epoch`
    /// (0: never).
    left_at: AtomicU64,
    epoch: Instant,
}

impl Turn {
    pub(crate) fn new() -> Arc<Turn> {
        Arc::new(Turn {
            receiving: Mutex::new(()),
            waiting: AtomicBool::new(false),
            served: AtomicBool::new(false),
            left_at: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The progress thread serves the socket from now on.
    pub(crate) fn serve(&self) {
        self.served.store(true, Ordering::SeqCst);
    }

    /// Whether the socket's thread may receive itself.
    pub(crate) fn served(&self) -> bool {
        self.served.load(Ordering::SeqCst)
    }

    /// Marks the socket's thread as waiting in a receive until the guard is dropped.
    pub(crate) fn wait_here(&self) -> Waiting<'_> {
        self.waiting.store(true, Ordering::SeqCst);
        Waiting(self)
    }

    /// Whether the socket's thread waits in a receive: the progress thread, holding
    /// the turn, hands it over before its next message.
    pub(crate) fn wanted(&self) -> bool {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Waits for the turn (the progress thread holds it only while it receives).
    pub(crate) fn take(&self) -> MutexGuard<'_, ()> {
        self.receiving.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The turn, for the progress thread: if nobody holds it and the socket's thread
    /// neither waits in a receive nor left one within [`HOLD_OFF`].
    pub(crate) fn try_take(&self) -> Option<MutexGuard<'_, ()>> {
        if self.waiting.load(Ordering::SeqCst) {
            return None;
        }
        let left_at = self.left_at.load(Ordering::Relaxed);
        if left_at != 0 && self.now().saturating_sub(left_at) < HOLD_OFF.as_nanos() as u64 {
            return None;
        }
        match self.receiving.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// A socket's thread waiting in a receive (see [`Turn::wait_here`]).
pub(crate) struct Waiting<'a>(&'a Turn);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.left_at.store(self.0.now().max(1), Ordering::Relaxed);
        self.0.waiting.store(false, Ordering::SeqCst);
    }
}

/// Posts `encoded` to `dest`'s socket `tag` on this thread; the credit is released
/// when MPI is done with the buffers.
pub(crate) fn send(
    engine: &Engine,
    comm: Comm,
    dest: i32,
    tag: i32,
    encoded: Encoded,
    credits: Arc<Credits>,
) -> Result<(), String> {
    let posted = engine.shared.while_open(|| {
        // SAFETY: `encoded` stays alive and unmoved (its heap buffers) until the
        // request completes: freed below only once `test` says so, otherwise moved
        // into the progress thread's table with the request, or leaked.
        let mut request = unsafe { ffi::isend_encoded(comm.0, &encoded, dest, tag)? };
        if ffi::test(&mut request)? {
            return Ok(None);
        }
        Ok(Some(request))
    });
    match posted {
        Ok(None) => {
            credits.release();
            Ok(())
        }
        Ok(Some(request)) => {
            let track = Command::Track {
                posted: Posted(request),
                encoded,
                credits,
            };
            if let Err((reason, command)) = engine.submit_or_return(track) {
                // Nobody will complete the send: its buffers must outlive any read
                // MPI might still make of them.
                std::mem::forget(command);
                return Err(reason);
            }
            Ok(())
        }
        Err(reason) => {
            credits.release();
            Err(reason)
        }
    }
}

/// The next message on `tag` (from `source`, or any rank) if one has arrived, received
/// into a pooled buffer, with the rank that sent it.
pub(crate) fn receive(
    engine: &Engine,
    comm: Comm,
    source: Option<i32>,
    tag: i32,
) -> Result<Option<(i32, Bytes)>, String> {
    engine.shared.while_open(|| {
        let Some(matched) = ffi::probe(comm.0, source, Some(tag))? else {
            return Ok(None);
        };
        let from = matched.source;
        Ok(Some((from, receive_pooled(matched)?)))
    })
}

/// Receives a matched message into a buffer of the pool.
pub(crate) fn receive_pooled(matched: ffi::Matched) -> Result<Bytes, ffi::MpiError> {
    let mut buffer = pool::take(matched.len);
    ffi::receive_into(matched, &mut buffer)?;
    Ok(pool::share(buffer))
}

/// How long of [`RECEIVE_SPIN`] a receiving thread polls without giving up its core
/// between polls: a `sched_yield` costs about a microsecond here, as much as a whole
/// small-message round trip in MPI.
const BUSY_SPIN: Duration = Duration::from_micros(50);

/// Polls `fetch` on this thread until it yields something or [`RECEIVE_SPIN`] (or the
/// deadline) passes: `Ok(None)` then, and the caller blocks on its inbox.
pub(crate) fn spin<T, E>(
    deadline: Option<Instant>,
    mut fetch: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let started = Instant::now();
    let until = deadline.map_or(started + RECEIVE_SPIN, |d| d.min(started + RECEIVE_SPIN));
    loop {
        if let Some(found) = fetch()? {
            return Ok(Some(found));
        }
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        if now - started < BUSY_SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
