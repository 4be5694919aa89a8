//! The bytes both tracker protocols share: the magic, little-endian `i32`s,
//! length-prefixed strings (classic) and length-prefixed JSON frames (XGBoost 2.1+),
//! read under a deadline and a cap.
//!
//! Encoding is pure (`put_*` append to a buffer); decoding reads from a stream through
//! [`Deadline`] (on the network floor's `DeadlineStream`), so every read of every connection has a time limit and every length a
//! cap. Errors name what was being read, so a dropped connection can be logged with a
//! reason.

use std::io;
use std::net::TcpStream;
use std::time::Duration;
use switchyard_net::stream::{DeadlineStream, StreamError};

/// The magic both sides send first on every tracker connection (`99 ff 00 00`).
pub const MAGIC: i32 = 0xFF99;

/// Caps on what a peer may make us read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest string (task id, command, host, `print` text) in bytes. Default 64 KiB.
    pub max_str: usize,
    /// Longest JSON frame in bytes. Default 1 MiB (real frames are under 100 bytes
    /// plus the task id and `print` text).
    pub max_frame: usize,
    /// Most ranks in one good-link list or link map. Default 4096.
    pub max_list: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_str: 64 << 10,
            max_frame: 1 << 20,
            max_list: 4096,
        }
    }
}

/// Why a read or write on a tracker connection failed. Each variant names the field
/// (`what`) being read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The peer closed the connection.
    #[error("connection closed while reading {what}")]
    Closed {
        /// The field being read.
        what: &'static str,
    },
    /// The deadline passed.
    #[error("no {what} within {waited:?}")]
    TimedOut {
        /// The field being read.
        what: &'static str,
        /// How long we waited.
        waited: Duration,
    },
    /// The first four bytes were not [`MAGIC`].
    #[error("wrong magic {got:#x} (expected {MAGIC:#x})")]
    BadMagic {
        /// What came instead.
        got: i32,
    },
    /// A tracker opened with the job secret's challenge where its magic belongs: it
    /// requires the job secret, and this process has none.
    #[error(
        "the tracker requires the job secret (it sent the secret's challenge instead of its \
         magic): set SWITCHYARD_JOB_SECRET or SWITCHYARD_JOB_SECRET_FILE as for the tracker"
    )]
    SecretRequired,
    /// A length prefix below zero.
    #[error("negative length {len} for {what}")]
    NegativeLength {
        /// The field being read.
        what: &'static str,
        /// The length received.
        len: i32,
    },
    /// A length prefix above the cap in [`Limits`].
    #[error("length {len} for {what} is over the cap of {cap} bytes")]
    TooLong {
        /// The field being read.
        what: &'static str,
        /// The length received.
        len: i64,
        /// The cap.
        cap: usize,
    },
    /// A string that is not UTF-8.
    #[error("{what} is not UTF-8")]
    NotUtf8 {
        /// The field being read.
        what: &'static str,
    },
    /// A JSON frame that does not parse or lacks a field of the right type.
    #[error("bad JSON in {what}: {reason}")]
    BadJson {
        /// The frame being read.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Any other I/O error.
    #[error("I/O error while {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// Maps the floor's errors onto the tracker's own, whose variants and wording tracker
/// users and tests match.
impl From<StreamError> for WireError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::Closed { what, .. } => WireError::Closed { what },
            StreamError::TimedOut { what, waited, .. } => WireError::TimedOut { what, waited },
            StreamError::BadMagic { got, .. } => WireError::BadMagic {
                got: i32::from_le_bytes(got),
            },
            StreamError::TooLong { what, len, cap, .. } => WireError::TooLong {
                what,
                len: i64::try_from(len).unwrap_or(i64::MAX),
                cap: usize::try_from(cap).unwrap_or(usize::MAX),
            },
            StreamError::NotUtf8 { what, .. } => WireError::NotUtf8 { what },
            StreamError::Io { what, source, .. } => WireError::Io { what, source },
            // The floor's error may grow; its text still says what happened.
            other => WireError::Io {
                what: "reading",
                source: io::Error::other(other.to_string()),
            },
        }
    }
}

/// A stream whose reads share one deadline: each read waits at most the time left.
/// The tracker's face of the network floor's [`DeadlineStream`], with the tracker's
/// `i32` length prefixes and [`WireError`].
#[derive(Debug)]
pub struct Deadline<'a> {
    inner: DeadlineStream<'a>,
}

impl<'a> Deadline<'a> {
    /// Reads from `stream` must all finish within `limit` from now.
    pub fn new(stream: &'a TcpStream, limit: Duration) -> Self {
        Deadline {
            inner: DeadlineStream::new(stream, limit),
        }
    }

    /// Fills `buf` completely, or fails naming `what`.
    pub fn read_exact(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), WireError> {
        Ok(self.inner.read_exact(buf, what)?)
    }

    /// One little-endian `i32`.
    pub fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        Ok(self.inner.i32(what)?)
    }

    /// The magic; anything else is [`WireError::BadMagic`].
    pub fn magic(&mut self) -> Result<(), WireError> {
        self.inner.magic(&[MAGIC.to_le_bytes()])?;
        Ok(())
    }

    /// A length prefix in `0..=cap`.
    pub fn length(&mut self, what: &'static str, cap: usize) -> Result<usize, WireError> {
        let len = self.i32(what)?;
        if len < 0 {
            return Err(WireError::NegativeLength { what, len });
        }
        let len = len as usize;
        if len > cap {
            return Err(WireError::TooLong {
                what,
                len: len as i64,
                cap,
            });
        }
        Ok(len)
    }

    /// A classic string: `i32` length, then that many UTF-8 bytes.
    pub fn str(&mut self, what: &'static str, cap: usize) -> Result<String, WireError> {
        let bytes = self.bytes(what, cap)?;
        Ok(self.inner.utf8(what, bytes)?)
    }

    /// A length-prefixed byte string (a JSON frame's body).
    pub fn bytes(&mut self, what: &'static str, cap: usize) -> Result<Vec<u8>, WireError> {
        let len = self.length(what, cap)?;
        self.exact(what, len)
    }

    /// Exactly `len` bytes (a body whose length was read and checked already).
    pub fn exact(&mut self, what: &'static str, len: usize) -> Result<Vec<u8>, WireError> {
        Ok(self.inner.bytes(what, len)?)
    }

    /// A JSON frame parsed as `T`.
    pub fn json<T: serde::de::DeserializeOwned>(
        &mut self,
        what: &'static str,
        cap: usize,
    ) -> Result<T, WireError> {
        let body = self.bytes(what, cap)?;
        serde_json::from_slice(&body).map_err(|e| WireError::BadJson {
            what,
            reason: e.to_string(),
        })
    }
}

/// Appends a little-endian `i32`.
pub fn put_i32(buf: &mut Vec<u8>, v: i32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

/// Appends a classic string (byte count, then the bytes).
pub fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_i32(buf, s.len() as i32);
    buf.extend_from_slice(s.as_bytes());
}

/// Appends a JSON frame: byte count, then compact JSON text.
pub fn put_json<T: serde::Serialize>(buf: &mut Vec<u8>, value: &T) {
    // Serializing our own plain structs cannot fail.
    let body = serde_json::to_vec(value).unwrap_or_default();
    put_i32(buf, body.len() as i32);
    buf.extend_from_slice(&body);
}

/// Writes all of `buf` within `limit`.
pub fn write_all_within(
    stream: &TcpStream,
    buf: &[u8],
    limit: Duration,
    what: &'static str,
) -> Result<(), WireError> {
    // A zero limit still tries once, as a socket timeout of zero cannot be set.
    let limit = limit.max(Duration::from_millis(1));
    DeadlineStream::new(stream, limit)
        .write_all(buf, what)
        .map_err(|e| match e {
            // The limit, not the time spent, as the tracker always said.
            StreamError::TimedOut { what, .. } => WireError::TimedOut {
                what,
                waited: limit,
            },
            e => e.into(),
        })
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
    fn strings_round_trip_and_caps_hold() {
        let (a, b) = pair();
        let mut buf = Vec::new();
        put_i32(&mut buf, MAGIC);
        put_str(&mut buf, "start");
        put_i32(&mut buf, -5);
        put_i32(&mut buf, 1 << 30);
        write_all_within(&a, &buf, Duration::from_secs(1), "test").unwrap();
        let mut r = Deadline::new(&b, Duration::from_secs(2));
        r.magic().unwrap();
        assert_eq!(r.str("command", 16).unwrap(), "start");
        assert!(matches!(
            r.str("task id", 16),
            Err(WireError::NegativeLength { len: -5, .. })
        ));
        assert!(matches!(
            r.str("task id", 16),
            Err(WireError::TooLong { cap: 16, .. })
        ));
    }

    #[test]
    fn a_silent_peer_times_out_and_a_closed_one_is_named() {
        let (a, b) = pair();
        let mut r = Deadline::new(&b, Duration::from_millis(50));
        assert!(matches!(
            r.i32("rank"),
            Err(WireError::TimedOut { what: "rank", .. })
        ));
        drop(a);
        let mut r = Deadline::new(&b, Duration::from_secs(2));
        assert!(matches!(
            r.i32("rank"),
            Err(WireError::Closed { what: "rank" })
        ));
    }
}
