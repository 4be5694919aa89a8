//! Stopping a call that is waiting, from another thread or a signal handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A flag that ends the running call of a communicator: once it is raised, a mesh
/// call on the TCP data path (a [`StreamLink`](crate::StreamLink), whose wait fails
/// with [`LinkError::Interrupted`](crate::LinkError::Interrupted)) returns
/// `CollectiveError::Interrupted` at its next message or
/// pass of its wait, whether it waits for a peer or moves data (within about 20 ms),
/// and a call whose messages were all exchanged already fails at its end. The other
/// ranks' calls (this one, or their next) fail with `Aborted` naming this rank
/// instead of waiting for it until their timeout.
///
/// Raising is one atomic store, so it may be done from a signal handler (the Python
/// module raises it on Ctrl-C). The flag stays raised until [`clear`](Interrupt::clear);
/// the communicator is then broken, as after any error, and should be dropped.
/// Meshes over ZeroMQ only, in-process links and MPI do not look at it.
///
/// # Examples
///
/// ```
/// use switchyard_link::Interrupt;
/// let stop = Interrupt::new();
/// let watched = stop.clone();
/// assert!(!stop.is_raised());
/// stop.raise();
/// assert!(watched.is_raised());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A flag that is not raised.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Raises the flag: async-signal-safe.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the flag is raised.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Lowers the flag.
    pub fn clear(&self) {
        self.0.store(false, Ordering::Release);
    }
}
