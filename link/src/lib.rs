//! The data links under switchyard's collectives: the [`Link`] trait the mesh
//! algorithms run over, and its implementations. Frames in, frames out, between ranks
//! of a world, tagged by call and step; a link never looks inside them.
//!
//! | file | what it holds |
//! |---|---|
//! | `socket.rs` | [`SocketLink`] and [`BoundLink`]: the link over the Dealer/Router transports, with its goodbye handshake |
//! | `stream.rs` | [`StreamLink`]: the TCP data path beside a [`SocketLink`] |
//! | `setup.rs` | opening the [`StreamLink`]'s connections |
//! | `blame.rs` | following abort notices back to where a failure began ([`blame`]) |
//! | `liveness.rs` | the [`StreamLink`]'s heartbeat: telling a stopped or cut-off peer from a busy one |
//! | `framing.rs` | the stream wire format, as a pure encoder and decoder ([`framing`]) |
//! | `pool.rs` | frame buffers for reuse |
//! | `group.rs` | [`GroupLink`]: some of a link's ranks as a world of their own, for the phases of a hierarchical call |
//! | `shm/` | the shared-memory pipe a [`StreamLink`] uses for a peer on this host, the host board, and their hand-over at setup |
//! | `memory/` | `MemoryLink`: ranks in one process, taking turns on a deterministic schedule (`turn.rs`; feature `testing`) |
//! | `sync.rs` | the atomics of the shared-memory protocols: std's, or loom's in the models of `shm/*_loom.rs` |
//! | `error.rs`, `interrupt.rs` | [`LinkError`], what a link reports; [`Interrupt`], the flag that ends a wait |
//!
//! The facade (`switchyard`) builds its mesh engine on these links; a program uses
//! them through its `Communicator`, not directly. The `testing` feature (the
//! in-memory link, [`Clock::silence`]) is for switchyard's own tests.
#![doc(test(attr(deny(warnings))))]

pub mod blame;
mod error;
pub mod framing;
mod group;
mod interrupt;
mod liveness;
// Only tests run over it: no program's communicator does.
#[cfg(any(test, feature = "testing"))]
mod memory;
mod pool;
mod processor;
mod setup;
mod shm;
mod socket;
mod stream;
#[cfg(target_os = "linux")]
mod sync;

pub use error::LinkError;
pub use group::GroupLink;
pub use interrupt::Interrupt;
#[cfg(any(test, feature = "testing"))]
pub use memory::{MemoryLink, MemorySchedule};
pub use shm::host_identity;
pub use socket::{BoundLink, SocketLink};
pub use stream::{SILENT, StreamLink};

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Which pairs of a world's ranks a [`StreamLink`] connects.
///
/// Non-exhaustive: a later version may add shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// Every pair: the collectives' mesh.
    #[default]
    Mesh,
    /// Each rank below `split` with each rank from `split` up, and no pair of one
    /// side: a parameter server's servers (ranks `0..split`) and its workers. A
    /// [`StreamLink`] of this shape has no host board ([`Link::board_bytes`] is 0).
    Bipartite {
        /// The first rank of the second side.
        split: usize,
    },
}

impl Topology {
    /// Whether ranks `a` and `b` (two different ranks) get a connection.
    pub fn connects(self, a: usize, b: usize) -> bool {
        match self {
            Topology::Mesh => a != b,
            Topology::Bipartite { split } => (a < split) != (b < split),
        }
    }
}

/// Names one message stream of one collective call: the call's sequence number
/// (every rank numbers its calls alike) and a step within the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The call's sequence number on this communicator.
    pub call: u64,
    /// The algorithm's step within the call.
    pub step: u32,
}

/// What the mesh algorithms need from the network: ordered, tagged messages between
/// ranks. Implementations move frames; they never look inside them.
///
/// Messages from one rank with one tag arrive in the order they were sent. A link
/// never opens sockets on its own initiative after it is built.
pub trait Link: Send {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Queues `frames` for rank `to`, waiting at most until `deadline` for room.
    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError>;

    /// The next message from rank `from` with `tag`, waiting at most until
    /// `deadline`. Messages with other tags that arrive meanwhile are kept for later.
    /// An abort notice from any rank ends the wait with [`LinkError::Aborted`].
    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError>;

    /// Tells every other rank, best effort and without blocking for long, that this
    /// rank gave up on call `call` and why.
    fn abort(&mut self, call: u64, reason: &str);

    /// A buffer of `len` bytes for a frame about to be filled and sent. Links that
    /// recycle memory hand back one that was used before.
    fn buffer(&mut self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    /// Gives a frame this rank is done with back to the link for reuse.
    fn recycle(&mut self, frame: Bytes) {
        drop(frame);
    }

    /// [`Link::send`] under `clock`: waits for room while `to` keeps taking bytes,
    /// failing once it took none for `clock.silence` (or at the call's deadline).
    /// Links that cannot see partial progress count from the start of the send.
    fn send_within(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        clock: Clock,
    ) -> Result<(), LinkError> {
        self.send(to, tag, frames, clock.until(Instant::now()))
    }

    /// [`Link::recv`] under `clock`: fails with [`LinkError::Timeout`] once nothing
    /// arrived from `from` for `clock.silence` (or at the call's deadline), never while
    /// `from` keeps sending. Links that see whole messages only count from the start
    /// of the wait; the TCP and ZeroMQ links restart the count on every byte or
    /// message from `from`.
    fn recv_within(
        &mut self,
        from: usize,
        tag: Tag,
        clock: Clock,
    ) -> Result<Vec<Bytes>, LinkError> {
        self.recv(from, tag, clock.until(Instant::now()))
    }

    /// Waits until every message this rank queued has been handed to the network
    /// (the kernel, or a transport's own I/O thread), under `clock` as
    /// [`Link::send_within`]: a call must not return while output its peers need
    /// still sits in this rank's own queue, since nothing writes that queue while the
    /// caller computes between calls, and a peer waiting for it would see silence.
    /// Links that hand every message over as it is sent (the default) have nothing
    /// to do.
    fn flush_within(&mut self, clock: Clock) -> Result<(), LinkError> {
        let _ = clock;
        Ok(())
    }

    /// [`Link::abort`], saying which rank this rank blames (the peer that went
    /// silent or away), or `None` when the failure began here. Receivers use it to
    /// follow a chain of failures back to where it began.
    fn abort_blaming(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        let _ = blames;
        self.abort(call, reason);
    }

    /// Whether `rank`'s process is alive and reading its control messages (as every
    /// rank does while it waits in a call): asks it and waits at most `within` for
    /// the answer. A stopped or dead process, or one busy outside the collectives,
    /// does not answer. `None` where the link cannot ask.
    fn alive(&mut self, rank: usize, within: Duration) -> Option<bool> {
        let _ = (rank, within);
        None
    }

    /// Every abort notice received so far, after reading what arrives until `until`;
    /// `None` for links that do not carry [`Link::abort_blaming`]'s blame.
    fn notices(&mut self, until: Instant) -> Option<Vec<Notice>> {
        let _ = until;
        None
    }

    /// Announces that every message of call `call`, from any rank and with any step,
    /// must begin with `stamp` (the first bytes of its first frame; on the mesh, the
    /// call's element count and signature). From now on such a message that begins
    /// otherwise is not kept for later: the current or next [`Link::recv`] fails with
    /// [`LinkError::Refused`], and messages of `call` kept already are checked at
    /// once. This is how a rank in another call is caught at its first message even
    /// when it waits on other steps than this rank. A link that cannot check may
    /// ignore this (the default): the engine still checks each message it takes.
    fn expect(&mut self, call: u64, stamp: &[u8]) {
        let _ = (call, stamp);
    }

    /// The most bytes a rank may put on the host board in one call: every rank of
    /// the world is on this host and maps one segment with a slot per rank (see
    /// [`Link::board_publish`]). 0, the default, when there is no board. Every rank of
    /// a world gets the same answer, since it decides which algorithm a call runs.
    fn board_bytes(&self) -> usize {
        0
    }

    /// [`Link::board_bytes`] of the board shared by this rank's host only, in a world
    /// spread over several hosts (see [`Link::host_groups`]): the ranks of
    /// `host_groups()`'s group of this rank take [`Link::board_publish`] and
    /// [`Link::board_take`] with their world ranks. 0 when this rank has no board; in a
    /// world on one host, the same as `board_bytes`. Every rank of a host gets the
    /// same answer (the host's first rank makes the board and tells the others).
    fn host_board_bytes(&self) -> usize {
        self.board_bytes()
    }

    /// The rank of the whole world that this link's rank `rank` is: itself, except on
    /// a link over a group of a world's ranks (the phases of a hierarchical call),
    /// whose errors must still name the ranks a user knows.
    fn world_rank(&self, rank: usize) -> usize {
        rank
    }

    /// The world's ranks grouped by host, each group in rank order and the groups in
    /// order of their first rank, when the ranks announced their hosts at setup and
    /// are on more than one; empty otherwise (the default). Every rank of a world
    /// gets the same groups: they decide which algorithm a call runs.
    fn host_groups(&self) -> &[Vec<usize>] {
        &[]
    }

    /// Puts this rank's part of its next board call on the board: `parts`, one after
    /// the other (at most [`Link::board_bytes`] in all), after the call's `meta` frame
    /// (at most 40 bytes), and
    /// wakes the ranks asleep waiting for it. Every rank publishes a part in every
    /// board call, once it has taken what it reads of the call before
    /// ([`Link::board_take`]: all parts, or only some, as a broadcast does). First it
    /// waits under `clock` until every rank on the board has published its part of
    /// this rank's previous board call: a slot is reused two board calls later, and
    /// that part says its rank is done reading the slot. Fails as
    /// [`Link::board_take`] does when such a rank is gone, silent or aborted.
    fn board_publish(
        &mut self,
        meta: &[u8],
        parts: &[&[u8]],
        clock: Clock,
    ) -> Result<(), LinkError> {
        let _ = (meta, parts, clock);
        Err(LinkError::Transport {
            rank: self.rank(),
            reason: "this link has no host board".into(),
        })
    }

    /// Waits under `clock` until rank `from` has put its part of the current board
    /// call, then hands its data to `take`. Fails with [`LinkError::Refused`] when
    /// `from`'s meta frame does not begin with `stamp` (another call), and, as
    /// [`Link::recv_within`] does, when `from` is gone, silent, or aborted.
    fn board_take(
        &mut self,
        from: usize,
        stamp: &[u8],
        clock: Clock,
        take: &mut dyn FnMut(&[u8]),
    ) -> Result<(), LinkError> {
        let _ = (stamp, clock, take);
        Err(LinkError::Transport {
            rank: from,
            reason: "this link has no host board".into(),
        })
    }
}

/// The two clocks of a collective call. `silence` is the longest a rank waits for a
/// peer that sends nothing at all (the facade's `CommOptions::timeout`); `deadline`,
/// when set, ends the whole call however busy it is (`CommOptions::deadline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    /// How long the awaited peer may stay silent.
    pub silence: Duration,
    /// When the call must be over, if ever.
    pub deadline: Option<Instant>,
}

impl Clock {
    /// A clock with a silence limit and no deadline.
    #[cfg(any(test, feature = "testing"))]
    pub fn silence(silence: Duration) -> Clock {
        Clock {
            silence,
            deadline: None,
        }
    }

    /// When a wait whose peer was last heard from at `heard` ends: `silence` later,
    /// or at the deadline if that comes first.
    pub fn until(&self, heard: Instant) -> Instant {
        // A silence too long to add is as good as forever: a year.
        let quiet = heard
            .checked_add(self.silence)
            .unwrap_or_else(|| heard + Duration::from_secs(365 * 24 * 3600));
        self.deadline.map_or(quiet, |d| d.min(quiet))
    }

    /// Whether the call's deadline has passed.
    pub fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// An abort notice as a rank received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The rank that gave up.
    pub rank: usize,
    /// Its error, in words.
    pub reason: String,
    /// The rank it blamed (one that went silent or away), or `None` when the failure
    /// began on `rank` itself.
    pub blames: Option<usize>,
}

/// Messages that arrived before anyone asked for them, by sender and tag, each
/// queue in arrival order; and the stamp of [`Link::expect`], which every message
/// of the current call is checked against before it is filed.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    queues: HashMap<(usize, Tag), VecDeque<Vec<Bytes>>>,
    /// The current call and the stamp its messages begin with.
    expect: Option<(u64, Vec<u8>)>,
    /// The first message of the current call that did not begin with the stamp:
    /// its sender and first frame.
    refused: Option<(usize, Bytes)>,
}

impl Pending {
    /// Files a message from `from` with `tag`, unless it belongs to the expected call
    /// and does not begin with its stamp (then it is kept as the refusal instead).
    /// Returns whether it was filed.
    pub(crate) fn push(&mut self, from: usize, tag: Tag, frames: Vec<Bytes>) -> bool {
        if !self.fits(tag, &frames) {
            if self.refused.is_none() {
                self.refused = Some((from, frames.into_iter().next().unwrap_or_default()));
            }
            return false;
        }
        self.queues
            .entry((from, tag))
            .or_default()
            .push_back(frames);
        true
    }

    /// Whether `frames`, tagged `tag`, are not of the expected call or begin with its
    /// stamp.
    fn fits(&self, tag: Tag, frames: &[Bytes]) -> bool {
        match &self.expect {
            Some((call, stamp)) if *call == tag.call => {
                frames.first().is_some_and(|f| f.starts_with(stamp))
            }
            _ => true,
        }
    }

    /// The current call and its stamp, once [`Link::expect`] named one.
    pub(crate) fn expected(&self) -> Option<(u64, &[u8])> {
        self.expect
            .as_ref()
            .map(|(call, stamp)| (*call, stamp.as_slice()))
    }

    /// The oldest message from `from` with `tag`, if one is filed.
    pub(crate) fn pop(&mut self, from: usize, tag: Tag) -> Option<Vec<Bytes>> {
        let queue = self.queues.get_mut(&(from, tag))?;
        let frames = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(&(from, tag));
        }
        frames
    }

    /// The oldest message with `tag` from the first rank, counting from `start` round
    /// the world of `size` ranks, that has one filed: the rank and the message.
    pub(crate) fn pop_any(
        &mut self,
        tag: Tag,
        start: usize,
        size: usize,
    ) -> Option<(usize, Vec<Bytes>)> {
        if self.queues.is_empty() {
            return None;
        }
        (start..size)
            .chain(0..start.min(size))
            .find_map(|from| Some((from, self.pop(from, tag)?)))
    }

    /// [`Link::expect`]: from now on messages of `call` must begin with `stamp`; those
    /// filed already are checked now (a fast peer may have sent them early). A
    /// refusal from an earlier call is forgotten.
    pub(crate) fn expect(&mut self, call: u64, stamp: &[u8]) {
        // Once per call: keep the stamp's buffer rather than allocate a new one.
        match &mut self.expect {
            Some((current, kept)) => {
                *current = call;
                kept.clear();
                kept.extend_from_slice(stamp);
            }
            None => self.expect = Some((call, stamp.to_vec())),
        }
        self.refused = None;
        // Usually nothing is filed at a call's start: skip the walk over the table.
        if self.queues.is_empty() {
            return;
        }
        let filed: Vec<(usize, Tag)> = self
            .queues
            .keys()
            .filter(|(_, tag)| tag.call == call)
            .copied()
            .collect();
        for (from, tag) in filed {
            let wrong = self.queues[&(from, tag)]
                .iter()
                .find(|frames| !self.fits(tag, frames))
                .cloned();
            if let Some(frames) = wrong {
                self.queues.remove(&(from, tag));
                if self.refused.is_none() {
                    self.refused = Some((from, frames.into_iter().next().unwrap_or_default()));
                }
            }
        }
    }

    /// Whether a message was refused and not yet reported.
    #[cfg(test)]
    pub(crate) fn has_refusal(&self) -> bool {
        self.refused.is_some()
    }

    /// The refusal not yet reported, as the error `recv` returns.
    pub(crate) fn refusal(&mut self) -> Option<LinkError> {
        let (rank, first) = self.refused.take()?;
        Some(LinkError::Refused { rank, first })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(call: u64, step: u32) -> Tag {
        Tag { call, step }
    }

    fn message(head: &[u8]) -> Vec<Bytes> {
        vec![Bytes::copy_from_slice(head), Bytes::from_static(b"payload")]
    }

    #[test]
    fn messages_of_the_expected_call_are_checked_whatever_their_step() {
        let mut pending = Pending::default();
        // Early messages: one of the coming call with a wrong stamp, one of a later
        // call (not checked), one right one.
        assert!(pending.push(1, tag(5, 7), message(b"XXXXrest")));
        assert!(pending.push(2, tag(6, 0), message(b"anything")));
        assert!(pending.push(3, tag(5, 0), message(b"ABCDrest")));
        pending.expect(5, b"ABCD");
        assert!(pending.has_refusal());
        match pending.refusal() {
            Some(LinkError::Refused { rank: 1, first }) => assert_eq!(&first[..], b"XXXXrest"),
            other => panic!("{other:?}"),
        }
        assert!(pending.refusal().is_none());
        assert!(pending.pop(1, tag(5, 7)).is_none());
        assert!(pending.pop(3, tag(5, 0)).is_some());
        // A message arriving now, at another step, is refused on arrival.
        assert!(!pending.push(4, tag(5, 63), message(b"ABCXrest")));
        assert!(matches!(
            pending.refusal(),
            Some(LinkError::Refused { rank: 4, .. })
        ));
        // A message with no frames cannot carry the stamp.
        assert!(!pending.push(2, tag(5, 1), Vec::new()));
        // Other calls pass; the next call forgets the last refusal.
        assert!(pending.push(2, tag(6, 1), message(b"any more")));
        pending.expect(6, b"any");
        assert!(!pending.has_refusal());
        assert!(pending.pop(2, tag(6, 0)).is_some());
    }
}
