//! A rank's ring listener, served from the moment it is bound.
//!
//! The listener is announced to the root in the check-in, so anyone may connect to it
//! from then on: the predecessor, another rank's probe, a stranger. Were it accepted
//! only once this rank's own connect to its successor had finished, a stranger who
//! fills its backlog (129 idle connections with std's backlog of 128) would make the
//! kernel drop the predecessor's SYN while that predecessor, stuck in its own connect,
//! accepts nothing either; with every listener so filled, no rank's connect ever ends
//! and the job stops at its timeout. So the listener is accepted on a thread of its own
//! from its bind on, each connection's handshake on a thread of its own as the root
//! does ([`handshakes`](switchyard_net::handshakes)), and the backlog never stays full.

use super::member::PredecessorHello;
use super::wire::Wire;
use super::{CHECK_IN_READ, IdError, PROBE_CONNECT, RETRY, RING, RING_PURPOSE, WATCH_EVERY, gone};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Instant;
use switchyard_net::handshakes::{self, Handshakes, accept_all};
use switchyard_secret::JobSecret;

/// The predecessor's ring connection and the ring listener, which stays bound until
/// the rank's exchange ends: a successor still waiting for this rank's hello probes it,
/// and a refused probe would read as this rank having left.
pub(super) type Accepted = (TcpStream, TcpListener);

/// The thread serving a ring listener until the predecessor's hello arrives.
pub(super) struct RingAcceptor {
    /// Takes the predecessor's ring address once the root named it (to probe it);
    /// dropped, it tells the thread that this rank gave up.
    predecessor: Sender<SocketAddr>,
    thread: JoinHandle<Result<Accepted, IdError>>,
}

impl RingAcceptor {
    /// Serves `ring` from now on for the predecessor's ring hello, until `until`.
    pub(super) fn start(
        ring: TcpListener,
        want: PredecessorHello,
        secret: Option<JobSecret>,
        until: Instant,
    ) -> Result<RingAcceptor, IdError> {
        ring.set_nonblocking(true)
            .map_err(|e| IdError::Address(e.to_string()))?;
        let (predecessor, told) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("sy-ring-accept".into())
            .spawn(move || {
                accept_predecessor(&ring, want, &told, secret.as_ref(), until)
                    .map(|stream| (stream, ring))
            })
            .map_err(|e| IdError::Address(format!("no thread for the ring listener: {e}")))?;
        Ok(RingAcceptor {
            predecessor,
            thread,
        })
    }

    /// The predecessor's ring listener is at `addr`: from now on a refused probe of it
    /// means it left.
    pub(super) fn predecessor_at(&self, addr: SocketAddr) {
        let _ = self.predecessor.try_send(addr);
    }

    /// The predecessor's ring connection, its hello read, and the listener.
    pub(super) fn join(self) -> Result<Accepted, IdError> {
        let RingAcceptor {
            predecessor,
            thread,
        } = self;
        let accepted = thread
            .join()
            .unwrap_or_else(|_| Err(IdError::Address("the ring listener thread panicked".into())));
        drop(predecessor);
        accepted
    }
}

/// Reads a ring hello (after the job secret's proof, with a secret): tag and rank.
fn read_ring_hello(
    mut stream: TcpStream,
    peer: SocketAddr,
    secret: Option<&JobSecret>,
    until: Instant,
) -> Result<(TcpStream, u64, u32), String> {
    let by = until.min(Instant::now() + CHECK_IN_READ);
    if let Some(secret) = secret {
        switchyard_secret::accept(&mut stream, secret, RING_PURPOSE, by)
            .map_err(|e| format!("job secret not proven: {e}"))?;
    }
    let wire = Wire {
        stream: &stream,
        peer: peer.to_string(),
        until: by,
    };
    let hello = (|| {
        wire.magic(RING)?;
        Ok::<_, IdError>((wire.u64("job tag")?, wire.u32("rank")?))
    })();
    let (tag, rank) = hello.map_err(|e| e.to_string())?;
    Ok((stream, tag, rank))
}

/// Accepts the predecessor's ring connection (the hello `hello` accepts), serving every connection's
/// handshake concurrently; strangers are closed and logged. Once `told` gives the
/// predecessor's ring listener, it is probed now and then while it has not come: a
/// refused probe means it left, and waiting ends at once. `told` disconnected: this
/// rank gave up, and so does its listener.
fn accept_predecessor(
    ring: &TcpListener,
    hello: PredecessorHello,
    told: &Receiver<SocketAddr>,
    secret: Option<&JobSecret>,
    until: Instant,
) -> Result<TcpStream, IdError> {
    let want = hello.rank();
    let mut handshakes = Handshakes::new(handshakes::DEFAULT_LIMIT);
    let mut addr: Option<SocketAddr> = None;
    let mut probed = Instant::now();
    let name = |addr: Option<SocketAddr>| match addr {
        Some(a) => format!("ring predecessor {a} (rank {want})"),
        None => format!("ring predecessor (rank {want})"),
    };
    loop {
        accept_all(ring, &mut handshakes, {
            let secret = secret.cloned();
            move |s, peer| read_ring_hello(s, peer, secret.as_ref(), until)
        });
        match told.try_recv() {
            Ok(a) => addr = Some(a),
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => {
                return Err(IdError::Protocol {
                    peer: name(addr),
                    reason: "this rank gave up before its predecessor connected".into(),
                });
            }
        }
        if Instant::now() >= until {
            return Err(IdError::Protocol {
                peer: name(addr),
                reason: "never connected before the timeout".into(),
            });
        }
        if let Some(addr) = addr {
            if probed.elapsed() >= WATCH_EVERY * 2 {
                probed = Instant::now();
                if let Err(e) = TcpStream::connect_timeout(&addr, PROBE_CONNECT) {
                    if e.kind() == std::io::ErrorKind::ConnectionRefused {
                        return Err(gone(want, addr));
                    }
                }
            }
        }
        let Some(done) = handshakes.next(RETRY) else {
            continue;
        };
        let peer = done.peer;
        match done.result {
            Ok((stream, t, r)) if hello.accepts(t, r) => return Ok(stream),
            Ok((_, t, r)) => {
                tracing::warn!(%peer, rank = r, tag = format!("{t:016x}"), "bootstrap ring: not the predecessor, closed")
            }
            // A probe of another rank's (connects and closes at once) is no stranger.
            Err(e) if e.contains("closed the connection") => {
                tracing::debug!(%peer, error = %e, "bootstrap ring: connection closed before a hello")
            }
            Err(e) => tracing::warn!(%peer, error = %e, "bootstrap ring: hello dropped"),
        }
    }
}
