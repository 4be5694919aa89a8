//! [`ShmPipe`]: one peer's rings and its Unix socket.

use super::ring::{Reader, RingError, Writer};
use super::segment::{Segment, recv_fd, send_fd};
use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How often an empty ring makes a reader look whether the peer's socket closed,
/// while it is not sleeping (a sleeping reader is woken by the close itself). Rare
/// enough that spinning costs no system calls, often enough that a rank busy with
/// other peers still sees a dead one at once.
const SOCKET_CHECK: Duration = Duration::from_millis(1);

/// Rank 0's first message on each pipe's socket: the host board's descriptor rides
/// with it.
const BOARD: [u8; 4] = *b"SYB1";
/// The same when rank 0 has no board to share (it could not make one).
const NO_BOARD: [u8; 4] = *b"SYB0";

/// The shared-memory connection to one peer on this host.
pub(crate) struct ShmPipe {
    writer: Writer,
    reader: Reader,
    /// The peer's Unix socket: wake-ups, and its end when the peer is gone.
    socket: UnixStream,
    /// Set once the socket closed: the peer's process ended or dropped its link.
    peer_gone: bool,
    /// When an empty ring next makes a read look at the socket.
    check_socket_at: Instant,
    /// Declared last: the ring ends point into it, and fields drop in order.
    _segment: Segment,
}

impl std::fmt::Debug for ShmPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPipe")
            .field("peer_gone", &self.peer_gone)
            .finish_non_exhaustive()
    }
}

impl ShmPipe {
    /// The pipe over `segment`, to the peer at the other end of `socket`. The rank
    /// that created the segment writes ring 0 and reads ring 1; the other the reverse.
    pub(super) fn new(
        segment: Segment,
        created_here: bool,
        socket: UnixStream,
    ) -> io::Result<ShmPipe> {
        socket.set_nonblocking(true)?;
        let (out, back) = if created_here { (0, 1) } else { (1, 0) };
        Ok(ShmPipe {
            writer: segment.ring(out).writer(),
            reader: segment.ring(back).reader(),
            socket,
            peer_gone: false,
            check_socket_at: Instant::now(),
            _segment: segment,
        })
    }

    /// Copies as much of `slices` as the ring has room for; `WouldBlock` when it has
    /// none, `BrokenPipe` once the peer is gone.
    pub(crate) fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.peer_gone {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer's process closed its shared-memory pipe",
            ));
        }
        let (written, wake) = self.writer.write(slices).map_err(corrupt)?;
        if wake {
            self.wake();
        }
        if written == 0 && slices.iter().any(|s| !s.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(written)
    }

    /// Copies waiting bytes into `buf`; `WouldBlock` when there are none, `Ok(0)` once
    /// the peer is gone and all it wrote was read.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (read, wake) = self.reader.read(buf).map_err(corrupt)?;
        if wake {
            self.wake();
        }
        if read > 0 || buf.is_empty() {
            return Ok(read);
        }
        let now = Instant::now();
        if !self.peer_gone && now >= self.check_socket_at {
            self.check_socket_at = now + SOCKET_CHECK;
            self.drain_socket();
        }
        if self.peer_gone {
            // What the peer wrote before it closed its socket is in the ring now.
            return Ok(self.reader.read(buf).map_err(corrupt)?.0);
        }
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// The descriptor to sleep on in `poll(2)` for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Before sleeping in `poll(2)`: asks the peer to wake this rank when it writes
    /// (and, with `waiting_to_write`, when it frees room). Returns true when there is
    /// something to do already, in which case the caller must not sleep.
    pub(crate) fn prepare_sleep(&mut self, waiting_to_write: bool) -> bool {
        let mut ready = self.reader.prepare_sleep();
        if waiting_to_write {
            ready |= self.writer.prepare_sleep();
        }
        ready || self.peer_gone
    }

    /// After the sleep: no more wake-ups wanted, and the next empty read looks at the
    /// socket (the sleep may have ended because it closed).
    pub(crate) fn end_sleep(&mut self) {
        self.reader.end_sleep();
        self.writer.end_sleep();
        self.check_socket_at = Instant::now();
    }

    /// Reads the wake-up bytes off the socket; notes the peer's end.
    fn drain_socket(&mut self) {
        let mut bytes = [0u8; 64];
        loop {
            // SAFETY: a valid socket and buffer.
            let got = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    bytes.as_mut_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if got > 0 {
                continue;
            }
            if got == 0 {
                self.peer_gone = true;
                return;
            }
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return,
                _ => {
                    self.peer_gone = true;
                    return;
                }
            }
        }
    }

    /// Sends the host board's descriptor (`Some`), or word that there is none, to the
    /// peer: the first message on the socket after the hand-over, from rank 0 only.
    pub(super) fn send_board(&self, board: Option<BorrowedFd<'_>>) -> io::Result<()> {
        match board {
            Some(fd) => send_fd(&self.socket, &BOARD, fd),
            None => (&self.socket).write_all(&NO_BOARD),
        }
    }

    /// Receives what [`ShmPipe::send_board`] sent, waiting until `deadline`.
    pub(super) fn recv_board(&self, deadline: Instant) -> io::Result<Option<OwnedFd>> {
        loop {
            let mut word = [0u8; 4];
            match recv_fd(&self.socket, &mut word) {
                Ok((4, fd)) if word == BOARD && fd.is_some() => return Ok(fd),
                Ok((4, None)) if word == NO_BOARD => return Ok(None),
                Ok((0, _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed its socket before it shared the host board",
                    ));
                }
                Ok((got, _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{:02x?} where the host board was due", &word[..got.min(4)]),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no host board from rank 0 before the set-up deadline",
                        ));
                    }
                    let mut p = libc::pollfd {
                        fd: self.socket.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    let millis = left.as_millis().clamp(1, 100) as libc::c_int;
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, millis) };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Wakes the peer: one byte on the socket. A full socket already holds wake-ups
    /// and a closed one has nobody to wake, so errors are ignored.
    pub(crate) fn wake(&self) {
        // SAFETY: a valid socket and a one-byte buffer; MSG_NOSIGNAL: a closed peer
        // gives EPIPE, never SIGPIPE.
        unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }
}

fn corrupt(e: RingError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Two pipes over one segment and a socket pair, as the hand-over makes them.
    pub(super) fn pair(ring_bytes: usize) -> (ShmPipe, ShmPipe) {
        let (a, b) = UnixStream::pair().unwrap();
        let (mine, fd) = Segment::create(ring_bytes).unwrap();
        let theirs = Segment::open(fd).unwrap();
        (
            ShmPipe::new(mine, true, a).unwrap(),
            ShmPipe::new(theirs, false, b).unwrap(),
        )
    }

    #[test]
    fn bytes_cross_both_ways_and_a_full_ring_would_block() {
        let (mut a, mut b) = pair(64);
        assert_eq!(a.write_vectored(&[IoSlice::new(b"ping")]).unwrap(), 4);
        assert_eq!(b.write_vectored(&[IoSlice::new(b"pong!")]).unwrap(), 5);
        let mut buf = [0u8; 16];
        assert_eq!(b.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"ping");
        assert_eq!(a.read(&mut buf).unwrap(), 5);
        assert_eq!(
            a.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(a.write_vectored(&[IoSlice::new(&[7; 100])]).unwrap(), 64);
        assert_eq!(
            a.write_vectored(&[IoSlice::new(&[7; 1])])
                .unwrap_err()
                .kind(),
            io::ErrorKind::WouldBlock
        );
    }

    /// A peer that goes away after writing: its last bytes are read, then the end of
    /// the stream (0), and writing to it fails.
    #[test]
    fn a_departed_peer_leaves_its_last_bytes_then_the_end() {
        let (mut a, mut b) = pair(64);
        a.write_vectored(&[IoSlice::new(b"last words")]).unwrap();
        drop(a);
        let mut buf = [0u8; 4];
        let mut got = Vec::new();
        loop {
            match b.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(SOCKET_CHECK),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, b"last words");
        assert_eq!(
            b.write_vectored(&[IoSlice::new(b"x")]).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    /// A sleeper on the socket is woken by a write into its ring, and by the peer's end.
    #[test]
    fn a_sleeping_reader_is_woken_by_a_write_and_by_the_end() {
        let (mut a, mut b) = pair(64);
        assert!(!b.prepare_sleep(false));
        a.write_vectored(&[IoSlice::new(b"hi")]).unwrap();
        assert!(poll_in(b.fd(), 5000), "no wake-up after a write");
        b.end_sleep();
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).unwrap(), 2);
        // The wake-up byte was read off with the empty ring's look at the socket.
        assert!(b.read(&mut buf).is_err());
        assert!(!poll_in(b.fd(), 0));
        drop(a);
        assert!(poll_in(b.fd(), 5000), "no wake-up at the peer's end");
    }

    fn poll_in(fd: RawFd, millis: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, millis) == 1 }
    }
}
