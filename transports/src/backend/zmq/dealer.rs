//! A libzmq DEALER: connects to one router, sends it a HELLO and waits for its READY.

use super::{OverRaw, Parts, Raw, backend_error, decode_parts, hello, timeout_ms, tried};
use crate::backend::warn_limit::PeerWarnings;
use crate::backend::{BackendDealer, Deadline};
use crate::{PeerId, RecvError, SendError, SocketOptions, TransportError};
use std::collections::VecDeque;
use std::time::Instant;
use switchyard_msg::{DecodeError, Kind, Msg};

/// A libzmq DEALER.
pub(crate) struct ZmqDealer {
    raw: Raw,
    identity: PeerId,
    pending: VecDeque<Msg>,
    dropped: u64,
    warnings: PeerWarnings<&'static str>,
}

impl std::fmt::Debug for ZmqDealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqDealer")
            .field("endpoint", &self.raw.endpoint)
            .field("identity", &self.identity)
            .finish()
    }
}

impl ZmqDealer {
    /// `address` is the libzmq form (`inproc://x` or `tcp://h:p`).
    pub(crate) fn connect(address: &str, options: SocketOptions) -> Result<Self, TransportError> {
        let started = Instant::now();
        let deadline = started + options.connect_timeout;
        let identity = options
            .identity
            .clone()
            .unwrap_or_else(crate::backend::fresh_identity);
        let raw = Raw::new(zmq::DEALER, address, options)?;
        let err = |e| backend_error(address, e);
        raw.socket.set_identity(identity.as_bytes()).map_err(err)?;
        raw.socket.connect(address).map_err(err)?;
        let mut dealer = ZmqDealer {
            raw,
            identity,
            pending: VecDeque::new(),
            dropped: 0,
            warnings: PeerWarnings::new(address),
        };
        let unreachable = || TransportError::Unreachable {
            endpoint: address.to_string(),
            waited: started.elapsed(),
        };
        dealer
            .raw
            .send_msg(None, hello(), timeout_ms(Deadline::At(deadline)))
            .map_err(|_| unreachable())?;
        loop {
            match dealer.recv_decoded(Deadline::At(deadline)) {
                Ok(msg) if msg.header.kind == Kind::Ready => return Ok(dealer),
                Ok(msg) => dealer.pending.push_back(msg),
                Err(RecvError::Timeout) => return Err(unreachable()),
                Err(e) => {
                    return Err(TransportError::Backend {
                        backend: "zmq",
                        endpoint: address.to_string(),
                        reason: e.to_string(),
                    });
                }
            }
        }
    }

    /// Receives and decodes, dropping (and counting) what does not decode.
    fn recv_decoded(&mut self, deadline: Deadline) -> Result<Msg, RecvError> {
        loop {
            let decoded = match self.raw.recv_parts(deadline)? {
                Parts::Whole(parts) => decode_parts(parts.into_iter(), &self.raw.options.limits),
                Parts::TooMany { limit, .. } => Err(DecodeError::TooManyFrames {
                    count: limit,
                    limit: self.raw.options.limits.max_frames,
                }),
            };
            match decoded {
                Ok(msg) => return Ok(msg),
                Err(reason) => {
                    self.dropped += 1;
                    if self.warnings.admit(&"router") {
                        tracing::warn!(endpoint = %self.raw.endpoint, peer = "router", %reason,
                            "dropped malformed message");
                    }
                }
            }
        }
    }

    /// The next application message, skipping transport chatter.
    fn recv_waiting(&mut self, deadline: Deadline) -> Result<Msg, RecvError> {
        if let Some(msg) = self.pending.pop_front() {
            return Ok(msg);
        }
        loop {
            let msg = self.recv_decoded(deadline)?;
            // A READY repeated by a router we reconnected to is transport chatter.
            if msg.header.kind != Kind::Ready {
                return Ok(msg);
            }
        }
    }
}

impl OverRaw for ZmqDealer {
    fn raw(&self) -> &Raw {
        &self.raw
    }

    fn holds_messages(&self) -> bool {
        !self.pending.is_empty()
    }
}

impl BackendDealer for ZmqDealer {
    fn identity(&self) -> &PeerId {
        &self.identity
    }

    fn send(&mut self, msg: Msg, deadline: Deadline) -> Result<(), SendError> {
        self.raw.send_msg(None, msg, timeout_ms(deadline))
    }

    fn recv(&mut self, deadline: Deadline) -> Result<Msg, RecvError> {
        tried(deadline, self.recv_waiting(deadline))
    }
}
