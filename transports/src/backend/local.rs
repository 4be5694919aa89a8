//! The `local` backend: crossbeam channels between threads of one process.
//!
//! A router owns a bounded inbound channel (capacity = HWM) and registers it under its
//! name in a process-wide table. A dealer looks the name up, announces itself with a
//! `Connect` event carrying the sender of its own bounded inbound channel, and then
//! sends `Data` events. Control events share the router's channel with data, so they
//! keep their order with respect to the messages around them.

use super::{BackendDealer, BackendSocket, Deadline, Delivery, Inbound, InboxRouter, send_error};
use crate::poller::Watch;
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{Receiver, Sender, bounded};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

/// The local router's events: a connecting dealer hands over its own inbound sender.
type LocalInbound = Inbound<Sender<Msg>>;

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
    fn reconnect(&mut self, deadline: Deadline) -> bool {
        let Some(to_router) = lookup(&self.name) else {
            return false;
        };
        let hello = Inbound::Connect {
            peer: self.identity.clone(),
            route: self.inbound_tx.clone(),
        };
        if deadline.send(&to_router, hello).is_err() {
            return false;
        }
        self.to_router = to_router;
        true
    }
}

impl BackendSocket for LocalDealer {
    fn options(&self) -> &SocketOptions {
        &self.options
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn watch(&self) -> Watch<'_> {
        Watch::channel(&self.inbound)
    }
}

impl BackendDealer for LocalDealer {
    fn identity(&self) -> &PeerId {
        &self.identity
    }

    fn send(&mut self, msg: Msg, deadline: Deadline) -> Result<(), SendError> {
        let event = Inbound::Data {
            peer: self.identity.clone(),
            msg,
        };
        let mut outcome = deadline.send(&self.to_router, event);
        // The router went away: like a ZeroMQ dealer, follow a new router bound to the
        // same name; otherwise hand the message back.
        if let Err((event, SendErrorKind::Disconnected)) = outcome {
            outcome = if self.reconnect(deadline) {
                deadline.send(&self.to_router, event)
            } else {
                Err((event, SendErrorKind::Disconnected))
            };
        }
        match outcome {
            Ok(()) => Ok(()),
            Err((Inbound::Data { msg, .. }, kind)) => Err(send_error(msg, kind, &self.endpoint)),
            // Only data is sent here; a control event cannot come back.
            Err(_) => Ok(()),
        }
    }

    fn recv(&mut self, deadline: Deadline) -> Result<Msg, RecvError> {
        deadline.recv(&self.inbound, &self.endpoint)
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
pub(crate) type LocalRouter = InboxRouter<LocalDelivery>;

/// How a local router reaches its dealers: through each one's own inbound sender.
/// It holds the router's name in the process-wide table, and frees it when dropped.
#[derive(Debug)]
pub(crate) struct LocalDelivery {
    name: String,
    generation: u64,
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
        let delivery = LocalDelivery {
            name: name.to_string(),
            generation,
        };
        Ok(InboxRouter::new(endpoint, options, inbound, delivery))
    }
}

impl Delivery for LocalDelivery {
    type Route = Sender<Msg>;

    fn deliver(
        &self,
        route: &Sender<Msg>,
        msg: Msg,
        deadline: Deadline,
    ) -> Result<(), (Msg, SendErrorKind)> {
        deadline.send(route, msg)
    }

    fn failure(&self) -> Option<String> {
        None
    }

    fn dropped_malformed(&self) -> u64 {
        // Messages between threads are never encoded, so none can be malformed.
        0
    }
}

impl Drop for LocalDelivery {
    fn drop(&mut self) {
        let mut table = registry().lock().unwrap_or_else(|p| p.into_inner());
        if table.1.get(&self.name).map(|b| b.generation) == Some(self.generation) {
            table.1.remove(&self.name);
        }
    }
}
