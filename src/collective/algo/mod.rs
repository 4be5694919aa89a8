//! The mesh engine's algorithms, generic over [`Link`].
//!
//! Every message of a call carries a 24-byte meta frame before its payload: the
//! call's total element count (`u64`), the call's signature (call, operation, element type, root) and the
//! element offset of the payload within the call's buffer. A receiver checks all
//! three, so that ranks calling with different lengths, operations, types or roots
//! get an error naming the other rank instead of wrong numbers.

pub(crate) mod direct;
pub(crate) mod doubling;
#[cfg(test)]
mod in_memory_tests;
pub(crate) mod ring;
pub(crate) mod tree;

use super::error::{Call, CollectiveError, LinkError};
use super::link::{Link, Tag};
use bytes::Bytes;
use std::ops::Range;
use std::time::Instant;
use switchyard_msg::payload::{self, Element};

const META_LEN: usize = 24;

/// What every rank of one call must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub(crate) call: Call,
    /// Operation code (0 for none, 0xff for a user reducer).
    pub(crate) op: u8,
    /// Element type code (0 for bytes or serde values).
    pub(crate) dtype: u8,
    pub(crate) root: u32,
}

impl Signature {
    fn encode(self) -> u64 {
        u64::from(self.call.code())
            | u64::from(self.op) << 8
            | u64::from(self.dtype) << 16
            | u64::from(self.root) << 32
    }

    fn describe(bits: u64) -> String {
        format!(
            "call {} op {} dtype {} root {}",
            bits & 0xff,
            (bits >> 8) & 0xff,
            (bits >> 16) & 0xff,
            bits >> 32
        )
    }
}

/// One collective call in progress on one rank.
pub(crate) struct Round<'a> {
    pub(crate) link: &'a mut dyn Link,
    pub(crate) sig: Signature,
    pub(crate) seq: u64,
    pub(crate) total: u64,
    pub(crate) deadline: Instant,
}

impl Round<'_> {
    pub(crate) fn rank(&self) -> usize {
        self.link.rank()
    }

    pub(crate) fn size(&self) -> usize {
        self.link.world_size()
    }

    fn link_error(&self, e: LinkError) -> CollectiveError {
        e.during(self.sig.call)
    }

    /// Sends `payload`, which starts at element `offset` of the call's buffer.
    pub(crate) fn send(
        &mut self,
        to: usize,
        step: u32,
        offset: u64,
        payload: Bytes,
    ) -> Result<(), CollectiveError> {
        let mut meta = [0u8; META_LEN];
        meta[..8].copy_from_slice(&self.total.to_le_bytes());
        meta[8..16].copy_from_slice(&self.sig.encode().to_le_bytes());
        meta[16..].copy_from_slice(&offset.to_le_bytes());
        let tag = Tag {
            call: self.seq,
            step,
        };
        self.link
            .send(
                to,
                tag,
                vec![Bytes::copy_from_slice(&meta), payload],
                self.deadline,
            )
            .map_err(|e| self.link_error(e))
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
            step,
        };
        let frames = self
            .link
            .recv(from, tag, self.deadline)
            .map_err(|e| self.link_error(e))?;
        let call = self.sig.call;
        let malformed = |reason: String| CollectiveError::Malformed {
            call,
            rank: from,
            reason,
        };
        let [meta, payload]: [Bytes; 2] = frames
            .try_into()
            .map_err(|f: Vec<Bytes>| malformed(format!("{} frames, expected 2", f.len())))?;
        if meta.len() != META_LEN {
            return Err(malformed(format!("meta frame of {} bytes", meta.len())));
        }
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&meta[i * 8..i * 8 + 8]);
            u64::from_le_bytes(bytes)
        };
        let (total, sig, at) = (word(0), word(1), word(2));
        if sig != self.sig.encode() {
            return Err(CollectiveError::CallMismatch {
                call,
                rank: from,
                ours: Signature::describe(self.sig.encode()),
                theirs: Signature::describe(sig),
            });
        }
        if total != self.total {
            return Err(CollectiveError::SizeMismatch {
                call,
                rank: from,
                me: self.rank(),
                ours: self.total,
                theirs: total,
            });
        }
        if let Some(offset) = offset {
            if at != offset {
                return Err(malformed(format!(
                    "payload at element {at}, expected {offset}"
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
        let wrong = |reason: String| CollectiveError::Malformed {
            call,
            rank: from,
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
        buffer.copy_from_slice(bytes);
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
