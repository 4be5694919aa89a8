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
//! been carried out, or been dropped). The wait is bounded: a stranger that connects and
//! stays silent delays the prints of its host by at most the read timeout, never
//! forever, and a print whose wait ran out is still logged.

use super::shared::lock;
use crate::classic::ConnId;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The connections that have not settled yet, by accept order, with their host.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    open: Mutex<BTreeMap<ConnId, String>>,
    settled: Condvar,
}

impl Sequence {
    /// Takes `conn`'s place (in the accept loop, so that places follow accept order).
    pub(crate) fn enter(&self, conn: ConnId, host: &str) {
        lock(&self.open).insert(conn, host.to_string());
    }

    /// `conn` no longer holds back the later connections of its host.
    pub(crate) fn settle(&self, conn: ConnId) {
        if lock(&self.open).remove(&conn).is_some() {
            self.settled.notify_all();
        }
    }

    /// Waits, at most `limit`, until every connection from `host` accepted before
    /// `conn` has settled; false when the limit ran out first.
    pub(crate) fn await_turn(&self, conn: ConnId, host: &str, limit: Duration) -> bool {
        let open = lock(&self.open);
        let (_open, waited) = self
            .settled
            .wait_timeout_while(open, limit, |open| {
                open.range(..conn).any(|(_, h)| h == host)
            })
            .unwrap_or_else(PoisonError::into_inner);
        !waited.timed_out()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_later_connection_waits_only_for_earlier_ones_of_its_host() {
        let s = Arc::new(Sequence::default());
        s.enter(1, "10.0.0.1");
        s.enter(2, "10.0.0.2");
        s.enter(3, "10.0.0.1");
        // Another host's earlier connection does not hold it back.
        assert!(s.await_turn(2, "10.0.0.2", Duration::ZERO));
        // Its own host's does, until it settles or the limit runs out.
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
}
