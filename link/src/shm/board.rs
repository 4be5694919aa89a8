//! The host board: one segment that every rank of a world on one host maps, with a
//! slot per rank, for the calls where each rank's data must reach every other rank
//! (allreduce, broadcast, allgather, the barrier; a call larger than a slot in
//! pieces, see `algo/board.rs`). A rank writes its part once into its own slot;
//! every rank then reads the slots it needs (every slot, but for a broadcast's),
//! in rank order, straight from the shared memory: no message, no per-peer round
//! trip, one copy per byte written and one to read.
//!
//! Each rank has two slots and uses them in turn (board call `k` in slot `k % 2`).
//! Reuse needs no acknowledgement beyond the parts themselves: every rank publishes
//! its part of each board call, and only once it is done reading the call before, so
//! a rank that sees every rank's part of call `k + 1` knows that every rank is done
//! reading call `k`, and may write its slot of `k` again, for call `k + 2`
//! ([`Board::published_last`], looked at before each publish). In a call where every
//! rank reads every slot (allreduce, allgather, barrier) that was seen already; a
//! broadcast's root reads nothing and the other ranks read only the root's slot, so
//! the root returns as soon as its part is written, and a rank looks at the parts it
//! did not read before it publishes again.
//!
//! A slot is published by storing its call number with release ordering after the
//! data; a reader that loads that number with acquire ordering sees the data. A rank
//! about to sleep raises its flag in the board and looks once more; a rank that
//! publishes puts a sequentially consistent fence between its store and reading the
//! flags, then wakes every sleeper through the pair's pipe (one byte on its Unix
//! socket), so no wake-up is lost (the rings' argument, `ring.rs`).
//!
//! A rank that waits also notes in its line the processor it runs on: of two ranks
//! that wait for each other on one processor, the higher moves to another processor
//! it may use, and where it cannot, a rank that waits for a peer last seen on its own
//! processor gives the processor up (after a short grace in which the scheduler may
//! move one of them to an idle core) instead of spinning on it, since the peer cannot
//! publish until it runs (two ranks put on one core by the scheduler, beside other
//! work, would otherwise take turns to spin out).
//!
//! Layout: a 64-byte header (magic, ranks, slot size), a 64-byte line per rank with
//! its sleep flag and processor, then per rank two slots, each a 48-byte head (board call number,
//! the communicator's call number, length, the call's meta frame) followed at once by
//! the data (so that a call of a few bytes is one cache line), in whole cache lines.

use super::segment::{map_shared, sealed_len, sealed_memfd};
use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Data bytes of one slot in a board of `ranks`: 256 KiB up to 64 ranks (a board of
/// 32 MiB, mapped whole but touched only as far as calls write), then less so that
/// no board exceeds 32 MiB, and never under 16 KiB (the largest small call, which
/// runs in one board call). A call larger than a slot runs in pieces of a slot;
/// larger pieces mean fewer synchronisations, smaller ones that the slots a piece
/// touches stay in cache.
pub(crate) fn slot_bytes_for(ranks: usize) -> usize {
    let share = (BOARD_BUDGET / (2 * ranks.max(1))) / LINE * LINE;
    share.clamp(MIN_SLOT_BYTES, MAX_OWN_SLOT_BYTES)
}

/// The most bytes the slots of one board take, where that leaves slots of at least
/// [`MIN_SLOT_BYTES`].
const BOARD_BUDGET: usize = 32 << 20;
/// The largest slot this process makes.
const MAX_OWN_SLOT_BYTES: usize = 256 << 10;
/// The smallest slot this process makes.
const MIN_SLOT_BYTES: usize = 16 << 10;
/// The largest slot a board handed over may have: a peer cannot make this process
/// map more than a few MiB per rank.
const MAX_SLOT_BYTES: usize = 1 << 20;
/// The most ranks a board handed over may have.
const MAX_RANKS: usize = 4096;
/// The first bytes of a board.
const MAGIC: u64 = u64::from_le_bytes(*b"SYBRD001");
/// One cache line.
const LINE: usize = 64;
/// The longest meta frame a slot keeps beside its data.
pub(crate) const META_BYTES: usize = 24;

/// The head of one slot; the data follows at once, so that a call of a few bytes
/// takes one cache line to publish and one to read.
///
/// Its methods, with [`wake_sleepers`] and [`set_flag`], are the protocol: [`Board`]
/// adds the bytes, and the loom models (`board_loom.rs`) run the same functions over
/// bytes of their own.
#[repr(C)]
struct SlotControl {
    /// The board call whose data the slot holds (0: none yet).
    call: AtomicU64,
    /// The communicator's call it belongs to (every rank numbers its calls alike,
    /// board or not): what a rank in another algorithm compares with its own.
    seq: AtomicU64,
    /// Bytes of data.
    len: AtomicU32,
    /// Bytes of `meta` in use.
    meta_len: AtomicU32,
    /// The call's meta frame, which readers compare with their own call's.
    meta: [u8; META_BYTES],
}

/// Where a slot's data begins: right after its head, 8-aligned for any element.
const DATA_AT: usize = std::mem::size_of::<SlotControl>();

#[cfg(not(all(test, loom)))]
const _: () = assert!(DATA_AT == 48 && DATA_AT < LINE);

impl SlotControl {
    /// A slot head of loom's atomics, holding no call, for the models.
    #[cfg(all(test, loom))]
    fn new() -> SlotControl {
        SlotControl {
            call: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            len: AtomicU32::new(0),
            meta_len: AtomicU32::new(0),
            meta: [0; META_BYTES],
        }
    }

    /// Publishes board call `call` in this slot: `copy` writes its data and meta
    /// first, then the head's fields are stored, the call number last with release
    /// ordering, so that a reader that sees the number sees the rest.
    fn publish(&self, call: u64, seq: u64, len: u32, meta_len: u32, copy: impl FnOnce()) {
        copy();
        self.seq.store(seq, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.meta_len.store(meta_len, Ordering::Relaxed);
        self.call.store(call, Ordering::Release);
    }

    /// The communicator's call number, the data length and the meta length of board
    /// call `call`, once the slot holds it; the data and meta are then complete.
    fn holding(&self, call: u64) -> Option<(u64, u32, u32)> {
        // Board call 0 is none: a slot that holds nothing yet says 0 too.
        if call == 0 || self.call.load(Ordering::Acquire) != call {
            return None;
        }
        let seq = self.seq.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        let meta_len = self.meta_len.load(Ordering::Relaxed);
        Some((seq, len, meta_len))
    }

    /// Whether the slot holds board call `call` or a later one.
    fn reached(&self, call: u64) -> bool {
        self.call.load(Ordering::Acquire) >= call
    }
}

/// After a publish: calls `wake` for every rank of `flags` whose sleep flag is up.
/// The fence pairs with the one in [`set_flag`]: either the sleeper's second look
/// sees the part, or this sees its flag.
fn wake_sleepers<'a>(
    flags: impl Iterator<Item = (usize, &'a AtomicU32)>,
    mut wake: impl FnMut(usize),
) {
    fence(Ordering::SeqCst);
    for (rank, flag) in flags {
        if flag.load(Ordering::Relaxed) != 0 {
            wake(rank);
        }
    }
}

/// Raises (before a sleep) or lowers (after it) a rank's sleep `flag`. Raising is
/// followed by a fence: the rank then looks at the slot it waits for once more before
/// it sleeps.
fn set_flag(flag: &AtomicU32, asleep: bool) {
    flag.store(u32::from(asleep), Ordering::Relaxed);
    if asleep {
        fence(Ordering::SeqCst);
    }
}

/// A slot's content as its reader sees it.
pub(crate) struct Entry<'a> {
    /// The communicator's call it belongs to.
    pub(crate) seq: u64,
    /// The meta frame the writer stored.
    pub(crate) meta: &'a [u8],
    /// Its data.
    pub(crate) data: &'a [u8],
}

/// A board's content that cannot be right: only a peer that writes nonsense into the
/// shared memory makes one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host board corrupt: rank {rank}'s slot claims {len} bytes of data and {meta} of meta")]
pub(crate) struct BoardError {
    rank: usize,
    len: u32,
    meta: u32,
}

/// This rank's view of a mapped board.
pub(crate) struct Board {
    base: *mut u8,
    len: usize,
    ranks: usize,
    slot_bytes: usize,
    me: usize,
    /// Board calls this rank has published: the current one, once it published.
    calls: u64,
}

// SAFETY: the mapping is plain memory owned by this value, used by one thread at a
// time (the link that owns it).
unsafe impl Send for Board {}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("ranks", &self.ranks)
            .field("slot_bytes", &self.slot_bytes)
            .field("me", &self.me)
            .field("calls", &self.calls)
            .finish()
    }
}

/// Bytes one slot of `slot_bytes` takes: its head and data, in whole cache lines.
fn slot_len(slot_bytes: usize) -> usize {
    (DATA_AT + slot_bytes).next_multiple_of(LINE)
}

/// Bytes of a board of `ranks` slot pairs of `slot_bytes`.
fn board_len(ranks: usize, slot_bytes: usize) -> usize {
    LINE + ranks * LINE + ranks * 2 * slot_len(slot_bytes)
}

impl Board {
    /// Creates and maps a board for `ranks` ranks with slots of `slot_bytes` (a
    /// multiple of 64, at most 1 MiB), as rank 0. Returns it with its descriptor, to be handed to
    /// every other rank.
    pub(crate) fn create(ranks: usize, slot_bytes: usize) -> io::Result<(Board, OwnedFd)> {
        if slot_bytes % LINE != 0 || slot_bytes > MAX_SLOT_BYTES || ranks == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a board of {ranks} ranks and {slot_bytes}-byte slots"),
            ));
        }
        let len = board_len(ranks, slot_bytes);
        let fd = sealed_memfd(c"switchyard-board", len)?;
        let base = map_shared(fd.as_raw_fd(), len)?;
        // A fresh memfd reads as zeros: no slot holds a call, nobody sleeps.
        // SAFETY: the header is inside the mapping, 8-aligned (page-aligned base).
        unsafe {
            let header = base.cast::<u64>();
            header.write(MAGIC);
            header.add(1).write(ranks as u64);
            header.add(2).write(slot_bytes as u64);
        }
        let board = Board {
            base,
            len,
            ranks,
            slot_bytes,
            me: 0,
            calls: 0,
        };
        Ok((board, fd))
    }

    /// Maps the board rank 0 handed over as `fd`, as rank `me` of `ranks`, checking
    /// its size and header.
    pub(crate) fn open(fd: OwnedFd, me: usize, ranks: usize) -> io::Result<Board> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let len = sealed_len(&fd)?;
        if len < LINE || ranks > MAX_RANKS || me >= ranks {
            return Err(bad(format!(
                "a board of {len} bytes for rank {me} of {ranks}"
            )));
        }
        let base = map_shared(fd.as_raw_fd(), len)?;
        let mut board = Board {
            base,
            len,
            ranks,
            slot_bytes: 0,
            me,
            calls: 0,
        };
        // SAFETY: inside the mapping (len >= LINE), 8-aligned.
        let (magic, their_ranks, slot_bytes) = unsafe {
            let header = base.cast::<u64>();
            (
                header.read_volatile(),
                header.add(1).read_volatile(),
                header.add(2).read_volatile(),
            )
        };
        let slot_bytes = usize::try_from(slot_bytes).unwrap_or(usize::MAX);
        if magic != MAGIC
            || their_ranks != ranks as u64
            || slot_bytes % LINE != 0
            || slot_bytes > MAX_SLOT_BYTES
            || board_len(ranks, slot_bytes) != len
        {
            // Dropping `board` unmaps it.
            return Err(bad(format!(
                "board header {magic:#x}, {their_ranks} ranks, {slot_bytes}-byte slots in \
                 {len} bytes is not a switchyard board for {ranks} ranks"
            )));
        }
        board.slot_bytes = slot_bytes;
        Ok(board)
    }

    /// The most data bytes a rank may publish per call.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Rank `rank`'s sleep flag.
    fn sleeping(&self, rank: usize) -> &AtomicU32 {
        debug_assert!(rank < self.ranks);
        // SAFETY: the line is inside the mapping (checked length), 64-aligned; only
        // atomics touch it.
        unsafe { &*self.base.add(LINE + rank * LINE).cast::<AtomicU32>() }
    }

    /// Rank `rank`'s processor word: 0 while unknown, else 1 + the processor it was
    /// on when it last waited. The second word of its flag line: publishers read the
    /// line's flag anyway, and the word changes only when the rank moves.
    fn processor_word(&self, rank: usize) -> &AtomicU32 {
        debug_assert!(rank < self.ranks);
        // SAFETY: as `sleeping`: the line is inside the mapping; 4 bytes past its
        // start is 4-aligned; only atomics touch it.
        unsafe { &*self.base.add(LINE + rank * LINE + 4).cast::<AtomicU32>() }
    }

    /// Notes on the board the processor this thread runs on, and says whether the
    /// rank of slot `rank` (with `None`: every other rank) was last seen on it: a wait
    /// for such a rank gives the processor up instead of spinning on it.
    ///
    /// The word is written only when it changes, so that a rank that stays put does
    /// not take the line from the publishers' caches; relaxed, since it is a hint: a
    /// stale value costs a spin, or a sleep where a spin would have done. False when
    /// the kernel does not say where this thread runs.
    pub(crate) fn shares_processor_with(&self, rank: Option<usize>) -> bool {
        // SAFETY: no arguments; glibc reads it from the thread's rseq area or the
        // vDSO, without a system call.
        let Ok(processor) = u32::try_from(unsafe { libc::sched_getcpu() }) else {
            return false;
        };
        let here = processor.saturating_add(1);
        let mine = self.processor_word(self.me);
        if mine.load(Ordering::Relaxed) != here {
            mine.store(here, Ordering::Relaxed);
        }
        let seen_here = |r: usize| self.processor_word(r).load(Ordering::Relaxed) == here;
        match rank {
            Some(r) => r != self.me && seen_here(r),
            None => self.ranks > 1 && (0..self.ranks).all(|r| r == self.me || seen_here(r)),
        }
    }

    /// Whether a rank of a lower slot than this one, among those a wait for slot
    /// `rank` waits for (`None`: every other rank), was last seen on the processor
    /// this rank last noted ([`Board::shares_processor_with`]): of two ranks on one
    /// processor, the higher one moves, so that the two never move together.
    pub(crate) fn gives_way_to_a_lower_rank(&self, rank: Option<usize>) -> bool {
        let here = self.processor_word(self.me).load(Ordering::Relaxed);
        let seen_here =
            |r: usize| here != 0 && self.processor_word(r).load(Ordering::Relaxed) == here;
        match rank {
            Some(r) => r < self.me && seen_here(r),
            None => (0..self.me).any(seen_here),
        }
    }

    /// The control line and data of `rank`'s slot for board call `call`.
    fn slot(&self, rank: usize, call: u64) -> (&SlotControl, *mut u8) {
        debug_assert!(rank < self.ranks);
        let index = rank * 2 + (call % 2) as usize;
        let at = LINE + self.ranks * LINE + index * slot_len(self.slot_bytes);
        // SAFETY: `at + DATA_AT + slot_bytes <= len` for every rank and index (the
        // length was checked against `board_len`); the head is 64-aligned and its
        // fields are atomics or plain bytes.
        unsafe {
            let control = &*self.base.add(at).cast::<SlotControl>();
            (control, self.base.add(at + DATA_AT))
        }
    }

    /// Writes this rank's part of its next board call, `parts` one after the other (at
    /// most [`Board::slot_bytes`] in all) with the call's `meta` (at most [`META_BYTES`]) and the
    /// communicator's call number `seq`, and calls `wake` for every other rank that may
    /// be asleep waiting for it.
    pub(crate) fn publish(
        &mut self,
        seq: u64,
        meta: &[u8],
        parts: &[&[u8]],
        wake: impl FnMut(usize),
    ) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len <= self.slot_bytes && meta.len() <= META_BYTES);
        self.calls += 1;
        let (control, slot) = self.slot(self.me, self.calls);
        // Both lengths fit: at most a slot (below 4 GiB, checked at open) and
        // META_BYTES.
        control.publish(self.calls, seq, len as u32, meta.len() as u32, || {
            // SAFETY: `slot` has `slot_bytes` bytes, `len` of them written here; nobody
            // reads this slot until the call number says it holds this call (readers of
            // the call two back are done, see the module documentation).
            unsafe {
                let mut at = slot;
                for part in parts {
                    switchyard_msg::copy::copy_bytes_raw(part.as_ptr(), at, part.len());
                    at = at.add(part.len());
                }
                let meta_at = std::ptr::addr_of!(control.meta).cast::<u8>().cast_mut();
                std::ptr::copy_nonoverlapping(meta.as_ptr(), meta_at, meta.len());
            }
        });
        let others = (0..self.ranks).filter(|&r| r != self.me);
        wake_sleepers(others.map(|rank| (rank, self.sleeping(rank))), wake);
    }

    /// Whether rank `from` has published its part of this rank's last board call
    /// (true before the first): until then this rank must not publish again, since
    /// its next call's slot may still be read by `from` (see the module
    /// documentation).
    pub(crate) fn published_last(&self, from: usize) -> bool {
        if self.calls == 0 {
            return true;
        }
        // `from` writes this slot next for the call after our next one, which needs
        // our next part: the slot holds our last call or an earlier one.
        let (control, _) = self.slot(from, self.calls);
        control.reached(self.calls)
    }

    /// Rank `from`'s part of the current board call (the one this rank published
    /// last), once `from` has published it.
    pub(crate) fn entry(&self, from: usize) -> Result<Option<Entry<'_>>, BoardError> {
        self.read(from, self.calls)
    }

    /// Rank `from`'s part of the board call after this rank's last, if `from` has
    /// published it already: a rank in a call this rank is not making on the board.
    pub(crate) fn ahead(&self, from: usize) -> Result<Option<Entry<'_>>, BoardError> {
        self.read(from, self.calls + 1)
    }

    /// Rank `from`'s part of board call `call`, once it holds that call.
    fn read(&self, from: usize, call: u64) -> Result<Option<Entry<'_>>, BoardError> {
        let (control, slot) = self.slot(from, call);
        let Some((seq, len, meta_len)) = control.holding(call) else {
            return Ok(None);
        };
        if len as usize > self.slot_bytes || meta_len as usize > META_BYTES {
            return Err(BoardError {
                rank: from,
                len,
                meta: meta_len,
            });
        }
        // SAFETY: both ranges lie inside the slot (checked above). For the current
        // call, `from` does not write this slot again before this rank publishes its
        // next call, which ends the borrow (`&self` here, `&mut self` there). A slot
        // read ahead (`ahead`) is not written again either: `from` writes it next for
        // the call after that one, which needs this rank's part of the next call.
        unsafe {
            let meta = std::ptr::addr_of!(control.meta).cast::<u8>();
            Ok(Some(Entry {
                seq,
                meta: std::slice::from_raw_parts(meta, meta_len as usize),
                data: std::slice::from_raw_parts(slot, len as usize),
            }))
        }
    }

    /// Raises (before a sleep) or lowers (after it) this rank's sleep flag. Raising
    /// is followed by a fence: the caller then looks at the slot it waits for once
    /// more before it sleeps.
    pub(crate) fn set_sleeping(&self, asleep: bool) {
        set_flag(self.sleeping(self.me), asleep);
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create` or `open`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A board for `ranks` ranks as each of them maps it.
    fn boards(ranks: usize, slot_bytes: usize) -> Vec<Board> {
        let (first, fd) = Board::create(ranks, slot_bytes).unwrap();
        let mut all = vec![first];
        for me in 1..ranks {
            let dup = fd.try_clone().unwrap();
            all.push(Board::open(dup, me, ranks).unwrap());
        }
        all
    }

    #[test]
    fn a_rank_knows_which_peers_were_last_seen_on_its_processor() {
        // Pinned to the processor it is on, so that every look below sees the same.
        // SAFETY: a zeroed set is a valid empty `cpu_set_t`; pid 0 is this thread.
        let pinned = unsafe {
            let here = usize::try_from(libc::sched_getcpu()).unwrap();
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(here, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        assert!(pinned);
        let b = boards(3, 64);
        // Nobody has said where it runs: no peer is beside rank 0.
        assert!(!b[0].shares_processor_with(Some(1)));
        assert!(!b[0].shares_processor_with(None));
        // Rank 1 looks (and so notes its processor): beside rank 0 now, rank 2 not yet.
        assert!(b[1].shares_processor_with(Some(0)));
        assert!(b[0].shares_processor_with(Some(1)));
        assert!(!b[0].shares_processor_with(Some(2)));
        assert!(!b[0].shares_processor_with(None));
        assert!(b[2].shares_processor_with(None));
        assert!(b[0].shares_processor_with(None));
        // A rank is never beside itself.
        assert!(!b[0].shares_processor_with(Some(0)));
        // All three on one processor now: of each pair the higher rank gives way.
        assert!(b[1].gives_way_to_a_lower_rank(Some(0)));
        assert!(!b[0].gives_way_to_a_lower_rank(Some(1)));
        assert!(b[2].gives_way_to_a_lower_rank(None));
        assert!(!b[0].gives_way_to_a_lower_rank(None));
        assert!(!b[2].gives_way_to_a_lower_rank(Some(2)));
    }

    #[test]
    fn every_rank_reads_every_part_and_the_slots_alternate() {
        let mut b = boards(3, 64);
        for call in 1..=5u8 {
            for (me, board) in b.iter_mut().enumerate() {
                board.publish(u64::from(call), &[call], &[&[call, me as u8]], |_| {});
            }
            for board in &b {
                for from in 0..3 {
                    let e = board.entry(from).unwrap().expect("published");
                    assert_eq!((e.meta, e.data), (&[call][..], &[call, from as u8][..]));
                    assert_eq!(e.seq, u64::from(call));
                }
            }
        }
    }

    /// A rank that publishes a board call the reader has not made is seen ahead, with
    /// its call number; once the reader publishes too, it is the current entry.
    #[test]
    fn a_rank_ahead_on_the_board_is_seen() {
        let mut b = boards(2, 64);
        assert!(b[1].ahead(0).unwrap().is_none());
        b[0].publish(7, &[1], &[&[]], |_| {});
        let ahead = b[1].ahead(0).unwrap().expect("ahead");
        assert_eq!((ahead.seq, ahead.meta), (7, &[1][..]));
        assert!(b[1].entry(0).unwrap().is_none());
        b[1].publish(7, &[1], &[&[]], |_| {});
        assert_eq!(b[1].entry(0).unwrap().expect("current").seq, 7);
        assert!(b[1].ahead(0).unwrap().is_none());
    }

    #[test]
    fn a_sleeping_rank_is_woken_by_a_publish() {
        let mut b = boards(2, 64);
        b[1].set_sleeping(true);
        let mut woken = Vec::new();
        b[0].publish(1, &[], &[&[1]], |r| woken.push(r));
        assert_eq!(woken, [1]);
        b[1].set_sleeping(false);
        b[0].calls = 0;
        woken.clear();
        b[0].publish(1, &[], &[&[1]], |r| woken.push(r));
        assert!(woken.is_empty());
    }

    /// A rank knows when every other rank has published its part of its last call:
    /// before that it must not write the slot two calls back.
    #[test]
    fn a_rank_sees_who_has_published_its_last_call() {
        let mut b = boards(3, 64);
        assert!(
            (0..3).all(|r| b[0].published_last(r)),
            "nothing to wait for yet"
        );
        b[0].publish(1, b"m", &[&b"x"[..]], |_| {});
        assert!(!b[0].published_last(1) && !b[0].published_last(2));
        b[1].publish(1, b"m", &[&b""[..]], |_| {});
        assert!(b[0].published_last(1) && !b[0].published_last(2));
        b[2].publish(1, b"m", &[&b""[..]], |_| {});
        assert!(b[0].published_last(2));
        // Rank 1 goes on to the next call: still past rank 0's last.
        b[1].publish(2, b"m", &[&b""[..]], |_| {});
        assert!(b[0].published_last(1));
    }

    #[test]
    fn a_corrupt_length_is_an_error_not_a_read() {
        let mut b = boards(2, 64);
        b[0].publish(1, &[], &[&[1, 2, 3]], |_| {});
        b[1].calls = 1;
        let (control, _) = b[0].slot(0, 1);
        control.len.store(1 << 30, Ordering::Relaxed);
        assert!(b[1].entry(0).is_err());
    }

    #[test]
    fn a_board_for_another_world_is_refused() {
        let (_board, fd) = Board::create(2, 64).unwrap();
        let err = Board::open(fd.try_clone().unwrap(), 1, 3).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let segment_fd = sealed_memfd(c"not-a-board", board_len(2, 64)).unwrap();
        assert!(Board::open(segment_fd, 1, 2).is_err());
    }
}

#[cfg(all(test, loom))]
#[path = "board_loom.rs"]
mod loom_tests;
