//! Serving the opening handshakes of many connections at once.
//!
//! A set-up listener (the unique-id root, its ring listeners, the launcher's
//! rendezvous, the collectives' data listeners) reads a handshake from each connection it accepts:
//! the job secret's challenge-response and a hello or check-in. Read one connection
//! after another, a stranger that connects and says nothing holds every real rank
//! behind it for the handshake's whole deadline, and a few of them outlast a rank's
//! patience. Here each accepted connection's handshake runs on its own thread with
//! its own deadline, and its outcome comes back to the listener's loop in the order
//! the handshakes end: a silent stranger delays nobody.
//!
//! At most `limit` handshakes run at once; one more evicts the oldest (its socket is
//! shut down, which ends its read at once), so that a flood of idle connections costs
//! bounded threads and still leaves the newest, a real rank's among them, served.

use crossbeam_channel::{Receiver, Sender};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// How many handshakes run at once by default.
pub const DEFAULT_LIMIT: usize = 256;

/// One connection's handshake, ended.
#[derive(Debug)]
pub struct Done<T> {
    /// Who connected.
    pub peer: SocketAddr,
    /// What the handshake gave, or why it failed.
    pub result: Result<T, String>,
}

/// The handshakes running, and the outcomes not yet taken.
#[derive(Debug)]
pub struct Handshakes<T> {
    tx: Sender<(u64, Done<T>)>,
    rx: Receiver<(u64, Done<T>)>,
    /// The running handshakes' sockets (clones), oldest first, to evict.
    running: VecDeque<(u64, TcpStream)>,
    next_id: u64,
    limit: usize,
    /// Handshakes closed to make room, for the log.
    evicted: u64,
}

impl<T: Send + 'static> Handshakes<T> {
    /// At most `limit` (at least 1) handshakes at once.
    pub fn new(limit: usize) -> Handshakes<T> {
        let (tx, rx) = crossbeam_channel::unbounded();
        Handshakes {
            tx,
            rx,
            running: VecDeque::new(),
            next_id: 0,
            limit: limit.max(1),
            evicted: 0,
        }
    }

    /// Runs `work` on `stream` (accepted from `peer`) on a thread of its own. `work`
    /// must bound its own reads: its deadline is the connection's.
    pub fn start(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        work: impl FnOnce(TcpStream) -> Result<T, String> + Send + 'static,
    ) {
        // An accepted socket may inherit the listener's non-blocking mode.
        let _ = stream.set_nonblocking(false);
        let Ok(handle) = stream.try_clone() else {
            tracing::warn!(%peer, "bootstrap: cannot share an accepted socket; closed");
            return;
        };
        while self.running.len() >= self.limit {
            if let Some((_, oldest)) = self.running.pop_front() {
                self.evicted += 1;
                // A flood would log a line per connection: the 1st, 2nd, 4th, ... only.
                if self.evicted.is_power_of_two() {
                    tracing::warn!(peer = ?oldest.peer_addr().ok(), limit = self.limit,
                        evicted = self.evicted,
                        "bootstrap: too many handshakes at once; the oldest closed");
                }
                let _ = oldest.shutdown(Shutdown::Both);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let tx = self.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("sy-handshake".into())
            .spawn(move || {
                let result = work(stream);
                let _ = tx.send((id, Done { peer, result }));
            });
        match spawned {
            Ok(_) => self.running.push_back((id, handle)),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bootstrap: no thread for a handshake; closed");
                let _ = handle.shutdown(Shutdown::Both);
            }
        }
    }

    /// The next handshake to end, waiting at most `wait`.
    pub fn next(&mut self, wait: Duration) -> Option<Done<T>> {
        let (id, done) = self.rx.recv_timeout(wait).ok()?;
        self.running.retain(|(i, _)| *i != id);
        Some(done)
    }

    /// How many handshakes are still running.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }
}

/// Accepts every connection pending on the non-blocking `listener` and starts its
/// handshake (`work`) in `handshakes`.
pub fn accept_all<T: Send + 'static>(
    listener: &TcpListener,
    handshakes: &mut Handshakes<T>,
    work: impl Fn(TcpStream, SocketAddr) -> Result<T, String> + Clone + Send + 'static,
) {
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let work = work.clone();
                handshakes.start(stream, peer, move |s| work(s, peer));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::warn!(error = %e, "bootstrap accept failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    fn read_byte(mut s: TcpStream) -> Result<u8, String> {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(b[0])
    }

    /// Idle connections before a speaking one do not delay it, and over the limit
    /// the oldest are closed.
    #[test]
    fn a_speaker_is_served_past_idle_connections_and_the_oldest_are_evicted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let idle: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut speaker = TcpStream::connect(addr).unwrap();
        speaker.write_all(&[42]).unwrap();
        let mut hs = Handshakes::new(4);
        for _ in 0..7 {
            let (s, p) = listener.accept().unwrap();
            hs.start(s, p, read_byte);
        }
        let started = Instant::now();
        let mut got = None;
        let mut failed = 0;
        while got.is_none() && started.elapsed() < Duration::from_secs(5) {
            if let Some(done) = hs.next(Duration::from_millis(50)) {
                match done.result {
                    Ok(b) => got = Some(b),
                    Err(_) => failed += 1,
                }
            }
        }
        assert_eq!(got, Some(42));
        // Waiting behind an idle one would cost its 10 s read timeout.
        assert!(started.elapsed() < Duration::from_secs(8));
        // Three of the six idle ones were evicted to keep four running.
        while failed < 3 && started.elapsed() < Duration::from_secs(5) {
            if hs.next(Duration::from_millis(50)).is_some() {
                failed += 1;
            }
        }
        assert_eq!(failed, 3);
        assert_eq!(hs.running(), 3);
        drop(idle);
    }
}
