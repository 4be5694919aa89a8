//! The socket traits: [`Socket`] (send and receive), [`Dealer`] (connects to one
//! router) and [`Router`] (binds, talks to many dealers by identity).

use crate::{PeerId, RecvError, SendError, SocketOptions, TransportError};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

/// Sending and receiving [`Msg`]s.
///
/// Backends implement the four core methods; the rest are defaults built on them.
/// Sends block only while the peer's queue is at its high-water mark, and never longer
/// than the deadline; a send that fails hands the message back in its [`SendError`].
pub trait Socket {
    /// Receives the next message, waiting until `deadline` (`None`: no limit).
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError>;

    /// Receives a message if one is queued, without waiting.
    fn try_recv(&mut self) -> Result<Msg, RecvError>;

    /// Sends `msg`, waiting until `deadline` at most while the peer's queue is full.
    ///
    /// A dealer sends to its router; a router sends to every connected peer (Singa's
    /// `Send(msg, dst = -1)`), see [`Router::send_to`] for one peer.
    fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError>;

    /// Sends `msg` if the peer's queue has room, without waiting.
    fn try_send(&mut self, msg: Msg) -> Result<(), SendError>;

    /// The options the socket was made with.
    fn options(&self) -> &SocketOptions;

    /// The endpoint the socket is bound or connected to (for tcp port 0, the port the
    /// system chose).
    fn endpoint(&self) -> &str;

    /// Sends `msg`, waiting at most [`SocketOptions::send_timeout`].
    fn send(&mut self, msg: Msg) -> Result<(), SendError> {
        let deadline = Instant::now() + self.options().send_timeout;
        self.send_deadline(msg, deadline)
    }

    /// Sends `msg`, waiting at most `timeout` while the peer's queue is full.
    fn send_timeout(&mut self, msg: Msg, timeout: Duration) -> Result<(), SendError> {
        self.send_deadline(msg, Instant::now() + timeout)
    }

    /// Receives the next message, waiting as long as it takes.
    fn recv(&mut self) -> Result<Msg, RecvError> {
        self.recv_deadline(None)
    }

    /// Receives the next message, waiting at most `timeout`.
    fn recv_timeout(&mut self, timeout: Duration) -> Result<Msg, RecvError> {
        self.recv_deadline(Some(Instant::now() + timeout))
    }
}

/// A socket connected to one router (Singa's Dealer).
pub trait Dealer: Socket + Sized {
    /// Connects to the router at `endpoint` and waits, at most
    /// [`SocketOptions::connect_timeout`], for it to answer.
    ///
    /// Over ZeroMQ the dealer sends a HELLO and waits for the router's READY, which the
    /// router sends from any of its receive calls or from [`Router::await_peers`].
    fn connect(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError>;

    /// This dealer's identity as its router sees it.
    fn identity(&self) -> &PeerId;
}

/// A socket bound to an endpoint that many dealers connect to (Singa's Router).
///
/// Every message received comes with the sender's [`PeerId`]; a send to an identity
/// that is not connected fails with [`crate::SendErrorKind::UnknownPeer`] and returns
/// the message (ZeroMQ's `ROUTER_MANDATORY`). A dealer that reconnects with the same
/// identity takes the old one's place (`ROUTER_HANDOVER`).
pub trait Router: Socket + Sized {
    /// Binds to `endpoint` (`tcp://host:0` picks a free port; [`Socket::endpoint`]
    /// reports it).
    fn bind(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError>;

    /// Waits until at least `expected` dealers have connected or `timeout` passes, and
    /// returns how many are connected. Messages arriving meanwhile are kept for the
    /// next receive.
    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError>;

    /// Receives the next message and its sender, waiting until `deadline`.
    fn recv_from_deadline(&mut self, deadline: Option<Instant>)
    -> Result<(PeerId, Msg), RecvError>;

    /// Receives a message and its sender if one is queued.
    fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError>;

    /// Sends `msg` to `peer`, waiting until `deadline` at most while its queue is full.
    ///
    /// A ZeroMQ router never waits: a full peer returns `Full` and the message at once,
    /// so that a peer that stops reading cannot stall the others (WIRE.md, section 8).
    fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Instant,
    ) -> Result<(), SendError>;

    /// Sends `msg` to `peer` only if its queue has room now.
    fn try_send_to(&mut self, peer: &PeerId, msg: Msg) -> Result<(), SendError>;

    /// The identities of the connected dealers this router knows of.
    fn peers(&self) -> Vec<PeerId>;

    /// How many malformed messages this router has dropped (each also logged at
    /// `warn` with the peer and the reason).
    fn dropped_malformed(&self) -> u64;

    /// Sends `msg` to `peer`, waiting at most [`SocketOptions::send_timeout`].
    fn send_to(&mut self, peer: &PeerId, msg: Msg) -> Result<(), SendError> {
        let deadline = Instant::now() + self.options().send_timeout;
        self.send_to_deadline(peer, msg, deadline)
    }

    /// Receives the next message and its sender, waiting as long as it takes.
    fn recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        self.recv_from_deadline(None)
    }

    /// Receives the next message and its sender, waiting at most `timeout`.
    fn recv_from_timeout(&mut self, timeout: Duration) -> Result<(PeerId, Msg), RecvError> {
        self.recv_from_deadline(Some(Instant::now() + timeout))
    }

    /// Sends a copy of `msg` (frames shared, not copied) to every connected peer and
    /// returns how many got it. Stops at the first peer that fails, returning the
    /// message; peers before it have their copy.
    fn send_all_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<usize, SendError> {
        let peers = self.peers();
        for peer in &peers {
            self.send_to_deadline(peer, msg.clone(), deadline)?;
        }
        Ok(peers.len())
    }
}
