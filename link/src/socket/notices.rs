//! The control messages a [`SocketLink`] exchanges beside the data: abort notices
//! (with the rank each blames, so that a survivor can follow a failure back to where
//! it began), their receipts (so that a failing rank's notice leaves before its
//! process does), and the question whether a rank is alive (a stopped or dead process
//! does not answer).

use super::{ABORT_STEP, SocketLink};
use crate::{Notice, Tag};
use bytes::Bytes;
use std::time::{Duration, Instant};
use switchyard_transports::Socket;

/// The step number of the receipt a rank sends for an abort notice.
pub(super) const ACK_STEP: u32 = u32::MAX - 2;
/// The step numbers of [`Link::alive`](crate::Link::alive)'s question
/// and its answer.
pub(super) const PROBE_STEP: u32 = u32::MAX - 3;
pub(super) const ANSWER_STEP: u32 = u32::MAX - 4;
/// How long a closing [`SocketLink`] that sent abort notices waits for their
/// receipts. ZeroMQ sends from its own I/O thread, and a process that exits right
/// after its error (the `?` in `main`) would otherwise take its notice with it: the
/// others would see a closed connection instead of the cause.
pub(super) const ABORT_FLUSH: Duration = Duration::from_millis(300);

impl SocketLink {
    /// Handles a control message from `sender` (call `seq`, step `step`); `false`
    /// when the message is not one.
    pub(super) fn control_step(
        &mut self,
        sender: usize,
        seq: u64,
        step: u32,
        frames: &[Bytes],
    ) -> bool {
        if step == ABORT_STEP {
            let reason = frames
                .first()
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .unwrap_or_default();
            // The second frame, when present, is the rank the sender blames.
            let blames = frames
                .get(1)
                .and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok())
                .map(u64::from_le_bytes)
                .and_then(|r| usize::try_from(r).ok())
                .filter(|&r| r < self.size);
            if self.aborted.is_none() {
                self.aborted = Some((sender, reason.clone()));
            }
            self.notices.push(Notice {
                rank: sender,
                reason,
                blames,
            });
            let ack = self.message(
                sender,
                Tag {
                    call: seq,
                    step: ACK_STEP,
                },
                Vec::new(),
            );
            if let Some(Some(dealer)) = self.dealers.get_mut(sender) {
                let _ = dealer.try_send(ack);
            }
            return true;
        }
        if step == ACK_STEP {
            self.acks[sender] = true;
            return true;
        }
        if step == PROBE_STEP {
            let tag = Tag {
                call: seq,
                step: ANSWER_STEP,
            };
            let answer = self.message(sender, tag, Vec::new());
            if let Some(Some(dealer)) = self.dealers.get_mut(sender) {
                let _ = dealer.try_send(answer);
            }
            return true;
        }
        if step == ANSWER_STEP {
            self.answered[sender] = true;
            return true;
        }
        false
    }

    /// Sends every peer an abort notice for `call` with `reason`, blaming `blames`.
    pub(super) fn send_abort(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        let tag = Tag {
            call,
            step: ABORT_STEP,
        };
        let deadline = Instant::now() + ABORT_FLUSH;
        self.sent_abort = true;
        for to in 0..self.size {
            if to == self.rank {
                continue;
            }
            let mut frames = vec![Bytes::copy_from_slice(reason.as_bytes())];
            if let Some(blamed) = blames {
                frames.push(Bytes::copy_from_slice(&(blamed as u64).to_le_bytes()));
            }
            let msg = self.message(to, tag, frames);
            if let Some(Some(dealer)) = self.dealers.get_mut(to) {
                // Bounded: a peer whose queue is full is not waited for long.
                let _ = dealer.send_deadline(msg, deadline);
            }
        }
    }

    /// Asks `rank` whether it is alive; see [`Link::alive`](crate::Link::alive).
    pub(super) fn ask_alive(&mut self, rank: usize, within: Duration) -> bool {
        if rank >= self.size || rank == self.rank {
            return rank == self.rank;
        }
        self.answered[rank] = false;
        let question = self.message(
            rank,
            Tag {
                call: 0,
                step: PROBE_STEP,
            },
            Vec::new(),
        );
        let deadline = Instant::now() + within;
        if let Some(Some(dealer)) = self.dealers.get_mut(rank) {
            if dealer.send_deadline(question, deadline).is_err() {
                return false;
            }
        }
        let started = Instant::now();
        while !self.answered[rank] && Instant::now() < deadline {
            match self.receive_one(rank, started, deadline) {
                Ok(Some((sender, header, frames, step))) => {
                    let tag = Tag {
                        call: header.seq,
                        step,
                    };
                    self.pending.push(sender, tag, frames);
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
        self.answered[rank]
    }

    /// Every notice so far, after reading what arrives until `until`.
    pub(super) fn read_notices(&mut self, until: Instant) -> Vec<Notice> {
        let started = Instant::now();
        while Instant::now() < until {
            match self.receive_one(self.rank, started, until) {
                Ok(Some((sender, header, frames, step))) => {
                    let tag = Tag {
                        call: header.seq,
                        step,
                    };
                    self.pending.push(sender, tag, frames);
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
        self.notices.clone()
    }

    /// Waits (at most [`ABORT_FLUSH`]) until every peer has acknowledged this rank's
    /// abort notices, reading and dropping whatever else arrives.
    pub(crate) fn flush_aborts(&mut self) {
        let deadline = Instant::now() + ABORT_FLUSH;
        let started = Instant::now();
        while Instant::now() < deadline && (0..self.size).any(|p| p != self.rank && !self.acks[p]) {
            if self.receive_one(self.rank, started, deadline).is_err() {
                break;
            }
        }
    }
}
