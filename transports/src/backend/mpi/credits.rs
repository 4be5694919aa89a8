//! Credits: a socket's sends in flight, bounded by its high-water mark, so that a
//! sender blocks (or fails) in its own thread instead of queueing without bound on
//! the progress thread; and the route a router holds per dealer, which carries that
//! dealer's credits.

use crate::backend::{Deadline, Inbound};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

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

    pub(crate) fn release(&self) {
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
