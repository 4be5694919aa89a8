//! Loom models of the host board (`board.rs`): [`SlotControl`]'s methods,
//! [`wake_sleepers`] and [`set_flag`], the protocol [`Board`](super::Board) runs, over
//! slots whose data loom watches (a `loom::cell::UnsafeCell` per slot: a read or
//! write of a slot that the protocol did not order after the other side's last access
//! to it is a causality violation). The ranks' steps are those of
//! `stream/board.rs`: before a publish, every other rank's part of this rank's last
//! board call ([`Board::published_last`](super::Board::published_last)); the wait
//! for a part spins, or sleeps with the rank's flag up, or ends at the peer's close.
//! The models' names start with `loom_`.
//!
//! Each invariant has a broken variant beside it, the protocol with one ordering
//! weakened or one step left out, which loom must fail (`#[should_panic]`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{SlotControl, set_flag, wake_sleepers};
use crate::sync::model::{Bell, check};
use crate::sync::{AtomicU32, Ordering};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicBool;
use loom::thread;
use std::sync::Arc;

/// Ranks on the models' board.
const RANKS: usize = 2;

/// The protocol a model runs: as written, or broken in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    AsWritten,
    /// A slot's call number is stored with relaxed ordering, not release.
    CallRelaxed,
    /// A rank publishes without waiting for every rank's part of its last call.
    NoWaitForParts,
    /// A rank raises its sleep flag with no fence before its second look.
    NoFenceAfterFlag,
    /// A rank that sees the peer's close reports it lost without looking at its slot
    /// once more.
    NoLookAfterClose,
}

/// The board: two slots a rank, their data (one number), a sleep flag and a bell a
/// rank.
struct Board {
    slots: [[SlotControl; 2]; RANKS],
    data: [[UnsafeCell<u64>; 2]; RANKS],
    flags: [AtomicU32; RANKS],
    bells: [Bell; RANKS],
    variant: Variant,
}

// SAFETY: the data are loom's cells, which check every access against the orderings
// the protocol set up: the point of the model.
unsafe impl Sync for Board {}

impl Board {
    fn new(variant: Variant) -> Arc<Board> {
        Arc::new(Board {
            slots: std::array::from_fn(|_| std::array::from_fn(|_| SlotControl::new())),
            data: std::array::from_fn(|_| std::array::from_fn(|_| UnsafeCell::new(0))),
            flags: std::array::from_fn(|_| AtomicU32::new(0)),
            bells: std::array::from_fn(|_| Bell::new()),
            variant,
        })
    }
}

/// One rank's view of the board, as [`Board`](super::Board) keeps it.
struct Rank {
    board: Arc<Board>,
    me: usize,
    /// Board calls this rank has published.
    calls: u64,
}

impl Rank {
    fn new(board: &Arc<Board>, me: usize) -> Rank {
        Rank {
            board: board.clone(),
            me,
            calls: 0,
        }
    }

    /// `publish_on_board`: waits (spinning) for every other rank's part of this
    /// rank's last call, then publishes `value` (or an empty part) and rings the bell
    /// of every rank whose flag is up.
    fn publish(&mut self, value: Option<u64>) {
        let board = self.board.clone();
        for from in (0..RANKS).filter(|&r| r != self.me) {
            while board.variant != Variant::NoWaitForParts && !self.published_last(from) {
                thread::yield_now();
            }
        }
        self.calls += 1;
        let (call, index) = (self.calls, (self.calls % 2) as usize);
        let slot = &board.slots[self.me][index];
        let copy = || {
            if let Some(value) = value {
                // SAFETY: loom's cell; a write the protocol did not order after the
                // readers of the slot's last call fails the model.
                board.data[self.me][index].with_mut(|p| unsafe { *p = value });
            }
        };
        let len = u32::from(value.is_some());
        if board.variant == Variant::CallRelaxed {
            copy();
            slot.seq.store(call, Ordering::Relaxed);
            slot.len.store(len, Ordering::Relaxed);
            slot.meta_len.store(0, Ordering::Relaxed);
            slot.call.store(call, Ordering::Relaxed);
        } else {
            slot.publish(call, call, len, 0, copy);
        }
        let others = (0..RANKS).filter(|&r| r != self.me);
        wake_sleepers(others.map(|r| (r, &board.flags[r])), |r| {
            board.bells[r].ring()
        });
    }

    /// [`Board::published_last`](super::Board::published_last).
    fn published_last(&self, from: usize) -> bool {
        self.calls == 0 || self.board.slots[from][(self.calls % 2) as usize].reached(self.calls)
    }

    /// [`Board::entry`](super::Board::entry): `from`'s part of this rank's last call,
    /// as its communicator call number and value, once it is there. A slot that holds
    /// a later call was written again before this rank took its part: that fails.
    fn entry(&self, from: usize) -> Option<(u64, u64)> {
        let index = (self.calls % 2) as usize;
        let slot = &self.board.slots[from][index];
        let Some((seq, len, _)) = slot.holding(self.calls) else {
            assert!(
                !slot.reached(self.calls + 1),
                "a slot reused before its reader took it"
            );
            return None;
        };
        assert_eq!(len, 1);
        // SAFETY: loom's cell; a read the protocol did not order after the write of
        // this call fails the model.
        let value = self.board.data[from][index].with(|p| unsafe { *p });
        Some((seq, value))
    }

    /// `wait_on_board` for `from`'s part of this rank's last call, sleeping with the
    /// flag up after a look that finds nothing.
    fn sleep_for(&self, from: usize) -> (u64, u64) {
        let flag = &self.board.flags[self.me];
        loop {
            if let Some(entry) = self.entry(from) {
                return entry;
            }
            if self.board.variant == Variant::NoFenceAfterFlag {
                flag.store(1, Ordering::Relaxed);
            } else {
                set_flag(flag, true);
            }
            if let Some(entry) = self.entry(from) {
                set_flag(flag, false);
                return entry;
            }
            self.board.bells[self.me].sleep();
            set_flag(flag, false);
        }
    }
}

/// A broadcast from rank 0, three board calls in a row: the root publishes its part
/// and returns; rank 1 publishes its (empty) part, then takes the root's. The third
/// call reuses the first one's slot: the root must not write it before rank 1 took
/// the first call's part, and rank 1 must take each call's part, not the next one's.
fn broadcast_root_returns_early(variant: Variant) {
    check(move || {
        let board = Board::new(variant);
        let root = {
            let mut root = Rank::new(&board, 0);
            thread::spawn(move || {
                for call in 1..=3 {
                    root.publish(Some(100 + call));
                }
            })
        };
        let mut rank = Rank::new(&board, 1);
        for call in 1..=3 {
            rank.publish(None);
            let entry = loop {
                match rank.entry(0) {
                    Some(entry) => break entry,
                    None => thread::yield_now(),
                }
            };
            assert_eq!(entry, (call, 100 + call), "another call's part taken");
        }
        root.join().unwrap();
    });
}

#[test]
fn loom_board_broadcast_root_returns_early() {
    broadcast_root_returns_early(Variant::AsWritten);
}

#[test]
#[should_panic]
fn loom_board_broken_no_wait_for_parts_reuses_a_slot_too_soon() {
    broadcast_root_returns_early(Variant::NoWaitForParts);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn loom_board_broken_call_relaxed_reads_a_part_before_it_is_written() {
    broadcast_root_returns_early(Variant::CallRelaxed);
}

/// Rank 1 waits for rank 0's part with its flag up and sleeps; rank 0 publishes and
/// rings the bells the flags ask for. Rank 1 always wakes (a lost wake-up leaves it
/// asleep for good: loom's deadlock) and takes the part.
fn sleeper_is_woken(variant: Variant) {
    check(move || {
        let board = Board::new(variant);
        let root = {
            let mut root = Rank::new(&board, 0);
            thread::spawn(move || root.publish(Some(101)))
        };
        let mut rank = Rank::new(&board, 1);
        // Rank 1's view of call 1, without a part of its own: the wait is the model.
        rank.calls = 1;
        assert_eq!(rank.sleep_for(0), (1, 101));
        root.join().unwrap();
    });
}

#[test]
fn loom_board_sleeper_is_woken() {
    sleeper_is_woken(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_board_broken_no_fence_after_the_flag_loses_a_wake_up() {
    sleeper_is_woken(Variant::NoFenceAfterFlag);
}

/// Rank 0 publishes its part and leaves (its pipe's socket closes, which the kernel
/// orders after everything it did before: a flag set with release ordering here).
/// Rank 1, spinning, sees the close or the part; seeing the close, it looks at the
/// slot once more (`wait_on_board`), and so always takes the part.
fn closed_peer_leaves_its_last_part(variant: Variant) {
    check(move || {
        let board = Board::new(variant);
        let closed = Arc::new(AtomicBool::new(false));
        let root = {
            let (mut root, closed) = (Rank::new(&board, 0), closed.clone());
            thread::spawn(move || {
                root.publish(Some(101));
                closed.store(true, Ordering::Release);
            })
        };
        let mut rank = Rank::new(&board, 1);
        rank.calls = 1;
        let entry = loop {
            if let Some(entry) = rank.entry(0) {
                break entry;
            }
            if closed.load(Ordering::Acquire) {
                let last_look = match variant {
                    Variant::NoLookAfterClose => None,
                    _ => rank.entry(0),
                };
                break last_look.expect("the peer's last part lost to its close");
            }
            thread::yield_now();
        };
        assert_eq!(entry, (1, 101));
        root.join().unwrap();
    });
}

#[test]
fn loom_board_closed_peer_leaves_its_last_part() {
    closed_peer_leaves_its_last_part(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "the peer's last part lost to its close")]
fn loom_board_broken_no_look_after_close_loses_the_last_part() {
    closed_peer_leaves_its_last_part(Variant::NoLookAfterClose);
}
