//! The launcher's rendezvous protocol, on one TCP connection per process.
//!
//! All integers are little-endian `u32`s.
//!
//! 1. The process sends `"SYRV"`, its rank, the world size it was told, the length of
//!    its endpoint string (at most 1024 bytes) and the UTF-8 endpoint. For
//!    any communicator after its first it sends `"SYRG"` instead, and its
//!    generation (1 for the second, ...) after the world size.
//! 2. When every rank has checked in for a generation, the launcher sends each of them
//!    `"SYRV"`, the world size, and for each rank in order its endpoint's length and
//!    bytes.
//! 3. When a generation can no longer form, because ranks it needs exited for good
//!    without checking in at it (the launcher saw them end; a later communicator that
//!    only some ranks ask for), the launcher sends each rank waiting at it, and each
//!    that checks in at it later, `"SYRX"`, the generation, the number of exited
//!    ranks, each of their ranks, and a text (at most 1024 bytes) saying how they
//!    ended: [`BootstrapError::RanksExited`] on the process side, at once instead of
//!    at its timeout.
//!
//! Generations keep the communicators of one job apart: a process that forms a second
//! communicator after dropping its first is answered with the endpoints of the other
//! ranks' second communicators, not their first ones' (closed by now). A rank that
//! checks in again at a generation already answered (a restarted process) is answered
//! at once with that generation's endpoints, its own replaced.
//!
//! With a job secret (`SWITCHYARD_JOB_SECRET` or `SWITCHYARD_JOB_SECRET_FILE`, see
//! [`switchyard_secret`]) the connection first runs the secret's challenge-response
//! (purpose `rendezvous`, the process claiming its rank), and the launcher holds
//! the check-in to the rank the handshake claimed.
//!
//! Every read is bounded by a deadline, and every length is checked against its limit
//! before anything is allocated. A connection with a wrong magic, a rank outside the
//! job, a rank already taken or a wrong world size is closed and logged; the launcher
//! keeps accepting others. The launcher's end is [`RendezvousServer`](super::RendezvousServer).

use super::BootstrapError;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use switchyard_net::stream::{DeadlineStream, StreamError, put_text};

/// The 4-byte magic that opens each direction.
pub(crate) const MAGIC: [u8; 4] = *b"SYRV";
/// The magic of a check-in for a later generation of communicators, which carries the
/// generation number.
pub(crate) const MAGIC_GENERATION: [u8; 4] = *b"SYRG";
/// The magic of the launcher's refusal of a generation that can no longer form.
pub(crate) const MAGIC_REFUSED: [u8; 4] = *b"SYRX";
/// Longest text of a refusal.
pub(crate) const MAX_REFUSAL: u32 = 1024;
/// The job secret's purpose label for rendezvous connections.
pub(crate) const AUTH_PURPOSE: &str = "rendezvous";
/// Longest endpoint string accepted.
pub(crate) const MAX_ENDPOINT: u32 = 1024;

/// The floor's error as the bootstrap's, naming the peer. A job secret's challenge
/// where the launcher's magic belongs means the launcher wants a secret this process
/// lacks: said in those words, which users and tests look for.
fn lift(e: StreamError) -> BootstrapError {
    let reason = match &e {
        StreamError::BadMagic { got, .. } if switchyard_secret::looks_like_challenge(got) => {
            "the launcher expects a job secret: set the same SWITCHYARD_JOB_SECRET or \
             SWITCHYARD_JOB_SECRET_FILE as the launcher"
                .to_string()
        }
        _ => e.reason(),
    };
    BootstrapError::Protocol {
        peer: e.peer().to_string(),
        reason,
    }
}

fn peer_of(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A process's check-in, as the launcher reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckIn {
    /// The rank the process claims.
    pub(crate) rank: u32,
    /// The world size it was told.
    pub(crate) world: u32,
    /// Which of the process's communicators this is (0 for its first).
    pub(crate) generation: u32,
    /// Its endpoint.
    pub(crate) endpoint: String,
}

/// Reads a check-in (launcher side), within `deadline`.
pub(crate) fn read_check_in(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<CheckIn, BootstrapError> {
    let peer = peer_of(stream);
    let r = DeadlineStream::until(stream, deadline).with_peer(&peer);
    let read = || {
        let magic = r.magic(&[MAGIC, MAGIC_GENERATION])?;
        let rank = r.u32("rank")?;
        let world = r.u32("world size")?;
        let generation = if magic == MAGIC_GENERATION {
            r.u32("generation")?
        } else {
            0
        };
        let endpoint = r.text("endpoint", MAX_ENDPOINT)?;
        Ok(CheckIn {
            rank,
            world,
            generation,
            endpoint,
        })
    };
    read().map_err(lift)
}

/// Sends every rank's endpoint (launcher side).
pub(crate) fn write_endpoints(
    stream: &mut TcpStream,
    endpoints: &[String],
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let peer = peer_of(stream);
    let mut out = Vec::with_capacity(8 + endpoints.iter().map(|e| e.len() + 4).sum::<usize>());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(endpoints.len() as u32).to_le_bytes());
    for endpoint in endpoints {
        put_text(&mut out, endpoint);
    }
    DeadlineStream::until(stream, deadline)
        .with_peer(&peer)
        .write_all(&out, "endpoints")
        .map_err(lift)
}

/// Sends the refusal of `generation`, which misses the exited ranks `exited` (each
/// with how it ended) (launcher side).
pub(crate) fn write_refusal(
    stream: &mut TcpStream,
    generation: u32,
    exited: &[(u32, String)],
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let peer = peer_of(stream);
    let mut out = MAGIC_REFUSED.to_vec();
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&(exited.len() as u32).to_le_bytes());
    for (rank, _) in exited {
        out.extend_from_slice(&rank.to_le_bytes());
    }
    let how: Vec<String> = exited
        .iter()
        .map(|(rank, how)| format!("rank {rank} {how}"))
        .collect();
    let mut text = how.join(", ");
    if text.len() > MAX_REFUSAL as usize {
        let mut end = MAX_REFUSAL as usize - 3;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    put_text(&mut out, &text);
    DeadlineStream::until(stream, deadline)
        .with_peer(&peer)
        .write_all(&out, "refusal")
        .map_err(lift)
}

/// Checks in and waits for every endpoint (process side), proving the job secret of
/// this process's environment when one is set.
pub fn exchange(
    addr: &str,
    rank: u32,
    world: u32,
    endpoint: &str,
    timeout: Duration,
) -> Result<Vec<String>, BootstrapError> {
    let secret =
        switchyard_secret::JobSecret::from_env().map_err(|e| BootstrapError::Rendezvous {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
    exchange_with_secret(addr, rank, world, endpoint, timeout, secret.as_ref())
}

/// [`exchange`] with the job secret given (`None`: no authentication).
pub(crate) fn exchange_with_secret(
    addr: &str,
    rank: u32,
    world: u32,
    endpoint: &str,
    timeout: Duration,
    secret: Option<&switchyard_secret::JobSecret>,
) -> Result<Vec<String>, BootstrapError> {
    exchange_generation(addr, (rank, world, 0), endpoint, timeout, secret)
}

/// [`exchange_with_secret`] for the process's communicator number `generation` (0 for
/// its first): the launcher answers with the endpoints the other ranks checked in for
/// the same generation.
pub(crate) fn exchange_generation(
    addr: &str,
    (rank, world, generation): (u32, u32, u32),
    endpoint: &str,
    timeout: Duration,
    secret: Option<&switchyard_secret::JobSecret>,
) -> Result<Vec<String>, BootstrapError> {
    let deadline = Instant::now() + timeout;
    let unreachable = |reason: String| BootstrapError::Rendezvous {
        addr: addr.to_string(),
        reason,
    };
    if endpoint.len() > MAX_ENDPOINT as usize {
        return Err(unreachable(format!(
            "endpoint longer than {MAX_ENDPOINT} bytes"
        )));
    }
    // A host name is fine too: on a cluster the launcher tells its host name.
    let socket_addr = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| unreachable(format!("not a reachable host:port address: {e}")))?
        .next()
        .ok_or_else(|| unreachable("the host name has no address".into()))?;
    // The launcher listens before it starts any process, so a refused connection is
    // final; a slow accept is covered by the connect timeout.
    let mut stream = TcpStream::connect_timeout(&socket_addr, timeout)
        .map_err(|e| unreachable(e.to_string()))?;
    if let Some(secret) = secret {
        switchyard_secret::connect(&mut stream, secret, AUTH_PURPOSE, rank, deadline)
            .map_err(|e| unreachable(e.to_string()))?;
    }
    let wire = DeadlineStream::until(&stream, deadline).with_peer(addr);
    let mut out = Vec::new();
    // The first generation keeps the original check-in, which launchers without
    // generations read too.
    if generation == 0 {
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&world.to_le_bytes());
    } else {
        out.extend_from_slice(&MAGIC_GENERATION);
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&world.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
    }
    put_text(&mut out, endpoint);
    wire.write_all(&out, "check-in")
        .map_err(|e| unreachable(e.reason()))?;
    if wire.magic(&[MAGIC, MAGIC_REFUSED]).map_err(lift)? == MAGIC_REFUSED {
        let refused = wire.u32("refused generation").map_err(lift)?;
        let count = wire.u32("exited rank count").map_err(lift)?;
        if count == 0 || count > world {
            return Err(BootstrapError::Protocol {
                peer: addr.to_string(),
                reason: format!("launcher refused with {count} exited ranks of {world}"),
            });
        }
        let ranks = (0..count)
            .map(|_| wire.u32("exited rank").map_err(lift))
            .collect::<Result<Vec<u32>, _>>()?;
        let detail = wire.text("refusal", MAX_REFUSAL).map_err(lift)?;
        return Err(BootstrapError::RanksExited {
            addr: addr.to_string(),
            generation: refused,
            ranks,
            detail,
        });
    }
    let count = wire.u32("endpoint count").map_err(lift)?;
    if count != world {
        return Err(BootstrapError::Protocol {
            peer: addr.to_string(),
            reason: format!("launcher sent {count} endpoints for a world of {world}"),
        });
    }
    (0..count)
        .map(|_| wire.text("endpoint", MAX_ENDPOINT).map_err(lift))
        .collect()
}
