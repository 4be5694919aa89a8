//! Length-checked reads and writes under a deadline, on one bootstrap stream.

use super::{IdError, MAX_TEXT};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Reads and writes with deadlines on one stream.
pub(super) struct Wire<'a> {
    pub(super) stream: &'a TcpStream,
    pub(super) peer: String,
    pub(super) until: Instant,
}

impl Wire<'_> {
    pub(super) fn fail(&self, reason: impl Into<String>) -> IdError {
        IdError::Protocol {
            peer: self.peer.clone(),
            reason: reason.into(),
        }
    }

    pub(super) fn arm(&self) -> Result<(), IdError> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.fail("timed out"));
        }
        self.stream
            .set_read_timeout(Some(left))
            .and_then(|_| self.stream.set_write_timeout(Some(left)))
            .map_err(|e| self.fail(e.to_string()))
    }

    pub(super) fn read(&self, buf: &mut [u8]) -> Result<(), IdError> {
        self.arm()?;
        let mut s = self.stream;
        s.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => self.fail("closed the connection"),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                self.fail("silent until the timeout")
            }
            _ => self.fail(e.to_string()),
        })
    }

    pub(super) fn u32(&self) -> Result<u32, IdError> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub(super) fn u64(&self) -> Result<u64, IdError> {
        let mut b = [0u8; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub(super) fn magic(&self, want: [u8; 4]) -> Result<(), IdError> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        if b != want {
            // A root or ring neighbour with a job secret opens with its challenge.
            let hint = if switchyard_secret::looks_like_challenge(&b) {
                " (the peer expects a job secret: set the same SWITCHYARD_JOB_SECRET or \
                 SWITCHYARD_JOB_SECRET_FILE as the other ranks)"
            } else {
                ""
            };
            return Err(self.fail(format!("bad magic {b:02x?}{hint}")));
        }
        Ok(())
    }

    pub(super) fn text(&self) -> Result<String, IdError> {
        let len = self.u32()?;
        if len > MAX_TEXT {
            return Err(self.fail(format!("string of {len} bytes, over {MAX_TEXT}")));
        }
        let mut b = vec![0u8; len as usize];
        self.read(&mut b)?;
        String::from_utf8(b).map_err(|_| self.fail("string is not UTF-8"))
    }

    pub(super) fn write(&self, bytes: &[u8]) -> Result<(), IdError> {
        self.arm()?;
        let mut s = self.stream;
        s.write_all(bytes).map_err(|e| self.fail(e.to_string()))
    }
}

pub(super) fn put_text(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}
