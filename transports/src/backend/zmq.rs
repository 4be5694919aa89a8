//! The `zmq` backend: libzmq DEALER and ROUTER sockets over `inproc://` and `tcp://`.
//!
//! Socket options set on every socket (see `SocketOptions` for the values):
//! `SNDHWM`/`RCVHWM` = hwm, `LINGER` = linger, `MAXMSGSIZE` = the largest frame the
//! limits allow (libzmq drops a peer that sends more), and on routers
//! `ROUTER_MANDATORY` = 1 (a send to an unknown peer is `EHOSTUNREACH`, to a full one
//! `EAGAIN`, never a silent drop; routers send with `DONTWAIT`, so a full peer is
//! `Full` at once and never stalls the others) and `ROUTER_HANDOVER` = 1 (a
//! reconnecting dealer with the same identity takes over; without authentication any
//! peer can claim any identity, see WIRE.md). `ZAP_DOMAIN` is set so that libzmq
//! refuses legacy ZMTP 1.0/2.0 greetings; the mechanism is NULL (no authentication,
//! no encryption).
//!
//! Deadlines become `SNDTIMEO`/`RCVTIMEO`, set only when they change. A dealer's
//! `connect` sends a HELLO and waits for the router's READY, because libzmq connects
//! asynchronously and would otherwise never report a router that is not there.
//!
//! A tcp dealer whose router restarts reconnects by itself (libzmq's `RECONNECT_IVL`,
//! 100 ms); messages in flight on the dead connection are lost. An inproc dealer does
//! not: libzmq's inproc transport never reconnects, so connect a new dealer (with the
//! same identity, if the router should see the same peer).

use super::zmq_frame::{into_bytes, send_frame};
use super::warn_limit::PeerWarnings;
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use bytes::Bytes;
use std::collections::{HashSet, VecDeque};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, DecodeError, Kind, Msg};

/// The process-wide libzmq context; `inproc://` only reaches sockets of one context.
fn context() -> &'static zmq::Context {
    static CONTEXT: OnceLock<zmq::Context> = OnceLock::new();
    CONTEXT.get_or_init(zmq::Context::new)
}

fn backend_error(endpoint: &str, err: zmq::Error) -> TransportError {
    TransportError::Backend {
        backend: "zmq",
        endpoint: endpoint.to_string(),
        reason: err.to_string(),
    }
}

/// Milliseconds until `deadline` in libzmq's convention (-1 = forever).
fn timeout_ms(deadline: Option<Instant>) -> i32 {
    match deadline {
        None => -1,
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            // Round up so that a wait of 0.4 ms does not become a non-blocking poll.
            let ms = left.as_micros().div_ceil(1000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        }
    }
}

/// The ZAP domain every socket sets; see `Raw::new`.
const ZAP_DOMAIN: &str = "switchyard";

/// One libzmq socket with the options switchyard sets, and cached timeouts.
struct Raw {
    socket: zmq::Socket,
    endpoint: String,
    options: SocketOptions,
    sndtimeo: i32,
    rcvtimeo: i32,
    /// Reused for every header this socket encodes.
    header: Vec<u8>,
}

impl Raw {
    fn new(kind: zmq::SocketType, endpoint: &str, options: SocketOptions) -> Result<Raw, TransportError> {
        let err = |e| backend_error(endpoint, e);
        let socket = context().socket(kind).map_err(err)?;
        let hwm = i32::try_from(options.hwm).unwrap_or(i32::MAX);
        socket.set_sndhwm(hwm).map_err(err)?;
        socket.set_rcvhwm(hwm).map_err(err)?;
        let linger = i32::try_from(options.linger.as_millis()).unwrap_or(i32::MAX);
        socket.set_linger(linger).map_err(err)?;
        let max = i64::try_from(options.limits.max_frame_bytes.max(options.limits.max_header_bytes))
            .unwrap_or(i64::MAX);
        socket.set_maxmsgsize(max).map_err(err)?;
        // With a ZAP domain set, libzmq refuses ZMTP 1.0/2.0 greetings (raw bytes would
        // otherwise become messages from made-up identities). No ZAP handler is bound
        // in this context, so the NULL mechanism still accepts every ZMTP 3 peer.
        socket.set_zap_domain(ZAP_DOMAIN).map_err(err)?;
        Ok(Raw {
            socket,
            endpoint: endpoint.to_string(),
            options,
            sndtimeo: i32::MIN,
            rcvtimeo: i32::MIN,
            header: Vec::with_capacity(64),
        })
    }

    fn set_sndtimeo(&mut self, ms: i32) -> zmq::Result<()> {
        if ms != self.sndtimeo {
            self.socket.set_sndtimeo(ms)?;
            self.sndtimeo = ms;
        }
        Ok(())
    }

    /// Sends `prefix` (a router's identity frame, if any), the header and the frames as
    /// one multipart message. libzmq applies the HWM to the first part only, so once
    /// it is accepted the rest follow without blocking: the message goes whole or not
    /// at all.
    fn send_msg(&mut self, prefix: Option<&Bytes>, msg: Msg, timeout: i32) -> Result<(), SendError> {
        let fail = |msg, kind, endpoint: &str| SendError {
            msg,
            kind,
            endpoint: endpoint.to_string(),
        };
        if let Err(e) = self.set_sndtimeo(timeout) {
            return Err(fail(msg, SendErrorKind::Backend(e.to_string()), &self.endpoint));
        }
        msg.encode_header_into(&mut self.header);
        let header = &self.header[..];
        let frames = msg.frames();
        let first_flags = zmq::SNDMORE | if timeout == 0 { zmq::DONTWAIT } else { 0 };
        let first = match prefix {
            Some(identity) => send_frame(&mut self.socket, identity, first_flags),
            None => self.socket.send(
                header,
                if frames.is_empty() { first_flags & !zmq::SNDMORE } else { first_flags },
            ),
        };
        if let Err(e) = first {
            let kind = match e {
                zmq::Error::EAGAIN if timeout == 0 => SendErrorKind::Full,
                zmq::Error::EAGAIN => SendErrorKind::Timeout,
                zmq::Error::EHOSTUNREACH => match prefix {
                    Some(id) => SendErrorKind::UnknownPeer(PeerId::from_wire(id.clone())),
                    None => SendErrorKind::Disconnected,
                },
                other => SendErrorKind::Backend(other.to_string()),
            };
            return Err(fail(msg, kind, &self.endpoint));
        }
        let last = frames.len();
        if prefix.is_some() {
            let flags = if last > 0 { zmq::SNDMORE } else { 0 };
            if let Err(e) = self.socket.send(header, flags) {
                return Err(fail(msg, SendErrorKind::Backend(e.to_string()), &self.endpoint));
            }
        }
        for (i, frame) in frames.iter().enumerate() {
            let flags = if i + 1 < last { zmq::SNDMORE } else { 0 };
            if let Err(e) = send_frame(&mut self.socket, frame, flags) {
                // Not expected after the first part was accepted; the receiver would
                // see a truncated message and drop it as malformed.
                return Err(fail(msg, SendErrorKind::Backend(e.to_string()), &self.endpoint));
            }
        }
        Ok(())
    }

    /// Receives all parts of one multipart message. Parts past the most a valid message
    /// can have (identity, header and `max_frames` payloads) are discarded as they are
    /// read, so this socket keeps no more than that; libzmq itself has buffered the
    /// whole message before its first part arrives here (no option of libzmq bounds
    /// the parts of a message). The truncated message then fails to decode and is
    /// dropped as malformed.
    fn recv_parts(&mut self, deadline: Option<Instant>) -> Result<Parts, RecvError> {
        let max_parts = self.options.limits.max_frames.saturating_add(3);
        let endpoint = &self.endpoint;
        let backend = |e: zmq::Error| RecvError::Backend {
            endpoint: endpoint.clone(),
            reason: e.to_string(),
        };
        let ms = timeout_ms(deadline);
        if ms != self.rcvtimeo {
            self.socket.set_rcvtimeo(ms).map_err(backend)?;
            self.rcvtimeo = ms;
        }
        let flags = if ms == 0 { zmq::DONTWAIT } else { 0 };
        let mut part = zmq::Message::new();
        match self.socket.recv(&mut part, flags) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) if ms == 0 && deadline.is_some_and(|d| d <= Instant::now()) => {
                return Err(RecvError::Timeout)
            }
            Err(zmq::Error::EAGAIN) => return Err(RecvError::Timeout),
            Err(e) => return Err(backend(e)),
        }
        let mut parts = Vec::with_capacity(4);
        let mut more = part.get_more();
        parts.push(part);
        let mut overflow = false;
        while more {
            let mut part = zmq::Message::new();
            self.socket.recv(&mut part, 0).map_err(backend)?;
            more = part.get_more();
            if parts.len() < max_parts {
                parts.push(part);
            } else {
                overflow = true;
            }
        }
        if overflow {
            return Ok(Parts::TooMany { first: parts.swap_remove(0), limit: max_parts });
        }
        Ok(Parts::Whole(parts))
    }

}

/// What one receive produced.
enum Parts {
    /// Every part of a message, as libzmq delivered them.
    Whole(Vec<zmq::Message>),
    /// A message with more parts than any valid one; only its first part was kept
    /// (a router's identity frame names the sender).
    TooMany { first: zmq::Message, limit: usize },
}

/// Decodes the parts after any identity: the header is read in place, payloads become
/// `Bytes` (small ones copied, large ones owned without a copy).
fn decode_parts(mut parts: std::vec::IntoIter<zmq::Message>, limits: &switchyard_msg::Limits) -> Result<Msg, DecodeError> {
    let Some(header) = parts.next() else {
        return Err(DecodeError::NoFrames);
    };
    let frames: Vec<Bytes> = parts.map(into_bytes).collect();
    Msg::from_header_frame(&header, frames, limits)
}

fn hello() -> Msg {
    Msg::new(Addr::stub(0), Addr::stub(0), Kind::Hello)
}

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
        let identity = options.identity.clone().unwrap_or_else(super::fresh_identity);
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
            .send_msg(None, hello(), timeout_ms(Some(deadline)))
            .map_err(|_| unreachable())?;
        loop {
            match dealer.recv_decoded(Some(deadline)) {
                Ok(msg) if msg.header.kind == Kind::Ready => return Ok(dealer),
                Ok(msg) => dealer.pending.push_back(msg),
                Err(RecvError::Timeout) => return Err(unreachable()),
                Err(e) => {
                    return Err(TransportError::Backend {
                        backend: "zmq",
                        endpoint: address.to_string(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    }

    pub(crate) fn identity(&self) -> &PeerId {
        &self.identity
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.raw.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.raw.endpoint
    }

    pub(crate) fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        let ms = timeout_ms(Some(deadline));
        self.raw.send_msg(None, msg, ms)
    }

    pub(crate) fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        self.raw.send_msg(None, msg, 0)
    }

    /// Receives and decodes, dropping (and counting) what does not decode.
    fn recv_decoded(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
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

    pub(crate) fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
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

    pub(crate) fn try_recv(&mut self) -> Result<Msg, RecvError> {
        match self.recv_deadline(Some(Instant::now())) {
            Err(RecvError::Timeout) => Err(RecvError::Empty),
            other => other,
        }
    }

    pub(crate) fn socket(&self) -> &zmq::Socket {
        &self.raw.socket
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// A libzmq ROUTER with `ROUTER_MANDATORY` and `ROUTER_HANDOVER` on, whose sends never
/// wait on a peer.
pub(crate) struct ZmqRouter {
    raw: Raw,
    peers: HashSet<PeerId>,
    pending: VecDeque<(PeerId, Msg)>,
    dropped: u64,
    warnings: PeerWarnings<PeerId>,
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
            warnings: PeerWarnings::new(&raw.endpoint),
            raw,
            peers: HashSet::new(),
            pending: VecDeque::new(),
            dropped: 0,
        })
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.raw.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.raw.endpoint
    }

    pub(crate) fn dropped_malformed(&self) -> u64 {
        self.dropped
    }

    /// The identity in a received frame, shared with the known peer's when there is
    /// one, so that the common case allocates nothing.
    fn peer_id(&self, identity: &[u8]) -> PeerId {
        match self.peers.get(identity) {
            Some(known) => known.clone(),
            None => PeerId::from_wire(Bytes::copy_from_slice(identity)),
        }
    }

    /// Receives one message. Returns `None` for transport chatter it handled itself (a
    /// HELLO it answered, a malformed message it dropped).
    fn next_event(&mut self, deadline: Option<Instant>) -> Result<Option<(PeerId, Msg)>, RecvError> {
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
                Err(DecodeError::TooManyFrames { count: limit, limit: self.raw.options.limits.max_frames }),
            ),
        };
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
        self.peers.insert(peer.clone());
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
    fn next(&mut self, deadline: Option<Instant>) -> Result<(PeerId, Msg), RecvError> {
        loop {
            if let Some(data) = self.next_event(deadline)? {
                return Ok(data);
            }
        }
    }

    pub(crate) fn await_peers(&mut self, expected: usize, timeout: Duration) -> Result<usize, TransportError> {
        let started = Instant::now();
        let deadline = started + timeout;
        while self.peers.len() < expected {
            match self.next_event(Some(deadline)) {
                Ok(Some(data)) => self.pending.push_back(data),
                Ok(None) => {}
                Err(RecvError::Timeout) => {
                    return Err(TransportError::PeersMissing {
                        endpoint: self.raw.endpoint.clone(),
                        expected,
                        connected: self.peers.len(),
                        waited: started.elapsed(),
                    })
                }
                Err(e) => {
                    return Err(TransportError::Backend {
                        backend: "zmq",
                        endpoint: self.raw.endpoint.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(self.peers.len())
    }

    pub(crate) fn recv_from_deadline(&mut self, deadline: Option<Instant>) -> Result<(PeerId, Msg), RecvError> {
        if let Some(data) = self.pending.pop_front() {
            return Ok(data);
        }
        self.next(deadline)
    }

    pub(crate) fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        match self.recv_from_deadline(Some(Instant::now())) {
            Err(RecvError::Timeout) => Err(RecvError::Empty),
            other => other,
        }
    }

    /// Sends to one peer without ever waiting on it, whatever the deadline: a peer
    /// whose queue is full gets `Full` and the message back at once. One thread serves
    /// every peer of a router, so a wait on a peer that does not read (slow, stopped or
    /// hostile) would stall all the others; the caller decides what to do with the
    /// message (retry later, drop it, give up on the peer).
    pub(crate) fn send_to_deadline(&mut self, peer: &PeerId, msg: Msg, _deadline: Option<Instant>) -> Result<(), SendError> {
        let result = self.raw.send_msg(Some(peer.bytes()), msg, 0);
        if let Err(SendError { kind: SendErrorKind::UnknownPeer(_), .. }) = &result {
            self.peers.remove(peer);
        }
        result
    }

    pub(crate) fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.peers.iter().cloned().collect();
        peers.sort();
        peers
    }

    pub(crate) fn socket(&self) -> &zmq::Socket {
        &self.raw.socket
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
