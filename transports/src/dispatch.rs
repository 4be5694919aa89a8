//! [`DealerSocket`] and [`RouterSocket`]: one type each over every backend, chosen by
//! the endpoint's scheme at run time.

use crate::backend::local::{LocalDealer, LocalRouter};
use crate::{
    Dealer, Endpoint, PeerId, RecvError, Router, SendError, Socket, SocketOptions, TransportError,
};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

crate::cfg_zmq! {
    use crate::backend::zmq::{ZmqDealer, ZmqRouter};
}
#[cfg(feature = "mpi")]
use crate::backend::mpi::{MpiDealer, MpiRouter};

/// The libzmq address for an endpoint, or the error saying which feature is missing.
#[cfg_attr(not(feature = "zmq"), allow(dead_code))]
fn zmq_address(endpoint: &Endpoint, text: &str, binding: bool) -> Result<String, TransportError> {
    match endpoint {
        Endpoint::Inproc(name) => Ok(format!("inproc://{name}")),
        Endpoint::Tcp { host, port } => {
            let host = if host == "localhost" {
                "127.0.0.1"
            } else {
                host
            };
            match (*port, binding) {
                (0, true) => Ok(format!("tcp://{host}:*")),
                (0, false) => Err(TransportError::InvalidEndpoint {
                    endpoint: text.to_string(),
                    reason:
                        "port 0 only means 'any port' when binding; connect needs the router's port"
                            .into(),
                }),
                (port, _) => Ok(format!("tcp://{host}:{port}")),
            }
        }
        _ => Err(TransportError::InvalidEndpoint {
            endpoint: text.to_string(),
            reason: "not a zmq endpoint".into(),
        }),
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

#[derive(Debug)]
pub(crate) enum DealerKind {
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
    pub(crate) kind: DealerKind,
}

#[derive(Debug)]
pub(crate) enum RouterKind {
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
    pub(crate) kind: RouterKind,
}

macro_rules! on_dealer {
    ($self:expr, $s:ident => $body:expr) => {
        match &mut $self.kind {
            DealerKind::Local($s) => $body,
            #[cfg(feature = "zmq")]
            DealerKind::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            DealerKind::Mpi($s) => $body,
        }
    };
}

/// Like `on_dealer!` for the backends whose dealers share a send signature.
macro_rules! on_dealer_other {
    ($self:expr, $s:ident => $body:expr) => {
        match &mut $self.kind {
            DealerKind::Local($s) => $body,
            #[cfg(feature = "zmq")]
            DealerKind::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            DealerKind::Mpi(_) => unreachable!("handled by the caller"),
        }
    };
}

macro_rules! on_dealer_ref {
    ($self:expr, $s:ident => $body:expr) => {
        match &$self.kind {
            DealerKind::Local($s) => $body,
            #[cfg(feature = "zmq")]
            DealerKind::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            DealerKind::Mpi($s) => $body,
        }
    };
}

macro_rules! on_router {
    ($self:expr, $s:ident => $body:expr) => {
        match &mut $self.kind {
            RouterKind::Local($s) => $body,
            #[cfg(feature = "zmq")]
            RouterKind::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            RouterKind::Mpi($s) => $body,
        }
    };
}

macro_rules! on_router_ref {
    ($self:expr, $s:ident => $body:expr) => {
        match &$self.kind {
            RouterKind::Local($s) => $body,
            #[cfg(feature = "zmq")]
            RouterKind::Zmq($s) => $body,
            #[cfg(feature = "mpi")]
            RouterKind::Mpi($s) => $body,
        }
    };
}

impl Socket for DealerSocket {
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        on_dealer!(self, s => s.recv_deadline(deadline))
    }

    fn try_recv(&mut self) -> Result<Msg, RecvError> {
        on_dealer!(self, s => s.try_recv())
    }

    fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        match &mut self.kind {
            #[cfg(feature = "mpi")]
            DealerKind::Mpi(s) => s.send_deadline(msg, Some(deadline)),
            _ => on_dealer_other!(self, s => s.send_deadline(msg, deadline)),
        }
    }

    fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        match &mut self.kind {
            #[cfg(feature = "mpi")]
            DealerKind::Mpi(s) => s.send_deadline(msg, None),
            _ => on_dealer_other!(self, s => s.try_send(msg)),
        }
    }

    fn options(&self) -> &SocketOptions {
        on_dealer_ref!(self, s => s.options())
    }

    fn endpoint(&self) -> &str {
        on_dealer_ref!(self, s => s.endpoint())
    }
}

impl Dealer for DealerSocket {
    fn connect(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let parsed = Endpoint::parse(endpoint)?;
        let kind = match &parsed {
            Endpoint::Local(name) => DealerKind::Local(LocalDealer::connect(name, options)?),
            Endpoint::Inproc(_) | Endpoint::Tcp { .. } => {
                #[cfg(feature = "zmq")]
                {
                    let address = zmq_address(&parsed, endpoint, false)?;
                    DealerKind::Zmq(ZmqDealer::connect(&address, options)?)
                }
                #[cfg(not(feature = "zmq"))]
                return Err(not_built(endpoint, "zmq"));
            }
            Endpoint::Mpi(rank) => {
                #[cfg(feature = "mpi")]
                {
                    DealerKind::Mpi(MpiDealer::connect(*rank, options)?)
                }
                #[cfg(not(feature = "mpi"))]
                {
                    let _ = rank;
                    return Err(not_built(endpoint, "mpi"));
                }
            }
        };
        Ok(DealerSocket { kind })
    }

    fn identity(&self) -> &PeerId {
        on_dealer_ref!(self, s => s.identity())
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
        on_router_ref!(self, s => s.options())
    }

    fn endpoint(&self) -> &str {
        on_router_ref!(self, s => s.endpoint())
    }
}

impl Router for RouterSocket {
    fn bind(endpoint: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let parsed = Endpoint::parse(endpoint)?;
        let kind = match &parsed {
            Endpoint::Local(name) => RouterKind::Local(LocalRouter::bind(name, options)?),
            Endpoint::Inproc(_) | Endpoint::Tcp { .. } => {
                #[cfg(feature = "zmq")]
                {
                    let address = zmq_address(&parsed, endpoint, true)?;
                    RouterKind::Zmq(ZmqRouter::bind(&address, options)?)
                }
                #[cfg(not(feature = "zmq"))]
                return Err(not_built(endpoint, "zmq"));
            }
            Endpoint::Mpi(rank) => {
                #[cfg(feature = "mpi")]
                {
                    RouterKind::Mpi(MpiRouter::bind(*rank, options)?)
                }
                #[cfg(not(feature = "mpi"))]
                {
                    let _ = rank;
                    return Err(not_built(endpoint, "mpi"));
                }
            }
        };
        Ok(RouterSocket { kind })
    }

    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError> {
        on_router!(self, s => s.await_peers(expected, timeout))
    }

    fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        on_router!(self, s => s.recv_from_deadline(deadline))
    }

    fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        on_router!(self, s => s.try_recv_from())
    }

    fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Instant,
    ) -> Result<(), SendError> {
        on_router!(self, s => s.send_to_deadline(peer, msg, Some(deadline)))
    }

    fn try_send_to(&mut self, peer: &PeerId, msg: Msg) -> Result<(), SendError> {
        on_router!(self, s => s.send_to_deadline(peer, msg, None))
    }

    fn peers(&self) -> Vec<PeerId> {
        on_router_ref!(self, s => s.peers())
    }

    fn dropped_malformed(&self) -> u64 {
        match &self.kind {
            RouterKind::Local(_) => 0,
            #[cfg(feature = "zmq")]
            RouterKind::Zmq(s) => s.dropped_malformed(),
            #[cfg(feature = "mpi")]
            RouterKind::Mpi(s) => s.dropped_malformed(),
        }
    }
}
