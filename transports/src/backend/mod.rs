//! Backends. Each one provides a dealer and a router type implementing
//! [`crate::Dealer`] and [`crate::Router`] with these promises:
//!
//! - per-peer FIFO order, and a message arrives whole or not at all;
//! - sends block only at the high-water mark and never past the deadline, and a failed
//!   send returns the message;
//! - a send to an identity that is not connected fails at once with `UnknownPeer`;
//! - a dealer's identity is [`crate::SocketOptions::identity`] or a unique one, and a
//!   reconnecting dealer with the same identity replaces the old one;
//! - a router counts a peer once it has heard from it, and answers HELLO with READY;
//! - malformed input is dropped with a `warn` naming the peer and the reason, and
//!   counted; it never panics and never stops the socket.
//!
//! Backend types are crate-private: users see [`crate::DealerSocket`] and
//! [`crate::RouterSocket`], which dispatch on the endpoint's scheme.

mod inbox;
pub(crate) mod local;

crate::cfg_zmq! {
    pub(crate) mod zmq;
    mod zmq_frame;
}

#[cfg(feature = "mpi")]
pub(crate) mod mpi;

#[cfg(any(feature = "zmq", feature = "mpi"))]
mod warn_limit;

use std::sync::atomic::{AtomicU64, Ordering};

/// A process-unique identity for a dealer that was given none.
pub(crate) fn fresh_identity() -> crate::PeerId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tag = format!("~{}.{n}", std::process::id());
    crate::PeerId::new(tag).unwrap_or_else(|| crate::PeerId::from_index(n))
}
