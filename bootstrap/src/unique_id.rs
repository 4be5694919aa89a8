//! The tracker-less bootstrap of NCCL's kind: a [`UniqueId`] names a root, every rank
//! reports to it, and the endpoints go round a ring.
//!
//! # Who listens
//!
//! Rank 0 is the root. [`UniqueId::new`] binds the root's listener at once and keeps
//! it in this process, so the process that makes the id must be the one that runs
//! rank 0 (NCCL's rule too); rank 0's [`exchange`] takes that listener. An id made by
//! [`UniqueId::at`] (the `MASTER_ADDR`/`MASTER_PORT` convention) has no listener yet:
//! rank 0 binds the id's port itself, on every interface, and the other ranks retry their connection
//! until it does or their timeout ends.
//!
//! # Protocol
//!
//! Little-endian integers; strings are a `u32` length (at most 4096 bytes) and UTF-8.
//!
//! 1. Every rank (rank 0 too) binds a *ring listener* on its mesh address, connects to
//!    the root and sends `"SYUI"`, the job tag (`u64`), its rank, the world size and
//!    its ring listener's `host:port`.
//! 2. The root closes a connection whose magic or tag is wrong (logged) and keeps
//!    accepting. A rank outside the world, a rank already checked in, or another
//!    world size is answered `"SYUI"`, a status (1: duplicate rank, 2: wrong world, 3:
//!    bad rank) and a reason, and accepting goes on.
//! 3. When all ranks have checked in, the root answers each `"SYUI"`, status 0, the
//!    ring listener of its successor (`rank + 1 mod world`) and that of its
//!    predecessor.
//! 4. Each rank connects to its successor and sends `"SYUR"`, the tag and its rank; it
//!    accepts one connection from its predecessor (others are closed and logged). Its
//!    ring listener is accepted from the moment it is bound, before step 1's check-in
//!    announces it, so that strangers filling its backlog hold no connect up.
//! 5. The mesh endpoints go round the ring: at step `k` a rank sends entry `rank − k`
//!    to its successor and receives entry `rank − k − 1` from its predecessor.
//!
//! Every read and connect is bounded by the caller's timeout. The root and the ring
//! listeners read each connection's handshake on a thread of its own, within
//! `CHECK_IN_READ` (5 s), so that connections that say nothing delay no rank.
//!
//! # Where the decisions live
//!
//! The root's and each rank's decisions are state machines without sockets or clocks
//! (`root.rs`: check-ins in, answers out, the time given; `member.rs`: the root's
//! answer and the ring's entries in, what to link and send out). The functions here
//! are their shells: they accept, read, write, connect, probe and keep the time. The
//! deterministic simulation (`sim_tests.rs`, docs/testing.md) drives the same machines
//! with strangers, crashes and stopped processes.
//!
//! # A rank that leaves
//!
//! Every listener a rank announces was bound before it checked in, so a rank that
//! leaves (dies, is interrupted, gives up) is seen at once instead of at the timeout:
//!
//! - a connection to the root that closes before the answer: the root answers every
//!   waiting rank, and those checking in within a few seconds, status 5 and the
//!   departed rank's number, and the bootstrap ends ([`IdError::Left`]);
//! - a successor's ring listener that refuses the connection, a predecessor whose
//!   ring listener refuses a probe while it is awaited, or a ring link closed or reset
//!   before the exchange ends: [`IdError::Left`] naming that neighbour (which may
//!   itself have given up because its own neighbour left).
//!
//! # Job secret
//!
//! With a job secret in the environment (`SWITCHYARD_JOB_SECRET` or
//! `SWITCHYARD_JOB_SECRET_FILE`, see [`switchyard_secret`]), every connection of steps
//! 1 and 4 starts with the secret's challenge-response (purposes `unique-id-root` and
//! `unique-id-ring`, the connector claiming its rank) before any of the bytes above.
//! The root and the ring listener log and close a connection that fails it and go on
//! accepting. The connector's proof (and its ring hello) runs on a side thread while
//! the rank waits for its predecessor, and every ring listener accepts and
//! authenticates from its bind on, so that no proof waits for another rank's connect.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use switchyard_secret::JobSecret;
use thiserror::Error;

mod member;
mod ring;
mod root;
#[cfg(test)]
mod sim_tests;
mod wire;

use switchyard_net::handshakes::{self, Handshakes, accept_all};

use member::{Member, MemberAction, MemberEvent};
use ring::RingAcceptor;
use root::{Conn, Root, RootAction, RootEvent};
use wire::{Wire, put_text};

/// Magic of a check-in and of the root's answer.
const CHECK_IN: [u8; 4] = *b"SYUI";
/// Magic of the ring hello.
const RING: [u8; 4] = *b"SYUR";
/// Purpose of the job secret's proof on a connection to the root.
pub(crate) const ROOT_PURPOSE: &str = "unique-id-root";
/// Purpose of the job secret's proof on a ring connection.
pub(crate) const RING_PURPOSE: &str = "unique-id-ring";
/// Longest string (address, endpoint, reason) accepted.
pub(crate) const MAX_TEXT: u32 = 4096;
/// How long the root waits for one connection's check-in once accepted, so that a
/// silent stranger cannot hold the others up for the whole timeout.
const CHECK_IN_READ: Duration = Duration::from_secs(5);
/// Pause between connection attempts to a root that is not listening yet, and
/// between polls of a non-blocking accept.
const RETRY: Duration = Duration::from_millis(20);

/// How often the root looks whether a rank waiting for its answer left, and how long
/// a rank waits for its predecessor before it starts probing whether it left.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How many refused check-ins the root keeps for its timeout error.
const MAX_REFUSALS_KEPT: usize = 8;
/// How long the root goes on telling ranks that check in late that one left.
const LINGER: Duration = Duration::from_secs(3);
/// Status of the root's answer telling that a rank left (the text: its number).
const LEFT: u32 = 5;
/// How long a probe of a ring listener may take to connect.
const PROBE_CONNECT: Duration = Duration::from_millis(500);

/// The listeners [`UniqueId::new`] bound, by job tag, until rank 0 takes its own.
static PARKED: Mutex<Option<HashMap<u64, TcpListener>>> = Mutex::new(None);

/// A job's bootstrap identity: the root's address and a random 64-bit job tag.
///
/// Printed as `syid:TAG@HOST:PORT` (tag in 16 hex digits), which [`FromStr`] parses
/// back: pass it to the other ranks by environment variable, file or any channel.
/// The tag keeps strangers (another job reusing the port) out; it is not a secret.
///
/// # Examples
///
/// ```
/// use switchyard_bootstrap::UniqueId;
/// let id: UniqueId = "syid:00000000000000ff@127.0.0.1:29500".parse().unwrap();
/// assert_eq!(id.tag(), 255);
/// assert_eq!(id.root().port(), 29500);
/// assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
/// assert!("syid:zz@127.0.0.1:1".parse::<UniqueId>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    root: SocketAddr,
    tag: u64,
}

impl UniqueId {
    /// A new id whose root is this process, on the interface named by
    /// `SWITCHYARD_IFNAME`, else the source address of the default route, else the
    /// first IPv4 interface that is not loopback, else loopback (a job on this host
    /// only). The listener is bound now, on a free port; rank 0 of the job must run in
    /// this process.
    pub fn new() -> Result<UniqueId, IdError> {
        let ip = match super::ifname_address() {
            Err(e) => return Err(IdError::Address(e.to_string())),
            Ok(Some(ip)) => ip,
            // The default route's source address: any routable target will do, the UDP
            // "connect" sends nothing (192.0.2.1 is the documentation network).
            // Without a default route, the first interface that is not loopback (as
            // NCCL does), else loopback.
            Ok(None) => super::iface::route_address("192.0.2.1", 9)
                .ok()
                .or_else(first_non_loopback)
                .unwrap_or(IpAddr::from([127, 0, 0, 1])),
        };
        tracing::debug!(%ip, "unique id root address");
        UniqueId::new_on(ip)
    }

    /// A new id whose root listens on `ip` (any free port), in this process.
    pub fn new_on(ip: IpAddr) -> Result<UniqueId, IdError> {
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| IdError::Address(format!("bind {ip}: {e}")))?;
        let root = listener
            .local_addr()
            .map_err(|e| IdError::Address(e.to_string()))?;
        let id = UniqueId {
            root,
            tag: switchyard_net::tag::random_tag(),
        };
        parked()
            .get_or_insert_with(HashMap::new)
            .insert(id.tag, listener);
        tracing::debug!(%id, "unique id made; its listener waits for rank 0");
        Ok(id)
    }

    /// An id for a root that rank 0 will bind at `root` (as `MASTER_ADDR:MASTER_PORT`),
    /// with a tag every rank derives the same way.
    pub fn at(root: SocketAddr, tag: u64) -> UniqueId {
        UniqueId { root, tag }
    }

    /// The root's bootstrap address.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// The job tag.
    pub fn tag(&self) -> u64 {
        self.tag
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "syid:{:016x}@{}", self.tag, self.root)
    }
}

impl FromStr for UniqueId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<UniqueId, IdError> {
        let bad = |why: &str| IdError::Parse {
            text: s.to_string(),
            reason: why.to_string(),
        };
        let rest = s
            .trim()
            .strip_prefix("syid:")
            .ok_or_else(|| bad("does not start with syid:"))?;
        let (tag, root) = rest
            .split_once('@')
            .ok_or_else(|| bad("no @ between tag and address"))?;
        if tag.len() != 16 {
            return Err(bad("the tag is not 16 hex digits"));
        }
        let tag = u64::from_str_radix(tag, 16).map_err(|_| bad("the tag is not hex"))?;
        let root = root
            .parse::<SocketAddr>()
            .map_err(|_| bad("the root is not an IP:port address"))?;
        Ok(UniqueId { root, tag })
    }
}

/// What can go wrong in a unique-id bootstrap.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IdError {
    /// The text is not a unique id.
    #[error("not a unique id {text:?}: {reason}")]
    Parse {
        /// The text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No local address could be chosen or bound.
    #[error("no bootstrap address: {0}")]
    Address(String),
    /// The root (or a ring neighbour) could not be reached before the timeout.
    #[error("cannot reach {addr} within {waited:?}: {reason}")]
    Unreachable {
        /// The address tried.
        addr: SocketAddr,
        /// How long connecting was tried.
        waited: Duration,
        /// The last failure.
        reason: String,
    },
    /// Another process already checked in as this rank.
    #[error("root {root} refused rank {rank}: {reason}")]
    DuplicateRank {
        /// The root.
        root: SocketAddr,
        /// The rank.
        rank: u32,
        /// The root's explanation.
        reason: String,
    },
    /// This rank's world size differs from the root's, or its rank is outside it.
    #[error("root {root} refused world size {world}: {reason}")]
    WrongWorld {
        /// The root.
        root: SocketAddr,
        /// The world size this rank was given.
        world: u32,
        /// The root's explanation.
        reason: String,
    },
    /// A rank number outside `0..world`, refused before any traffic.
    #[error("rank {rank} is outside a world of {world}")]
    BadRank {
        /// The rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// A peer broke the protocol, closed the connection or went silent.
    #[error("bootstrap peer {peer}: {reason}")]
    Protocol {
        /// Who (the root, or the ring neighbour).
        peer: String,
        /// What happened.
        reason: String,
    },
    /// The job secret in the environment is unusable, or this rank's proof of it failed.
    #[error("job secret: {0}")]
    Secret(String),
    /// A rank that had been reached left during the bootstrap: its connection to the
    /// root closed after it checked in, or its ring listener refused the connection
    /// (it died, was interrupted, or failed).
    #[error("rank {rank} left during the bootstrap: {reason}")]
    Left {
        /// The rank that left.
        rank: u32,
        /// How that was seen.
        reason: String,
    },
    /// Not every rank checked in at the root before the timeout.
    #[error(
        "root waited {waited:?}; ranks {missing:?} never checked in{}",
        refusals(refused)
    )]
    Missing {
        /// How long the root waited.
        waited: Duration,
        /// The ranks that did not come.
        missing: Vec<u32>,
        /// The check-ins the root refused meanwhile (another world size, a rank
        /// outside the world, a duplicate), each as the root told it: the likely
        /// reason why ranks are missing.
        refused: Vec<String>,
    },
}

/// The refused check-ins of [`IdError::Missing`], for its message.
fn refusals(refused: &[String]) -> String {
    if refused.is_empty() {
        String::new()
    } else {
        format!(" (refused meanwhile: {})", refused.join("; "))
    }
}

fn parked() -> std::sync::MutexGuard<'static, Option<HashMap<u64, TcpListener>>> {
    // A poisoned lock only means another thread panicked while holding the map.
    PARKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the listener [`UniqueId::new`] parked for `tag`, if this process has it.
fn take_parked(tag: u64) -> Option<TcpListener> {
    parked().get_or_insert_with(HashMap::new).remove(&tag)
}

/// The first IPv4 address of an interface other than loopback, if any.
fn first_non_loopback() -> Option<IpAddr> {
    switchyard_net::route::interface_addresses()
        .ok()?
        .into_iter()
        .map(|(_, ip)| ip)
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
}

/// Connects to `addr`, retrying while nothing listens there yet, until `until`. With
/// `listened` (the rank that bound `addr` before it was handed out), a refused
/// connection is final: that rank left.
fn connect(
    addr: SocketAddr,
    until: Instant,
    started: Instant,
    listened: Option<u32>,
) -> Result<TcpStream, IdError> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let reason = if left.is_zero() {
            "timed out".to_string()
        } else {
            match TcpStream::connect_timeout(&addr, left) {
                Ok(s) => return Ok(s),
                Err(e) => match listened {
                    Some(rank) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        return Err(gone(rank, addr));
                    }
                    _ => e.to_string(),
                },
            }
        };
        if Instant::now() + RETRY >= until {
            return Err(IdError::Unreachable {
                addr,
                waited: started.elapsed(),
                reason,
            });
        }
        std::thread::sleep(RETRY);
    }
}

/// The error for rank `rank`, whose ring listener at `addr` refused a connection.
fn gone(rank: u32, addr: SocketAddr) -> IdError {
    IdError::Left {
        rank,
        reason: format!(
            "its ring listener {addr} refused the connection (it was bound before the \
             rank checked in, so the process died, was interrupted, or gave up as a rank \
             does whose own ring neighbour left)"
        ),
    }
}

/// Whether the peer closed `stream` (or reset it); a stream it only keeps open (or
/// sent stray bytes on) is not closed.
fn closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let seen = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    seen
}

/// A check-in as the root read it: tag, rank, world size, ring address.
type CheckIn = (TcpStream, u64, u32, u32, String);

/// Reads one connection's check-in (after the job secret's proof, with a secret),
/// within [`CHECK_IN_READ`] and `until`.
fn read_check_in(
    mut stream: TcpStream,
    peer: SocketAddr,
    secret: Option<&JobSecret>,
    until: Instant,
) -> Result<CheckIn, String> {
    let by = until.min(Instant::now() + CHECK_IN_READ);
    if let Some(secret) = secret {
        switchyard_secret::accept(&mut stream, secret, ROOT_PURPOSE, by)
            .map_err(|e| format!("job secret not proven: {e}"))?;
    }
    let wire = Wire {
        stream: &stream,
        peer: peer.to_string(),
        until: by,
    };
    let read = (|| {
        wire.magic(CHECK_IN)?;
        Ok::<_, IdError>((
            wire.u64("job tag")?,
            wire.u32("rank")?,
            wire.u32("world size")?,
            wire.text("ring address")?,
        ))
    })();
    let (tag, rank, world, ring) = read.map_err(|e| e.to_string())?;
    Ok((stream, tag, rank, world, ring))
}

/// Writes the root's answer `status` and `texts` to `stream` (errors logged).
fn answer(stream: &TcpStream, rank: u32, status: u32, texts: &[&str], until: Instant) {
    let mut out = CHECK_IN.to_vec();
    out.extend_from_slice(&status.to_le_bytes());
    for text in texts {
        put_text(&mut out, text);
    }
    let wire = Wire {
        stream,
        peer: format!("rank {rank}"),
        until: until.max(Instant::now() + CHECK_IN_READ),
    };
    if let Err(e) = wire.write(&out, "answer") {
        tracing::warn!(rank, error = %e, "bootstrap root: answer lost");
    }
}

/// The root: accepts check-ins (their handshakes concurrently, so that no silent
/// connection holds a rank up) and hands each to the [`Root`] machine, which decides
/// whom to refuse, when every rank is in (each is then answered with its successor's
/// and predecessor's ring addresses), and when to give up.
///
/// A rank whose connection closes while it waits for the answer has left: the
/// machine tells every rank waiting (status [`LEFT`]) and every rank that checks in
/// within [`LINGER`], and the root returns [`IdError::Left`]. A rank arriving later
/// finds no root, as after any failure of rank 0.
fn serve_root(
    listener: TcpListener,
    tag: u64,
    world: u32,
    until: Instant,
    secret: Option<JobSecret>,
) -> Result<(), IdError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| IdError::Address(e.to_string()))?;
    let mut root = Root::new(tag, world, Instant::now(), until);
    // The connections the machine may still answer: those waiting for it.
    let mut streams: HashMap<Conn, TcpStream> = HashMap::new();
    let mut next_conn: Conn = 0;
    let mut handshakes = Handshakes::new(handshakes::DEFAULT_LIMIT);
    let mut watched = Instant::now();
    loop {
        accept_all(&listener, &mut handshakes, {
            let secret = secret.clone();
            move |s, peer| read_check_in(s, peer, secret.as_ref(), until)
        });
        if let Some(end) = root.poll(Instant::now()) {
            return end;
        }
        // A rank that closed its connection before the answer died or was stopped.
        if watched.elapsed() >= WATCH_EVERY {
            watched = Instant::now();
            let gone = root
                .waiting()
                .find(|conn| streams.get(conn).is_none_or(closed));
            if let Some(conn) = gone {
                let actions = root.handle(RootEvent::Closed(conn), Instant::now());
                act(&mut streams, actions, until);
            }
        }
        let Some(done) = handshakes.next(RETRY) else {
            continue;
        };
        let peer = done.peer;
        let (stream, tag, rank, world, ring) = match done.result {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bootstrap root: check-in dropped");
                continue;
            }
        };
        let conn = next_conn;
        next_conn += 1;
        streams.insert(conn, stream);
        let event = RootEvent::CheckIn {
            conn,
            peer: peer.to_string(),
            tag,
            rank,
            world,
            ring,
        };
        let actions = root.handle(event, Instant::now());
        act(&mut streams, actions, until);
    }
}

/// Carries out the root's `actions`: each connection is answered (or not) and
/// dropped.
fn act(streams: &mut HashMap<Conn, TcpStream>, actions: Vec<RootAction>, until: Instant) {
    for RootAction {
        conn,
        answer: reply,
    } in actions
    {
        let (Some(stream), Some(reply)) = (streams.remove(&conn), reply) else {
            continue;
        };
        let texts: Vec<&str> = reply.texts.iter().map(String::as_str).collect();
        answer(&stream, reply.rank, reply.status, &texts, until);
    }
}

/// Joins the job of `id` as `rank` of `world`: reports to the root (rank 0 serves
/// it), learns the ring, and returns every rank's `endpoint` in rank order. `ip` is
/// where this rank's ring listener binds (its mesh address). Everything is bounded by
/// `timeout`.
pub fn exchange(
    id: &UniqueId,
    rank: u32,
    world: u32,
    ip: IpAddr,
    endpoint: &str,
    timeout: Duration,
) -> Result<Vec<String>, IdError> {
    let secret = JobSecret::from_env().map_err(|e| IdError::Secret(e.to_string()))?;
    exchange_with(id, (rank, world), (ip, endpoint), timeout, secret, &|_| {})
}

/// [`exchange`] with the job secret given, calling `announced` with this rank's ring
/// listener address once it is bound and before it is announced (tests fill it there).
fn exchange_with(
    id: &UniqueId,
    (rank, world): (u32, u32),
    (ip, endpoint): (IpAddr, &str),
    timeout: Duration,
    secret: Option<JobSecret>,
    announced: &dyn Fn(SocketAddr),
) -> Result<Vec<String>, IdError> {
    // Refused here, before rank 0 starts its root.
    let member = Member::new(id.tag, (rank, world), id.root, endpoint)?;
    let started = Instant::now();
    let until = started + timeout;
    let root = if rank == 0 {
        let listener = match take_parked(id.tag) {
            Some(l) => l,
            // Every interface, at the id's port: the root's name (MASTER_ADDR) may
            // stand for an address this host only receives on (a service address).
            None => {
                let any: IpAddr = match id.root {
                    SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                    SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
                };
                TcpListener::bind((any, id.root.port())).map_err(|e| {
                    IdError::Address(format!("rank 0 binds the root port {}: {e}", id.root))
                })?
            }
        };
        let tag = id.tag;
        let secret = secret.clone();
        Some(std::thread::spawn(move || {
            serve_root(listener, tag, world, until, secret)
        }))
    } else {
        None
    };
    let result = ring_exchange(id, member, ip, secret.as_ref(), (until, started), announced);
    if let Some(root) = root {
        let served = root
            .join()
            .unwrap_or_else(|_| Err(IdError::Address("the root thread panicked".into())));
        // Rank 0 that cannot reach its own root: the root's address names another
        // host (or none), which is the error to report, not that no rank came.
        if let Err(IdError::Unreachable {
            addr,
            waited,
            reason,
        }) = result
        {
            if addr == id.root {
                return Err(IdError::Unreachable {
                    addr,
                    waited,
                    reason: format!(
                        "{reason}; rank 0 serves the root on port {} of every interface of \
                         this host, so {} is not an address of it: the root address \
                         (MASTER_ADDR) must name rank 0's host",
                        addr.port(),
                        addr.ip()
                    ),
                });
            }
            return Err(IdError::Unreachable {
                addr,
                waited,
                reason,
            });
        }
        // The root's own error (who never came) says more than this rank's.
        served?;
    }
    result
}

/// This rank's part: check in, link the ring, pass the endpoints round, each step as
/// `member` decides.
fn ring_exchange(
    id: &UniqueId,
    mut member: Member,
    ip: IpAddr,
    secret: Option<&JobSecret>,
    (until, started): (Instant, Instant),
    announced: &dyn Fn(SocketAddr),
) -> Result<Vec<String>, IdError> {
    let (rank, world) = (member.rank(), member.world());
    let (next_rank, prev_rank) = (member.successor(), member.predecessor());
    let ring =
        TcpListener::bind((ip, 0)).map_err(|e| IdError::Address(format!("bind {ip}: {e}")))?;
    let ring_addr = ring
        .local_addr()
        .map_err(|e| IdError::Address(e.to_string()))?;
    // Accepting starts before the address is announced: see `ring`. Dropped on an
    // early return, it stops.
    let acceptor = RingAcceptor::start(ring, member.predecessor_hello(), secret.cloned(), until)?;
    announced(ring_addr);
    let mut to_root = connect(id.root, until, started, None)?;
    if let Some(secret) = secret {
        switchyard_secret::connect(&mut to_root, secret, ROOT_PURPOSE, rank, until)
            .map_err(|e| IdError::Secret(format!("root {}: {e}", id.root)))?;
    }
    let wire = Wire {
        stream: &to_root,
        peer: format!("root {} (rank 0)", id.root),
        until,
    };
    let mut out = CHECK_IN.to_vec();
    out.extend_from_slice(&id.tag.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&world.to_le_bytes());
    put_text(&mut out, &ring_addr.to_string());
    wire.write(&out, "check-in")?;
    wire.magic(CHECK_IN).map_err(|e| match e {
        IdError::Protocol { peer, reason } => IdError::Protocol {
            peer,
            reason: format!(
                "{reason} before answering: rank 0 left, or its job tag is not this \
                 rank's (another job on that port, or another MASTER_ADDR, MASTER_PORT \
                 or job id)"
            ),
        },
        e => e,
    })?;
    let status = wire.u32("answer status")?;
    let texts = Member::answer_texts(status)
        .iter()
        .map(|what| wire.text(what))
        .collect::<Result<Vec<String>, IdError>>()?;
    let (successor, predecessor) = match member.handle(MemberEvent::Answer { status, texts }) {
        MemberAction::Link {
            successor,
            predecessor,
        } => (successor, predecessor),
        MemberAction::Done(Err(e)) => return Err(e),
        other => return Err(out_of_turn(&other)),
    };
    drop(to_root);
    acceptor.predecessor_at(predecessor);
    // Its ring listener was bound before it checked in: refused means it is gone.
    let next = connect(successor, until, started, Some(next_rank))?;
    let mut hello = RING.to_vec();
    hello.extend_from_slice(&id.tag.to_le_bytes());
    hello.extend_from_slice(&rank.to_le_bytes());
    let next_name = format!("ring successor {successor} (rank {next_rank})");
    let next_wire = Wire {
        stream: &next,
        peer: next_name.clone(),
        until,
    };
    // Prove and say hello on a side thread while this rank waits for its predecessor,
    // so that a successor slow to prove delays neither wait.
    let greeter = {
        let mut own = next
            .try_clone()
            .map_err(|e| next_wire.fail(format!("cannot share the stream: {e}")))?;
        let secret = secret.cloned();
        std::thread::spawn(move || {
            if let Some(secret) = &secret {
                switchyard_secret::connect(&mut own, secret, RING_PURPOSE, rank, until)
                    .map_err(|e| IdError::Secret(format!("{next_name}: {e}")))?;
            }
            Wire {
                stream: &own,
                peer: next_name,
                until,
            }
            .write(&hello, "ring hello")
        })
    };
    let prev = acceptor.join();
    // Without a predecessor this rank fails: the successor's side thread may then wait
    // in vain, so it is not waited for.
    // The listener stays bound until this rank is done (see `ring::Accepted`).
    let (prev, _ring) = prev?;
    greeter
        .join()
        .unwrap_or_else(|_| Err(IdError::Address("the ring greeter thread panicked".into())))
        .map_err(|e| ring_closed(e, next_rank))?;
    let prev_wire = Wire {
        stream: &prev,
        peer: format!("ring predecessor {predecessor} (rank {prev_rank})"),
        until,
    };
    let mut action = member.handle(MemberEvent::Linked);
    loop {
        action = match action {
            MemberAction::Send(entry) => {
                let mut frame = Vec::new();
                put_text(&mut frame, &entry);
                next_wire
                    .write(&frame, "endpoint")
                    .map_err(|e| ring_closed(e, next_rank))?;
                let got = prev_wire
                    .text("endpoint")
                    .map_err(|e| ring_closed(e, prev_rank))?;
                member.handle(MemberEvent::Entry(got))
            }
            MemberAction::Done(result) => return result,
            other => return Err(out_of_turn(&other)),
        };
    }
}

/// An action the rank's machine cannot ask for at this point of the exchange; the
/// machine never does, and an error is better than a panic should it change.
fn out_of_turn(action: &MemberAction) -> IdError {
    IdError::Address(format!("bootstrap step out of turn: {action:?}"))
}

/// A ring link that `neighbour` closed or reset: it left (it died, was interrupted,
/// or gave up because its own neighbour left). Other errors are kept.
fn ring_closed(e: IdError, neighbour: u32) -> IdError {
    match e {
        IdError::Protocol { peer, reason }
            if reason.contains("closed the connection")
                || reason.contains("reset")
                || reason.contains("roken pipe") =>
        {
            IdError::Left {
                rank: neighbour,
                reason: format!(
                    "{peer} {reason} (it died, was interrupted, or gave up because its own \
                     ring neighbour left)"
                ),
            }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Every ring listener's backlog filled with silent strangers as soon as it is
    /// bound, before its rank checks in: the job still forms, with and without the job
    /// secret. Before, a rank accepted only after its own connect to its successor had
    /// ended, and with every backlog full the kernel dropped every connect's SYN: each
    /// rank waited on the next until the timeout.
    #[test]
    fn ring_listeners_with_full_backlogs_still_form_the_job() {
        let key = JobSecret::new(b"0123456789abcdef0123456789abcdef".to_vec(), "test").unwrap();
        for secret in [None, Some(key)] {
            let world = 3u32;
            let id = UniqueId::new_on(IpAddr::from([127, 0, 0, 1])).unwrap();
            let strangers = std::sync::Arc::new(Mutex::new(Vec::new()));
            let started = Instant::now();
            let ranks: Vec<_> = (0..world)
                .map(|rank| {
                    let strangers = strangers.clone();
                    let secret = secret.clone();
                    std::thread::spawn(move || {
                        // std's backlog is 128: 129 connections fill it, and the next
                        // connect is not answered. Stop there, or at 200 when the
                        // listener keeps accepting.
                        let fill = |addr: SocketAddr| {
                            for _ in 0..200 {
                                match TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                                {
                                    Ok(s) => strangers.lock().unwrap().push(s),
                                    Err(_) => break,
                                }
                            }
                        };
                        exchange_with(
                            &id,
                            (rank, world),
                            (IpAddr::from([127, 0, 0, 1]), &format!("tcp://r{rank}")),
                            Duration::from_secs(8),
                            secret,
                            &fill,
                        )
                    })
                })
                .collect();
            let want: Vec<String> = (0..world).map(|r| format!("tcp://r{r}")).collect();
            let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
            for got in &results {
                assert_eq!(
                    got.as_ref().ok(),
                    Some(&want),
                    "{results:?} (secret: {})",
                    secret.is_some()
                );
            }
            // 129 strangers at least were in each listener's backlog or accepted.
            assert!(strangers.lock().unwrap().len() >= 3 * 129);
            assert!(started.elapsed() < Duration::from_secs(8));
        }
    }

    #[test]
    fn ids_parse_and_print() {
        let id = UniqueId::at("[::1]:80".parse().unwrap(), u64::MAX);
        assert_eq!(id.to_string(), "syid:ffffffffffffffff@[::1]:80");
        assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        for bad in [
            "",
            "syid:",
            "syid:0000000000000001",
            "syid:1@127.0.0.1:1",
            "syid:000000000000000g@127.0.0.1:1",
            "syid:0000000000000001@host:1",
        ] {
            assert!(bad.parse::<UniqueId>().is_err(), "{bad}");
        }
    }
}
