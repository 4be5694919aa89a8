//! The stream link's side of the host board (`shm/board.rs`): publishing this rank's
//! part of a call, and waiting for a peer's with the same clocks, liveness checks and
//! abort notices as a wait for a message.

use super::{Pipe, StreamLink};
use crate::Clock;
use crate::LinkError;
use crate::shm::Board;
use bytes::Bytes;
use std::time::Instant;

impl StreamLink {
    /// The host board's slot size; 0 without a board.
    pub(super) fn board_slot_bytes(&self) -> usize {
        self.board.as_ref().map_or(0, |b| b.slot_bytes())
    }

    /// Rank `rank`'s slot on the host board: its place among the ranks that share it.
    fn slot_of(&self, rank: usize) -> Result<usize, LinkError> {
        self.board_ranks
            .iter()
            .position(|&r| r == rank)
            .ok_or_else(|| LinkError::Transport {
                rank,
                reason: format!("rank {rank} is not on this rank's host board"),
            })
    }

    fn no_board(&self) -> LinkError {
        LinkError::Transport {
            rank: self.rank,
            reason: "this link has no host board".into(),
        }
    }

    /// [`Link::board_publish`](crate::Link::board_publish): waits
    /// for every rank's part of this rank's last board call, then publishes; a
    /// sleeping peer is woken through its pipe.
    pub(super) fn publish_on_board(
        &mut self,
        meta: &[u8],
        parts: &[&[u8]],
        clock: Clock,
    ) -> Result<(), LinkError> {
        self.interrupted()?;
        let mut published = |board: &Board, slot| Ok(board.published_last(slot));
        for slot in 0..self.board_ranks.len() {
            let from = self.board_ranks[slot];
            // Most calls find every part there at the first look: only a missing one
            // enters the wait, with its clock and liveness checks.
            if from != self.rank && !self.board.as_ref().is_some_and(|b| b.published_last(slot)) {
                self.wait_on_board(from, clock, &mut published)?;
            }
        }
        let Some(board) = self.board.as_mut() else {
            return Err(self.no_board());
        };
        let seq = self.pending.expected().map_or(0, |(call, _)| call);
        let (peers, ranks) = (&self.peers, &self.board_ranks);
        board.publish(seq, meta, parts, |slot| {
            if let Some(Some(peer)) = ranks.get(slot).and_then(|&rank| peers.get(rank)) {
                if let Pipe::Shm(pipe) = &peer.pipe {
                    pipe.wake();
                }
            }
        });
        Ok(())
    }

    /// The refusal for a peer that is in this rank's current call on the board while
    /// this rank runs it another way (another length or call put the two on different
    /// algorithms): neither would ever hear from the other, so a rank waiting for a
    /// message looks here too. `None` without a board or such a peer. A peer on the
    /// board in a later call is no refusal: its slot says which call it is in.
    pub(super) fn board_refusal(&self) -> Option<LinkError> {
        let board = self.board.as_ref()?;
        let (call, stamp) = self.pending.expected()?;
        let ranks = self.board_ranks.iter().enumerate();
        ranks
            .filter(|&(_, &r)| r != self.rank)
            .find_map(|(slot, &from)| {
                let entry = board.ahead(slot).ok()??;
                (entry.seq == call && !entry.meta.starts_with(stamp)).then(|| LinkError::Refused {
                    rank: from,
                    first: Bytes::copy_from_slice(entry.meta),
                })
            })
    }

    /// [`Link::board_take`](crate::Link::board_take).
    pub(super) fn take_from_board(
        &mut self,
        from: usize,
        stamp: &[u8],
        clock: Clock,
        take: &mut dyn FnMut(&[u8]),
    ) -> Result<(), LinkError> {
        self.wait_on_board(from, clock, &mut |board, slot| {
            let entry = board.entry(slot).map_err(|e| LinkError::Transport {
                rank: from,
                reason: e.to_string(),
            })?;
            let Some(entry) = entry else {
                return Ok(false);
            };
            if !entry.meta.starts_with(stamp) {
                return Err(LinkError::Refused {
                    rank: from,
                    first: Bytes::copy_from_slice(entry.meta),
                });
            }
            take(entry.data);
            Ok(true)
        })
    }

    /// Waits under `clock` until `look`, given the board and rank `from`'s slot on
    /// it, says that what this rank waits for from `from` is there (`Ok(true)`,
    /// having taken it). While it waits it keeps every pipe moving (output still
    /// queued, heartbeats, a closed pipe), spins for the link's spin time, then
    /// sleeps in `poll(2)` with its flag up on the board, woken by `from`'s next
    /// publish. Fails when `from` is gone, silent or aborted, as a wait for a message
    /// does, or with `look`'s error.
    fn wait_on_board(
        &mut self,
        from: usize,
        clock: Clock,
        look: &mut dyn FnMut(&Board, usize) -> Result<bool, LinkError>,
    ) -> Result<(), LinkError> {
        self.interrupted()?;
        let slot = self.slot_of(from)?;
        // Read the clock only once the wait is not over at the first look: a small
        // call on ranks that keep pace finds every part there, and two clock reads
        // per part would be a good part of its time.
        let mut clock_started: Option<(Instant, Instant)> = None;
        loop {
            let board = self.board.as_ref().ok_or_else(|| self.no_board())?;
            if look(board, slot)? {
                return Ok(());
            }
            let (started, spin_until) =
                *clock_started.get_or_insert_with(|| (Instant::now(), Instant::now() + self.spin));
            self.interrupted()?;
            self.progress()?;
            if let Some(refused) = self.pending.refusal() {
                return Err(refused);
            }
            let peer = self.peer(from)?;
            if let Some(reason) = peer.closed.clone() {
                let endpoint = peer.endpoint();
                // A peer publishes its last part and then leaves: when its part came
                // between the look above and the close seen here, it is there now
                // (the publish happened before the close, which we saw).
                let board = self.board.as_ref().ok_or_else(|| self.no_board())?;
                if look(board, slot)? {
                    return Ok(());
                }
                return Err(LinkError::Lost {
                    rank: from,
                    endpoint,
                    reason,
                });
            }
            if let Some(silent) = self.silent(from) {
                self.control.check_aborts()?;
                return Err(silent);
            }
            // A part arrives whole or not at all: the silence counts from the start
            // of the wait.
            let until = clock.until(started);
            let now = Instant::now();
            if now >= until {
                self.control.check_aborts()?;
                return Err(LinkError::Timeout {
                    rank: from,
                    waited: now - started,
                });
            }
            if now < spin_until && self.spin_pass(Some(slot)) {
                continue;
            }
            self.control.check_aborts()?;
            let board = self.board.as_ref().ok_or_else(|| self.no_board())?;
            board.set_sleeping(true);
            // Looked at once more with the flag up: a publish after this look wakes us.
            match look(board, slot) {
                Ok(false) => {}
                done => {
                    board.set_sleeping(false);
                    return done.map(|_| ());
                }
            }
            self.sleep(self.watch_until(from, until));
            if let Some(board) = &self.board {
                board.set_sleeping(false);
            }
        }
    }
}
