//! What a link reports.

use std::time::Duration;

/// What a link reports. The facade's engines add the call (allreduce, broadcast, the
/// communicator's set-up, ...) to make the error a program sees; the text here is
/// that error's, after the call's name: `"{call}: {link error}"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// Nothing arrived from `rank` for the silence timeout, or the wait reached the
    /// deadline it was given.
    #[error("waited {waited:.2?} for rank {rank}, no byte arrived")]
    Timeout {
        /// The peer.
        rank: usize,
        /// How long `rank` had been silent (for the silence timeout: at least it).
        waited: Duration,
    },
    /// The connection to `rank` is gone.
    #[error("lost rank {rank} at {endpoint}: {reason}")]
    Lost {
        /// The peer.
        rank: usize,
        /// Its endpoint.
        endpoint: String,
        /// What the transport said.
        reason: String,
    },
    /// `rank` aborted the call.
    #[error("rank {rank} aborted the call: {reason}")]
    Aborted {
        /// The peer.
        rank: usize,
        /// Its reason.
        reason: String,
    },
    /// This rank's [`Interrupt`](crate::Interrupt) was raised while it waited.
    #[error("interrupted on rank {rank}")]
    Interrupted {
        /// This rank.
        rank: usize,
    },
    /// Any other transport failure.
    #[error("transport error with rank {rank}: {reason}")]
    Transport {
        /// The peer.
        rank: usize,
        /// What failed.
        reason: String,
    },
    /// A message of the current call from `rank` did not begin with the stamp the
    /// call expects ([`Link::expect`](crate::Link::expect)): that rank is in a
    /// different call. The engine describes the difference from `first`.
    #[error(
        "malformed message from rank {rank}: a message of another call ({} bytes of meta)",
        first.len()
    )]
    Refused {
        /// The sender.
        rank: usize,
        /// The message's first frame (the meta frame, on the mesh).
        first: bytes::Bytes,
    },
}

impl LinkError {
    /// The rank the error names: the peer, or this rank for
    /// [`Interrupted`](LinkError::Interrupted).
    pub fn rank(&self) -> usize {
        match self {
            LinkError::Timeout { rank, .. }
            | LinkError::Lost { rank, .. }
            | LinkError::Aborted { rank, .. }
            | LinkError::Interrupted { rank }
            | LinkError::Transport { rank, .. }
            | LinkError::Refused { rank, .. } => *rank,
        }
    }
}
