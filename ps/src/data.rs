//! The data plane: values (push, pull, push_pull, init and their answers) on the
//! collectives' links, while every control message stays on ZeroMQ.
//!
//! **The world.** The job's servers and workers form one link world of
//! `servers + workers` ranks: server `s` is rank `s`, worker `w` is rank
//! `servers + w` (the ranks the scheduler assigned at registration). It is
//! [`Topology::Bipartite`]: each worker is connected to each server, by TCP between
//! hosts and by shared memory between processes of one host, and no two workers nor
//! two servers are. The links' own set-up runs it: addresses swapped over a ZeroMQ
//! control link, the job secret's challenge-response on every connection (with
//! `SWITCHYARD_JOB_SECRET`), a hello naming the connecting rank, and a stranger on the
//! data port refused without holding anyone up.
//!
//! **Opening.** After the scheduler's rank assignment every node binds its control
//! link and sends the scheduler its endpoint; the scheduler sends every node the list
//! by rank; the nodes open the connections and tell the scheduler whether they did;
//! the scheduler's verdict goes to every node: the data plane if every node opened it,
//! ZeroMQ for every node otherwise (each node that falls back says so in its log,
//! once). A node with `SWITCHYARD_PS_DATA=zmq` offers no data plane at registration,
//! and the job's values travel over ZeroMQ.
//!
//! **Messages.** A value message is the same [`Msg`] as over ZeroMQ (kind, request id,
//! the metadata frame, the values), its header cut to the [`HEAD_LEN`] bytes the
//! receiver cannot know: the sender's role and rank are its link rank's, so a worker
//! cannot speak for another. A server answers each request on the plane it came on.
//!
//! **Order.** The two planes are not ordered with each other. Every control message
//! that concerns a value message is either sent after the answer it depends on (a
//! push follows the answers to its check), or is a withdrawal's, which a server may
//! see before the push it names: the store keeps the push out of every round when the
//! push comes after its withdrawal (see `store.rs`).
//!
//! **Failures.** A connection that closes is not an error by itself: a server or
//! worker that dies is declared by the scheduler, as over ZeroMQ, and a failover sends
//! the dead server's unanswered requests to its replica on this plane too.

use super::wire::{self, NodeRole};
use super::{PsConfig, PsError};
use bytes::Bytes;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use switchyard_link::{BoundLink, LinkError, StreamLink, Tag};
use switchyard_msg::{Addr, Kind, Msg};
use switchyard_transports::PeerId;

/// Every value message travels under this one tag, so that a pair's messages keep
/// their order.
const TAG: Tag = Tag { call: 1, step: 0 };
/// Bytes of the head frame: kind (`u16`), request id (`u64`), the source's and
/// destination's ids (`u32` each), little-endian.
pub(crate) const HEAD_LEN: usize = 18;
/// Most frames the link carries in one message; the values past it are joined.
const MAX_FRAMES: usize = switchyard_link::framing::MAX_FRAMES;

/// Where an answer goes: back on the plane its request came on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// A ZeroMQ peer of the server's Router.
    Zmq(PeerId),
    /// A rank of the data plane.
    Link(usize),
}

impl std::fmt::Display for Back {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Back::Zmq(peer) => write!(f, "{peer}"),
            Back::Link(rank) => write!(f, "data-plane rank {rank}"),
        }
    }
}

/// Whether messages of `kind` travel on the data plane (when there is one): values
/// and the answers to them. Checks, releases and withdrawals stay on ZeroMQ.
pub(crate) fn carries(kind: Kind) -> bool {
    [wire::PUSH, wire::PULL, wire::PUSH_PULL, wire::INIT].contains(&kind)
}

/// A node's end of the data plane.
pub(crate) struct DataLink {
    link: StreamLink,
    servers: u32,
}

impl std::fmt::Debug for DataLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLink")
            .field("rank", &switchyard_link::Link::rank(&self.link))
            .field("servers", &self.servers)
            .finish()
    }
}

impl DataLink {
    /// The data-plane rank of server `s`.
    pub(crate) fn server_rank(s: usize) -> usize {
        s
    }

    /// The data-plane rank of worker `w` in a job of `servers` servers.
    pub(crate) fn worker_rank(servers: u32, w: u32) -> usize {
        (servers + w) as usize
    }

    /// Sends `msg` to data-plane rank `to`, without waiting (the rest is written in
    /// this end's later waits). A connection that has closed takes nothing and is no
    /// error here: the scheduler declares the dead node.
    pub(crate) fn send(&mut self, to: usize, msg: Msg) -> Result<(), PsError> {
        match self.link.send_nowait(to, TAG, encode(msg)) {
            Ok(()) => Ok(()),
            Err(LinkError::Lost { rank, reason, .. }) => {
                tracing::debug!("ps data plane: rank {rank} gone ({reason}); not sent");
                Ok(())
            }
            Err(e) => Err(PsError::Send {
                to: format!("data-plane rank {to}"),
                reason: e.to_string(),
            }),
        }
    }

    /// Gives the frame of a value message this node is done with back to the link,
    /// which receives the next frames into it instead of a fresh zero-filled buffer
    /// (a page fault and a zero-fill per page of a large value).
    pub(crate) fn recycle(&mut self, frame: Bytes) {
        switchyard_link::Link::recycle(&mut self.link, frame);
    }

    /// Writes queued output and reads what has come, without waiting (see
    /// [`StreamLink::advance`]).
    pub(crate) fn advance(&mut self) {
        self.link.advance();
    }

    /// The next value message from any node, waiting until `deadline` (`None` then).
    /// A message that does not decode is dropped with a warning.
    pub(crate) fn recv(&mut self, deadline: Instant) -> Result<Option<(usize, Msg)>, PsError> {
        loop {
            let got = self
                .link
                .recv_any(TAG, deadline)
                .map_err(|e| PsError::Send {
                    to: "the data plane".into(),
                    reason: e.to_string(),
                })?;
            let Some((from, frames)) = got else {
                return Ok(None);
            };
            match decode(from, self.servers, frames) {
                Ok(msg) => return Ok(Some((from, msg))),
                Err(reason) => {
                    tracing::warn!("ps data plane: message from rank {from} dropped: {reason}")
                }
            }
        }
    }
}

/// The link frames of `msg`: the head, then its frames (the values joined past the
/// link's frame limit).
fn encode(msg: Msg) -> Vec<Bytes> {
    let (header, mut frames) = msg.into_parts();
    let code = match header.kind {
        Kind::User(code) => code,
        _ => 0,
    };
    let mut head = Vec::with_capacity(HEAD_LEN);
    head.extend_from_slice(&code.to_le_bytes());
    head.extend_from_slice(&header.seq.to_le_bytes());
    head.extend_from_slice(&header.src.id.to_le_bytes());
    head.extend_from_slice(&header.dst.id.to_le_bytes());
    if frames.len() + 1 > MAX_FRAMES {
        // Frame 0 is the metadata; the values may be cut anywhere.
        let tail: Vec<u8> = frames[MAX_FRAMES - 2..].concat();
        frames.truncate(MAX_FRAMES - 2);
        frames.push(Bytes::from(tail));
    }
    let mut out = Vec::with_capacity(frames.len() + 1);
    out.push(Bytes::from(head));
    out.extend(frames);
    out
}

/// The message in link frames from data-plane rank `from`: its source is that rank's
/// node (a worker, or for a server the server whose keys it answers about, which the
/// head names: not the sender itself after a failover).
fn decode(from: usize, servers: u32, mut frames: Vec<Bytes>) -> Result<Msg, String> {
    if frames.is_empty() || frames[0].len() != HEAD_LEN {
        return Err("no head frame".into());
    }
    let head = frames.remove(0);
    let u32_at = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&head[at..at + 4]);
        u32::from_le_bytes(b)
    };
    let code = u16::from_le_bytes([head[0], head[1]]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&head[2..10]);
    let (src_id, dst_id) = (u32_at(10), u32_at(14));
    let kind = Kind::User(code);
    let (src, dst) = if (from as u64) < u64::from(servers) {
        (Addr::server(0, src_id), Addr::worker(0, dst_id))
    } else {
        let worker = u32::try_from(from as u64 - u64::from(servers)).unwrap_or(u32::MAX);
        (Addr::worker(0, worker), Addr::server(0, dst_id))
    };
    let mut msg = Msg::new(src, dst, kind).with_seq(u64::from_le_bytes(seq));
    *msg.frames_mut() = frames;
    Ok(msg)
}

/// Binds a node's control link for the data plane: data-plane rank `rank` of `size`,
/// next to the scheduler at `scheduler` (the same backend: `tcp://` on `host` or the
/// address that reaches the scheduler, else an in-process name).
pub(crate) fn bind(
    scheduler: &str,
    config: &PsConfig,
    rank: usize,
    size: usize,
) -> Result<BoundLink, String> {
    #[cfg(test)]
    if tests_hook::fails(scheduler, rank) {
        return Err(format!("rank {rank} cannot bind (a test's failure)"));
    }
    let endpoint = super::node::server_bind_endpoint(scheduler, config.host.as_deref())
        .map_err(|e| e.to_string())?;
    BoundLink::bind(rank, size, &endpoint, config.socket.clone()).map_err(|e| e.to_string())
}

/// Opens the data plane's connections over `bound`, the control endpoints of every
/// rank being `endpoints`, within `timeout`; `servers` is the number of servers (the
/// first side of the world).
pub(crate) fn open(
    bound: BoundLink,
    endpoints: &[String],
    servers: u32,
    config: &PsConfig,
    timeout: Duration,
) -> Result<DataLink, String> {
    let secret = switchyard_secret::JobSecret::from_env().map_err(|e| e.to_string())?;
    let host = listen_host(bound.endpoint());
    let listener =
        TcpListener::bind((host.as_str(), 0)).map_err(|e| format!("listen on {host}: {e}"))?;
    #[cfg(test)]
    tests_hook::listening(&listener);
    let control = bound
        .connect(endpoints, timeout)
        .map_err(|e| e.to_string())?;
    let host_id = switchyard_link::host_identity().filter(|_| config.shared_memory);
    let mut link = StreamLink::open_bipartite(
        control,
        listener,
        secret.as_ref(),
        servers as usize,
        timeout,
        config.socket.limits.max_frame_bytes,
        host_id.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    if let Some(spin) = config.spin {
        link.set_spin(spin);
    }
    Ok(DataLink { link, servers })
}

/// The host a node's data listener binds: the control link's `tcp://` host, or the
/// loopback for an in-process job.
fn listen_host(control: &str) -> String {
    let Some(address) = control.strip_prefix("tcp://") else {
        return "127.0.0.1".into();
    };
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

/// What a node's role and rank are on the data plane.
pub(crate) fn rank_of(role: NodeRole, rank: u32, servers: u32) -> usize {
    match role {
        NodeRole::Server => DataLink::server_rank(rank as usize),
        NodeRole::Worker => DataLink::worker_rank(servers, rank),
    }
}

/// Hooks for the in-crate tests: a function that sees every data listener before
/// its ranks connect (a stranger dials it), and data-plane ranks of a job (by its
/// scheduler's endpoint) that fail to bind.
#[cfg(test)]
pub(crate) mod tests_hook {
    use std::net::TcpListener;
    use std::sync::Mutex;

    type Hook = Box<dyn Fn(std::net::SocketAddr) + Send>;
    static HOOK: Mutex<Option<Hook>> = Mutex::new(None);
    static FAILING: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());

    /// Makes data-plane rank `rank` of the job whose scheduler is at `scheduler` fail
    /// to bind its control link.
    pub(crate) fn fail_bind(scheduler: &str, rank: usize) {
        if let Ok(mut f) = FAILING.lock() {
            f.push((scheduler.to_string(), rank));
        }
    }

    pub(super) fn fails(scheduler: &str, rank: usize) -> bool {
        FAILING
            .lock()
            .is_ok_and(|f| f.iter().any(|(s, r)| s == scheduler && *r == rank))
    }

    /// Sets the hook (`None`: no hook).
    pub(crate) fn set(hook: Option<Hook>) {
        if let Ok(mut h) = HOOK.lock() {
            *h = hook;
        }
    }

    pub(super) fn listening(listener: &TcpListener) {
        let Ok(addr) = listener.local_addr() else {
            return;
        };
        if let Ok(h) = HOOK.lock() {
            if let Some(hook) = h.as_ref() {
                hook(addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_message_crosses_with_its_kind_id_addresses_and_frames() {
        let msg = Msg::new(Addr::server(0, 1), Addr::worker(0, 3), wire::REPLY)
            .with_seq(77)
            .with_frame(Bytes::from_static(b"meta"))
            .with_frame(Bytes::from_static(b"values"));
        let back = decode(1, 2, encode(msg)).unwrap();
        assert_eq!(back.header.kind, wire::REPLY);
        assert_eq!(back.header.seq, 77);
        assert_eq!(back.header.src, Addr::server(0, 1));
        assert_eq!(back.frames(), [&b"meta"[..], &b"values"[..]]);
        // From a worker's rank, the source is that worker whatever the head says.
        let msg = Msg::new(Addr::worker(0, 9), Addr::server(0, 1), wire::PUSH).with_seq(5);
        let back = decode(3, 2, encode(msg)).unwrap();
        assert_eq!(back.header.src, Addr::worker(0, 1));
        assert_eq!(back.header.dst, Addr::server(0, 1));
        assert!(decode(3, 2, vec![Bytes::from_static(b"short")]).is_err());
    }

    #[test]
    fn many_value_frames_are_joined_under_the_links_limit() {
        let mut msg = Msg::new(Addr::worker(0, 0), Addr::server(0, 0), wire::PUSH)
            .with_frame(Bytes::from_static(b"meta"));
        for i in 0..40u8 {
            msg.push_frame(Bytes::from(vec![i; 3]));
        }
        let frames = encode(msg);
        assert_eq!(frames.len(), MAX_FRAMES);
        let back = decode(2, 2, frames).unwrap();
        assert_eq!(back.frames()[0], &b"meta"[..]);
        let values: Vec<u8> = back.frames()[1..].concat();
        let expected: Vec<u8> = (0..40u8).flat_map(|i| [i; 3]).collect();
        assert_eq!(values, expected);
    }

    #[test]
    fn the_listener_binds_the_control_links_host() {
        assert_eq!(listen_host("tcp://10.1.2.3:0"), "10.1.2.3");
        assert_eq!(listen_host("tcp://[::1]:0"), "::1");
        assert_eq!(listen_host("local://ps-data-1"), "127.0.0.1");
    }
}
