//! The rest of the typed collectives: byte strings, allgather, reduce-scatter,
//! barrier. Each checks its arguments and makes one or two engine calls.

use super::Communicator;
use super::algo::split;
use super::element::{ReduceOp, Reducible};
use super::engine::{Collective, Elem};
use super::error::{Call, CollectiveError};
use std::ops::Range;
use switchyard_msg::payload::Element;

impl Communicator {
    /// Copies rank `root`'s byte buffer to every rank, resizing the others' to fit
    /// (like rabit's `Broadcast(std::string*, root)`).
    pub fn broadcast_bytes(
        &mut self,
        buf: &mut Vec<u8>,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        let mut len = (buf.len() as u64).to_ne_bytes();
        self.run(Collective::Broadcast {
            buf: &mut len,
            elem: Elem::Bytes,
            root,
        })?;
        let len = u64::from_ne_bytes(len);
        let len = usize::try_from(len).map_err(|_| CollectiveError::Malformed {
            call: Call::Broadcast,
            rank: root,
            reason: format!("a length of {len} bytes"),
        })?;
        buf.resize(len, 0);
        self.run(Collective::Broadcast {
            buf,
            elem: Elem::Bytes,
            root,
        })
    }

    /// Gathers every rank's `mine` (all of one length) into `out`, in rank order:
    /// `out` must hold `world_size() * mine.len()` elements.
    pub fn allgather<T: Element>(
        &mut self,
        mine: &[T],
        out: &mut [T],
    ) -> Result<(), CollectiveError> {
        let (n, r, m) = (self.size, self.rank, mine.len());
        if out.len() != n * m {
            return Err(CollectiveError::InvalidArgument {
                call: Call::Allgather,
                reason: format!(
                    "out holds {} elements, {n} ranks x {m} need {}",
                    out.len(),
                    n * m
                ),
            });
        }
        out[r * m..(r + 1) * m].copy_from_slice(mine);
        let blocks: Vec<Range<usize>> = (0..n).map(|i| i * m..(i + 1) * m).collect();
        self.gather_blocks(out, &blocks)
    }

    /// Gathers every rank's `mine`, whatever its length; returns them in rank order.
    pub fn allgather_varied<T: Element>(
        &mut self,
        mine: &[T],
    ) -> Result<Vec<Vec<T>>, CollectiveError> {
        let n = self.size;
        let mut lens = vec![0u64; n];
        self.allgather(&[mine.len() as u64], &mut lens)?;
        let mut starts = Vec::with_capacity(n + 1);
        let mut total = 0usize;
        for len in &lens {
            starts.push(total);
            total = total.saturating_add(usize::try_from(*len).unwrap_or(usize::MAX));
        }
        starts.push(total);
        let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); total];
        out[starts[self.rank]..starts[self.rank + 1]].copy_from_slice(mine);
        let blocks: Vec<Range<usize>> = (0..n).map(|i| starts[i]..starts[i + 1]).collect();
        self.gather_blocks(&mut out, &blocks)?;
        Ok(blocks.into_iter().map(|b| out[b].to_vec()).collect())
    }

    /// Allgather of `out` where block `r` (complete on rank `r`) is `blocks[r]`.
    fn gather_blocks<T: Element>(
        &mut self,
        out: &mut [T],
        blocks: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        self.run(Collective::Allgather {
            out: bytemuck::cast_slice_mut(out),
            width: size_of::<T>(),
            blocks,
        })
    }

    /// Reduces `buf` over all ranks and leaves block `rank()` of the result on this
    /// rank: returns that block's range, `buf[range]` holds it, the rest of `buf` is
    /// unspecified. Blocks split `buf` evenly, the first `len % world_size()` ranks
    /// getting one element more.
    pub fn reduce_scatter<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<Range<usize>, CollectiveError> {
        if !T::supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call: Call::ReduceScatter,
                reason: format!("{op:?} is not defined for {:?}", T::DTYPE),
            });
        }
        let mine = split(buf.len(), self.size, self.rank);
        self.run(Collective::ReduceScatter {
            buf: bytemuck::cast_slice_mut(buf),
            dtype: T::DTYPE,
            op,
        })?;
        Ok(mine)
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.run(Collective::Barrier)
    }
}
