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
        let len = match usize::try_from(len) {
            Ok(len) => len,
            Err(_) => {
                let e = CollectiveError::Malformed {
                    call: Call::Broadcast,
                    rank: root,
                    reason: format!("a length of {len} bytes"),
                };
                // The root goes on with the bytes, which this rank cannot take.
                self.poison(&e);
                return Err(e);
            }
        };
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

    /// Whether `result` is the refusal of a poisoned communicator, naming the first
    /// failure.
    fn refused<R: std::fmt::Debug>(what: &str, result: Result<R, CollectiveError>) {
        match result {
            Err(CollectiveError::Poisoned { first, .. }) => {
                assert!(
                    first.contains("prepare failed on rank 0: no data"),
                    "{what}: {first}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
    }

    /// After a failed call every kind of call is refused, naming the first failure;
    /// arguments refused before any traffic leave a communicator usable.
    #[test]
    fn a_poisoned_communicator_refuses_every_kind_of_call() {
        let mut comm = Communicator::solo();
        // Refused by the call's own checks: still usable.
        let mut one = [1u32];
        assert!(matches!(
            comm.broadcast(&mut one, 3),
            Err(CollectiveError::InvalidArgument { .. })
        ));
        assert!(comm.allreduce(&mut [1.5f32], ReduceOp::BitOr).is_err());
        assert!(comm.checkpoint(b"model", None).is_err());
        assert!(!comm.is_poisoned());
        comm.broadcast(&mut one, 0).unwrap();

        let e = comm
            .try_allreduce_lazy(&mut one, ReduceOp::Sum, |_| Err("no data"))
            .unwrap_err();
        assert!(matches!(e, CollectiveError::PrepareFailed { .. }), "{e}");
        assert!(comm.is_poisoned());
        let text = comm.barrier().unwrap_err().to_string();
        assert!(
            text.contains("barrier: this communicator is unusable after an earlier call failed")
                && text.contains("make a new communicator"),
            "{text}"
        );

        let mut words = [0u64; 2];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        refused("allreduce", comm.allreduce(&mut one, ReduceOp::Sum));
        refused(
            "allreduce_raw",
            comm.allreduce_raw(bytes, DType::U64, ReduceOp::Sum),
        );
        refused(
            "allreduce_lazy",
            comm.allreduce_lazy(&mut one, ReduceOp::Sum, |b| b[0] = 1),
        );
        refused(
            "try_allreduce_lazy",
            comm.try_allreduce_lazy(&mut one, ReduceOp::Sum, |_| Ok::<(), String>(())),
        );
        refused(
            "allreduce_with",
            comm.allreduce_with(&mut one, |a, b| *a += *b),
        );
        refused(
            "allreduce_serde",
            comm.allreduce_serde(&mut [String::new()], |a, b| a.push_str(b)),
        );
        refused("broadcast", comm.broadcast(&mut one, 0));
        refused("broadcast_raw", comm.broadcast_raw(bytes, DType::U8, 0));
        refused(
            "broadcast_bytes",
            comm.broadcast_bytes(&mut b"data".to_vec(), 0),
        );
        refused(
            "broadcast_value",
            comm.broadcast_value(&mut "value".to_string(), 0),
        );
        refused("allgather", comm.allgather(&[1u8], &mut [0u8]));
        refused(
            "allgather_raw",
            comm.allgather_raw(&[1u8], &mut [0u8], DType::U8),
        );
        refused("allgather_varied", comm.allgather_varied(&[1u8, 2]));
        refused(
            "reduce_scatter",
            comm.reduce_scatter(&mut words, ReduceOp::Sum),
        );
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
        refused(
            "reduce_scatter_raw",
            comm.reduce_scatter_raw(bytes, DType::U64, ReduceOp::Max),
        );
        refused("barrier", comm.barrier());
        // Nothing was touched: the buffers hold what they held.
        assert_eq!(one, [1]);
        // Closing still works.
        comm.finalize().unwrap();
    }

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
