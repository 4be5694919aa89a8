//! Backends, and the contract their sockets keep.
//!
//! Each backend provides a dealer implementing [`BackendDealer`] and a router
//! implementing [`BackendRouter`]. [`crate::DealerSocket`] and [`crate::RouterSocket`]
//! hold one of them, opened on the backend that [`route`] picks for the endpoint, and
//! forward every call through one `match` (`with_backend!` in `dispatch.rs`), so the
//! compiler checks that every backend answers every call with the same signature.
//!
//! What the signatures cannot say, every backend promises (and `tests/conformance.rs`
//! checks for each):
//!
//! - per-peer FIFO order, and a message arrives whole or not at all;
//! - every wait ends by its [`Deadline`]: [`Deadline::Now`] never blocks and fails
//!   with `Full` (send) or `Empty` (receive); a deadline that passes fails with
//!   `Timeout`; a send blocks only while the peer is at the high-water mark;
//! - a failed send returns the message;
//! - a send to an identity that is not connected fails at once with `UnknownPeer`;
//! - a dealer's identity is [`crate::SocketOptions::identity`] or a unique one, and a
//!   reconnecting dealer with the same identity replaces the old one;
//! - a router counts a peer once it has heard from it, and answers HELLO with READY;
//! - malformed input is dropped with a `warn` naming the peer and the reason, and
//!   counted; it never panics and never stops the socket;
//! - [`BackendSocket::watch`] says [`Watch::Ready`] whenever a message is buffered
//!   where the poller's wait cannot see it, so that a poll never sleeps on one.
//!
//! Backend types are crate-private: users see [`crate::DealerSocket`] and
//! [`crate::RouterSocket`].

mod inbox;
pub(crate) mod local;
// Always built: its wire codec is pure Rust; the rest is behind the `mpi` feature.
pub(crate) mod mpi;
#[cfg(any(feature = "zmq", feature = "mpi"))]
mod warn_limit;
#[cfg(feature = "zmq")]
pub(crate) mod zmq;

use crate::poller::Watch;
use crate::{Endpoint, PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

#[cfg(feature = "mpi")]
pub(crate) use inbox::Fetched;
pub(crate) use inbox::{Delivery, Inbound, InboxRouter};

/// How long a backend call may wait: the one deadline type of every backend call.
///
/// The public API says it three ways (`try_*`; `*_deadline(Instant)` for sends;
/// `Option<Instant>` for receives, where `None` waits forever). At the backend
/// boundary all of them become a `Deadline`, so that "do not wait" and "wait forever"
/// cannot be mixed up the way an `Option<Instant>` meaning one for sends and the other
/// for receives would allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// Do not wait (a `try_*` call): a send that cannot go at once fails with `Full`,
    /// a receive with nothing queued with `Empty`.
    Now,
    /// Wait until this instant at most, then fail with `Timeout`.
    At(Instant),
    /// Wait as long as it takes.
    Forever,
}

impl Deadline {
    /// A receive's deadline in the public API's form (`None`: no limit).
    pub(crate) fn or_forever(deadline: Option<Instant>) -> Deadline {
        deadline.map_or(Deadline::Forever, Deadline::At)
    }

    /// Why a send that found no room before this deadline failed.
    pub(crate) fn no_room(self) -> SendErrorKind {
        match self {
            Deadline::Now => SendErrorKind::Full,
            Deadline::At(_) | Deadline::Forever => SendErrorKind::Timeout,
        }
    }

    /// Sends on a bounded crossbeam channel within this deadline, or hands `value`
    /// back with why not.
    pub(crate) fn send<T>(self, tx: &Sender<T>, value: T) -> Result<(), (T, SendErrorKind)> {
        match self {
            Deadline::Now => tx.try_send(value).map_err(|e| match e {
                TrySendError::Full(v) => (v, self.no_room()),
                TrySendError::Disconnected(v) => (v, SendErrorKind::Disconnected),
            }),
            Deadline::At(at) => tx.send_deadline(value, at).map_err(|e| match e {
                SendTimeoutError::Timeout(v) => (v, self.no_room()),
                SendTimeoutError::Disconnected(v) => (v, SendErrorKind::Disconnected),
            }),
            Deadline::Forever => tx
                .send(value)
                .map_err(|e| (e.into_inner(), SendErrorKind::Disconnected)),
        }
    }

    /// Receives from a crossbeam channel within this deadline. A try finds the channel
    /// `Empty` whether or not its senders are gone, as every backend's `try_recv` does.
    pub(crate) fn recv<T>(self, rx: &Receiver<T>, endpoint: &str) -> Result<T, RecvError> {
        let disconnected = || RecvError::Disconnected {
            endpoint: endpoint.to_string(),
        };
        match self {
            Deadline::Now => rx.try_recv().map_err(|_| RecvError::Empty),
            Deadline::At(at) => rx.recv_deadline(at).map_err(|e| match e {
                RecvTimeoutError::Timeout => RecvError::Timeout,
                RecvTimeoutError::Disconnected => disconnected(),
            }),
            Deadline::Forever => rx.recv().map_err(|_| disconnected()),
        }
    }
}

/// What every backend socket offers, dealer or router.
pub(crate) trait BackendSocket: std::fmt::Debug {
    /// The options the socket was made with.
    fn options(&self) -> &SocketOptions;

    /// The endpoint as the user sees it (for tcp port 0, with the port chosen).
    fn endpoint(&self) -> &str;

    /// What a [`crate::Poller`] waits on for this socket's next message.
    fn watch(&self) -> Watch<'_>;
}

/// A backend's dealer: talks to one router.
pub(crate) trait BackendDealer: BackendSocket {
    /// This dealer's identity as its router sees it.
    fn identity(&self) -> &PeerId;

    /// Sends `msg` to the router, waiting for room until `deadline`.
    fn send(&mut self, msg: Msg, deadline: Deadline) -> Result<(), SendError>;

    /// Receives the router's next message, waiting until `deadline`.
    fn recv(&mut self, deadline: Deadline) -> Result<Msg, RecvError>;
}

/// A backend's router: talks to many dealers by identity.
pub(crate) trait BackendRouter: BackendSocket {
    /// Waits until `expected` dealers are known or `timeout` passes; keeps the data
    /// that arrives meanwhile for the next receive.
    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError>;

    /// Receives the next message and its sender, waiting until `deadline`.
    fn recv_from(&mut self, deadline: Deadline) -> Result<(PeerId, Msg), RecvError>;

    /// Sends `msg` to `peer`, waiting for room in its queue until `deadline`.
    fn send_to(&mut self, peer: &PeerId, msg: Msg, deadline: Deadline) -> Result<(), SendError>;

    /// The connected dealers, sorted.
    fn peers(&self) -> Vec<PeerId>;

    /// How many malformed messages this router has dropped.
    fn dropped_malformed(&self) -> u64;
}

/// The backend an endpoint names, with the address in that backend's own terms.
pub(crate) enum Route {
    /// A `local://` name.
    Local(String),
    /// A libzmq address; a router's tcp port 0 is already written as `*`.
    #[cfg(feature = "zmq")]
    Zmq(String),
    /// An MPI rank.
    #[cfg(feature = "mpi")]
    Mpi(u32),
}

/// Which end of a connection a socket is: port 0 means "any port" only to a router.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// A dealer's `connect`.
    Connect,
    /// A router's `bind`.
    Bind,
}

/// Parses `endpoint` and picks its backend, for `connect` and `bind` alike; names the
/// missing feature when the backend is not built.
pub(crate) fn route(
    endpoint: &str,
    #[cfg_attr(not(feature = "zmq"), allow(unused_variables))] side: Side,
) -> Result<Route, TransportError> {
    match Endpoint::parse(endpoint)? {
        Endpoint::Local(name) => Ok(Route::Local(name)),
        #[cfg(feature = "zmq")]
        parsed @ (Endpoint::Inproc(_) | Endpoint::Tcp { .. }) => {
            zmq::address(&parsed, endpoint, side).map(Route::Zmq)
        }
        #[cfg(not(feature = "zmq"))]
        Endpoint::Inproc(_) | Endpoint::Tcp { .. } => Err(not_built(endpoint, "zmq")),
        #[cfg(feature = "mpi")]
        Endpoint::Mpi(rank) => Ok(Route::Mpi(rank)),
        #[cfg(not(feature = "mpi"))]
        Endpoint::Mpi(_) => Err(not_built(endpoint, "mpi")),
    }
}

#[cfg_attr(all(feature = "zmq", feature = "mpi"), allow(dead_code))]
fn not_built(endpoint: &str, feature: &'static str) -> TransportError {
    TransportError::FeatureNotBuilt {
        endpoint: endpoint.to_string(),
        feature,
        built: Endpoint::built_backends(),
    }
}

/// A process-unique identity for a dealer that was given none.
pub(crate) fn fresh_identity() -> PeerId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tag = format!("~{}.{n}", std::process::id());
    PeerId::new(tag).unwrap_or_else(|| PeerId::from_index(n))
}

/// A failed send's error, handing `msg` back.
pub(crate) fn send_error(msg: Msg, kind: SendErrorKind, endpoint: &str) -> SendError {
    SendError {
        msg,
        kind,
        endpoint: endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    // What each deadline makes of a full, an empty and a closed channel: the errors
    // the conformance suite expects from every backend start here for two of them.
    #[test]
    fn deadlines_on_channels() {
        let (tx, rx) = bounded::<u8>(1);
        assert_eq!(Deadline::Now.send(&tx, 1), Ok(()));
        assert_eq!(Deadline::Now.send(&tx, 2), Err((2, SendErrorKind::Full)));
        let past = Deadline::At(Instant::now());
        assert_eq!(past.send(&tx, 3), Err((3, SendErrorKind::Timeout)));
        assert_eq!(Deadline::Forever.recv(&rx, "e"), Ok(1));
        assert_eq!(Deadline::Now.recv(&rx, "e"), Err(RecvError::Empty));
        assert_eq!(past.recv(&rx, "e"), Err(RecvError::Timeout));
        drop(rx);
        let closed = Err((4, SendErrorKind::Disconnected));
        assert_eq!(Deadline::Now.send(&tx, 4), closed);
        assert_eq!(Deadline::Forever.send(&tx, 4), closed);
        let (tx, rx) = bounded::<u8>(1);
        drop(tx);
        // A try reports a closed channel as empty, as every backend's try_recv does.
        assert_eq!(Deadline::Now.recv(&rx, "e"), Err(RecvError::Empty));
        let gone = Err(RecvError::Disconnected {
            endpoint: "e".into(),
        });
        assert_eq!(past.recv(&rx, "e"), gone);
        assert_eq!(Deadline::Forever.recv(&rx, "e"), gone);
    }

    #[test]
    fn a_receive_without_a_deadline_waits_forever() {
        assert_eq!(Deadline::or_forever(None), Deadline::Forever);
        let at = Instant::now();
        assert_eq!(Deadline::or_forever(Some(at)), Deadline::At(at));
    }
}
