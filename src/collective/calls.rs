//! The rest of the typed collectives: byte strings, allgather, reduce-scatter,
//! barrier. Each checks its arguments and makes one or two engine calls.

use super::algo::split;
use super::element::{DType, ReduceOp, Reducible};
use super::engine::{Collective, Elem};
use super::error::{Call, CollectiveError};
use super::{Communicator, aligned, whole_elements};
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
        let width = size_of::<T>();
        self.allgather_bytes(
            bytemuck::cast_slice(mine),
            bytemuck::cast_slice_mut(out),
            width,
        )
    }

    /// [`allgather`](Communicator::allgather) for callers without Rust types (the
    /// Python package): `mine` and `out` are bytes of `dtype` elements, and ranks that
    /// call `allgather::<f32>` and `allgather_raw(.., DType::F32)` are in the same
    /// call.
    ///
    /// ```
    /// use switchyard::collective::{Communicator, DType};
    /// let mut comm = Communicator::solo();
    /// let mine = 7u32.to_ne_bytes();
    /// let mut out = [0u8; 4];
    /// comm.allgather_raw(&mine, &mut out, DType::U32)?;
    /// assert_eq!(out, mine);
    /// assert!(comm.allgather_raw(&mine[..3], &mut out[..3], DType::U32).is_err());
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allgather_raw(
        &mut self,
        mine: &[u8],
        out: &mut [u8],
        dtype: DType,
    ) -> Result<(), CollectiveError> {
        whole_elements(Call::Allgather, mine.len(), dtype)?;
        whole_elements(Call::Allgather, out.len(), dtype)?;
        self.allgather_bytes(mine, out, dtype.size())
    }

    /// The allgather of both entry points: `mine` and `out` hold elements of `width`
    /// bytes (whole ones: checked by the callers).
    fn allgather_bytes(
        &mut self,
        mine: &[u8],
        out: &mut [u8],
        width: usize,
    ) -> Result<(), CollectiveError> {
        let (n, r) = (self.size, self.rank);
        let (m, have) = (mine.len() / width, out.len() / width);
        if have != n * m {
            return Err(CollectiveError::InvalidArgument {
                call: Call::Allgather,
                reason: format!("out holds {have} elements, {n} ranks x {m} need {}", n * m),
            });
        }
        out[r * m * width..(r + 1) * m * width].copy_from_slice(mine);
        let blocks: Vec<Range<usize>> = (0..n).map(|i| i * m..(i + 1) * m).collect();
        self.run(Collective::Allgather {
            out,
            width,
            blocks: &blocks,
        })
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
        self.reduce_scatter_raw(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// [`reduce_scatter`](Communicator::reduce_scatter) for callers without Rust
    /// types: `buf` is bytes of `dtype` elements, aligned for them, and the range is
    /// in elements.
    ///
    /// ```
    /// use switchyard::collective::{Communicator, DType, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut buf = [0u64; 2];
    /// let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    /// assert_eq!(comm.reduce_scatter_raw(bytes, DType::U64, ReduceOp::Sum)?, 0..2);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn reduce_scatter_raw(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<Range<usize>, CollectiveError> {
        let call = Call::ReduceScatter;
        if !dtype.supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call,
                reason: format!("{op:?} is not defined for {dtype:?}"),
            });
        }
        whole_elements(call, buf.len(), dtype)?;
        aligned(call, buf, dtype)?;
        let mine = split(buf.len() / dtype.size(), self.size, self.rank);
        self.run(Collective::ReduceScatter { buf, dtype, op })?;
        Ok(mine)
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.run(Collective::Barrier)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The raw calls read bytes as elements in place: a buffer off its element
    /// boundary is refused by name, an empty one (any pointer) passes.
    #[test]
    fn raw_calls_refuse_a_misaligned_buffer_and_pass_an_empty_one() {
        let mut comm = Communicator::solo();
        let mut words = [0u64; 3];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        let off = &mut bytes[1..9];
        let e = comm
            .reduce_scatter_raw(off, DType::U64, ReduceOp::Sum)
            .unwrap_err();
        assert!(
            e.to_string().contains("does not start on a U64 boundary"),
            "{e}"
        );
        let e = comm
            .try_allreduce_lazy_raw(off, DType::U64, ReduceOp::Sum, |_| Ok::<(), String>(()))
            .unwrap_err();
        assert!(
            e.to_string().contains("does not start on a U64 boundary"),
            "{e}"
        );
        let empty = &mut bytes[1..1];
        assert_eq!(
            comm.reduce_scatter_raw(empty, DType::U64, ReduceOp::Sum)
                .unwrap(),
            0..0
        );
    }
}
