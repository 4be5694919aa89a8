//! [`GroupLink`]: some of a link's ranks as a world of their own. A hierarchical call
//! runs its phases on such worlds (the ranks of one host, then one leader per host)
//! with the mesh's algorithms unchanged: they see ranks `0..k` of the group, and every
//! message, board call and error goes through the link underneath with world ranks.
//! Errors and abort notices name world ranks, which is what a user looks for.

use super::{Clock, Link, Notice, Tag};
use crate::LinkError;
use bytes::Bytes;
use std::time::{Duration, Instant};

/// The ranks `ranks` of `inner`'s world (this rank among them, at `me`) as a world
/// of `ranks.len()`.
pub struct GroupLink<'a> {
    inner: &'a mut dyn Link,
    ranks: &'a [usize],
    me: usize,
    /// Whether the group is exactly the ranks of this rank's host board, whose board
    /// it may then use ([`Link::host_board_bytes`]).
    on_host_board: bool,
}

impl std::fmt::Debug for GroupLink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLink")
            .field("ranks", &self.ranks)
            .field("me", &self.me)
            .field("on_host_board", &self.on_host_board)
            .finish_non_exhaustive()
    }
}

impl<'a> GroupLink<'a> {
    /// The group `ranks` (in rank order, this rank among them) of `inner`'s world;
    /// `on_host_board`: the group is this rank's host, whose board it may use.
    /// `None` when this rank is not in `ranks`.
    pub fn new(
        inner: &'a mut dyn Link,
        ranks: &'a [usize],
        on_host_board: bool,
    ) -> Option<GroupLink<'a>> {
        let me = ranks.iter().position(|&r| r == inner.rank())?;
        Some(GroupLink {
            inner,
            ranks,
            me,
            on_host_board,
        })
    }

    /// The world rank of group rank `rank`.
    fn world(&self, rank: usize) -> usize {
        self.ranks.get(rank).copied().unwrap_or(usize::MAX)
    }
}

impl Link for GroupLink<'_> {
    fn rank(&self) -> usize {
        self.me
    }

    fn world_size(&self) -> usize {
        self.ranks.len()
    }

    fn world_rank(&self, rank: usize) -> usize {
        self.inner.world_rank(self.world(rank))
    }

    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let to = self.world(to);
        self.inner.send(to, tag, frames, deadline)
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        let from = self.world(from);
        self.inner.recv(from, tag, deadline)
    }

    fn abort(&mut self, call: u64, reason: &str) {
        self.inner.abort(call, reason);
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        self.inner.buffer(len)
    }

    fn recycle(&mut self, frame: Bytes) {
        self.inner.recycle(frame);
    }

    fn send_within(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        clock: Clock,
    ) -> Result<(), LinkError> {
        let to = self.world(to);
        self.inner.send_within(to, tag, frames, clock)
    }

    fn recv_within(
        &mut self,
        from: usize,
        tag: Tag,
        clock: Clock,
    ) -> Result<Vec<Bytes>, LinkError> {
        let from = self.world(from);
        self.inner.recv_within(from, tag, clock)
    }

    fn flush_within(&mut self, clock: Clock) -> Result<(), LinkError> {
        self.inner.flush_within(clock)
    }

    fn abort_blaming(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        // Blame arrives as a world rank (errors name world ranks).
        self.inner.abort_blaming(call, reason, blames);
    }

    fn alive(&mut self, rank: usize, within: Duration) -> Option<bool> {
        let rank = self.world(rank);
        self.inner.alive(rank, within)
    }

    fn notices(&mut self, until: Instant) -> Option<Vec<Notice>> {
        self.inner.notices(until)
    }

    fn expect(&mut self, call: u64, stamp: &[u8]) {
        self.inner.expect(call, stamp);
    }

    fn board_bytes(&self) -> usize {
        if self.on_host_board {
            self.inner.host_board_bytes()
        } else {
            0
        }
    }

    fn board_publish(
        &mut self,
        meta: &[u8],
        parts: &[&[u8]],
        clock: Clock,
    ) -> Result<(), LinkError> {
        self.inner.board_publish(meta, parts, clock)
    }

    fn board_take(
        &mut self,
        from: usize,
        stamp: &[u8],
        clock: Clock,
        take: &mut dyn FnMut(&[u8]),
    ) -> Result<(), LinkError> {
        let from = self.world(from);
        self.inner.board_take(from, stamp, clock, take)
    }
}
