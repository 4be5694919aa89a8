//! The atomics of the shared-memory protocols (`shm/ring.rs`, `shm/board.rs`): std's in
//! every build, loom's in this crate's own tests under `--cfg loom`, where the models
//! (`shm/ring_loom.rs`, `shm/board_loom.rs`) run the protocols' code under every
//! interleaving, and every outcome of its memory orderings, that the C11 model allows
//! (docs/testing.md, "Shared memory under loom").
//!
//! Under loom only the models mean anything: the control blocks then hold loom's
//! atomics, which cannot live in a mapped segment, so the rest of the crate's shared
//! memory compiles but is not for running.

#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// What the loom models use beside the protocols' atomics.
#[cfg(all(test, loom))]
pub(crate) mod model {
    #![allow(clippy::unwrap_used)]
    use loom::sync::{Condvar, Mutex};

    /// A sleeper's wake-up, as a byte on the pipe's socket is in the real code: a
    /// ring before the sleep is kept, and a sleep with no ring to come blocks for good,
    /// which loom reports as a deadlock.
    pub(crate) struct Bell {
        rung: Mutex<bool>,
        ringing: Condvar,
    }

    impl Bell {
        pub(crate) fn new() -> Bell {
            Bell {
                rung: Mutex::new(false),
                ringing: Condvar::new(),
            }
        }

        pub(crate) fn ring(&self) {
            *self.rung.lock().unwrap() = true;
            self.ringing.notify_one();
        }

        pub(crate) fn sleep(&self) {
            let mut rung = self.rung.lock().unwrap();
            while !*rung {
                rung = self.ringing.wait(rung).unwrap();
            }
            *rung = false;
        }
    }

    /// A loom model, bounded by `LOOM_MAX_PREEMPTIONS` (3 when unset).
    pub(crate) fn check(model: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(model);
    }
}
