//! The links of a finished classic join, watched while the worker still uses them.
//!
//! After its join a switchyard worker sends its mesh endpoint round the tracker's ring
//! (the endpoint exchange) before it drops the links. A peer that leaves during that
//! exchange (it died, or its own exchange failed) must fail this worker's at once: a
//! worker whose ring successor left, waiting for its predecessor, would otherwise wait
//! out its whole limit, while the successor's next process, which the tracker has told
//! to accept a link from this worker, waits for it to rejoin. Both limits then run out
//! at different times, each failure breaking the next set of links that formed, so a
//! recovery could go on failing until its timeout.
//!
//! Only the link being read carries data in the exchange; on every other link the
//! peer sends nothing but, once its exchange is over, one [`DONE`] byte. So a link
//! with something to read is either a peer that finished (it sent [`DONE`], then may
//! close: not a failure) or a peer that left (the connection closed or reset without
//! it).

use crate::client::ClientError;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The byte a worker sends on each link of its join once its endpoint exchange is
/// over, before it closes them: its peers then know the close is not a failure.
pub const DONE: u8 = 0xd0;

/// How often the other links are looked at while waiting on one.
const POLL: Duration = Duration::from_millis(2);

/// How long [`WatchedLinks::finish`] may take to send [`DONE`] on one link (a byte
/// into an idle connection's buffer: at once unless the peer is gone).
const DONE_LIMIT: Duration = Duration::from_millis(100);

/// A finished join's links by peer rank, watched for peers that leave; see the
/// module documentation.
#[derive(Debug, Default)]
pub struct WatchedLinks {
    links: BTreeMap<u32, TcpStream>,
    /// Peers that sent [`DONE`]: their links are no longer watched.
    finished: BTreeSet<u32>,
}

impl WatchedLinks {
    /// Watches `links` (one stream per peer rank, as a join returns them).
    pub fn new(links: BTreeMap<u32, TcpStream>) -> WatchedLinks {
        WatchedLinks {
            links,
            finished: BTreeSet::new(),
        }
    }

    /// Waits until `stream` has something to read (data, or its end), or `until`
    /// passes, whichever is first: the caller's read then says which. Every link
    /// except `reading` (the rank `stream` leads to, if it is one of these links) is
    /// looked at meanwhile.
    ///
    /// # Errors
    ///
    /// [`ClientError::LinkClosed`] as soon as a watched link closes before its peer
    /// said [`DONE`]; [`ClientError::PeerIo`] if a peer sends anything else on it.
    pub fn wait_readable(
        &mut self,
        stream: &TcpStream,
        reading: Option<u32>,
        until: Instant,
    ) -> Result<(), ClientError> {
        let mut byte = [0u8; 1];
        loop {
            self.check(reading)?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            stream
                .set_read_timeout(Some(left.min(POLL)))
                .map_err(|source| ClientError::PeerIo {
                    what: "setting a read timeout",
                    source,
                })?;
            match stream.peek(&mut byte) {
                Err(e) if waiting(&e) => {}
                // Data, the end, or an error: the caller's read reports it.
                _ => return Ok(()),
            }
        }
    }

    /// Looks once at every link except `reading`'s.
    ///
    /// # Errors
    ///
    /// As [`wait_readable`](Self::wait_readable).
    pub fn check(&mut self, reading: Option<u32>) -> Result<(), ClientError> {
        for (&rank, stream) in &self.links {
            if Some(rank) == reading || self.finished.contains(&rank) {
                continue;
            }
            match take_byte(stream) {
                Ok(None) => {}
                Ok(Some(DONE)) => {
                    self.finished.insert(rank);
                }
                Ok(Some(other)) => {
                    return Err(ClientError::PeerIo {
                        what: "watching a link after the join",
                        source: io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "rank {rank} sent byte {other:#04x} where only its done \
                                 mark ({DONE:#04x}) may come"
                            ),
                        ),
                    });
                }
                Err(_) => {
                    return Err(ClientError::LinkClosed {
                        rank,
                        during: "during the endpoint exchange",
                    });
                }
            }
        }
        Ok(())
    }

    /// Tells every peer this worker is done with its links ([`DONE`]), then closes
    /// them. A peer already gone is skipped.
    pub fn finish(&mut self) {
        for stream in std::mem::take(&mut self.links).into_values() {
            if stream.set_write_timeout(Some(DONE_LIMIT)).is_ok() {
                let _ = (&stream).write_all(&[DONE]);
            }
        }
    }
}

/// A read that waits, not one that failed.
fn waiting(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// The byte waiting on `stream`, taken; `None` when nothing waits. An error when the
/// connection is over (closed or reset).
fn take_byte(stream: &TcpStream) -> io::Result<Option<u8>> {
    stream.set_nonblocking(true)?;
    let mut byte = [0u8; 1];
    let got = (&*stream).read(&mut byte);
    stream.set_nonblocking(false)?;
    match got {
        Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(_) => Ok(Some(byte[0])),
        Err(e) if waiting(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
