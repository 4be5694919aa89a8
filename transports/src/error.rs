use crate::PeerId;
use std::time::Duration;
use switchyard_msg::Msg;
use thiserror::Error;

/// Errors from creating, binding or connecting sockets, and from waiting for peers.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The endpoint string does not parse.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The endpoint's backend was not compiled into this build.
    #[error("endpoint {endpoint} needs the `{feature}` cargo feature; this build has: {built}")]
    FeatureNotBuilt {
        /// The endpoint given.
        endpoint: String,
        /// The cargo feature that provides its backend.
        feature: &'static str,
        /// The backends this build has.
        built: &'static str,
    },
    /// Another router is already bound to the endpoint.
    #[error("endpoint {endpoint} is already bound: {reason}")]
    AddrInUse {
        /// The endpoint.
        endpoint: String,
        /// What the backend reported.
        reason: String,
    },
    /// A dealer's HELLO got no READY from a router within the connect timeout.
    #[error("no router answered at {endpoint} within {waited:?} (SocketOptions::connect_timeout)")]
    Unreachable {
        /// The endpoint.
        endpoint: String,
        /// How long the dealer waited.
        waited: Duration,
    },
    /// Fewer dealers connected to a router than expected before the timeout.
    #[error("router at {endpoint} has {connected} of {expected} expected peers after {waited:?}")]
    PeersMissing {
        /// The router's endpoint.
        endpoint: String,
        /// Peers expected.
        expected: usize,
        /// Peers connected.
        connected: usize,
        /// How long the router waited.
        waited: Duration,
    },
    /// The backend library failed.
    #[error("{backend} backend at {endpoint}: {reason}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The endpoint involved.
        endpoint: String,
        /// What the library reported.
        reason: String,
    },
}

/// Why a send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendErrorKind {
    /// The peer's queue stayed at its high-water mark until the deadline.
    Timeout,
    /// The peer's queue is at its high-water mark (from a `try_send`).
    Full,
    /// The router knows no peer with this identity (ZeroMQ's `EHOSTUNREACH` under
    /// `ROUTER_MANDATORY`).
    UnknownPeer(PeerId),
    /// No thread has this address in the job's address table (from the stub).
    UnknownAddress(switchyard_msg::Addr),
    /// The other end is gone and nothing has taken its place.
    Disconnected,
    /// The backend failed; the text says how.
    Backend(String),
}

impl std::fmt::Display for SendErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendErrorKind::Timeout => {
                f.write_str("peer queue full until the deadline (SocketOptions::send_timeout)")
            }
            SendErrorKind::Full => f.write_str("peer queue full (high-water mark reached)"),
            SendErrorKind::UnknownPeer(p) => write!(f, "no connected peer {p}"),
            SendErrorKind::UnknownAddress(a) => {
                write!(f, "no thread has address {a} in the address table")
            }
            SendErrorKind::Disconnected => f.write_str("peer disconnected"),
            SendErrorKind::Backend(reason) => write!(f, "backend error: {reason}"),
        }
    }
}

/// A send that did not happen. The message comes back untouched, so nothing is lost:
/// retry it, reroute it, or drop it deliberately.
///
/// # Examples
///
/// ```
/// use switchyard_transports::{Router, RouterSocket, PeerId, SendErrorKind, SocketOptions};
/// use switchyard_msg::{Addr, Kind, Msg};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut router = RouterSocket::bind("local://send-error-doc", SocketOptions::default())?;
/// let msg = Msg::new(Addr::server(0, 0), Addr::worker(0, 0), Kind::Put).with_seq(5);
/// let err = router.send_to(&PeerId::from_index(9), msg).unwrap_err();
/// assert!(matches!(err.kind, SendErrorKind::UnknownPeer(_)));
/// assert_eq!(err.msg.header.seq, 5); // the message is handed back
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Error)]
#[error("send to {endpoint} failed: {kind}")]
pub struct SendError {
    /// The message that was not sent.
    pub msg: Msg,
    /// Why.
    pub kind: SendErrorKind,
    /// The endpoint of the socket that tried.
    pub endpoint: String,
}

/// Why a receive returned no message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvError {
    /// Nothing arrived before the deadline.
    #[error("no message before the deadline")]
    Timeout,
    /// Nothing is queued (from a `try_recv`).
    #[error("no message queued")]
    Empty,
    /// The socket can never receive again.
    #[error("socket at {endpoint} is closed")]
    Disconnected {
        /// The socket's endpoint.
        endpoint: String,
    },
    /// The backend failed; the text says how.
    #[error("backend error at {endpoint}: {reason}")]
    Backend {
        /// The socket's endpoint.
        endpoint: String,
        /// What the library reported.
        reason: String,
    },
}
