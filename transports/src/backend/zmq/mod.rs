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
//! no encryption), or PLAIN checked by a ZAP handler when the process has a job secret
//! (`auth.rs`).
//!
//! Deadlines become `SNDTIMEO`/`RCVTIMEO`, set only when they change. A dealer's
//! `connect` sends a HELLO and waits for the router's READY, because libzmq connects
//! asynchronously and would otherwise never report a router that is not there.
//!
//! A tcp dealer whose router restarts reconnects by itself (libzmq's `RECONNECT_IVL`,
//! 100 ms); messages in flight on the dead connection are lost. An inproc dealer does
//! not: libzmq's inproc transport never reconnects, so connect a new dealer (with the
//! same identity, if the router should see the same peer).

mod auth;
mod dealer;
mod frame;
pub(crate) mod heap;
mod router;

pub(crate) use dealer::ZmqDealer;
pub(crate) use router::ZmqRouter;

use super::{BackendSocket, Deadline, Side};
use crate::poller::Watch;
use crate::{Endpoint, PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use bytes::Bytes;
use frame::{into_bytes, send_frame};
use std::sync::OnceLock;
use std::time::Instant;
use switchyard_msg::{Addr, DecodeError, Kind, Msg};

/// The process-wide libzmq context; `inproc://` only reaches sockets of one context.
fn context() -> &'static zmq::Context {
    static CONTEXT: OnceLock<zmq::Context> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        heap::tune_once();
        zmq::Context::new()
    })
}

fn backend_error(endpoint: &str, err: zmq::Error) -> TransportError {
    TransportError::Backend {
        backend: "zmq",
        endpoint: endpoint.to_string(),
        reason: err.to_string(),
    }
}

/// Milliseconds until `deadline` in libzmq's convention (-1 = forever, 0 = do not wait).
fn timeout_ms(deadline: Deadline) -> i32 {
    match deadline {
        Deadline::Forever => -1,
        Deadline::Now => 0,
        Deadline::At(deadline) => {
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
    fn new(
        kind: zmq::SocketType,
        endpoint: &str,
        options: SocketOptions,
    ) -> Result<Raw, TransportError> {
        let err = |e| backend_error(endpoint, e);
        let socket = context().socket(kind).map_err(err)?;
        let hwm = i32::try_from(options.hwm).unwrap_or(i32::MAX);
        socket.set_sndhwm(hwm).map_err(err)?;
        socket.set_rcvhwm(hwm).map_err(err)?;
        let linger = i32::try_from(options.linger.as_millis()).unwrap_or(i32::MAX);
        socket.set_linger(linger).map_err(err)?;
        let max = i64::try_from(
            options
                .limits
                .max_frame_bytes
                .max(options.limits.max_header_bytes),
        )
        .unwrap_or(i64::MAX);
        socket.set_maxmsgsize(max).map_err(err)?;
        // With a ZAP domain set, libzmq refuses ZMTP 1.0/2.0 greetings (raw bytes would
        // otherwise become messages from made-up identities). Without the job secret
        // no ZAP handler is bound in this context, so the NULL mechanism accepts every
        // ZMTP 3 peer; with it, every tcp socket speaks PLAIN and auth.rs binds the
        // handler that checks the password.
        socket.set_zap_domain(ZAP_DOMAIN).map_err(err)?;
        let password = auth::password().map_err(|reason| TransportError::Backend {
            backend: "zmq",
            endpoint: endpoint.to_string(),
            reason: format!("job secret: {reason}"),
        })?;
        if let Some(password) = password {
            if kind == zmq::ROUTER {
                socket.set_plain_server(true).map_err(err)?;
            } else {
                socket.set_plain_username(Some(auth::USER)).map_err(err)?;
                socket.set_plain_password(Some(password)).map_err(err)?;
            }
        }
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
    fn send_msg(
        &mut self,
        prefix: Option<&Bytes>,
        msg: Msg,
        timeout: i32,
    ) -> Result<(), SendError> {
        let fail = |msg, kind, endpoint: &str| SendError {
            msg,
            kind,
            endpoint: endpoint.to_string(),
        };
        if let Err(e) = self.set_sndtimeo(timeout) {
            return Err(fail(
                msg,
                SendErrorKind::Backend(e.to_string()),
                &self.endpoint,
            ));
        }
        msg.encode_header_into(&mut self.header);
        let header = &self.header[..];
        let frames = msg.frames();
        let first_flags = zmq::SNDMORE | if timeout == 0 { zmq::DONTWAIT } else { 0 };
        let first = match prefix {
            Some(identity) => send_frame(&mut self.socket, identity, first_flags),
            None => self.socket.send(
                header,
                if frames.is_empty() {
                    first_flags & !zmq::SNDMORE
                } else {
                    first_flags
                },
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
                return Err(fail(
                    msg,
                    SendErrorKind::Backend(e.to_string()),
                    &self.endpoint,
                ));
            }
        }
        for (i, frame) in frames.iter().enumerate() {
            let flags = if i + 1 < last { zmq::SNDMORE } else { 0 };
            if let Err(e) = send_frame(&mut self.socket, frame, flags) {
                // Not expected after the first part was accepted; the receiver would
                // see a truncated message and drop it as malformed.
                return Err(fail(
                    msg,
                    SendErrorKind::Backend(e.to_string()),
                    &self.endpoint,
                ));
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
    fn recv_parts(&mut self, deadline: Deadline) -> Result<Parts, RecvError> {
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
            Err(zmq::Error::EAGAIN)
                if ms == 0 && matches!(deadline, Deadline::At(d) if d <= Instant::now()) =>
            {
                return Err(RecvError::Timeout);
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
            return Ok(Parts::TooMany {
                first: parts.swap_remove(0),
                limit: max_parts,
            });
        }
        Ok(Parts::Whole(parts))
    }
}

/// The dealer and the router: each a [`Raw`] socket, plus messages it already took
/// off that socket (which a poll of the socket would not see). [`BackendSocket`]
/// follows from these two.
trait OverRaw: std::fmt::Debug {
    fn raw(&self) -> &Raw;
    fn holds_messages(&self) -> bool;
}

impl<T: OverRaw> BackendSocket for T {
    fn options(&self) -> &SocketOptions {
        &self.raw().options
    }

    fn endpoint(&self) -> &str {
        &self.raw().endpoint
    }

    fn watch(&self) -> Watch<'_> {
        if self.holds_messages() {
            Watch::Ready
        } else {
            Watch::Zmq(&self.raw().socket)
        }
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
fn decode_parts(
    mut parts: std::vec::IntoIter<zmq::Message>,
    limits: &switchyard_msg::Limits,
) -> Result<Msg, DecodeError> {
    let Some(header) = parts.next() else {
        return Err(DecodeError::NoFrames);
    };
    let frames: Vec<Bytes> = parts.map(into_bytes).collect();
    Msg::from_header_frame(&header, frames, limits)
}

fn hello() -> Msg {
    Msg::new(Addr::stub(0), Addr::stub(0), Kind::Hello)
}

/// A try that found nothing is `Empty`, not `Timeout`, as on every backend.
fn tried<T>(deadline: Deadline, received: Result<T, RecvError>) -> Result<T, RecvError> {
    match received {
        Err(RecvError::Timeout) if deadline == Deadline::Now => Err(RecvError::Empty),
        other => other,
    }
}

/// The libzmq address for an `inproc://` or `tcp://` endpoint.
pub(crate) fn address(
    endpoint: &Endpoint,
    text: &str,
    side: Side,
) -> Result<String, TransportError> {
    match endpoint {
        Endpoint::Inproc(name) => Ok(format!("inproc://{name}")),
        Endpoint::Tcp { host, port } => {
            let host = if host == "localhost" {
                "127.0.0.1"
            } else {
                host
            };
            match (*port, side) {
                (0, Side::Bind) => Ok(format!("tcp://{host}:*")),
                (0, Side::Connect) => Err(TransportError::InvalidEndpoint {
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
