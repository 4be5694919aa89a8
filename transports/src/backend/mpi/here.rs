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

use super::comms::Comms;
use super::credits::Credits;
use super::engine::{Command, Engine};
use super::ffi::{self, Request};
use super::progress::Sending;
use super::shared::Open;
use super::wire::{Decoded, Encoded};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};
use switchyard_msg::Limits;

/// How long a receiving thread polls MPI itself before it blocks on the socket's
/// inbox (and leaves the polling to the progress thread's naps). A reply within this
/// window costs no wake-up; a longer wait costs at most this much CPU.
pub(crate) const RECEIVE_SPIN: Duration = Duration::from_micros(200);

/// Sends a socket's thread posted and MPI has not finished, for the progress
/// thread to complete.
pub(crate) struct Posted(pub(crate) Vec<Request>);

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

/// Posts `encoded` from the socket with tag `source_tag` to `dest`'s socket `tag`
/// on this thread; the credit is released when MPI is done with every buffer.
pub(crate) fn send(
    engine: &Engine,
    comms: &Comms,
    (dest, tag, source_tag): (i32, i32, i32),
    encoded: Encoded,
    credits: Arc<Credits>,
) -> Result<(), String> {
    if encoded.frames.is_empty() {
        // One MPI message, and usually done at once: no list of requests to build.
        let posted = engine.shared.while_open(|| {
            // SAFETY: as below; `encoded` is dropped only once the request is done
            // or moved with it to the progress thread.
            let mut request = unsafe { ffi::isend(comms.data, &encoded.head, dest, tag)? };
            Ok((!ffi::test(&mut request)?).then_some(request))
        });
        return match posted {
            Ok(None) => {
                credits.release();
                Ok(())
            }
            Ok(Some(request)) => track(engine, vec![request], encoded, credits, None),
            Err(reason) => {
                credits.release();
                Err(reason)
            }
        };
    }
    let mut requests = Vec::with_capacity(1 + encoded.frames.len());
    let posted = engine.shared.while_open(|| {
        // SAFETY: `encoded` stays alive and unmoved (its heap buffers) until the
        // requests complete: dropped below only once `test` says every one is,
        // otherwise moved into the progress thread's table with them, or leaked.
        let posted = unsafe { comms.post(&encoded, dest, tag, source_tag, &mut requests) };
        // A completed request is MPI_REQUEST_NULL, which MPI_Testsome never reports:
        // only the unfinished ones go to the progress thread.
        let mut i = 0;
        while i < requests.len() {
            if ffi::test(&mut requests[i])? {
                requests.swap_remove(i);
            } else {
                i += 1;
            }
        }
        posted.map(|()| requests.is_empty())
    });
    let reason = match posted {
        Ok(true) => {
            credits.release();
            return Ok(());
        }
        Ok(false) => None,
        Err(reason) => Some(reason),
    };
    track(engine, requests, encoded, credits, reason)
}

/// Hands unfinished sends to the progress thread with their buffers and credit, and
/// returns `failed` (why a later post failed), if any.
fn track(
    engine: &Engine,
    requests: Vec<Request>,
    encoded: Encoded,
    credits: Arc<Credits>,
    failed: Option<String>,
) -> Result<(), String> {
    let sending = Sending::new(encoded, Some(credits));
    if !requests.is_empty() {
        let track = Command::Track {
            posted: Posted(requests),
            sending,
        };
        if let Err((refused, command)) = engine.submit_or_return(track) {
            // Nobody will complete the sends: their buffers must outlive any read
            // MPI might still make of them.
            std::mem::forget(command);
            return Err(failed.unwrap_or(refused));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// The next message on socket `tag` (from `source`, or any rank) if one has arrived,
/// received whole into buffers of the pool, with the rank that sent it; `Err(_)`
/// inside for one dropped as malformed. The caller holds its leave to call MPI
/// across its polls (one lock for the whole spin, not one per poll).
pub(crate) fn receive(
    _open: &Open<'_>,
    comms: &Comms,
    source: Option<i32>,
    tag: i32,
    limits: &Limits,
) -> Result<Option<(i32, Decoded)>, String> {
    let received = || {
        let Some(matched) = ffi::probe(comms.data, source, Some(tag))? else {
            return Ok(None);
        };
        let from = matched.source;
        Ok(Some((from, comms.receive_data(matched, tag, limits)?)))
    };
    received().map_err(|e: ffi::MpiError| e.to_string())
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
    let mut busy = true;
    for polls in 1u32.. {
        if let Some(found) = fetch()? {
            return Ok(Some(found));
        }
        // The clock is read every few polls: a poll is far shorter than the window.
        if polls % 8 == 0 {
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            busy = now - started < BUSY_SPIN;
        }
        if busy {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    Ok(None)
}
