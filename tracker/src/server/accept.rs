//! The accept loop, the first bytes of every connection (magic, then which protocol),
//! and the wait of a `start` for its batch.

use super::cap::Admit;
use super::shared::{Go, Inbox, Shared};
use super::{classic_conn, json_conn};
use crate::common::ConnId;
use crate::wire::{Deadline, MAGIC, WireError, write_all_within};
use crossbeam_channel::RecvTimeoutError;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a waiting `start` checks its connection and the tracker's stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Why a connection was dropped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Bad {
    /// It broke the wire format or timed out.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// It said something the protocol does not allow.
    #[error("{0}")]
    Protocol(String),
    /// It was refused politely (classic: rank −1; JSON: closed).
    #[error("refused: {0}")]
    Refused(String),
}

pub(crate) fn run(shared: &Arc<Shared>, listener: &TcpListener) {
    loop {
        let accepted = listener.accept();
        if shared.stopping() {
            break;
        }
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "tracker accept failed");
                // Out of descriptors and the like: back off instead of spinning.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Numbered here, on the one accept thread, so that a worker's connections are
        // numbered and placed in the order it opened them (see `sequence`).
        let conn = shared.next_conn();
        // A flood must not exhaust threads: past the cap the oldest connection that
        // has not started a rank makes room (see `cap`).
        match shared.cap.admit(conn, stream.try_clone().ok()) {
            Admit::Room => {}
            Admit::Evict(idle) => shared.dropped(
                &close(&idle),
                format!(
                    "closed to make room: {} connections open \
                     (TrackerConfig::max_connections) and it had not started a rank",
                    shared.cap.max()
                ),
            ),
            Admit::Full => {
                shared.dropped(
                    &peer.to_string(),
                    format!(
                        "refused: {} connections open (TrackerConfig::max_connections), \
                         every one a worker's start waiting for its batch or negotiating; \
                         the cap is below what this job needs",
                        shared.cap.max()
                    ),
                );
                continue;
            }
        }
        // An IPv4 peer of a dual-stack listener shows as ::ffff:a.b.c.d; workers want
        // a.b.c.d.
        let host = peer.ip().to_canonical().to_string();
        shared.sequence.enter(conn, &host, Instant::now());
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("tracker-{peer}"))
            .spawn(move || {
                if let Err(e) = session(&sh, conn, &stream, &host) {
                    sh.dropped(&peer.to_string(), e.to_string());
                }
                sh.sequence.settle(conn);
                sh.cap.leave(conn);
            });
        if let Err(e) = spawned {
            shared.sequence.settle(conn);
            shared.cap.leave(conn);
            shared.dropped(&peer.to_string(), format!("cannot start a thread: {e}"));
        }
    }
}

fn session(shared: &Shared, conn: ConnId, stream: &TcpStream, host: &str) -> Result<(), Bad> {
    let timeout = shared.config.read_timeout;
    super::auth::check(stream, shared.secret.as_ref(), timeout)?;
    let mut r = Deadline::new(stream, timeout);
    r.magic()?;
    write_all_within(stream, &MAGIC.to_le_bytes(), timeout, "magic")?;
    // docs/xgboost-protocol.md, *Telling the protocols apart*: a JSON hello's length is
    // followed by `{"`, where a classic worker sends its world size (`7b 22` would be a
    // world of at least 8827).
    let mut head = [0u8; 8];
    r.read_exact(&mut head, "hello")?;
    let first = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let second = [head[4], head[5], head[6], head[7]];
    if second[..2] == *b"{\"" {
        json_conn::session(shared, conn, stream, host, first, second, &mut r)
    } else {
        classic_conn::session(
            shared,
            conn,
            stream,
            host,
            first,
            i32::from_le_bytes(second),
            &mut r,
        )
    }
}

/// Closes a connection evicted by the cap (its read ends at once, and its thread with
/// it); returns its peer's address.
fn close(stream: &TcpStream) -> String {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "a peer".into());
    let _ = stream.shutdown(Shutdown::Both);
    peer
}

/// Why a waiting `start` stopped waiting.
#[derive(Debug)]
pub(crate) enum Waited {
    /// Its connection closed.
    Closed,
    /// It sent bytes while it should wait in silence.
    Chatter,
    /// The deadline passed.
    TimedOut,
    /// The tracker is stopping.
    Stopped,
}

impl Waited {
    pub(crate) fn reason(&self, waited: Duration) -> String {
        match self {
            Waited::Closed => "closed while waiting for its batch".into(),
            Waited::Chatter => "sent bytes while waiting for its batch".into(),
            Waited::TimedOut => format!("its batch was not complete after {waited:?}"),
            Waited::Stopped => "the tracker stopped".into(),
        }
    }
}

/// Waits for a decision in `inbox` until `deadline`, checking every [`POLL`] that the
/// connection is still open (a live worker sends nothing while it waits).
pub(crate) fn await_decision(
    shared: &Shared,
    stream: &TcpStream,
    inbox: &Inbox<'_>,
    deadline: Option<Instant>,
) -> Result<Go, Waited> {
    loop {
        match inbox.rx.recv_timeout(POLL) {
            Ok(go) => return Ok(go),
            Err(RecvTimeoutError::Disconnected) => return Err(Waited::Stopped),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if shared.stopping() {
            return Err(Waited::Stopped);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Waited::TimedOut);
        }
        peek_open(stream)?;
    }
}

fn peek_open(stream: &TcpStream) -> Result<(), Waited> {
    if stream.set_nonblocking(true).is_err() {
        return Err(Waited::Closed);
    }
    let mut b = [0u8; 1];
    let r = stream.peek(&mut b);
    let _ = stream.set_nonblocking(false);
    match r {
        Ok(0) => Err(Waited::Closed),
        Ok(_) => Err(Waited::Chatter),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(())
        }
        Err(_) => Err(Waited::Closed),
    }
}
