//! What a robust rank keeps in memory: its committed checkpoint (the global model,
//! its own local model and copies of its ring predecessors'), and the results of
//! the calls since, the ones [`Rules::keeps`](super::state::Rules::keeps) gives it.

use crate::collective::error::{Call, CollectiveError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A global model handed to `lazy_checkpoint`: encoded only when a restarted rank
/// needs it.
pub(crate) type LazyModel = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// A checkpoint's global model.
#[derive(Clone)]
pub(crate) enum Global {
    /// Bytes, copied at the checkpoint.
    Bytes(Arc<Vec<u8>>),
    /// A closure that encodes it.
    Lazy(LazyModel),
}

impl Global {
    /// The model's bytes.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        match self {
            Global::Bytes(b) => b.as_ref().clone(),
            Global::Lazy(f) => f(),
        }
    }
}

/// One committed (or staged) checkpoint.
#[derive(Clone, Default)]
pub(crate) struct Saved {
    /// Versions committed (0: none yet).
    pub version: u64,
    /// The global model (`None` at version 0).
    pub global: Option<Global>,
    /// Local models this rank holds, by owner rank (its own included); `None` for an
    /// owner that checkpointed none.
    pub locals: BTreeMap<usize, Option<Vec<u8>>>,
}

/// A result's bytes in memory aligned for every element type (8 bytes), so that a
/// call can run into it as into the caller's own buffer, empty ones included.
#[derive(Default)]
pub(crate) struct ResultBuffer {
    words: Vec<u64>,
    len: usize,
}

impl ResultBuffer {
    /// The result's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The result's bytes, to write.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// Bytes it can hold without growing.
    fn capacity(&self) -> usize {
        self.words.capacity() * 8
    }

    /// Makes it `len` bytes long; bytes it held before stay (a spare of this size is
    /// not written here), new ones are zeros.
    fn set_len(&mut self, len: usize) {
        self.words.resize(len.div_ceil(8), 0);
        self.len = len;
    }
}

/// Results of the calls since the last checkpoint, by call number: those this rank
/// keeps for good ([`Rules::keeps`](super::state::Rules::keeps)), and every other one
/// since the last call that every rank is known to have passed (rabit keeps the last
/// result everywhere for the same reason: ranks that finished a broadcast may not be
/// its keepers, and the keepers may not have finished it).
#[derive(Default)]
pub(crate) struct Results {
    /// Each result, and whether it is kept for good.
    kept: BTreeMap<u64, (ResultBuffer, bool)>,
    bytes: usize,
    /// Results of calls from this one on are held even where not kept for good.
    held_from: u64,
    /// Buffers of results dropped at the last checkpoint, reused for the next ones
    /// (fresh allocations of large results cost a page fault per page, every call).
    spare: Vec<ResultBuffer>,
}

impl Results {
    /// Keeps a copy of `result` of call `seq` (for good when `for_good`), unless
    /// that passes `budget`.
    pub(crate) fn keep(
        &mut self,
        call: Call,
        seq: (u64, bool),
        result: &[u8],
        budget: usize,
        version: u64,
    ) -> Result<(), CollectiveError> {
        let mut copy = self.buffer(result.len());
        switchyard_msg::copy::copy_bytes(copy.bytes_mut(), result);
        self.keep_buffer(call, seq, copy, budget, version)
    }

    /// A buffer of `len` bytes to run a call into and then keep with
    /// [`Results::keep_buffer`] (or hand back with [`Results::give_back`]): the
    /// smallest spare one that fits where there is one (its old bytes still in it;
    /// the smallest, so that a small call does not take the buffer a large one needs),
    /// since fresh memory costs a page fault per page.
    pub(crate) fn buffer(&mut self, len: usize) -> ResultBuffer {
        let fitting = (self.spare.iter().enumerate())
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut buffer = match fitting {
            Some(i) => self.spare.swap_remove(i),
            None => ResultBuffer::default(),
        };
        buffer.set_len(len);
        buffer
    }

    /// Takes a [`Results::buffer`] back unused.
    pub(crate) fn give_back(&mut self, buffer: ResultBuffer) {
        self.spare.push(buffer);
    }

    /// Keeps `result` of call `seq` (for good when `for_good`), unless that passes
    /// `budget` (the buffer then goes back to the spares).
    pub(crate) fn keep_buffer(
        &mut self,
        call: Call,
        (seq, for_good): (u64, bool),
        result: ResultBuffer,
        budget: usize,
        version: u64,
    ) -> Result<(), CollectiveError> {
        if self.bytes + result.len > budget {
            let needed = result.len;
            self.give_back(result);
            return Err(CollectiveError::ResultBudget {
                call,
                kept: self.bytes,
                needed,
                budget,
                version,
            });
        }
        self.bytes += result.len;
        if let Some((old, _)) = self.kept.insert(seq, (result, for_good)) {
            self.bytes -= old.len;
            self.spare.push(old);
        }
        Ok(())
    }

    /// Every rank has passed the calls before `seq`: results of those not kept for
    /// good are dropped.
    pub(crate) fn settle(&mut self, seq: u64) {
        if seq <= self.held_from {
            return;
        }
        let passed: Vec<u64> = self
            .kept
            .range(..seq)
            .filter(|(_, (_, for_good))| !for_good)
            .map(|(s, _)| *s)
            .collect();
        for s in passed {
            if let Some((old, _)) = self.kept.remove(&s) {
                self.bytes -= old.len;
                self.spare.push(old);
            }
        }
        self.held_from = seq;
    }

    /// The first call whose result this rank holds even where not kept for good.
    pub(crate) fn held_from(&self) -> u64 {
        self.held_from
    }

    /// The kept result of call `seq`.
    pub(crate) fn get(&self, seq: u64) -> Option<&[u8]> {
        self.kept.get(&seq).map(|(r, _)| r.bytes())
    }

    /// Forgets every result (a checkpoint was committed), keeping the buffers.
    pub(crate) fn clear(&mut self) {
        let kept = std::mem::take(&mut self.kept);
        self.spare.extend(kept.into_values().map(|(r, _)| r));
        self.bytes = 0;
        self.held_from = 0;
    }
}

/// An optional local model as bytes that say whether there is one: a first byte 0
/// (none) or 1 (the model follows).
pub(crate) fn encode_local(local: Option<&[u8]>) -> Vec<u8> {
    match local {
        None => vec![0],
        Some(bytes) => {
            let mut out = Vec::with_capacity(bytes.len() + 1);
            out.push(1);
            out.extend_from_slice(bytes);
            out
        }
    }
}

/// The inverse of [`encode_local`].
pub(crate) fn decode_local(bytes: &[u8]) -> Result<Option<Vec<u8>>, String> {
    match bytes.split_first() {
        Some((0, [])) => Ok(None),
        Some((1, rest)) => Ok(Some(rest.to_vec())),
        _ => Err(format!(
            "a local model record of {} bytes without its tag",
            bytes.len()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_call_takes_the_smallest_spare_that_fits_and_a_refused_one_comes_back() {
        let mut results = Results::default();
        for (seq, len) in [(0, 4 << 20), (1, 8), (2, 64 << 10)] {
            let buffer = results.buffer(len);
            results
                .keep_buffer(Call::Allreduce, (seq, true), buffer, usize::MAX, 1)
                .unwrap();
        }
        results.clear();
        assert_eq!(results.buffer(40).capacity(), 64 << 10);
        assert_eq!(results.buffer(1 << 20).capacity(), 4 << 20);
        // Aligned for every element type, an empty one too.
        assert_eq!(results.buffer(0).bytes().as_ptr() as usize % 8, 0);
        // Over the budget: refused, and the buffer goes back to the spares.
        let buffer = results.buffer(8);
        let address = buffer.bytes().as_ptr();
        let refused = results.keep_buffer(Call::Allreduce, (3, true), buffer, 4, 1);
        assert!(matches!(
            refused,
            Err(CollectiveError::ResultBudget { needed: 8, .. })
        ));
        assert_eq!(results.buffer(8).bytes().as_ptr(), address);
    }
}
