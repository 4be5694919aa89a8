//! The mesh engine's algorithms, generic over [`Link`], and [`choice::choose`], which
//! picks one for a call.
//!
//! Every message of a call carries a [`Meta`] frame before its payload: the call's
//! total element count, the call's [`Signature`] and the offset of the payload within
//! the call's buffer. A receiver checks all three, so that ranks calling with
//! different lengths, operations, types or roots get an error naming the other rank
//! instead of wrong numbers.
//!
//! The first 16 bytes of the meta frame (total and signature) are the same on every
//! message of a call: [`Round::expect`] hands them to the link as the call's stamp,
//! and the link refuses any message of the call that does not start with them,
//! whatever its step, as it arrives ([`Link::expect`]). So ranks that disagree fail
//! at their first message to each other even when their disagreement put them on
//! different algorithms, whose step tags never meet.

pub(crate) mod accumulate;
pub(crate) mod board;
pub(crate) mod choice;
pub(crate) mod direct;
pub(crate) mod doubling;
#[cfg(test)]
mod in_memory_tests;
pub(crate) mod ring;
pub(crate) mod run;
pub(crate) mod tree;

use super::error::{CollectiveError, During, LinkError};
use super::link::{Clock, Link, Tag};
use super::signature::{Meta, Signature};
use bytes::Bytes;
use std::ops::Range;
use std::time::{Duration, Instant};
use switchyard_msg::payload::{self, Element};

/// One collective call in progress on one rank.
pub(crate) struct Round<'a> {
    pub(crate) link: &'a mut dyn Link,
    pub(crate) sig: Signature,
    pub(crate) seq: u64,
    pub(crate) total: u64,
    /// The call's silence timeout and deadline.
    pub(crate) clock: Clock,
    /// When the call began, for the deadline's length in errors.
    pub(crate) started: Instant,
    /// The algorithm running, named in timeout errors ("ring", "direct exchange");
    /// each algorithm sets it as it starts.
    pub(crate) algo: &'static str,
    /// Added to every step number: 0 for the data, [`AGREE_STEPS`] for checked
    /// mode's agreement before it, so that the two never share a tag.
    pub(crate) step_base: u32,
}

/// The step that errors of [`Round::finish`] name: no message carries it.
const FINISH_STEP: u32 = u32::MAX;

/// The step numbers of checked mode's agreement start here (the algorithms use
/// small step numbers; the links reserve the top few).
pub(crate) const AGREE_STEPS: u32 = 1 << 30;

impl Round<'_> {
    pub(crate) fn rank(&self) -> usize {
        self.link.rank()
    }

    pub(crate) fn size(&self) -> usize {
        self.link.world_size()
    }

    /// Rank `rank` of this round's link as errors name it: its rank in the whole
    /// world (the phases of a hierarchical call run on a group of the world's ranks).
    pub(crate) fn world_rank(&self, rank: usize) -> usize {
        self.link.world_rank(rank)
    }

    /// `e` as an error of this call; a timeout says which clock ran out and where in
    /// the call (the algorithm and step) this rank was waiting.
    pub(crate) fn link_error(&self, e: LinkError, step: u32) -> CollectiveError {
        if let LinkError::Refused { rank, first } = &e {
            if let Some(meta) = Meta::decode(first) {
                if let Err(mismatch) = self.sig.agree(
                    self.total,
                    self.world_rank(self.rank()),
                    *rank,
                    meta.sig,
                    Some(meta.total),
                ) {
                    return mismatch;
                }
            }
        }
        let call = self.sig.call;
        let during = match (self.algo, step) {
            ("", FINISH_STEP) => " (handing over the call's last data)".to_string(),
            (algo, FINISH_STEP) => format!(" ({algo}, handing over the call's last data)"),
            ("", step) => format!(" (step {step})"),
            (algo, step) => format!(" ({algo} step {step})"),
        };
        match e {
            LinkError::Timeout { rank, .. } if self.clock.past_deadline() => {
                CollectiveError::DeadlineExceeded {
                    call,
                    limit: self.clock.deadline.map_or(Duration::ZERO, |d| {
                        d.saturating_duration_since(self.started)
                    }),
                    rank,
                    during,
                }
            }
            LinkError::Timeout { rank, waited } => CollectiveError::PeerTimeout {
                call,
                rank,
                waited,
                during,
            },
            e => e.during(call),
        }
    }

    /// Ends the call on this rank: waits until everything it sent has left its own
    /// queue ([`Link::flush_within`]), so that no peer still waiting for this call's
    /// data depends on what this rank's caller does next.
    pub(crate) fn finish(&mut self) -> Result<(), CollectiveError> {
        self.link
            .flush_within(self.clock)
            .map_err(|e| self.link_error(e, FINISH_STEP))
    }

    /// The meta frame of this call's payload that starts at element `offset`.
    pub(crate) fn meta(&self, offset: u64) -> [u8; Meta::LEN] {
        Meta {
            total: self.total,
            sig: self.sig.encode(),
            offset,
        }
        .encode()
    }

    /// The first bytes of every message of this call (see the module documentation).
    pub(crate) fn stamp(&self) -> [u8; 16] {
        let mut stamp = [0u8; 16];
        stamp.copy_from_slice(&self.meta(0)[..16]);
        stamp
    }

    /// Tells the link this call's stamp, so that it refuses any message of the call
    /// from a rank that made another call, whatever the message's step.
    pub(crate) fn expect(&mut self) {
        let stamp = self.stamp();
        self.link.expect(self.seq, &stamp);
    }

    /// Sends `payload`, which starts at element `offset` of the call's buffer.
    pub(crate) fn send(
        &mut self,
        to: usize,
        step: u32,
        offset: u64,
        payload: Bytes,
    ) -> Result<(), CollectiveError> {
        let meta = self.meta(offset);
        let tag = Tag {
            call: self.seq,
            step: self.step_base + step,
        };
        self.link
            .send_within(
                to,
                tag,
                vec![Bytes::copy_from_slice(&meta), payload],
                self.clock,
            )
            .map_err(|e| self.link_error(e, step))
    }

    /// Receives the payload that starts at element `offset` (or anywhere, for `None`)
    /// after checking that the sender is in the same call.
    pub(crate) fn recv(
        &mut self,
        from: usize,
        step: u32,
        offset: Option<u64>,
    ) -> Result<Bytes, CollectiveError> {
        let tag = Tag {
            call: self.seq,
            step: self.step_base + step,
        };
        let frames = self
            .link
            .recv_within(from, tag, self.clock)
            .map_err(|e| self.link_error(e, step))?;
        let call = self.sig.call;
        let (me, sender) = (self.world_rank(self.rank()), self.world_rank(from));
        let malformed = |reason: String| CollectiveError::Malformed {
            call,
            rank: sender,
            reason,
        };
        let [meta, payload]: [Bytes; 2] = frames
            .try_into()
            .map_err(|f: Vec<Bytes>| malformed(format!("{} frames, expected 2", f.len())))?;
        let meta = Meta::decode(&meta)
            .ok_or_else(|| malformed(format!("meta frame of {} bytes", meta.len())))?;
        self.sig
            .agree(self.total, me, sender, meta.sig, Some(meta.total))?;
        if let Some(offset) = offset {
            if meta.offset != offset {
                return Err(malformed(format!(
                    "payload at offset {}, expected {offset}",
                    meta.offset
                )));
            }
        }
        Ok(payload)
    }

    /// Receives a payload of exactly `expect` elements of `T` at `offset` and hands
    /// it to `use_it` as a slice (in place when aligned, else through one copy).
    pub(crate) fn recv_elements<T: Element>(
        &mut self,
        from: usize,
        step: u32,
        offset: u64,
        expect: usize,
        use_it: impl FnOnce(&[T], &Bytes),
    ) -> Result<(), CollectiveError> {
        let frame = self.recv(from, step, Some(offset))?;
        let call = self.sig.call;
        let sender = self.world_rank(from);
        let wrong = |reason: String| CollectiveError::Malformed {
            call,
            rank: sender,
            reason,
        };
        if frame.len() != expect * std::mem::size_of::<T>() {
            return Err(wrong(format!(
                "{} bytes, expected {expect} elements of {} bytes",
                frame.len(),
                std::mem::size_of::<T>()
            )));
        }
        match payload::frame_as_slice::<T>(&frame) {
            Ok(slice) => use_it(slice, &frame),
            Err(_) => {
                let copied =
                    payload::frame_to_vec::<T>(&frame).map_err(|e| wrong(e.to_string()))?;
                use_it(&copied, &frame);
            }
        }
        self.link.recycle(frame);
        Ok(())
    }

    /// A frame holding a copy of `values`, in memory the link may have recycled.
    pub(crate) fn frame_of<T: Element>(&mut self, values: &[T]) -> Bytes {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let mut buffer = self.link.buffer(bytes.len());
        switchyard_msg::copy::copy_bytes(&mut buffer, bytes);
        Bytes::from(buffer)
    }
}

/// Rank-independent split of `len` items into `parts` contiguous ranges: the first
/// `len % parts` ranges hold one item more.
pub(crate) fn split(len: usize, parts: usize, index: usize) -> Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = index * base + index.min(extra);
    let end = start + base + usize::from(index < extra);
    start..end
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_covers_everything_once() {
        for len in 0..40 {
            for parts in 1..9 {
                let mut next = 0;
                for i in 0..parts {
                    let r = split(len, parts, i);
                    assert_eq!(r.start, next);
                    assert!(r.len() == len / parts || r.len() == len / parts + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }
}
