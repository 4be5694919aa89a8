//! The router every channel-fed backend shares: one ordered channel of connect, data
//! and disconnect events, the table of connected peers it builds, the data parked
//! while control events are applied early, and every [`BackendRouter`] call on top.
//!
//! A backend adds only how it reaches a peer, as a [`Delivery`]: a crossbeam sender
//! for `local`, a rank, tag and credits for `mpi`. Control events travel in the same
//! channel as data, so a peer is known before its first message.

use super::{BackendRouter, BackendSocket, Deadline, send_error};
use crate::poller::Watch;
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::Receiver;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use switchyard_msg::Msg;
use switchyard_msg::fast_hash::FastMap;

/// One event on a router's inbound channel.
pub(crate) enum Inbound<R> {
    Connect { peer: PeerId, route: R },
    Data { peer: PeerId, msg: Msg },
    Disconnect { peer: PeerId },
}

/// What a backend's receive on the router's own thread found.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) enum Fetched {
    /// A message, received on this thread.
    Data(PeerId, Msg),
    /// The channel has events: they come first.
    Queued,
    /// Nothing arrived in the time the backend polls: wait on the channel.
    Nothing,
}

/// What a backend adds to an [`InboxRouter`]: how to reach a peer. Dropping it
/// unbinds the router's endpoint.
pub(crate) trait Delivery: std::fmt::Debug {
    /// How to reach one peer; a `Connect` event carries it.
    type Route: Clone + 'static;

    /// Whether [`fetch`](Delivery::fetch) may receive on the router's thread; `false`
    /// keeps the call out of a channel-only backend's receive.
    const MAY_FETCH: bool = false;

    /// Receives the next message on the calling thread, if the backend can, polling
    /// until something arrives or its own short window (or `deadline`) passes. Called
    /// with `events` found empty; a backend whose background side also feeds `events`
    /// must check again, while it keeps that side out, that `events` is still empty
    /// (and answer [`Fetched::Queued`] if not), so that messages keep their order.
    fn fetch(
        &self,
        _events: &Receiver<Inbound<Self::Route>>,
        _deadline: Deadline,
    ) -> Result<Fetched, RecvError> {
        Ok(Fetched::Nothing)
    }

    /// Sends `msg` on `route` within `deadline`, or hands it back with why not.
    /// `Disconnected` makes the router forget the peer.
    fn deliver(
        &self,
        route: &Self::Route,
        msg: Msg,
        deadline: Deadline,
    ) -> Result<(), (Msg, SendErrorKind)>;

    /// Why the backend stopped for good, if it did: a receive that would time out
    /// reports this instead, since nothing will ever arrive.
    fn failure(&self) -> Option<String>;

    /// How many malformed messages the backend has dropped.
    fn dropped_malformed(&self) -> u64;
}

/// A router fed by a channel of [`Inbound`] events.
pub(crate) struct InboxRouter<D: Delivery> {
    // First, so that it is dropped first: the endpoint is unbound before the channel
    // closes, and a dealer never finds a bound name whose router is gone.
    delivery: D,
    options: SocketOptions,
    endpoint: String,
    inbound: Receiver<Inbound<D::Route>>,
    peers: FastMap<PeerId, D::Route>,
    pending: VecDeque<(PeerId, Msg)>,
}

impl<D: Delivery> std::fmt::Debug for InboxRouter<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxRouter")
            .field("endpoint", &self.endpoint)
            .field("peers", &self.peers.len())
            .field("delivery", &self.delivery)
            .finish()
    }
}

impl<D: Delivery> InboxRouter<D> {
    pub(crate) fn new(
        endpoint: String,
        options: SocketOptions,
        inbound: Receiver<Inbound<D::Route>>,
        delivery: D,
    ) -> Self {
        InboxRouter {
            delivery,
            options,
            endpoint,
            inbound,
            peers: FastMap::default(),
            pending: VecDeque::new(),
        }
    }

    /// Applies a control event, or returns the data it carries.
    fn absorb(&mut self, event: Inbound<D::Route>) -> Option<(PeerId, Msg)> {
        match event {
            Inbound::Connect { peer, route } => {
                tracing::debug!(endpoint = %self.endpoint, %peer, "peer connected");
                self.peers.insert(peer, route);
                None
            }
            Inbound::Disconnect { peer } => {
                self.peers.remove(&peer);
                None
            }
            Inbound::Data { peer, msg } => Some((peer, msg)),
        }
    }

    /// Applies queued control events, parking data behind them, up to the HWM.
    fn drain_control(&mut self) {
        while self.pending.len() < self.options.hwm {
            match self.inbound.try_recv() {
                Ok(event) => {
                    if let Some(data) = self.absorb(event) {
                        self.pending.push_back(data);
                    }
                }
                Err(_) => break,
            }
        }
    }
}

impl<D: Delivery> BackendSocket for InboxRouter<D> {
    fn options(&self) -> &SocketOptions {
        &self.options
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn watch(&self) -> Watch<'_> {
        if self.pending.is_empty() {
            Watch::channel(&self.inbound)
        } else {
            Watch::Ready
        }
    }
}

impl<D: Delivery> BackendRouter for InboxRouter<D> {
    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError> {
        let started = Instant::now();
        let deadline = started + timeout;
        self.drain_control();
        while self.peers.len() < expected {
            match self.inbound.recv_deadline(deadline) {
                Ok(event) => {
                    if let Some(data) = self.absorb(event) {
                        self.pending.push_back(data);
                    }
                }
                Err(_) => {
                    return Err(TransportError::PeersMissing {
                        endpoint: self.endpoint.clone(),
                        expected,
                        connected: self.peers.len(),
                        waited: started.elapsed(),
                    });
                }
            }
        }
        Ok(self.peers.len())
    }

    fn recv_from(&mut self, deadline: Deadline) -> Result<(PeerId, Msg), RecvError> {
        if let Some(data) = self.pending.pop_front() {
            return Ok(data);
        }
        if D::MAY_FETCH {
            loop {
                if let Ok(event) = self.inbound.try_recv() {
                    match self.absorb(event) {
                        Some(data) => return Ok(data),
                        None => continue,
                    }
                }
                match self.delivery.fetch(&self.inbound, deadline)? {
                    Fetched::Data(peer, msg) => {
                        if !self.peers.contains_key(&peer) {
                            // Its connect event is queued (sent before the peer could
                            // send): apply it, parking newer data behind this message.
                            self.drain_control();
                        }
                        return Ok((peer, msg));
                    }
                    Fetched::Queued => continue,
                    Fetched::Nothing => break,
                }
            }
        }
        loop {
            let event = match deadline.recv(&self.inbound, &self.endpoint) {
                Ok(event) => event,
                // A backend that stopped never fills the channel again: say why.
                Err(RecvError::Timeout) => {
                    return Err(self
                        .delivery
                        .failure()
                        .map_or(RecvError::Timeout, |reason| RecvError::Backend {
                            endpoint: self.endpoint.clone(),
                            reason,
                        }));
                }
                Err(e) => return Err(e),
            };
            if let Some(data) = self.absorb(event) {
                return Ok(data);
            }
        }
    }

    fn send_to(&mut self, peer: &PeerId, msg: Msg, deadline: Deadline) -> Result<(), SendError> {
        if !self.peers.contains_key(peer) {
            // A dealer's connect event may still be queued behind data.
            self.drain_control();
        }
        let Some(route) = self.peers.get(peer).cloned() else {
            let kind = SendErrorKind::UnknownPeer(peer.clone());
            return Err(send_error(msg, kind, &self.endpoint));
        };
        self.delivery
            .deliver(&route, msg, deadline)
            .map_err(|(msg, kind)| {
                if kind == SendErrorKind::Disconnected {
                    self.peers.remove(peer);
                }
                send_error(msg, kind, &self.endpoint)
            })
    }

    fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.peers.keys().cloned().collect();
        peers.sort();
        peers
    }

    fn dropped_malformed(&self) -> u64 {
        self.delivery.dropped_malformed()
    }
}
