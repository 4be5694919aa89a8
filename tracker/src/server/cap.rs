//! The cap on open connections ([`TrackerConfig::max_connections`]) and whom it
//! evicts.
//!
//! Past the cap, the oldest connection that has not started a rank is closed to make
//! room for the newcomer, so that a few thousand connections (silent ones, or ones
//! that sent a hello and stalled) cannot lock real workers out until they time out.
//! What a connection claims costs nothing without a job secret (a whole `print` hello
//! is a few dozen bytes), so it counts as a worker's by what it did: its `start` or
//! `recover` was taken in by a state machine (waiting for its batch, negotiating).
//! Those are few (about two per rank at most), so the newcomer is refused only when
//! the cap is smaller than the job itself needs.
//!
//! Without sockets: the handle `H` of an evicted connection goes back to the caller,
//! which closes it.
//!
//! [`TrackerConfig::max_connections`]: super::TrackerConfig::max_connections

use super::shared::lock;
use crate::common::ConnId;
use std::collections::VecDeque;
use std::sync::Mutex;

/// What to do with a newcomer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit<H> {
    /// Serve it: there is room.
    Room,
    /// Serve it, and close this connection (the oldest that has not started a rank)
    /// to make room.
    Evict(H),
    /// Refuse it: every open connection is a worker's.
    Full,
}

/// Open connections, and those of them that have not started a rank, oldest first.
#[derive(Debug)]
pub(crate) struct Cap<H> {
    max: usize,
    inner: Mutex<Inner<H>>,
}

#[derive(Debug)]
struct Inner<H> {
    /// Connections admitted whose threads have not ended (an evicted one counts until
    /// its thread ends, so that the cap bounds threads too).
    open: usize,
    /// Admitted connections that have not started a rank, in accept order.
    strangers: VecDeque<(ConnId, Option<H>)>,
}

impl<H> Cap<H> {
    /// At most `max` connections.
    pub(crate) fn new(max: usize) -> Self {
        Cap {
            max,
            inner: Mutex::new(Inner {
                open: 0,
                strangers: VecDeque::new(),
            }),
        }
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A newcomer `conn` (in the accept loop); `handle` closes it if it is evicted
    /// later (`None`: it cannot be, and ends by its read timeout). Unless
    /// [`Admit::Full`], it is now open, to [`leave`](Self::leave) when its thread ends.
    pub(crate) fn admit(&self, conn: ConnId, handle: Option<H>) -> Admit<H> {
        let mut inner = lock(&self.inner);
        let mut admit = Admit::Room;
        if inner.open >= self.max {
            // The oldest first: a worker sends its hello at once and is done or
            // started within moments, so an old one is idle. One without a handle
            // cannot be closed, and is passed over.
            let Some(evicted) =
                std::iter::from_fn(|| inner.strangers.pop_front()).find_map(|(_, handle)| handle)
            else {
                return Admit::Full;
            };
            admit = Admit::Evict(evicted);
        }
        inner.open += 1;
        inner.strangers.push_back((conn, handle));
        admit
    }

    /// `conn`'s `start` was taken in: it is a worker's, never evicted.
    pub(crate) fn started(&self, conn: ConnId) {
        lock(&self.inner).strangers.retain(|(c, _)| *c != conn);
    }

    /// `conn`'s thread ended.
    pub(crate) fn leave(&self, conn: ConnId) {
        let mut inner = lock(&self.inner);
        inner.strangers.retain(|(c, _)| *c != conn);
        inner.open = inner.open.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_the_oldest_connection_without_a_rank_makes_room() {
        let cap = Cap::new(3);
        assert_eq!(cap.admit(1, Some("one")), Admit::Room);
        assert_eq!(cap.admit(2, Some("two")), Admit::Room);
        assert_eq!(cap.admit(3, Some("three")), Admit::Room);
        // 1 started a rank; 2 only claimed to be someone (a print hello, say).
        cap.started(1);
        assert_eq!(cap.admit(4, Some("four")), Admit::Evict("two"));
        assert_eq!(cap.admit(5, Some("five")), Admit::Evict("three"));
        // The evicted ones count until their threads end.
        cap.leave(2);
        cap.leave(3);
        assert_eq!(cap.admit(6, Some("six")), Admit::Evict("four"));
    }

    #[test]
    fn a_newcomer_is_refused_only_when_every_open_connection_started_a_rank() {
        let cap = Cap::new(2);
        assert_eq!(cap.admit(1, Some(1)), Admit::Room);
        assert_eq!(cap.admit(2, None), Admit::Room);
        cap.started(1);
        // 2 cannot be closed: passed over.
        assert_eq!(cap.admit(3, Some(3)), Admit::Full);
        cap.leave(2);
        assert_eq!(cap.admit(3, Some(3)), Admit::Room);
        cap.started(3);
        assert_eq!(cap.admit(4, Some(4)), Admit::Full);
        // A worker's connection that ends frees its place.
        cap.leave(1);
        assert_eq!(cap.admit(4, Some(4)), Admit::Room);
    }
}
