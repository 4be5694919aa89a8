//! The mesh's data path: one plain TCP connection per pair of ranks, beside the
//! ZeroMQ [`SocketLink`] that keeps the control traffic (setup and abort notices).
//!
//! Why: through ZeroMQ every message crosses two extra threads (libzmq's I/O threads),
//! and each hand-off is a wake-up of about 30 us on the project machines; streams of
//! large frames also stop at about 3.6 GB/s. Here the calling thread writes frames
//! straight from their buffers with `writev` and reads them into one allocation per
//! frame, spinning briefly before it sleeps in `poll(2)`, and a peer that dies shows up
//! at once as a closed connection ([`LinkError::Lost`]) instead of at the deadline.
//!
//! All sockets are non-blocking. A rank that cannot write (its peer's buffers are full)
//! keeps reading from every peer while it waits, so that ranks writing to each other in
//! a cycle (the ring) can never all block.
//!
//! Wire format of one message on a connection (little-endian):
//! `"SYC1"`, step `u32`, call `u64`, frame count `u32`, reserved `u32`, then one `u64`
//! length per frame, then the frames' bytes. A connection opens with
//! `"SYH1"`, the connecting rank `u32`, the world size `u32`.

use super::error::LinkError;
use super::link::{Link, Pending, SocketLink, Tag};
use bytes::Bytes;
use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const MESSAGE_MAGIC: [u8; 4] = *b"SYC1";
const HELLO_MAGIC: [u8; 4] = *b"SYH1";
const HEAD_LEN: usize = 24;
/// Most frames one message may claim (the collectives send two).
const MAX_FRAMES: usize = 16;
/// Setup messages on the control link use call 0, which no collective uses.
const SETUP_TAG: Tag = Tag { call: 0, step: 1 };
/// Queued bytes per peer above which `send` waits for the queue to drain.
const QUEUE_LIMIT: usize = 16 << 20;
/// Longest sleep in `poll` before the control link is checked for abort notices.
const CONTROL_CHECK: Duration = Duration::from_millis(20);

/// Frame buffers to reuse. Receiving into fresh allocations costs a page fault and
/// a zero-fill per page, the largest item in a profile of 4 MiB allreduces; a ring
/// reuses the same few piece-sized buffers over and over.
#[derive(Default)]
struct Pool {
    free: Vec<Vec<u8>>,
}

/// Most buffers the pool keeps.
const POOL_BUFFERS: usize = 64;
/// Frames smaller than this are not worth keeping.
const POOL_MIN: usize = 4096;

impl Pool {
    fn take(&mut self, len: usize) -> Vec<u8> {
        if len >= POOL_MIN {
            if let Some(at) = self.free.iter().rposition(|b| b.capacity() >= len) {
                let mut buffer = self.free.swap_remove(at);
                // Shrinking is free; growing within the capacity zero-fills the growth only.
                buffer.resize(len, 0);
                return buffer;
            }
        }
        vec![0; len]
    }

    fn give(&mut self, frame: Bytes) {
        if frame.len() < POOL_MIN || self.free.len() >= POOL_BUFFERS {
            return;
        }
        // Only a frame nobody else holds comes back; a shared one just drops.
        if let Ok(unique) = frame.try_into_mut() {
            self.free.push(Vec::from(unique));
        }
    }
}

/// A message being read.
enum Inbound {
    Head {
        buf: [u8; HEAD_LEN],
        got: usize,
    },
    Lens {
        tag: Tag,
        buf: Vec<u8>,
        got: usize,
    },
    Body {
        tag: Tag,
        lens: Vec<usize>,
        frames: Vec<Bytes>,
        cur: Vec<u8>,
        got: usize,
    },
}

impl Inbound {
    fn start() -> Inbound {
        Inbound::Head {
            buf: [0; HEAD_LEN],
            got: 0,
        }
    }
}

/// A message being written: its parts and how far the writing got.
struct Outbound {
    parts: Vec<Bytes>,
    part: usize,
    offset: usize,
}

/// One peer's connection.
struct Peer {
    stream: TcpStream,
    addr: String,
    inbound: Inbound,
    outbound: VecDeque<Outbound>,
    queued: usize,
    /// Why the connection ended, once it has. A peer that finished its last call
    /// and left is no error until this rank needs it.
    closed: Option<String>,
}

/// A [`Link`] whose messages travel on plain TCP connections, one per pair of ranks,
/// set up and supervised through a ZeroMQ [`SocketLink`].
pub struct StreamLink {
    control: SocketLink,
    rank: usize,
    size: usize,
    peers: Vec<Option<Peer>>,
    pending: Pending,
    max_frame_bytes: usize,
    spin: Duration,
    pool: Pool,
}

impl std::fmt::Debug for StreamLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLink")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

fn io_error(rank: usize, addr: &str, e: std::io::Error) -> LinkError {
    LinkError::Lost {
        rank,
        endpoint: format!("tcp://{addr}"),
        reason: e.to_string(),
    }
}

impl StreamLink {
    /// Opens a TCP connection to every other rank of `control`'s world: listens on
    /// `host` (any free port), swaps addresses over `control`, then the lower rank of
    /// each pair connects. Waits at most `timeout`.
    pub fn connect(
        mut control: SocketLink,
        host: &str,
        timeout: Duration,
        max_frame_bytes: usize,
        spin: Duration,
    ) -> Result<StreamLink, LinkError> {
        let (rank, size) = (control.rank(), control.world_size());
        // This link flushes its own connections when dropped.
        control.set_close_handshake(false);
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
            let mut stream = TcpStream::connect_timeout(&addr, wait)
                .map_err(|e| io_error(peer, &addrs[peer], e))?;
            let mut hello = Vec::with_capacity(12);
            hello.extend_from_slice(&HELLO_MAGIC);
            hello.extend_from_slice(&(rank as u32).to_le_bytes());
            hello.extend_from_slice(&(size as u32).to_le_bytes());
            stream
                .write_all(&hello)
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
                        let absent: Vec<usize> =
                            (0..rank).filter(|p| streams[*p].is_none()).collect();
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
        let mut peers = Vec::with_capacity(size);
        for (peer, stream) in streams.into_iter().enumerate() {
            let Some(stream) = stream else {
                peers.push(None);
                continue;
            };
            let addr = addrs[peer].clone();
            stream
                .set_nodelay(true)
                .map_err(|e| io_error(peer, &addr, e))?;
            stream
                .set_nonblocking(true)
                .map_err(|e| io_error(peer, &addr, e))?;
            peers.push(Some(Peer {
                stream,
                addr,
                inbound: Inbound::start(),
                outbound: VecDeque::new(),
                queued: 0,
                closed: None,
            }));
        }
        Ok(StreamLink {
            control,
            rank,
            size,
            peers,
            pending: Pending::default(),
            max_frame_bytes,
            spin,
            pool: Pool::default(),
        })
    }

    fn peer(&mut self, rank: usize) -> Result<&mut Peer, LinkError> {
        match self.peers.get_mut(rank) {
            Some(Some(peer)) => Ok(peer),
            _ => Err(LinkError::Transport {
                rank,
                reason: format!("no connection to rank {rank}"),
            }),
        }
    }

    /// Writes what `rank`'s connection accepts without blocking. Returns whether
    /// anything was written.
    fn flush(&mut self, rank: usize) -> Result<bool, LinkError> {
        let pool = &mut self.pool;
        let Some(Some(peer)) = self.peers.get_mut(rank) else {
            return Err(LinkError::Transport {
                rank,
                reason: format!("no connection to rank {rank}"),
            });
        };
        let mut progressed = false;
        if peer.closed.is_some() {
            // Whatever was queued for a peer that left can no longer matter to it.
            peer.outbound.clear();
            peer.queued = 0;
            return Ok(false);
        }
        while let Some(out) = peer.outbound.front_mut() {
            let mut slices = Vec::with_capacity(out.parts.len() - out.part);
            slices.push(IoSlice::new(&out.parts[out.part][out.offset..]));
            for part in &out.parts[out.part + 1..] {
                slices.push(IoSlice::new(part));
            }
            match peer.stream.write_vectored(&slices) {
                Ok(0) => return Err(io_error(rank, &peer.addr, ErrorKind::WriteZero.into())),
                Ok(mut written) => {
                    progressed = true;
                    peer.queued -= written;
                    while written > 0 {
                        let left = out.parts[out.part].len() - out.offset;
                        if written >= left {
                            written -= left;
                            out.part += 1;
                            out.offset = 0;
                        } else {
                            out.offset += written;
                            written = 0;
                        }
                    }
                    // Empty frames are skipped too, so that the message counts as done.
                    while out.part < out.parts.len() && out.parts[out.part].len() == out.offset {
                        out.part += 1;
                        out.offset = 0;
                    }
                    if out.part == out.parts.len() {
                        if let Some(done) = peer.outbound.pop_front() {
                            for part in done.parts {
                                pool.give(part);
                            }
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = Some(e.to_string());
                    peer.outbound.clear();
                    peer.queued = 0;
                    return Err(io_error(rank, &peer.addr, e));
                }
            }
        }
        Ok(progressed)
    }

    /// Reads what `rank`'s connection has without blocking, filing complete messages
    /// under their tag. Returns whether anything was read.
    fn pump(&mut self, rank: usize) -> Result<bool, LinkError> {
        let max_frame = self.max_frame_bytes;
        let mut progressed = false;
        loop {
            let peer = self.peer(rank)?;
            if peer.closed.is_some() {
                return Ok(progressed);
            }
            let addr = peer.addr.clone();
            let (target, got): (&mut [u8], usize) = match &mut peer.inbound {
                Inbound::Head { buf, got } => (&mut buf[*got..], *got),
                Inbound::Lens { buf, got, .. } => (&mut buf[*got..], *got),
                Inbound::Body { cur, got, .. } => (&mut cur[*got..], *got),
            };
            let read = if target.is_empty() {
                0
            } else {
                match peer.stream.read(target) {
                    Ok(0) => {
                        peer.closed =
                            Some(if matches!(peer.inbound, Inbound::Head { got: 0, .. }) {
                                "connection closed by the peer".into()
                            } else {
                                "connection closed by the peer in the middle of a message".into()
                            });
                        return Ok(true);
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(progressed),
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        peer.closed = Some(e.to_string());
                        return Ok(true);
                    }
                }
            };
            progressed |= read > 0;
            let got = got + read;
            let malformed = |reason: String| LinkError::Transport {
                rank,
                reason: format!("malformed stream from tcp://{addr}: {reason}"),
            };
            let next = match std::mem::replace(&mut peer.inbound, Inbound::start()) {
                Inbound::Head { buf, .. } if got < HEAD_LEN => Inbound::Head { buf, got },
                Inbound::Head { buf, .. } => {
                    if buf[..4] != MESSAGE_MAGIC {
                        return Err(malformed(format!("bad magic {:?}", &buf[..4])));
                    }
                    let word32 =
                        |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
                    let mut call = [0u8; 8];
                    call.copy_from_slice(&buf[8..16]);
                    let tag = Tag {
                        step: word32(4),
                        call: u64::from_le_bytes(call),
                    };
                    let count = word32(16) as usize;
                    if count > MAX_FRAMES {
                        return Err(malformed(format!("{count} frames, at most {MAX_FRAMES}")));
                    }
                    Inbound::Lens {
                        tag,
                        buf: vec![0; count * 8],
                        got: 0,
                    }
                }
                Inbound::Lens { tag, buf, .. } if got < buf.len() => {
                    Inbound::Lens { tag, buf, got }
                }
                Inbound::Lens { tag, buf, .. } => {
                    let mut lens = Vec::with_capacity(buf.len() / 8);
                    for chunk in buf.chunks_exact(8) {
                        let mut word = [0u8; 8];
                        word.copy_from_slice(chunk);
                        let len = u64::from_le_bytes(word);
                        if len > max_frame as u64 {
                            return Err(malformed(format!(
                                "a frame of {len} bytes, over the limit of {max_frame}"
                            )));
                        }
                        lens.push(len as usize);
                    }
                    Inbound::Body {
                        tag,
                        cur: self.pool.take(lens.first().copied().unwrap_or(0)),
                        lens,
                        frames: Vec::new(),
                        got: 0,
                    }
                }
                Inbound::Body {
                    tag,
                    lens,
                    frames,
                    cur,
                    ..
                } if got < cur.len() => Inbound::Body {
                    tag,
                    lens,
                    frames,
                    cur,
                    got,
                },
                Inbound::Body {
                    tag,
                    lens,
                    mut frames,
                    cur,
                    ..
                } => {
                    if frames.len() < lens.len() {
                        frames.push(Bytes::from(cur));
                    }
                    if frames.len() == lens.len() {
                        self.pending.push(rank, tag, frames);
                        Inbound::start()
                    } else {
                        let len = lens[frames.len()];
                        Inbound::Body {
                            tag,
                            cur: self.pool.take(len),
                            lens,
                            frames,
                            got: 0,
                        }
                    }
                }
            };
            if let Some(Some(peer)) = self.peers.get_mut(rank) {
                peer.inbound = next;
            }
        }
    }

    /// One pass over every connection: write what can be written, read what is there.
    fn progress(&mut self) -> Result<bool, LinkError> {
        let mut progressed = false;
        for rank in 0..self.size {
            if self.peers[rank].is_none() {
                continue;
            }
            // A failed write closes that peer; it matters only once this rank sends
            // to it or waits for it, which report it.
            progressed |= self.flush(rank).unwrap_or(true);
            progressed |= self.pump(rank)?;
        }
        Ok(progressed)
    }

    /// Sleeps in `poll(2)` until a connection is readable (or writable, where output
    /// waits), `until`, or [`CONTROL_CHECK`] passes.
    fn sleep(&self, until: Instant) {
        let mut fds: Vec<libc::pollfd> = self
            .peers
            .iter()
            .flatten()
            .filter(|p| p.closed.is_none())
            .map(|p| libc::pollfd {
                fd: p.stream.as_raw_fd(),
                events: libc::POLLIN
                    | if p.outbound.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    },
                revents: 0,
            })
            .collect();
        let wait = until
            .saturating_duration_since(Instant::now())
            .min(CONTROL_CHECK);
        let millis = wait.as_millis().max(1) as libc::c_int;
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds
        // for the duration of the call.
        unsafe {
            libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis);
        }
    }

    /// Waits for progress on any connection until `deadline`, spinning first, and
    /// watching the control link for abort notices. `Ok(false)` at the deadline.
    fn wait(&mut self, deadline: Instant) -> Result<bool, LinkError> {
        let spin_until = Instant::now() + self.spin;
        loop {
            if self.progress()? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now < spin_until {
                // Yield rather than spin in place: with more ranks than cores (as
                // under `switchyard launch` on a laptop) the peer we wait for may need
                // this very core. OpenMPI does the same when oversubscribed.
                std::thread::yield_now();
                continue;
            }
            self.control.check_aborts()?;
            self.sleep(deadline);
        }
    }
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
    let mut hello = [0u8; 12];
    stream.read_exact(&mut hello).map_err(|e| e.to_string())?;
    if hello[..4] != HELLO_MAGIC {
        return Err(format!("bad magic {:?}", &hello[..4]));
    }
    let peer = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
    let world = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
    if world != size || peer >= size {
        return Err(format!("rank {peer} of {world}, this job has {size}"));
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((peer, stream))
}

impl Link for StreamLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let mut head = Vec::with_capacity(HEAD_LEN + 8 * frames.len());
        head.extend_from_slice(&MESSAGE_MAGIC);
        head.extend_from_slice(&tag.step.to_le_bytes());
        head.extend_from_slice(&tag.call.to_le_bytes());
        head.extend_from_slice(&(frames.len() as u32).to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        for frame in &frames {
            head.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        }
        let mut parts = Vec::with_capacity(frames.len() + 1);
        parts.push(Bytes::from(head));
        parts.extend(frames);
        let bytes: usize = parts.iter().map(Bytes::len).sum();
        let peer = self.peer(to)?;
        if let Some(reason) = &peer.closed {
            return Err(LinkError::Lost {
                rank: to,
                endpoint: format!("tcp://{}", peer.addr),
                reason: reason.clone(),
            });
        }
        peer.outbound.push_back(Outbound {
            parts,
            part: 0,
            offset: 0,
        });
        peer.queued += bytes;
        self.flush(to)?;
        while self.peer(to)?.queued > QUEUE_LIMIT {
            if !self.wait(deadline)? {
                return Err(LinkError::Timeout {
                    rank: to,
                    waited: Duration::ZERO,
                });
            }
        }
        Ok(())
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        let started = Instant::now();
        loop {
            if let Some(frames) = self.pending.pop(from, tag) {
                return Ok(frames);
            }
            if let Some(Some(peer)) = self.peers.get(from) {
                if let Some(reason) = &peer.closed {
                    return Err(LinkError::Lost {
                        rank: from,
                        endpoint: format!("tcp://{}", peer.addr),
                        reason: reason.clone(),
                    });
                }
            }
            if !self.wait(deadline)? {
                self.control.check_aborts()?;
                return Err(LinkError::Timeout {
                    rank: from,
                    waited: started.elapsed(),
                });
            }
        }
    }

    fn abort(&mut self, call: u64, reason: &str) {
        self.control.abort(call, reason);
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        self.pool.take(len)
    }

    fn recycle(&mut self, frame: Bytes) {
        self.pool.give(frame);
    }
}

impl Drop for StreamLink {
    /// Writes out what is still queued (at most 5 s), so that a rank's last messages
    /// reach its peers even when it leaves right after its last call.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.peers.iter().flatten().any(|p| !p.outbound.is_empty())
            && Instant::now() < deadline
        {
            match self.wait(deadline) {
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}
