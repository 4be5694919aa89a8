//! A libzmq ROUTER with `ROUTER_MANDATORY` and `ROUTER_HANDOVER` on: it learns its
//! peers from what they send, answers each HELLO with READY, and never waits on a
//! peer to send (one thread serves them all, so a wait on a peer that does not read
//! would stall every other).

use super::{OverRaw, Parts, Raw, backend_error, decode_parts, tried};
use crate::backend::warn_limit::PeerWarnings;
use crate::backend::{BackendRouter, Deadline};
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use bytes::Bytes;
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};
use switchyard_msg::{DecodeError, Kind, Msg};

/// A libzmq ROUTER with `ROUTER_MANDATORY` and `ROUTER_HANDOVER` on, whose sends never
/// wait on a peer.
pub(crate) struct ZmqRouter {
    raw: Raw,
    peers: HashSet<PeerId>,
    /// The peer of the last message, known (in `peers`): a run of messages from one
    /// peer looks it up by comparing bytes, not by hashing (the table keeps SipHash,
    /// since over tcp any stranger picks its identity).
    last: Option<PeerId>,
    pending: VecDeque<(PeerId, Msg)>,
    dropped: u64,
    /// Boxed: only the unlucky paths use it, and it keeps the router small beside the
    /// other backends' (`RouterKind` holds any of them).
    warnings: Box<PeerWarnings<PeerId>>,
}

impl std::fmt::Debug for ZmqRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqRouter")
            .field("endpoint", &self.raw.endpoint)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl ZmqRouter {
    /// `address` is the libzmq form; a tcp port 0 must already be written as `*`.
    pub(crate) fn bind(address: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let mut raw = Raw::new(zmq::ROUTER, address, options)?;
        let err = |e| backend_error(address, e);
        raw.socket.set_router_mandatory(true).map_err(err)?;
        raw.socket.set_router_handover(true).map_err(err)?;
        raw.socket.bind(address).map_err(|e| match e {
            zmq::Error::EADDRINUSE => TransportError::AddrInUse {
                endpoint: address.to_string(),
                reason: e.to_string(),
            },
            other => backend_error(address, other),
        })?;
        if let Ok(Ok(actual)) = raw.socket.get_last_endpoint() {
            raw.endpoint = actual;
        }
        Ok(ZmqRouter {
            warnings: Box::new(PeerWarnings::new(&raw.endpoint)),
            raw,
            peers: HashSet::new(),
            last: None,
            pending: VecDeque::new(),
            dropped: 0,
        })
    }

    /// The identity in a received frame, shared with the known peer's when there is
    /// one, so that the common case allocates nothing; and whether it is known.
    fn peer_id(&self, identity: &[u8]) -> (PeerId, bool) {
        if let Some(last) = self.last.as_ref().filter(|p| p.as_bytes() == identity) {
            return (last.clone(), true);
        }
        match self.peers.get(identity) {
            Some(known) => (known.clone(), true),
            None => (PeerId::from_wire(Bytes::copy_from_slice(identity)), false),
        }
    }

    /// Receives one message. Returns `None` for transport chatter it handled itself (a
    /// HELLO it answered, a malformed message it dropped).
    fn next_event(&mut self, deadline: Deadline) -> Result<Option<(PeerId, Msg)>, RecvError> {
        let (peer, decoded) = match self.raw.recv_parts(deadline)? {
            Parts::Whole(parts) => {
                let mut parts = parts.into_iter();
                let Some(identity) = parts.next() else {
                    return Ok(None);
                };
                let peer = self.peer_id(&identity);
                (peer, decode_parts(parts, &self.raw.options.limits))
            }
            Parts::TooMany { first, limit } => (
                self.peer_id(&first),
                Err(DecodeError::TooManyFrames {
                    count: limit,
                    limit: self.raw.options.limits.max_frames,
                }),
            ),
        };
        let (peer, known) = peer;
        let msg = match decoded {
            Ok(msg) => msg,
            Err(reason) => {
                self.dropped += 1;
                if self.warnings.admit(&peer) {
                    tracing::warn!(endpoint = %self.raw.endpoint, %peer, %reason,
                        "dropped malformed message");
                }
                return Ok(None);
            }
        };
        if !known {
            self.peers.insert(peer.clone());
        }
        if self.last.as_ref() != Some(&peer) {
            self.last = Some(peer.clone());
        }
        if msg.header.kind == Kind::Hello {
            // Without waiting, like every router send: a peer that sends HELLOs and
            // never reads must not hold up this receive.
            let ready = msg.reply(Kind::Ready);
            if let Err(e) = self.raw.send_msg(Some(peer.bytes()), ready, 0) {
                if self.warnings.admit(&peer) {
                    tracing::warn!(endpoint = %self.raw.endpoint, %peer, error = %e.kind,
                        "could not answer HELLO");
                }
            }
            return Ok(None);
        }
        Ok(Some((peer, msg)))
    }

    /// Receives the next application message.
    fn next(&mut self, deadline: Deadline) -> Result<(PeerId, Msg), RecvError> {
        loop {
            if let Some(data) = self.next_event(deadline)? {
                return Ok(data);
            }
        }
    }

    /// The next application message, the ones `await_peers` kept first.
    fn recv_waiting(&mut self, deadline: Deadline) -> Result<(PeerId, Msg), RecvError> {
        if let Some(data) = self.pending.pop_front() {
            return Ok(data);
        }
        self.next(deadline)
    }
}

impl OverRaw for ZmqRouter {
    fn raw(&self) -> &Raw {
        &self.raw
    }

    fn holds_messages(&self) -> bool {
        !self.pending.is_empty()
    }
}

impl BackendRouter for ZmqRouter {
    fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError> {
        let started = Instant::now();
        let deadline = started + timeout;
        while self.peers.len() < expected {
            match self.next_event(Deadline::At(deadline)) {
                Ok(Some(data)) => self.pending.push_back(data),
                Ok(None) => {}
                Err(RecvError::Timeout) => {
                    return Err(TransportError::PeersMissing {
                        endpoint: self.raw.endpoint.clone(),
                        expected,
                        connected: self.peers.len(),
                        waited: started.elapsed(),
                    });
                }
                Err(e) => {
                    return Err(TransportError::Backend {
                        backend: "zmq",
                        endpoint: self.raw.endpoint.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(self.peers.len())
    }

    fn recv_from(&mut self, deadline: Deadline) -> Result<(PeerId, Msg), RecvError> {
        tried(deadline, self.recv_waiting(deadline))
    }

    /// Sends without ever waiting on `peer`, whatever the deadline: a full peer gets
    /// `Full` and the message back at once, and the caller decides what to do with it
    /// (retry later, drop it, give up on the peer).
    fn send_to(&mut self, peer: &PeerId, msg: Msg, _deadline: Deadline) -> Result<(), SendError> {
        let result = self.raw.send_msg(Some(peer.bytes()), msg, 0);
        if let Err(SendError {
            kind: SendErrorKind::UnknownPeer(_),
            ..
        }) = &result
        {
            self.peers.remove(peer);
            if self.last.as_ref() == Some(peer) {
                self.last = None;
            }
        }
        result
    }

    fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.peers.iter().cloned().collect();
        peers.sort();
        peers
    }

    fn dropped_malformed(&self) -> u64 {
        self.dropped
    }
}
