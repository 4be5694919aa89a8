//! The receiving half every router shares: one ordered channel of connect, data and
//! disconnect events, the table of connected peers it builds, and the data parked
//! while control events are applied early.
//!
//! A backend's router owns a [`RouterInbox`] and adds only how it reaches a peer (the
//! route `R`): a crossbeam sender for `local`, a rank and tag for `mpi`. Control events
//! travel in the same channel as data, so a peer is known before its first message.

use crate::{PeerId, RecvError, TransportError};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

/// One event on a router's inbound channel.
pub(crate) enum Inbound<R> {
    Connect { peer: PeerId, route: R },
    Data { peer: PeerId, msg: Msg },
    Disconnect { peer: PeerId },
}

/// A router's inbound channel and peer table.
pub(crate) struct RouterInbox<R> {
    endpoint: String,
    hwm: usize,
    inbound: Receiver<Inbound<R>>,
    peers: HashMap<PeerId, R>,
    pending: VecDeque<(PeerId, Msg)>,
}

pub(crate) fn recv_error(err: RecvTimeoutError, endpoint: &str) -> RecvError {
    match err {
        RecvTimeoutError::Timeout => RecvError::Timeout,
        RecvTimeoutError::Disconnected => RecvError::Disconnected {
            endpoint: endpoint.to_string(),
        },
    }
}

impl<R> RouterInbox<R> {
    pub(crate) fn new(endpoint: String, hwm: usize, inbound: Receiver<Inbound<R>>) -> Self {
        RouterInbox {
            endpoint,
            hwm,
            inbound,
            peers: HashMap::new(),
            pending: VecDeque::new(),
        }
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Applies a control event, or returns the data it carries.
    fn absorb(&mut self, event: Inbound<R>) -> Option<(PeerId, Msg)> {
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
        while self.pending.len() < self.hwm {
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

    pub(crate) fn await_peers(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
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
                    })
                }
            }
        }
        Ok(self.peers.len())
    }

    pub(crate) fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        if let Some(data) = self.pending.pop_front() {
            return Ok(data);
        }
        loop {
            let event = match deadline {
                Some(deadline) => self
                    .inbound
                    .recv_deadline(deadline)
                    .map_err(|e| recv_error(e, &self.endpoint))?,
                None => self.inbound.recv().map_err(|_| RecvError::Disconnected {
                    endpoint: self.endpoint.clone(),
                })?,
            };
            if let Some(data) = self.absorb(event) {
                return Ok(data);
            }
        }
    }

    pub(crate) fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        if let Some(data) = self.pending.pop_front() {
            return Ok(data);
        }
        loop {
            let event = self.inbound.try_recv().map_err(|_| RecvError::Empty)?;
            if let Some(data) = self.absorb(event) {
                return Ok(data);
            }
        }
    }

    /// How to reach `peer`, applying any connect events still queued first.
    pub(crate) fn route(&mut self, peer: &PeerId) -> Option<&R> {
        if !self.peers.contains_key(peer) {
            self.drain_control();
        }
        self.peers.get(peer)
    }

    /// Forgets a peer whose route turned out to be dead.
    pub(crate) fn forget(&mut self, peer: &PeerId) {
        self.peers.remove(peer);
    }

    pub(crate) fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.peers.keys().cloned().collect();
        peers.sort();
        peers
    }

    pub(crate) fn receiver(&self) -> &Receiver<Inbound<R>> {
        &self.inbound
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.inbound.is_empty()
    }
}
