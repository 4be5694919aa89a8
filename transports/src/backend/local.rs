//! The `local` backend: crossbeam channels between threads of one process.
//!
//! A router owns a bounded inbound channel (capacity = HWM) and registers it under its
//! name in a process-wide table. A dealer looks the name up, announces itself with a
//! `Connect` event carrying the sender of its own bounded inbound channel, and then
//! sends `Data` events. Control events share the router's channel with data, so they
//! keep their order with respect to the messages around them.

use super::inbox::{recv_error, Inbound, RouterInbox};
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender, TrySendError};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

/// The local router's events: a connecting dealer hands over its own inbound sender.
pub(crate) type LocalInbound = Inbound<Sender<Msg>>;

struct Binding {
    generation: u64,
    inbound: Sender<LocalInbound>,
}

fn registry() -> &'static Mutex<(u64, HashMap<String, Binding>)> {
    static REGISTRY: OnceLock<Mutex<(u64, HashMap<String, Binding>)>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new((0, HashMap::new())))
}

fn lookup(name: &str) -> Option<Sender<LocalInbound>> {
    let table = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    table.1.get(name).map(|b| b.inbound.clone())
}

fn send_error(msg: Msg, kind: SendErrorKind, endpoint: &str) -> SendError {
    SendError {
        msg,
        kind,
        endpoint: endpoint.to_string(),
    }
}

/// A dealer over crossbeam channels.
pub(crate) struct LocalDealer {
    name: String,
    endpoint: String,
    identity: PeerId,
    options: SocketOptions,
    to_router: Sender<LocalInbound>,
    inbound: Receiver<Msg>,
    inbound_tx: Sender<Msg>,
}

impl std::fmt::Debug for LocalDealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalDealer")
            .field("endpoint", &self.endpoint)
            .field("identity", &self.identity)
            .finish()
    }
}

impl LocalDealer {
    pub(crate) fn connect(name: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("local://{name}");
        let started = Instant::now();
        let deadline = started + options.connect_timeout;
        let identity = options
            .identity
            .clone()
            .unwrap_or_else(super::fresh_identity);
        let (inbound_tx, inbound) = bounded(options.hwm);
        let mut pause = Duration::from_micros(100);
        loop {
            if let Some(to_router) = lookup(name) {
                let hello = Inbound::Connect {
                    peer: identity.clone(),
                    route: inbound_tx.clone(),
                };
                if to_router.send_deadline(hello, deadline).is_ok() {
                    return Ok(LocalDealer {
                        name: name.to_string(),
                        endpoint,
                        identity,
                        options,
                        to_router,
                        inbound,
                        inbound_tx,
                    });
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Unreachable {
                    endpoint,
                    waited: now - started,
                });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Re-registers with a router newly bound under our name, if there is one.
    fn reconnect(&mut self, deadline: Instant) -> bool {
        let Some(to_router) = lookup(&self.name) else {
            return false;
        };
        let hello = Inbound::Connect {
            peer: self.identity.clone(),
            route: self.inbound_tx.clone(),
        };
        if to_router.send_deadline(hello, deadline).is_err() {
            return false;
        }
        self.to_router = to_router;
        true
    }

    pub(crate) fn identity(&self) -> &PeerId {
        &self.identity
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        let event = Inbound::Data {
            peer: self.identity.clone(),
            msg,
        };
        let event = match self.to_router.send_deadline(event, deadline) {
            Ok(()) => return Ok(()),
            Err(SendTimeoutError::Timeout(Inbound::Data { msg, .. })) => {
                return Err(send_error(msg, SendErrorKind::Timeout, &self.endpoint))
            }
            Err(SendTimeoutError::Timeout(_)) => return Ok(()),
            Err(SendTimeoutError::Disconnected(event)) => event,
        };
        // The router went away: like a ZeroMQ dealer, follow a new router bound to the
        // same name; otherwise hand the message back.
        if self.reconnect(deadline) {
            return match self.to_router.send_deadline(event, deadline) {
                Ok(()) => Ok(()),
                Err(SendTimeoutError::Timeout(Inbound::Data { msg, .. })) => {
                    Err(send_error(msg, SendErrorKind::Timeout, &self.endpoint))
                }
                Err(SendTimeoutError::Disconnected(Inbound::Data { msg, .. })) => {
                    Err(send_error(msg, SendErrorKind::Disconnected, &self.endpoint))
                }
                Err(_) => Ok(()),
            };
        }
        match event {
            Inbound::Data { msg, .. } => {
                Err(send_error(msg, SendErrorKind::Disconnected, &self.endpoint))
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        let event = Inbound::Data {
            peer: self.identity.clone(),
            msg,
        };
        match self.to_router.try_send(event) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Inbound::Data { msg, .. })) => {
                Err(send_error(msg, SendErrorKind::Full, &self.endpoint))
            }
            Err(TrySendError::Disconnected(Inbound::Data { msg, .. })) => {
                let deadline = Instant::now();
                if self.reconnect(deadline) {
                    return self.try_send(msg);
                }
                Err(send_error(msg, SendErrorKind::Disconnected, &self.endpoint))
            }
            Err(_) => Ok(()),
        }
    }

    pub(crate) fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        match deadline {
            Some(deadline) => self
                .inbound
                .recv_deadline(deadline)
                .map_err(|e| recv_error(e, &self.endpoint)),
            None => self.inbound.recv().map_err(|_| RecvError::Disconnected {
                endpoint: self.endpoint.clone(),
            }),
        }
    }

    pub(crate) fn try_recv(&mut self) -> Result<Msg, RecvError> {
        self.inbound.try_recv().map_err(|_| RecvError::Empty)
    }

    pub(crate) fn receiver(&self) -> &Receiver<Msg> {
        &self.inbound
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.inbound.is_empty()
    }
}

impl Drop for LocalDealer {
    fn drop(&mut self) {
        let _ = self.to_router.try_send(Inbound::Disconnect {
            peer: self.identity.clone(),
        });
    }
}

/// A router over crossbeam channels.
pub(crate) struct LocalRouter {
    name: String,
    generation: u64,
    options: SocketOptions,
    inbox: RouterInbox<Sender<Msg>>,
}

impl std::fmt::Debug for LocalRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRouter")
            .field("endpoint", &self.inbox.endpoint())
            .field("peers", &self.inbox.peers().len())
            .finish()
    }
}

impl LocalRouter {
    pub(crate) fn bind(name: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("local://{name}");
        let (tx, inbound) = bounded(options.hwm);
        let mut table = registry().lock().unwrap_or_else(|p| p.into_inner());
        if table.1.contains_key(name) {
            return Err(TransportError::AddrInUse {
                endpoint,
                reason: "a local router with this name exists in this process".into(),
            });
        }
        table.0 += 1;
        let generation = table.0;
        table.1.insert(
            name.to_string(),
            Binding {
                generation,
                inbound: tx,
            },
        );
        Ok(LocalRouter {
            name: name.to_string(),
            generation,
            inbox: RouterInbox::new(endpoint, options.hwm, inbound),
            options,
        })
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        self.inbox.endpoint()
    }

    pub(crate) fn await_peers(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        self.inbox.await_peers(expected, timeout)
    }

    pub(crate) fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        self.inbox.recv_from_deadline(deadline)
    }

    pub(crate) fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        self.inbox.try_recv_from()
    }

    pub(crate) fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let Some(tx) = self.inbox.route(peer).cloned() else {
            return Err(send_error(
                msg,
                SendErrorKind::UnknownPeer(peer.clone()),
                self.inbox.endpoint(),
            ));
        };
        let result = match deadline {
            Some(deadline) => tx.send_deadline(msg, deadline).map_err(|e| match e {
                SendTimeoutError::Timeout(msg) => (msg, SendErrorKind::Timeout),
                SendTimeoutError::Disconnected(msg) => (msg, SendErrorKind::Disconnected),
            }),
            None => tx.try_send(msg).map_err(|e| match e {
                TrySendError::Full(msg) => (msg, SendErrorKind::Full),
                TrySendError::Disconnected(msg) => (msg, SendErrorKind::Disconnected),
            }),
        };
        result.map_err(|(msg, kind)| {
            if kind == SendErrorKind::Disconnected {
                self.inbox.forget(peer);
            }
            send_error(msg, kind, self.inbox.endpoint())
        })
    }

    pub(crate) fn peers(&self) -> Vec<PeerId> {
        self.inbox.peers()
    }

    pub(crate) fn receiver(&self) -> &Receiver<LocalInbound> {
        self.inbox.receiver()
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.inbox.has_pending()
    }
}

impl Drop for LocalRouter {
    fn drop(&mut self) {
        let mut table = registry().lock().unwrap_or_else(|p| p.into_inner());
        if table.1.get(&self.name).map(|b| b.generation) == Some(self.generation) {
            table.1.remove(&self.name);
        }
    }
}

/// What the poller needs from a local socket: a receiver to select on.
pub(crate) enum LocalReceiver<'a> {
    Dealer(&'a Receiver<Msg>),
    Router(&'a Receiver<LocalInbound>),
    #[cfg(feature = "mpi")]
    MpiRouter(&'a Receiver<super::mpi::MpiInbound>),
}

impl LocalReceiver<'_> {
    pub(crate) fn register<'s>(&'s self, select: &mut crossbeam_channel::Select<'s>) -> usize {
        match self {
            LocalReceiver::Dealer(rx) => select.recv(rx),
            LocalReceiver::Router(rx) => select.recv(rx),
            #[cfg(feature = "mpi")]
            LocalReceiver::MpiRouter(rx) => select.recv(rx),
        }
    }
}
