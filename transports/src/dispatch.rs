//! [`DealerSocket`] and [`RouterSocket`]: one type each over every backend, chosen by
//! the endpoint's scheme at run time.
//!
//! Every call goes to the backend through `with_backend!`, the one place that lists
//! the backends; what a backend must offer is the [`BackendDealer`] /
//! [`BackendRouter`] contract in `backend/mod.rs`.

use crate::backend::local::{LocalDealer, LocalRouter};
use crate::backend::{BackendDealer, BackendRouter, BackendSocket, Deadline, Route, Side, route};
use crate::poller::Watch;
use crate::{Dealer, PeerId, RecvError, Router, SendError, Socket, SocketOptions, TransportError};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

#[cfg(feature = "mpi")]
use crate::backend::mpi::{MpiDealer, MpiRouter};
#[cfg(feature = "zmq")]
use crate::backend::zmq::{ZmqDealer, ZmqRouter};

/// Runs `$body` with `$s` bound to the backend socket inside `$kind` (a reference to a
/// [`DealerKind`] or [`RouterKind`], shared or mutable).
macro_rules! with_backend {
    ($enum:ident, $kind:expr, $s:ident => $body:expr) => {
        match $kind {
            $enum::Local($s) => $body,
            #[cfg(feature = "zmq")]
            $enum::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            $enum::Mpi($s) => $body,
        }
    };
}

#[derive(Debug)]
enum DealerKind {
    Local(LocalDealer),
    #[cfg(feature = "zmq")]
    Zmq(ZmqDealer),
    #[cfg(feature = "mpi")]
    Mpi(MpiDealer),
}

/// A dealer on whichever backend its endpoint names.
///
/// # Examples
///
/// A router and a dealer on the `local` backend, in two threads:
///
/// ```
/// use std::time::Duration;
/// use switchyard_msg::{Addr, Kind, Msg};
/// use switchyard_transports::{Dealer, DealerSocket, Router, RouterSocket, Socket, SocketOptions};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut router = RouterSocket::bind("local://dealer-doc", SocketOptions::default())?;
/// let worker = std::thread::spawn(|| -> Result<Msg, Box<dyn std::error::Error + Send + Sync>> {
///     let mut dealer = DealerSocket::connect("local://dealer-doc", SocketOptions::default())?;
///     dealer.send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get))?;
///     Ok(dealer.recv_timeout(Duration::from_secs(5))?)
/// });
/// let (peer, get) = router.recv_from_timeout(Duration::from_secs(5))?;
/// router.send_to(&peer, get.reply(Kind::Put).with_frame(&b"value"[..]))?;
/// let reply = worker.join().expect("worker thread").map_err(|e| e.to_string())?;
/// assert_eq!(reply.header.kind, Kind::Put);
/// assert_eq!(&reply.frames()[0][..], b"value");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DealerSocket {
    kind: DealerKind,
}

#[derive(Debug)]
enum RouterKind {
    Local(LocalRouter),
    #[cfg(feature = "zmq")]
    Zmq(ZmqRouter),
    #[cfg(feature = "mpi")]
    Mpi(MpiRouter),
}

/// A router on whichever backend its endpoint names.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_transports::{Router, RouterSocket, SocketOptions, TransportError};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut router = RouterSocket::bind("local://router-doc", SocketOptions::default())?;
/// // Nobody connects: await_peers reports how many came.
/// let err = router.await_peers(2, Duration::from_millis(20)).unwrap_err();
/// assert!(matches!(err, TransportError::PeersMissing { connected: 0, expected: 2, .. }));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RouterSocket {
    kind: RouterKind,
}

impl Socket for DealerSocket {
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        let deadline = Deadline::or_forever(deadline);
        with_backend!(DealerKind, &mut self.kind, s => s.recv(deadline))
    }

    fn try_recv(&mut self) -> Result<Msg, RecvError> {
        with_backend!(DealerKind, &mut self.kind, s => s.recv(Deadline::Now))
    }

    fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        with_backend!(DealerKind, &mut self.kind, s => s.send(msg, Deadline::At(deadline)))
    }

    fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        with_backend!(DealerKind, &mut self.kind, s => s.send(msg, Deadline::Now))
    }

    fn options(&self) -> &SocketOptions {
        with_backend!(DealerKind, &self.kind, s => s.options())
    }

    fn endpoint(&self) -> &str {
        with_backend!(DealerKind, &self.kind, s => s.endpoint())
    }
}

impl Dealer for DealerSocket {
    fn connect(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let kind = match route(endpoint, Side::Connect)? {
            Route::Local(name) => DealerKind::Local(LocalDealer::connect(&name, options)?),
            #[cfg(feature = "zmq")]
            Route::Zmq(address) => DealerKind::Zmq(ZmqDealer::connect(&address, options)?),
            #[cfg(feature = "mpi")]
            Route::Mpi(rank) => DealerKind::Mpi(MpiDealer::connect(rank, options)?),
        };
        Ok(DealerSocket { kind })
    }

    fn identity(&self) -> &PeerId {
        with_backend!(DealerKind, &self.kind, s => s.identity())
    }
}

impl DealerSocket {
    /// What a [`crate::Poller`] waits on for this socket.
    pub(crate) fn backend_watch(&self) -> Watch<'_> {
        with_backend!(DealerKind, &self.kind, s => s.watch())
    }
}

impl Socket for RouterSocket {
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        self.recv_from_deadline(deadline).map(|(_, msg)| msg)
    }

    fn try_recv(&mut self) -> Result<Msg, RecvError> {
        self.try_recv_from().map(|(_, msg)| msg)
    }

    fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        self.send_all_deadline(msg, deadline).map(|_| ())
    }

    fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        for peer in self.peers() {
            self.try_send_to(&peer, msg.clone())?;
        }
        Ok(())
    }

    fn options(&self) -> &SocketOptions {
        with_backend!(RouterKind, &self.kind, s => s.options())
    }

    fn endpoint(&self) -> &str {
        with_backend!(RouterKind, &self.kind, s => s.endpoint())
    }
}

impl Router for RouterSocket {
    fn bind(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let kind = match route(endpoint, Side::Bind)? {
            Route::Local(name) => RouterKind::Local(LocalRouter::bind(&name, options)?),
            #[cfg(feature = "zmq")]
            Route::Zmq(address) => RouterKind::Zmq(ZmqRouter::bind(&address, options)?),
            #[cfg(feature = "mpi")]
            Route::Mpi(rank) => RouterKind::Mpi(MpiRouter::bind(rank, options)?),
        };
        Ok(RouterSocket { kind })
    }

    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError> {
        with_backend!(RouterKind, &mut self.kind, s => s.await_peers(expected, timeout))
    }

    fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        let deadline = Deadline::or_forever(deadline);
        with_backend!(RouterKind, &mut self.kind, s => s.recv_from(deadline))
    }

    fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        with_backend!(RouterKind, &mut self.kind, s => s.recv_from(Deadline::Now))
    }

    fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Instant,
    ) -> Result<(), SendError> {
        let deadline = Deadline::At(deadline);
        with_backend!(RouterKind, &mut self.kind, s => s.send_to(peer, msg, deadline))
    }

    fn try_send_to(&mut self, peer: &PeerId, msg: Msg) -> Result<(), SendError> {
        with_backend!(RouterKind, &mut self.kind, s => s.send_to(peer, msg, Deadline::Now))
    }

    fn peers(&self) -> Vec<PeerId> {
        with_backend!(RouterKind, &self.kind, s => s.peers())
    }

    fn dropped_malformed(&self) -> u64 {
        with_backend!(RouterKind, &self.kind, s => s.dropped_malformed())
    }
}

impl RouterSocket {
    /// What a [`crate::Poller`] waits on for this socket.
    pub(crate) fn backend_watch(&self) -> Watch<'_> {
        with_backend!(RouterKind, &self.kind, s => s.watch())
    }
}
