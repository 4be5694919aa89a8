//! Handing segments over between the ranks of one host, at mesh setup, after their TCP
//! connections are open (and, with a job secret, authenticated).
//!
//! For each pair on one host, over their TCP connection and a Unix socket:
//!
//! 1. the higher rank offers an abstract Unix socket (no file: it disappears with the
//!    listener) and a 16-byte random nonce, over TCP (`SYO1`, name length, name,
//!    nonce);
//! 2. the lower rank creates the segment, connects to that socket and sends the
//!    nonce, its rank and the segment's descriptor (`SYF1`, `SCM_RIGHTS`);
//! 3. the higher rank maps it, keeps the Unix connection as the pair's pipe and
//!    confirms over TCP (`SYA1`); the TCP connection is then closed.
//!
//! The nonce went over the authenticated connection, so a stranger that connects to
//! the abstract socket cannot pass for the lower rank; the lower rank connects to the
//! name the higher one sent, so a stranger cannot receive a segment either.
//!
//! Every rank first sends its offers, then takes the offers of the ranks above it,
//! then accepts the segments of the ranks below, then reads the confirmations: each
//! step waits only on steps the other ranks reach without waiting, so no cycle of
//! ranks can wait on each other.

use super::ShmPipe;
use super::board::{Board, slot_bytes_for};
use super::segment::{RING_BYTES, Segment, recv_fd, send_fd};
use crate::LinkError;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};
use switchyard_net::stream::{DeadlineStream, StreamError};

/// The higher rank's offer: connect to this socket, prove yourself with this nonce.
const OFFER: [u8; 4] = *b"SYO1";
/// The lower rank's segment, on the Unix socket.
const SEGMENT: [u8; 4] = *b"SYF1";
/// The higher rank mapped the segment.
const ACCEPTED: [u8; 4] = *b"SYA1";
/// Bytes of a nonce.
const NONCE: usize = 16;
/// Bytes of the lower rank's message on the Unix socket.
const SEGMENT_MESSAGE: usize = 4 + NONCE + 4;
/// The longest abstract socket name (`sun_path` less its leading zero byte).
const MAX_NAME: usize = 107;
/// How long one connection to the offered socket may take to send its segment: a
/// rank sends it right after connecting, so a connection that stays silent longer is
/// a stranger's, and must not hold up the ranks behind it for long.
const SEGMENT_LIMIT: Duration = Duration::from_secs(1);

/// Gives every rank in `same_host` (true for the ranks on this rank's host) a
/// [`ShmPipe`], through the open TCP connections `streams` (blocking), by `deadline`.
/// `addrs` name the peers in errors. Entry `r` of the result is rank `r`'s pipe.
pub(crate) fn hand_over(
    rank: usize,
    streams: &[Option<TcpStream>],
    addrs: &[String],
    same_host: &[bool],
    deadline: Instant,
) -> Result<Vec<Option<ShmPipe>>, LinkError> {
    let size = streams.len();
    let mut pipes: Vec<Option<ShmPipe>> = (0..size).map(|_| None).collect();
    let below: Vec<usize> = (0..rank).filter(|&p| same_host[p]).collect();
    let above: Vec<usize> = (rank + 1..size).filter(|&p| same_host[p]).collect();
    if below.is_empty() && above.is_empty() {
        return Ok(pipes);
    }
    let lost = |peer: usize, reason: String| LinkError::Lost {
        rank: peer,
        endpoint: format!("shm://{}", addrs[peer]),
        reason,
    };
    let local = |reason: String| LinkError::Transport { rank, reason };
    let stream = |peer: usize| {
        streams[peer]
            .as_ref()
            .ok_or_else(|| lost(peer, "no connection to hand the segment over".into()))
    };
    let on =
        |peer: usize, e: StreamError| lost(peer, format!("shared-memory set-up: {}", e.reason()));

    // 1. Offers to the ranks below.
    let mut nonces: Vec<Option<[u8; NONCE]>> = vec![None; size];
    let listener = if below.is_empty() {
        None
    } else {
        let name = format!(
            "switchyard-shm-{:016x}-{rank}",
            switchyard_net::tag::random_tag()
        );
        let listener = SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|addr| UnixListener::bind_addr(&addr))
            .map_err(|e| local(format!("shared memory: listen on @{name}: {e}")))?;
        for &peer in &below {
            let nonce = random_nonce().map_err(|e| local(format!("shared memory: {e}")))?;
            let mut offer = Vec::with_capacity(4 + 1 + name.len() + NONCE);
            offer.extend_from_slice(&OFFER);
            offer.push(name.len() as u8);
            offer.extend_from_slice(name.as_bytes());
            offer.extend_from_slice(&nonce);
            DeadlineStream::until(stream(peer)?, deadline)
                .write_all(&offer, "shared-memory offer")
                .map_err(|e| on(peer, e))?;
            nonces[peer] = Some(nonce);
        }
        Some(listener)
    };

    // 2. Segments for the ranks above, handed over on the sockets they offered.
    for &peer in &above {
        let wire = DeadlineStream::until(stream(peer)?, deadline);
        wire.magic(&[OFFER]).map_err(|e| on(peer, e))?;
        let mut len = [0u8; 1];
        wire.read_exact(&mut len, "socket name length")
            .map_err(|e| on(peer, e))?;
        wire.check_len("socket name", u64::from(len[0]), MAX_NAME as u64)
            .map_err(|e| on(peer, e))?;
        let name = wire
            .bytes("socket name", usize::from(len[0]))
            .map_err(|e| on(peer, e))?;
        let mut nonce = [0u8; NONCE];
        wire.read_exact(&mut nonce, "nonce")
            .map_err(|e| on(peer, e))?;
        let (segment, fd) = Segment::create(RING_BYTES)
            .map_err(|e| local(format!("shared memory: create a segment: {e}")))?;
        let socket = SocketAddr::from_abstract_name(&name)
            .and_then(|addr| UnixStream::connect_addr(&addr))
            .map_err(|e| {
                // A misconfiguration, not a fault of the peer's: reported as this
                // rank's own failure, so that its notice to every rank blames no one
                // and every rank reports this advice.
                local(format!(
                    "cannot reach rank {peer}'s shared-memory socket at shm://{} ({e}): ranks \
                     that announce one host identity must share a network namespace (set \
                     SWITCHYARD_HOST_ID apart, or SWITCHYARD_SHM=0)",
                    addrs[peer]
                ))
            })?;
        let mut message = Vec::with_capacity(SEGMENT_MESSAGE);
        message.extend_from_slice(&SEGMENT);
        message.extend_from_slice(&nonce);
        message.extend_from_slice(&(rank as u32).to_le_bytes());
        send_fd(&socket, &message, fd.as_fd())
            .map_err(|e| lost(peer, format!("shared memory: send the segment: {e}")))?;
        let pipe = ShmPipe::new(segment, true, socket)
            .map_err(|e| lost(peer, format!("shared memory: {e}")))?;
        pipes[peer] = Some(pipe);
    }

    // 3. The segments of the ranks below.
    if let Some(listener) = listener {
        let waiter = Waiter {
            nonces: &nonces,
            deadline,
            // A rank below that failed before it sent its segment closes its TCP
            // connection: seen at once, not at the deadline.
            closed: &|peer| streams[peer].as_ref().is_none_or(closed_by_peer),
            lost: &lost,
        };
        waiter.accept_segments(&listener, &mut pipes, |peer| {
            DeadlineStream::until(stream(peer)?, deadline)
                .write_all(&ACCEPTED, "shared-memory confirmation")
                .map_err(|e| on(peer, e))
        })?;
    }

    // 4. The ranks above mapped theirs.
    for &peer in &above {
        DeadlineStream::until(stream(peer)?, deadline)
            .magic(&[ACCEPTED])
            .map_err(|e| on(peer, e))?;
    }
    Ok(pipes)
}

/// Gives the ranks of this host (this rank and every peer with a pipe in `pipes`)
/// their host board (`board.rs`), when there are at least two: the lowest of them
/// makes it and sends its descriptor on each pipe's socket, the others take it from
/// their pipe to that rank, by `deadline`. Returns the board with the ranks that
/// share it, in rank order (a rank's slot is its place in that list). `None` when
/// this rank is alone on its host, or when the lowest rank could not make one (it
/// says so to every rank of the host, so that all agree: the board changes which
/// algorithm a call runs).
pub(crate) fn share_board(
    rank: usize,
    pipes: &[Option<ShmPipe>],
    addrs: &[String],
    deadline: Instant,
) -> Result<Option<(Board, Vec<usize>)>, LinkError> {
    let here: Vec<usize> = (0..pipes.len())
        .filter(|&p| p == rank || pipes[p].is_some())
        .collect();
    let (Some(&first), Some(me)) = (here.first(), here.iter().position(|&p| p == rank)) else {
        return Ok(None);
    };
    if here.len() < 2 {
        return Ok(None);
    }
    let lost = |peer: usize, reason: String| LinkError::Lost {
        rank: peer,
        endpoint: format!("shm://{}", addrs[peer]),
        reason: format!("host board: {reason}"),
    };
    if rank == first {
        let made = Board::create(here.len(), slot_bytes_for(here.len()))
            .inspect_err(|e| tracing::warn!("no host board: {e}"))
            .ok();
        for (peer, pipe) in pipes.iter().enumerate() {
            if let Some(pipe) = pipe {
                pipe.send_board(made.as_ref().map(|(_, fd)| fd.as_fd()))
                    .map_err(|e| lost(peer, e.to_string()))?;
            }
        }
        return Ok(made.map(|(board, _)| (board, here)));
    }
    let Some(from_first) = &pipes[first] else {
        return Ok(None);
    };
    match from_first.recv_board(deadline) {
        Ok(Some(fd)) => Board::open(fd, me, here.len())
            .map(|board| Some((board, here)))
            .map_err(|e| lost(first, e.to_string())),
        Ok(None) => Ok(None),
        Err(e) => Err(lost(first, e.to_string())),
    }
}

/// What the accepting side of the hand-over waits for, and how it reports.
struct Waiter<'a> {
    /// The nonce offered to each rank below (`None`: not on this host).
    nonces: &'a [Option<[u8; NONCE]>],
    deadline: Instant,
    /// Whether a rank's TCP connection was closed by that rank.
    closed: &'a dyn Fn(usize) -> bool,
    /// The error naming a rank whose hand-over failed, and why.
    lost: &'a dyn Fn(usize, String) -> LinkError,
}

/// Why a connection on the offered socket gave no segment.
enum Refusal {
    /// Not one of the ranks (no valid nonce, another user): logged and closed.
    Stranger(String),
    /// A rank proved itself but its segment could not be taken: the hand-over fails.
    Failed { peer: usize, reason: String },
}

impl Waiter<'_> {
    /// The first rank below that has not sent its segment yet.
    fn waiting(&self, pipes: &[Option<ShmPipe>]) -> Option<usize> {
        (0..self.nonces.len()).find(|&p| self.nonces[p].is_some() && pipes[p].is_none())
    }

    /// Accepts connections on `listener` until every rank with a nonce has sent its
    /// segment, calling `confirm` for each; connections that do not carry a waiting
    /// rank's nonce are logged and closed. Fails at once for a rank that closes its
    /// TCP connection or whose segment cannot be mapped.
    fn accept_segments(
        &self,
        listener: &UnixListener,
        pipes: &mut [Option<ShmPipe>],
        mut confirm: impl FnMut(usize) -> Result<(), LinkError>,
    ) -> Result<(), LinkError> {
        let started = Instant::now();
        listener
            .set_nonblocking(true)
            .map_err(|e| LinkError::Transport {
                rank: self.waiting(pipes).unwrap_or(0),
                reason: e.to_string(),
            })?;
        while let Some(first) = self.waiting(pipes) {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(LinkError::Timeout {
                    rank: first,
                    waited: now - started,
                });
            }
            let socket = match listener.accept() {
                Ok((socket, _)) => socket,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(gone) = (first..self.nonces.len())
                        .filter(|&p| self.nonces[p].is_some() && pipes[p].is_none())
                        .find(|&p| (self.closed)(p))
                    {
                        return Err((self.lost)(
                            gone,
                            "closed its connection during the shared-memory set-up".into(),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(LinkError::Transport {
                        rank: first,
                        reason: format!("shared memory: accept: {e}"),
                    });
                }
            };
            let limit = self.deadline.min(Instant::now() + SEGMENT_LIMIT);
            match take_segment(socket, self.nonces, pipes, limit) {
                Ok(peer) => confirm(peer)?,
                Err(Refusal::Stranger(reason)) => {
                    tracing::warn!(%reason, "shared memory: refused a connection")
                }
                Err(Refusal::Failed { peer, reason }) => return Err((self.lost)(peer, reason)),
            }
        }
        Ok(())
    }
}

/// Reads one lower rank's segment from `socket` (by `limit`) and files its pipe.
/// Returns the rank.
fn take_segment(
    socket: UnixStream,
    nonces: &[Option<[u8; NONCE]>],
    pipes: &mut [Option<ShmPipe>],
    limit: Instant,
) -> Result<usize, Refusal> {
    let stranger = |reason: String| Refusal::Stranger(reason);
    // Only this user's processes may hand us memory (the ranks of a job run as one
    // user); anyone else is refused before a byte is read.
    let uid = peer_uid(&socket).map_err(|e| stranger(format!("no peer credentials: {e}")))?;
    // SAFETY: geteuid cannot fail.
    let mine = unsafe { libc::geteuid() };
    if uid != mine {
        return Err(stranger(format!(
            "a connection from user {uid}, not {mine}"
        )));
    }
    let wait = limit
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    socket
        .set_nonblocking(false)
        .and_then(|()| socket.set_read_timeout(Some(wait)))
        .map_err(|e| stranger(e.to_string()))?;
    let mut message = [0u8; SEGMENT_MESSAGE];
    let (got, fd) = recv_fd(&socket, &mut message).map_err(|e| stranger(e.to_string()))?;
    if got != SEGMENT_MESSAGE || message[..4] != SEGMENT {
        return Err(stranger(format!(
            "{got} bytes beginning {:02x?}, not a segment",
            &message[..got.min(4)]
        )));
    }
    let mut claimed = [0u8; 4];
    claimed.copy_from_slice(&message[4 + NONCE..]);
    let peer = u32::from_le_bytes(claimed) as usize;
    let expected = nonces.get(peer).copied().flatten();
    if expected.is_none_or(|nonce| nonce[..] != message[4..4 + NONCE]) {
        return Err(stranger(format!(
            "a claim to be rank {peer} with the wrong nonce"
        )));
    }
    if pipes[peer].is_some() {
        return Err(stranger(format!("a second segment from rank {peer}")));
    }
    // From here on the connection is the rank's own: a failure fails its hand-over.
    let failed = |reason: String| Refusal::Failed { peer, reason };
    let fd = fd.ok_or_else(|| failed("its segment message carried no descriptor".into()))?;
    let segment = Segment::open(fd).map_err(|e| failed(format!("its segment: {e}")))?;
    let pipe = ShmPipe::new(segment, false, socket).map_err(|e| failed(e.to_string()))?;
    pipes[peer] = Some(pipe);
    Ok(peer)
}

/// The user id of the process at the other end of `socket` (`SO_PEERCRED`).
fn peer_uid(socket: &UnixStream) -> io::Result<libc::uid_t> {
    // SAFETY: ucred is plain data that getsockopt fills.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and an out-buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Whether the peer closed or reset `stream`, looked at without blocking or taking
/// any byte.
fn closed_by_peer(stream: &TcpStream) -> bool {
    let mut byte = 0u8;
    // SAFETY: a valid socket and a one-byte buffer; MSG_PEEK leaves the byte there.
    let got = unsafe {
        libc::recv(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if got >= 0 {
        return got == 0;
    }
    !matches!(
        io::Error::last_os_error().kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// 16 bytes from the kernel's random source.
fn random_nonce() -> io::Result<[u8; NONCE]> {
    let mut nonce = [0u8; NONCE];
    let mut filled = 0;
    while filled < NONCE {
        // SAFETY: writes at most `NONCE - filled` bytes into the array's tail.
        let got =
            unsafe { libc::getrandom(nonce[filled..].as_mut_ptr().cast(), NONCE - filled, 0) };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += got as usize;
    }
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::IoSlice;
    use std::net::TcpListener;

    /// TCP connections between every pair of `n` ranks, as setup leaves them.
    fn mesh(n: usize) -> Vec<Vec<Option<TcpStream>>> {
        let mut streams: Vec<Vec<Option<TcpStream>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let pairs = (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b)));
        for (a, b) in pairs {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let there = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (here, _) = listener.accept().unwrap();
            streams[a][b] = Some(there);
            streams[b][a] = Some(here);
        }
        streams
    }

    /// Four ranks, three on one host: the three get pipes to each other that carry
    /// bytes both ways; nobody gets one to the fourth.
    #[test]
    fn ranks_on_one_host_get_pipes_to_each_other() {
        let hosts = ["a", "a", "b", "a"];
        let n = hosts.len();
        let addrs: Vec<String> = (0..n).map(|r| format!("rank{r}")).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        let pipes: Vec<Vec<Option<ShmPipe>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = mesh(n)
                .into_iter()
                .enumerate()
                .map(|(rank, streams)| {
                    let addrs = addrs.clone();
                    scope.spawn(move || {
                        let same: Vec<bool> = (0..n)
                            .map(|p| p != rank && hosts[p] == hosts[rank])
                            .collect();
                        hand_over(rank, &streams, &addrs, &same, deadline).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut pipes = pipes;
        for (rank, row) in pipes.iter().enumerate() {
            for (peer, pipe) in row.iter().enumerate() {
                let expected = peer != rank && hosts[peer] == hosts[rank];
                assert_eq!(pipe.is_some(), expected, "rank {rank} peer {peer}");
            }
        }
        for (a, b) in [(0, 1), (0, 3), (1, 3), (3, 0)] {
            let message = format!("{a} to {b}");
            let sent = pipes[a][b]
                .as_mut()
                .unwrap()
                .write_vectored(&[IoSlice::new(message.as_bytes())])
                .unwrap();
            assert_eq!(sent, message.len());
            let mut buf = [0u8; 32];
            let got = pipes[b][a].as_mut().unwrap().read(&mut buf).unwrap();
            assert_eq!(&buf[..got], message.as_bytes());
        }
    }

    /// A stranger that connects to the offered socket with a made-up nonce gets
    /// nothing and holds nobody up; the real rank's segment is taken.
    #[test]
    fn a_stranger_on_the_offered_socket_is_refused() {
        let mut streams = mesh(2);
        let deadline = Instant::now() + Duration::from_secs(20);
        let addrs = vec!["zero".to_string(), "one".to_string()];
        let higher = std::mem::take(&mut streams[1]);
        let lower = std::mem::take(&mut streams[0]);
        // Rank 1's side runs on a thread; the test reads its offer off the wire by
        // peeking, and races a stranger to the socket before rank 0 starts.
        let peek = lower[1].as_ref().unwrap().try_clone().unwrap();
        let addrs1 = addrs.clone();
        let one =
            std::thread::spawn(move || hand_over(1, &higher, &addrs1, &[true, false], deadline));
        let mut head = [0u8; 5];
        peek.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let got = loop {
            let n = peek.peek(&mut head).unwrap();
            if n == head.len() {
                break n;
            }
        };
        assert_eq!(got, 5);
        let mut offer = vec![0u8; 5 + usize::from(head[4]) + NONCE];
        while peek.peek(&mut offer).unwrap() < offer.len() {}
        let name = &offer[5..5 + usize::from(head[4])];
        let stranger =
            UnixStream::connect_addr(&SocketAddr::from_abstract_name(name).unwrap()).unwrap();
        let (_, fd) = Segment::create(4096).unwrap();
        let mut fake = SEGMENT.to_vec();
        fake.extend_from_slice(&[0u8; NONCE]);
        fake.extend_from_slice(&0u32.to_le_bytes());
        send_fd(&stranger, &fake, fd.as_fd()).unwrap();
        let zero = hand_over(0, &lower, &addrs, &[false, true], deadline).unwrap();
        let one = one.join().unwrap().unwrap();
        assert!(zero[1].is_some() && one[0].is_some());
        drop(stranger);
    }

    /// A rank below that gives up after the offer (its set-up failed, so its TCP
    /// connection closes) fails the rank above at once, naming it, not at the
    /// deadline.
    #[test]
    fn a_rank_below_that_gives_up_is_named_at_once() {
        let mut streams = mesh(2);
        let addrs = vec!["zero".to_string(), "one".to_string()];
        let deadline = Instant::now() + Duration::from_secs(30);
        let higher = std::mem::take(&mut streams[1]);
        let mut lower = std::mem::take(&mut streams[0]);
        let below = std::thread::spawn(move || {
            use std::io::Read;
            let mut stream = lower[1].take().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let mut head = [0u8; 5];
            stream.read_exact(&mut head).unwrap();
            let mut rest = vec![0u8; usize::from(head[4]) + NONCE];
            stream.read_exact(&mut rest).unwrap();
        });
        let started = Instant::now();
        let err = hand_over(1, &higher, &addrs, &[true, false], deadline).unwrap_err();
        below.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(&err, LinkError::Lost { rank: 0, reason, .. } if reason.contains("closed its connection")),
            "{err:?}"
        );
    }

    /// A rank whose peer never offers (it announced the host but is gone) fails at
    /// the deadline naming that peer.
    #[test]
    fn a_silent_peer_fails_the_hand_over_at_the_deadline() {
        let streams = mesh(2);
        let addrs = vec!["zero".to_string(), "one".to_string()];
        let deadline = Instant::now() + Duration::from_millis(300);
        let err = hand_over(0, &streams[0], &addrs, &[false, true], deadline).unwrap_err();
        assert!(
            matches!(&err, LinkError::Lost { rank: 1, reason, .. } if reason.contains("offer") || reason.contains("magic")),
            "{err:?}"
        );
    }
}
