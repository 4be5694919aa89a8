//! The order of one worker's `print`s and `shutdown`: the order their connections were
//! accepted in.
//!
//! Every command is a connection of its own, served on a thread of its own, so the
//! thread of a long print can still be reading when the thread of the short print after
//! it, or of the `shutdown` that ends the job, is done. A worker opens its next
//! connection only after the tracker answered the magic of the one before, so the accept
//! loop sees one worker's connections in the worker's order. Each connection takes a
//! place in the accept loop; a `print`, `shutdown` or `error` is carried out only once
//! every earlier connection from the same host has settled (said it is something else,
//! been carried out, or been dropped). A connection whose whole command has not arrived
//! yet holds back the later ones for [`GREETING_GRACE`] from its accept at most: a
//! worker sends its hello and command at once, so one still incomplete after that is a
//! stranger (silent, or stalled mid-hello), which must not delay the job's prints and
//! shutdowns by the whole read timeout. Only a connection whose command is complete
//! holds them back until it is carried out. Every wait is bounded anyway: a print whose
//! wait ran out is still logged.

use super::shared::lock;
use crate::common::ConnId;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a connection whose command has not all arrived holds back its host's later
/// connections.
pub(crate) const GREETING_GRACE: Duration = Duration::from_secs(1);
/// How often a wait looks again whether a silent connection's grace has run out.
const RECHECK: Duration = Duration::from_millis(50);

/// An unsettled connection: its host, when it was accepted, and whether its whole
/// command has arrived.
#[derive(Debug)]
struct Place {
    host: String,
    since: Instant,
    heard: bool,
}

/// The connections that have not settled yet, by accept order.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    open: Mutex<BTreeMap<ConnId, Place>>,
    settled: Condvar,
}

impl Sequence {
    /// Takes `conn`'s place (in the accept loop, so that places follow accept order),
    /// accepted at `now`.
    pub(crate) fn enter(&self, conn: ConnId, host: &str, now: Instant) {
        let place = Place {
            host: host.to_string(),
            since: now,
            heard: false,
        };
        lock(&self.open).insert(conn, place);
    }

    /// `conn`'s whole command has arrived (not merely the start of its hello, which a
    /// stranger can send and then stall): it holds back its host's later connections
    /// until it settles, however long that takes.
    pub(crate) fn heard(&self, conn: ConnId) {
        if let Some(place) = lock(&self.open).get_mut(&conn) {
            place.heard = true;
        }
    }

    /// `conn` no longer holds back the later connections of its host.
    pub(crate) fn settle(&self, conn: ConnId) {
        if lock(&self.open).remove(&conn).is_some() {
            self.settled.notify_all();
        }
    }

    /// Whether, at `now`, a connection from `host` accepted before `conn` still holds
    /// it back (what [`await_turn`](Self::await_turn) waits on, without waiting).
    #[cfg(test)]
    pub(crate) fn blocked(&self, conn: ConnId, host: &str, now: Instant) -> bool {
        blocks(&lock(&self.open), conn, host, now)
    }

    /// Waits, at most `limit`, until every connection from `host` accepted before
    /// `conn` has settled; false when the limit ran out first.
    pub(crate) fn await_turn(&self, conn: ConnId, host: &str, limit: Duration) -> bool {
        let started = Instant::now();
        let mut open = lock(&self.open);
        loop {
            if !blocks(&open, conn, host, Instant::now()) {
                return true;
            }
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return false;
            }
            open = self
                .settled
                .wait_timeout(open, left.min(RECHECK))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// Whether an unsettled connection from `host` accepted before `conn` holds it back at
/// `now`: one whose command is complete, or one still within its grace.
fn blocks(open: &BTreeMap<ConnId, Place>, conn: ConnId, host: &str, now: Instant) -> bool {
    open.range(..conn).any(|(_, p)| {
        p.host == host && (p.heard || now.saturating_duration_since(p.since) < GREETING_GRACE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_later_connection_waits_only_for_earlier_ones_of_its_host() {
        let s = Arc::new(Sequence::default());
        s.enter(1, "10.0.0.1", Instant::now());
        s.enter(2, "10.0.0.2", Instant::now());
        s.enter(3, "10.0.0.1", Instant::now());
        // Another host's earlier connection does not hold it back.
        assert!(s.await_turn(2, "10.0.0.2", Duration::ZERO));
        // Its own host's does, until it settles or the limit runs out.
        s.heard(1);
        let started = Instant::now();
        assert!(!s.await_turn(3, "10.0.0.1", Duration::from_millis(50)));
        assert!(started.elapsed() >= Duration::from_millis(50));
        let settler = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                s.settle(1);
            })
        };
        assert!(s.await_turn(3, "10.0.0.1", Duration::from_secs(10)));
        assert!(settler.join().is_ok());
    }

    #[test]
    fn a_connection_silent_past_the_grace_holds_back_nobody() {
        let s = Sequence::default();
        s.enter(1, "10.0.0.1", Instant::now());
        s.enter(2, "10.0.0.1", Instant::now());
        let started = Instant::now();
        assert!(s.await_turn(2, "10.0.0.1", Duration::from_secs(10)));
        let waited = started.elapsed();
        assert!(waited >= GREETING_GRACE - RECHECK, "{waited:?}");
        assert!(waited < GREETING_GRACE * 3, "{waited:?}");
    }
}
