//! Sockets for the clients: resolving and connecting with retries, listening, and
//! accepting under a deadline; with a job secret in the environment (see
//! [`switchyard_secret`]), the secret's challenge-response on every connection.

use super::{ClientConfig, ClientError};
use crate::common::{PEER_PURPOSE, TRACKER_PURPOSE};
use crate::wire::{self, Deadline, WireError};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use switchyard_secret::{HANDSHAKE_LIMIT, JobSecret};

/// Proves the job secret of this process's environment, if any, on a fresh
/// connection (no rank claimed: the tracker assigns ranks, and peers check ranks in
/// their own handshake).
fn prove(stream: &mut TcpStream, purpose: &str) -> io::Result<()> {
    let secret = JobSecret::from_env().map_err(io::Error::other)?;
    prove_with(stream, secret.as_ref(), purpose)
}

/// [`prove`] with the secret already read (`None`: nothing to prove).
fn prove_with(stream: &mut TcpStream, secret: Option<&JobSecret>, purpose: &str) -> io::Result<()> {
    if let Some(secret) = secret {
        switchyard_secret::connect(
            stream,
            secret,
            purpose,
            u32::MAX,
            Instant::now() + HANDSHAKE_LIMIT,
        )
        .map_err(io::Error::other)?;
    }
    Ok(())
}

/// `host:port` resolved to its first address (IPv6 literals may come with or without
/// brackets).
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr, ClientError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let text = if bare.contains(':') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    };
    let fail = |reason: String| ClientError::Address {
        addr: text.clone(),
        reason,
    };
    text.to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .next()
        .ok_or_else(|| fail("no address".into()))
}

/// A connection to the tracker, retried per [`ClientConfig`]'s schedule. The job
/// secret of the environment is read first: an unusable one (too short, both
/// variables set, an unreadable file) is [`ClientError::Secret`] before anything
/// connects, not a refusal blamed on the tracker or a wait for one that is not up.
pub(crate) fn connect_tracker(
    addr: SocketAddr,
    config: &ClientConfig,
) -> Result<TcpStream, ClientError> {
    let secret = JobSecret::from_env().map_err(ClientError::Secret)?;
    let mut retries = config.retries();
    let mut k = 0;
    loop {
        k += 1;
        match TcpStream::connect_timeout(&addr, config.connect_timeout) {
            Ok(mut stream) => {
                if let Err(e) = prove_with(&mut stream, secret.as_ref(), TRACKER_PURPOSE) {
                    return Err(ClientError::Refused {
                        addr: addr.to_string(),
                        reason: e.to_string(),
                    });
                }
                // Small messages, each answered before the next: never wait for Nagle.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(source) => match retries.on_failure() {
                None => {
                    return Err(ClientError::Connect {
                        addr: addr.to_string(),
                        attempts: retries.attempts(),
                        source,
                    });
                }
                Some(sleep) => {
                    tracing::debug!(%addr, attempt = k, error = %source, "tracker connect failed; retrying");
                    std::thread::sleep(sleep);
                }
            },
        }
    }
}

/// One connect to a peer, no retry (a failed peer connect is reported to the tracker,
/// which decides what happens next).
pub(crate) fn connect_peer(addr: SocketAddr, config: &ClientConfig) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&addr, config.connect_timeout)?;
    prove(&mut stream, PEER_PURPOSE)?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// [`connect_peer`] without the job secret's proof, for a caller that runs
/// [`prove_in_background`] because it must accept a peer of its own meanwhile (the JSON
/// ring: every worker connects to its successor before it accepts its predecessor, so
/// proofs run one after another would wait on each other around the ring).
pub(crate) fn connect_peer_unproven(
    addr: SocketAddr,
    config: &ClientConfig,
) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, config.connect_timeout)?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Proves the job secret (if any) on a peer link on another thread; join the handle
/// once this side's own accept is done.
pub(crate) fn prove_in_background(
    stream: &TcpStream,
) -> io::Result<std::thread::JoinHandle<io::Result<()>>> {
    let mut own = stream.try_clone()?;
    Ok(std::thread::spawn(move || prove(&mut own, PEER_PURPOSE)))
}

/// A listener on the wildcard address of `family`'s family, OS-chosen port: peers
/// reach it at whatever address the tracker saw for this worker.
pub(crate) fn listen_like(family: &SocketAddr) -> Result<TcpListener, ClientError> {
    let any: IpAddr = match family {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let addr = SocketAddr::new(any, 0);
    TcpListener::bind(addr).map_err(|source| ClientError::Listen {
        addr: addr.to_string(),
        source,
    })
}

/// The next connection on `listener`, waiting until `until`, or until `give_up`
/// (asked between polls) says to stop; `None` for either.
///
/// std has no accept timeout, so the listener is polled in non-blocking mode every
/// few milliseconds; peers arrive within the negotiation, so the cost is small.
pub(crate) fn accept_until(
    listener: &TcpListener,
    until: Instant,
    mut give_up: impl FnMut() -> bool,
) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    let secret = JobSecret::from_env().map_err(io::Error::other)?;
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                stream.set_nonblocking(false)?;
                if let Some(secret) = &secret {
                    let deadline = until.max(Instant::now() + Duration::from_millis(100));
                    if let Err(e) =
                        switchyard_secret::accept(&mut stream, secret, PEER_PURPOSE, deadline)
                    {
                        tracing::warn!(%peer, reason = %e.reason, "peer link: authentication failed; closed");
                        continue;
                    }
                }
                stream.set_nodelay(true)?;
                return Ok(Some((stream, peer)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= until || give_up() {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Sends the magic and checks the tracker's. A tracker that opens with the job secret's
/// challenge instead requires a secret this process does not have: say that, rather
/// than report the challenge's first bytes as a wrong magic.
pub(crate) fn magic(stream: &TcpStream, limit: Duration) -> Result<(), WireError> {
    let mut buf = Vec::with_capacity(4);
    wire::put_i32(&mut buf, wire::MAGIC);
    wire::write_all_within(stream, &buf, limit, "magic")?;
    match Deadline::new(stream, limit).magic() {
        Err(WireError::BadMagic { got })
            if switchyard_secret::looks_like_challenge(&got.to_le_bytes()) =>
        {
            Err(WireError::SecretRequired)
        }
        other => other,
    }
}
