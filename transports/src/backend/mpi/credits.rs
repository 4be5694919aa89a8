//! Credits: a socket's sends in flight, bounded by its high-water mark, so that a
//! sender blocks (or fails) in its own thread instead of queueing without bound on
//! the progress thread; and the route a router holds per dealer, which carries that
//! dealer's credits.

use crate::backend::{Deadline, Inbound};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// A socket's sends in flight, bounded by its high-water mark.
///
/// Taking and returning a credit are one atomic operation each; the lock and the
/// condition variable are touched only when a sender waits, so that a send that
/// completes at once costs no system call (a condition variable's notify is one).
#[derive(Debug)]
pub(crate) struct Credits {
    limit: usize,
    used: AtomicUsize,
    /// Senders waiting for a credit.
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Credits {
    pub(crate) fn new(limit: usize) -> Arc<Credits> {
        Arc::new(Credits {
            limit: limit.max(1),
            used: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        })
    }

    fn try_take(&self) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used < self.limit).then_some(used + 1)
            })
            .is_ok()
    }

    /// Takes a credit, waiting until `deadline` for one to be freed.
    pub(crate) fn acquire(&self, deadline: Deadline) -> bool {
        if self.try_take() {
            return true;
        }
        if deadline == Deadline::Now {
            return false;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // Counted before the next look, so that a release after that look sees a
        // waiter and notifies (under the lock, which this thread holds until it waits).
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let taken = loop {
            if self.try_take() {
                break true;
            }
            guard = match deadline {
                Deadline::Now => break false,
                Deadline::Forever => self.freed.wait(guard).unwrap_or_else(|p| p.into_inner()),
                Deadline::At(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break false;
                    }
                    self.freed
                        .wait_timeout(guard, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        taken
    }

    pub(crate) fn release(&self) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_sub(1)
            });
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.freed.notify_all();
        }
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
