//! Reads and writes on one `TcpStream` under one deadline.
//!
//! A set-up protocol reads a handful of small fields from a peer that may be slow,
//! silent, gone or not a switchyard process at all. [`DeadlineStream`] bounds every read
//! and write of one exchange by the same instant (each system call waits at most the
//! time left, so a peer trickling one byte at a time cannot stretch it), checks every
//! length against a cap before it allocates, and names the field being read and the
//! peer in its [`StreamError`]. The wire formats themselves (which fields, which
//! magic) stay with each protocol.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Why a read or write under a deadline failed. Every variant names the peer and,
/// except a wrong magic, the field (`what`) being read or written.
#[derive(Debug)]
#[non_exhaustive]
pub enum StreamError {
    /// The peer closed or reset the connection.
    Closed {
        /// The field being read or written.
        what: &'static str,
        /// Who the peer is.
        peer: String,
    },
    /// The deadline passed.
    TimedOut {
        /// The field being read or written.
        what: &'static str,
        /// Who the peer is.
        peer: String,
        /// How long this stream had waited by then.
        waited: Duration,
    },
    /// The four bytes where a magic belongs were none of those allowed.
    BadMagic {
        /// Who the peer is.
        peer: String,
        /// What came instead.
        got: [u8; 4],
        /// The magic expected (the first of those allowed).
        expected: [u8; 4],
    },
    /// A length prefix above its cap.
    TooLong {
        /// The field being read.
        what: &'static str,
        /// Who the peer is.
        peer: String,
        /// The length received.
        len: u64,
        /// The cap.
        cap: u64,
    },
    /// Text that is not UTF-8.
    NotUtf8 {
        /// The field being read.
        what: &'static str,
        /// Who the peer is.
        peer: String,
    },
    /// Any other I/O error.
    Io {
        /// The field being read or written.
        what: &'static str,
        /// Who the peer is.
        peer: String,
        /// The error.
        source: io::Error,
    },
}

impl StreamError {
    /// Who the peer is: the name the stream was given, else its address.
    pub fn peer(&self) -> &str {
        match self {
            StreamError::Closed { peer, .. }
            | StreamError::TimedOut { peer, .. }
            | StreamError::BadMagic { peer, .. }
            | StreamError::TooLong { peer, .. }
            | StreamError::NotUtf8 { peer, .. }
            | StreamError::Io { peer, .. } => peer,
        }
    }

    /// What went wrong, without the peer: for a caller whose own error names the peer
    /// in a field of its own.
    pub fn reason(&self) -> String {
        match self {
            StreamError::Closed { what, .. } => {
                format!("closed the connection at the {what}")
            }
            StreamError::TimedOut { what, waited, .. } => {
                format!("no {what} within {waited:?}")
            }
            StreamError::BadMagic { got, expected, .. } => {
                format!("bad magic {got:02x?}, expected {expected:02x?}")
            }
            StreamError::TooLong { what, len, cap, .. } => {
                format!("{what} of {len} bytes is over the cap of {cap}")
            }
            StreamError::NotUtf8 { what, .. } => format!("{what} is not UTF-8"),
            StreamError::Io { what, source, .. } => format!("{what}: {source}"),
        }
    }
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.peer(), self.reason())
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StreamError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A stream whose reads and writes share one deadline.
///
/// Reading takes `&self`: `&TcpStream` reads and writes, so one `DeadlineStream` can
/// be borrowed by helpers that build errors while a read is being composed.
///
/// # Examples
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use switchyard_net::stream::{DeadlineStream, StreamError};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let ours = TcpStream::connect(listener.local_addr()?)?;
/// let (theirs, _) = listener.accept()?;
/// let mut frame = b"DEMO".to_vec();
/// switchyard_net::stream::put_text(&mut frame, "tcp://10.0.0.1:5000");
/// DeadlineStream::new(&theirs, Duration::from_secs(5)).write_all(&frame, "frame")?;
///
/// let r = DeadlineStream::new(&ours, Duration::from_secs(5)).with_peer("the demo peer");
/// r.magic(&[*b"DEMO"])?;
/// assert_eq!(r.text("endpoint", 1024)?, "tcp://10.0.0.1:5000");
/// // Nothing more comes: the same deadline bounds the next read.
/// let r = DeadlineStream::new(&ours, Duration::from_millis(20)).with_peer("the demo peer");
/// assert!(matches!(r.u32("rank"), Err(StreamError::TimedOut { what: "rank", .. })));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeadlineStream<'a> {
    stream: &'a TcpStream,
    peer: Option<&'a str>,
    started: Instant,
    until: Instant,
}

impl<'a> DeadlineStream<'a> {
    /// Reads and writes on `stream` must all finish within `limit` from now.
    pub fn new(stream: &'a TcpStream, limit: Duration) -> Self {
        let started = Instant::now();
        DeadlineStream {
            stream,
            peer: None,
            started,
            until: started.checked_add(limit).unwrap_or(started + LONGEST),
        }
    }

    /// Reads and writes on `stream` must all finish by `until`.
    pub fn until(stream: &'a TcpStream, until: Instant) -> Self {
        DeadlineStream {
            stream,
            peer: None,
            started: Instant::now(),
            until,
        }
    }

    /// Names the peer in errors (by default, its socket address).
    pub fn with_peer(mut self, peer: &'a str) -> Self {
        self.peer = Some(peer);
        self
    }

    /// The stream read and written.
    pub fn stream(&self) -> &'a TcpStream {
        self.stream
    }

    /// The instant every read and write must finish by.
    pub fn deadline(&self) -> Instant {
        self.until
    }

    fn peer_name(&self) -> String {
        match self.peer {
            Some(p) => p.to_string(),
            None => self
                .stream
                .peer_addr()
                .map_or_else(|_| "?".to_string(), |a| a.to_string()),
        }
    }

    fn timed_out(&self, what: &'static str) -> StreamError {
        StreamError::TimedOut {
            what,
            peer: self.peer_name(),
            waited: self.started.elapsed(),
        }
    }

    fn io(&self, what: &'static str, source: io::Error) -> StreamError {
        StreamError::Io {
            what,
            peer: self.peer_name(),
            source,
        }
    }

    /// The time left, or [`StreamError::TimedOut`] when none is.
    fn left(&self, what: &'static str) -> Result<Duration, StreamError> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.timed_out(what));
        }
        Ok(left)
    }

    /// Fills `buf` completely, or fails naming `what`.
    pub fn read_exact(&self, buf: &mut [u8], what: &'static str) -> Result<(), StreamError> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = self.left(what)?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.io(what, e))?;
            match (&mut &*self.stream).read(&mut buf[filled..]) {
                Ok(0) => return Err(self.closed(what)),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(self.timed_out(what)),
                Err(e) if is_closed(&e) => return Err(self.closed(what)),
                Err(e) => return Err(self.io(what, e)),
            }
        }
        Ok(())
    }

    fn closed(&self, what: &'static str) -> StreamError {
        StreamError::Closed {
            what,
            peer: self.peer_name(),
        }
    }

    /// Writes all of `bytes`, or fails naming `what`.
    pub fn write_all(&self, bytes: &[u8], what: &'static str) -> Result<(), StreamError> {
        let mut written = 0;
        while written < bytes.len() {
            let left = self.left(what)?;
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|e| self.io(what, e))?;
            match (&mut &*self.stream).write(&bytes[written..]) {
                Ok(0) => return Err(self.closed(what)),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(self.timed_out(what)),
                Err(e) if is_closed(&e) => return Err(self.closed(what)),
                Err(e) => return Err(self.io(what, e)),
            }
        }
        Ok(())
    }

    /// One little-endian `u32`.
    pub fn u32(&self, what: &'static str) -> Result<u32, StreamError> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    /// One little-endian `i32`.
    pub fn i32(&self, what: &'static str) -> Result<i32, StreamError> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b, what)?;
        Ok(i32::from_le_bytes(b))
    }

    /// One little-endian `u64`.
    pub fn u64(&self, what: &'static str) -> Result<u64, StreamError> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Four bytes that must be one of `allowed`; returns which. Anything else is
    /// [`StreamError::BadMagic`], whose `got` a caller can inspect (a job secret's
    /// challenge where a magic belongs deserves its own message).
    pub fn magic(&self, allowed: &[[u8; 4]]) -> Result<[u8; 4], StreamError> {
        let mut got = [0u8; 4];
        self.read_exact(&mut got, "magic")?;
        if allowed.contains(&got) {
            return Ok(got);
        }
        Err(StreamError::BadMagic {
            peer: self.peer_name(),
            got,
            expected: allowed.first().copied().unwrap_or_default(),
        })
    }

    /// Checks a length against its cap, naming `what`.
    pub fn check_len(&self, what: &'static str, len: u64, cap: u64) -> Result<(), StreamError> {
        if len > cap {
            return Err(StreamError::TooLong {
                what,
                peer: self.peer_name(),
                len,
                cap,
            });
        }
        Ok(())
    }

    /// Exactly `len` bytes (a body whose length was read and checked already). The
    /// buffer grows as bytes arrive: a large but allowed length that never comes costs
    /// nothing up front.
    pub fn bytes(&self, what: &'static str, len: usize) -> Result<Vec<u8>, StreamError> {
        let mut out = Vec::with_capacity(len.min(CHUNK));
        let mut chunk = [0u8; CHUNK];
        while out.len() < len {
            let n = (len - out.len()).min(CHUNK);
            self.read_exact(&mut chunk[..n], what)?;
            out.extend_from_slice(&chunk[..n]);
        }
        Ok(out)
    }

    /// Text as [`put_text`] writes it: a little-endian `u32` byte count of at most
    /// `cap`, then that many UTF-8 bytes.
    pub fn text(&self, what: &'static str, cap: u32) -> Result<String, StreamError> {
        let len = self.u32(what)?;
        self.check_len(what, u64::from(len), u64::from(cap))?;
        self.utf8(what, self.bytes(what, len as usize)?)
    }

    /// `bytes` as a `String`, or [`StreamError::NotUtf8`] naming `what`.
    pub fn utf8(&self, what: &'static str, bytes: Vec<u8>) -> Result<String, StreamError> {
        String::from_utf8(bytes).map_err(|_| StreamError::NotUtf8 {
            what,
            peer: self.peer_name(),
        })
    }
}

/// Appends text as [`DeadlineStream::text`] reads it: a little-endian `u32` byte
/// count, then the bytes. Callers cap their texts far below `u32::MAX`.
pub fn put_text(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Read in pieces of this size, so that a claimed length allocates only what arrives.
const CHUNK: usize = 4096;

/// A limit so far off that it stands for none (`Instant` cannot hold every `Duration`).
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn fields_round_trip_and_caps_hold() {
        let (a, b) = pair();
        let mut buf = b"ABCD".to_vec();
        buf.extend_from_slice(&7u32.to_le_bytes());
        buf.extend_from_slice(&(-3i32).to_le_bytes());
        buf.extend_from_slice(&u64::MAX.to_le_bytes());
        put_text(&mut buf, "hello");
        put_text(&mut buf, "far too long");
        buf.extend_from_slice(b"WXYZ");
        DeadlineStream::new(&a, Duration::from_secs(1))
            .write_all(&buf, "test")
            .unwrap();
        let r = DeadlineStream::new(&b, Duration::from_secs(2)).with_peer("peer 1");
        assert_eq!(r.magic(&[*b"SYRV", *b"ABCD"]).unwrap(), *b"ABCD");
        assert_eq!(r.u32("rank").unwrap(), 7);
        assert_eq!(r.i32("port").unwrap(), -3);
        assert_eq!(r.u64("tag").unwrap(), u64::MAX);
        assert_eq!(r.text("host", 5).unwrap(), "hello");
        let e = r.text("endpoint", 5).unwrap_err();
        assert!(
            matches!(
                e,
                StreamError::TooLong {
                    what: "endpoint",
                    len: 12,
                    cap: 5,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().starts_with("peer 1: "), "{e}");
        r.bytes("rest", 12).unwrap();
        let e = r.magic(&[*b"SYRV"]).unwrap_err();
        assert!(
            matches!(e, StreamError::BadMagic { got, expected, .. } if got == *b"WXYZ" && expected == *b"SYRV"),
            "{e}"
        );
    }

    #[test]
    fn a_silent_peer_times_out_and_a_closed_one_is_named() {
        let (a, b) = pair();
        let r = DeadlineStream::new(&b, Duration::from_millis(50));
        let e = r.u32("rank").unwrap_err();
        assert!(
            matches!(e, StreamError::TimedOut { what: "rank", .. }),
            "{e}"
        );
        // Unnamed, the peer is its address.
        assert!(e.peer().starts_with("127.0.0.1:"), "{e}");
        drop(a);
        let r = DeadlineStream::new(&b, Duration::from_secs(2));
        assert!(matches!(
            r.u32("rank"),
            Err(StreamError::Closed { what: "rank", .. })
        ));
    }

    #[test]
    fn a_passed_deadline_fails_before_reading() {
        let (_a, b) = pair();
        let r = DeadlineStream::until(&b, Instant::now());
        assert!(matches!(
            r.u64("tag"),
            Err(StreamError::TimedOut { what: "tag", .. })
        ));
    }
}
