//! Opening a [`StreamLink`](super::StreamLink)'s connections: one TCP connection per
//! pair of ranks, addresses swapped over the control link, the lower rank of each
//! pair connecting and introducing itself with a hello.

use super::framing::{decode_hello, encode_hello, HELLO_LEN};
use super::{Link, SocketLink, Tag};
use crate::collective::error::LinkError;
use bytes::Bytes;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Setup messages on the control link use call 0, which no collective uses.
const SETUP_TAG: Tag = Tag { call: 0, step: 1 };

/// An open connection to one peer, ready for non-blocking use.
#[derive(Debug)]
pub(super) struct Connection {
    /// The stream, non-blocking, with Nagle's delay off.
    pub(super) stream: TcpStream,
    /// The peer's listening address, for errors.
    pub(super) addr: String,
}

/// The error for a connection to `rank` at `addr` that failed.
pub(super) fn io_error(rank: usize, addr: &str, e: std::io::Error) -> LinkError {
    LinkError::Lost {
        rank,
        endpoint: format!("tcp://{addr}"),
        reason: e.to_string(),
    }
}

/// Opens a TCP connection to every other rank of `control`'s world: listens on
/// `host` (any free port), swaps addresses over `control`, then the lower rank of
/// each pair connects. Waits at most `timeout`. Entry `r` is rank `r`'s connection
/// (`None` for this rank).
pub(super) fn open_connections(
    control: &mut SocketLink,
    host: &str,
    timeout: Duration,
) -> Result<Vec<Option<Connection>>, LinkError> {
    let (rank, size) = (control.rank(), control.world_size());
    let deadline = Instant::now() + timeout;
    let setup = |reason: String| LinkError::Transport { rank, reason };
    let listener =
        TcpListener::bind((host, 0)).map_err(|e| setup(format!("listen on {host}: {e}")))?;
    let mine = listener
        .local_addr()
        .map_err(|e| setup(e.to_string()))?
        .to_string();
    for peer in (0..size).filter(|&p| p != rank) {
        control.send(peer, SETUP_TAG, vec![Bytes::from(mine.clone())], deadline)?;
    }
    let mut addrs = vec![String::new(); size];
    for peer in (0..size).filter(|&p| p != rank) {
        let frames = control.recv(peer, SETUP_TAG, deadline)?;
        addrs[peer] = frames
            .first()
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .unwrap_or_default();
    }
    let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    // Connect upwards; accept from below.
    for peer in rank + 1..size {
        let addr: SocketAddr = addrs[peer]
            .parse()
            .map_err(|_| setup(format!("rank {peer} sent a bad address {:?}", addrs[peer])))?;
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let mut stream =
            TcpStream::connect_timeout(&addr, wait).map_err(|e| io_error(peer, &addrs[peer], e))?;
        stream
            .write_all(&encode_hello(rank, size))
            .map_err(|e| io_error(peer, &addrs[peer], e))?;
        streams[peer] = Some(stream);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| setup(e.to_string()))?;
    let mut missing = rank;
    while missing > 0 {
        match listener.accept() {
            Ok((stream, from)) => match read_hello(stream, size, deadline) {
                Ok((peer, stream)) if peer < rank && streams[peer].is_none() => {
                    streams[peer] = Some(stream);
                    missing -= 1;
                }
                Ok((peer, _)) => {
                    tracing::warn!(%from, peer, "stream link: unexpected hello; closed")
                }
                Err(reason) => tracing::warn!(%from, %reason, "stream link: bad hello; closed"),
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let absent: Vec<usize> = (0..rank).filter(|p| streams[*p].is_none()).collect();
                    return Err(LinkError::Timeout {
                        rank: absent.first().copied().unwrap_or(0),
                        waited: timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(setup(format!("accept: {e}"))),
        }
    }
    let mut connections = Vec::with_capacity(size);
    for (peer, stream) in streams.into_iter().enumerate() {
        let Some(stream) = stream else {
            connections.push(None);
            continue;
        };
        let addr = addrs[peer].clone();
        stream
            .set_nodelay(true)
            .map_err(|e| io_error(peer, &addr, e))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| io_error(peer, &addr, e))?;
        connections.push(Some(Connection { stream, addr }));
    }
    Ok(connections)
}

/// Reads and checks a connecting rank's hello (blocking, bounded by `deadline`).
fn read_hello(
    mut stream: TcpStream,
    size: usize,
    deadline: Instant,
) -> Result<(usize, TcpStream), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), Duration::from_secs(5));
    stream
        .set_read_timeout(Some(wait))
        .map_err(|e| e.to_string())?;
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).map_err(|e| e.to_string())?;
    let peer = decode_hello(&hello, size).map_err(|e| e.to_string())?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((peer, stream))
}
