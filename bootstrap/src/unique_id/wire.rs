//! The unique-id bootstrap's face of the network floor: reads and writes of one stream
//! under one deadline, failing as [`IdError::Protocol`] naming the peer.

use super::{IdError, MAX_TEXT};
use std::net::TcpStream;
use std::time::Instant;
use switchyard_net::stream::{DeadlineStream, StreamError};

pub(super) use switchyard_net::stream::put_text;

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

    fn floor(&self) -> DeadlineStream<'_> {
        DeadlineStream::until(self.stream, self.until).with_peer(&self.peer)
    }

    /// The floor's error as this protocol's, its words kept: `ring_closed` and the
    /// ring's accept loop tell a departed neighbour by "closed the connection".
    fn lift(&self, e: StreamError) -> IdError {
        let reason = match &e {
            StreamError::BadMagic { got, .. } if switchyard_secret::looks_like_challenge(got) => {
                // A root or ring neighbour with a job secret opens with its challenge.
                format!(
                    "{} (the peer expects a job secret: set the same SWITCHYARD_JOB_SECRET \
                     or SWITCHYARD_JOB_SECRET_FILE as the other ranks)",
                    e.reason()
                )
            }
            _ => e.reason(),
        };
        self.fail(reason)
    }

    pub(super) fn u32(&self, what: &'static str) -> Result<u32, IdError> {
        self.floor().u32(what).map_err(|e| self.lift(e))
    }

    pub(super) fn u64(&self, what: &'static str) -> Result<u64, IdError> {
        self.floor().u64(what).map_err(|e| self.lift(e))
    }

    pub(super) fn magic(&self, want: [u8; 4]) -> Result<(), IdError> {
        self.floor()
            .magic(&[want])
            .map(|_| ())
            .map_err(|e| self.lift(e))
    }

    pub(super) fn text(&self, what: &'static str) -> Result<String, IdError> {
        self.floor().text(what, MAX_TEXT).map_err(|e| self.lift(e))
    }

    pub(super) fn write(&self, bytes: &[u8], what: &'static str) -> Result<(), IdError> {
        self.floor()
            .write_all(bytes, what)
            .map_err(|e| self.lift(e))
    }
}
