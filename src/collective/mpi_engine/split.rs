//! Each collective as the MPI calls that make it, cut so that every count and
//! displacement fits MPI's `int`. Every rank sees the same lengths (the argument
//! check compared them), so every rank cuts alike and makes the same calls.
//!
//! All of it runs on the progress thread, inside the closure that lends
//! [`Collectives`].

use super::failed;
use crate::collective::algo::split as even_split;
use crate::collective::error::{Call, CollectiveError};
use std::ops::Range;
use switchyard_transports::mpi::{CallError, Collectives, Datatype, Operation};

/// Piece `k` of a block of `len` elements cut into pieces of `piece` elements
/// (empty once the block is exhausted).
fn piece(k: usize, piece: usize, len: usize) -> Range<usize> {
    let start = k.saturating_mul(piece).min(len);
    start..start.saturating_add(piece).min(len)
}

/// In-place `MPI_Allreduce` of `buf`, at most `max_count` elements a call.
pub(super) fn allreduce(
    c: &Collectives<'_>,
    buf: &mut [u8],
    ty: Datatype,
    op: Operation,
    max_count: usize,
    in_place: bool,
) -> Result<(), CallError> {
    for chunk in buf.chunks_mut(max_count.saturating_mul(ty.size())) {
        c.allreduce(chunk, ty, op, in_place)?;
    }
    Ok(())
}

/// Runs `body` on `buf`'s bytes widened to `u32` elements, then truncates them back:
/// how sums and products of `u8` wrap under MPI as they do on the mesh. OpenMPI
/// 4.1's `op/avx` component adds 8-bit integers with saturating instructions (ompi
/// issue #8045, closed as won't fix), so `MPI_SUM` on `MPI_UINT8_T` gives 255 where
/// the sum passes it. A `u32` sum of bytes cannot overflow below 2^24 ranks, and a
/// `u32` product wraps modulo 2^32, whose low byte is the product modulo 256. Costs 4x
/// the bytes; byte sums are rare and short.
pub(super) fn widened_u8(
    buf: &mut [u8],
    body: impl FnOnce(&mut [u8]) -> Result<(), CallError>,
) -> Result<(), CallError> {
    let mut wide: Vec<u32> = buf.iter().map(|&b| u32::from(b)).collect();
    body(bytemuck::cast_slice_mut(&mut wide))?;
    for (b, w) in buf.iter_mut().zip(&wide) {
        // The low byte: the result modulo 256.
        *b = w.to_le_bytes()[0];
    }
    Ok(())
}

/// `MPI_Bcast` of `buf` from `root`, at most `max_count` bytes a call.
pub(super) fn broadcast(
    c: &Collectives<'_>,
    buf: &mut [u8],
    root: usize,
    max_count: usize,
) -> Result<(), CallError> {
    for chunk in buf.chunks_mut(max_count) {
        c.broadcast(chunk, root)?;
    }
    Ok(())
}

/// In-place allgather over bytes: `blocks[r]` is rank `r`'s byte range in `out`, and
/// this rank's block is already filled.
pub(super) fn allgather(
    c: &Collectives<'_>,
    out: &mut [u8],
    blocks: &[Range<usize>],
    max_count: usize,
    in_place: bool,
) -> Result<(), CallError> {
    if blocks.iter().all(|b| b.end <= max_count) {
        return c.allgatherv(out, blocks, in_place);
    }
    // Offsets past `int`: each block from its owner, in pieces MPI can count.
    for (owner, block) in blocks.iter().enumerate() {
        let len = out.len();
        let block = out.get_mut(block.clone()).ok_or_else(|| CallError {
            function: "MPI_Bcast",
            reason: format!("block {block:?} is not inside {len} bytes"),
        })?;
        broadcast(c, block, owner, max_count)?;
    }
    Ok(())
}

/// How a reduce-scatter cuts its buffer: rank `r`'s block is `counts[r]` elements at
/// `offsets[r]`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Scatter {
    counts: Vec<usize>,
    offsets: Vec<usize>,
    rank: usize,
    /// Elements of every block one call moves, so that its total stays an `int`.
    per_call: usize,
}

impl Scatter {
    /// `len` elements cut as the mesh engine cuts them (`algo::split`).
    pub(super) fn even(len: usize, rank: usize, size: usize, max_count: usize) -> Scatter {
        let counts: Vec<usize> = (0..size).map(|i| even_split(len, size, i).len()).collect();
        let offsets = (0..size).map(|i| even_split(len, size, i).start).collect();
        Scatter {
            counts,
            offsets,
            rank,
            per_call: (max_count / size.max(1)).max(1),
        }
    }

    fn longest(&self) -> usize {
        self.counts.iter().copied().max().unwrap_or(0)
    }

    /// Piece `k` of every block, as element ranges of the whole buffer.
    fn pieces(&self, k: usize) -> Vec<Range<usize>> {
        self.counts
            .iter()
            .zip(&self.offsets)
            .map(|(&count, &offset)| {
                let p = piece(k, self.per_call, count);
                offset + p.start..offset + p.end
            })
            .collect()
    }
}

/// `MPI_Reduce_scatter` of `buf` (elements of `ty`) cut by `plan`: afterwards this
/// rank's block of `buf` holds its reduced block; the rest is unspecified.
pub(super) fn reduce_scatter(
    c: &Collectives<'_>,
    buf: &mut [u8],
    plan: &Scatter,
    ty: Datatype,
    op: Operation,
    in_place: bool,
) -> Result<(), CallError> {
    let w = ty.size();
    let rank = plan.rank;
    if in_place && c.has_in_place() && plan.longest() <= plan.per_call {
        c.reduce_scatter_in_place(buf, &plan.counts, ty, op)?;
        let mine = plan.offsets[rank] * w;
        buf.copy_within(0..plan.counts[rank] * w, mine);
        return Ok(());
    }
    // Call `k` reduces piece `k` of every block. It writes only piece `k` of this
    // rank's block, which it has already copied, and later calls read only later
    // pieces.
    let mut scratch: Vec<u8> = Vec::new();
    for k in 0..plan.longest().div_ceil(plan.per_call) {
        let pieces = plan.pieces(k);
        scratch.clear();
        for p in &pieces {
            scratch.extend_from_slice(&buf[p.start * w..p.end * w]);
        }
        let counts: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        let mine = &pieces[rank];
        c.reduce_scatter(
            &scratch,
            &mut buf[mine.start * w..mine.end * w],
            &counts,
            ty,
            op,
        )?;
    }
    Ok(())
}

/// Every rank's bytes (lengths may differ) on rank 0, in rank order: `Some` there,
/// `None` elsewhere. `pairs` is every rank's (signature, length) from the argument
/// exchange, so every rank knows how many `MPI_Gatherv` rounds the longest needs.
pub(super) fn gather_to_zero(
    c: &Collectives<'_>,
    mine: &[u8],
    pairs: &[[u64; 2]],
    rank: usize,
    size: usize,
    max_count: usize,
) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
    let call = Call::Allreduce;
    let lens = pairs
        .iter()
        .enumerate()
        .map(|(r, p)| {
            usize::try_from(p[1]).map_err(|_| CollectiveError::Malformed {
                call,
                rank: r,
                reason: format!("a length of {} bytes", p[1]),
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let per_call = (max_count / size.max(1)).max(1);
    let longest = lens.iter().copied().max().unwrap_or(0);
    let mut gathered: Vec<Vec<u8>> = if rank == 0 {
        lens.iter().map(|&len| Vec::with_capacity(len)).collect()
    } else {
        Vec::new()
    };
    let mut flat: Vec<u8> = Vec::new();
    for k in 0..longest.div_ceil(per_call) {
        let pieces: Vec<Range<usize>> = lens.iter().map(|&len| piece(k, per_call, len)).collect();
        let counts: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        if rank == 0 {
            flat.clear();
            flat.resize(counts.iter().sum(), 0);
        }
        let send = mine.get(pieces[rank].clone()).unwrap_or_default();
        c.gatherv(send, &mut flat, &counts, 0)
            .map_err(failed(call, rank))?;
        if rank == 0 {
            let mut at = 0;
            for (whole, p) in gathered.iter_mut().zip(&pieces) {
                whole.extend_from_slice(&flat[at..at + p.len()]);
                at += p.len();
            }
        }
    }
    Ok((rank == 0).then_some(gathered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_a_block_once() {
        let covered: Vec<usize> = (0..4).flat_map(|k| piece(k, 3, 10)).collect();
        assert_eq!(covered, (0..10).collect::<Vec<_>>());
        assert!(piece(5, 3, 10).is_empty());
        assert!(piece(usize::MAX, usize::MAX, 10).is_empty());
    }

    #[test]
    fn a_scatter_cuts_like_the_mesh_and_in_int_sized_rounds() {
        let plan = Scatter::even(10, 1, 3, 6);
        assert_eq!(plan.counts, [4, 3, 3]);
        assert_eq!(plan.offsets, [0, 4, 7]);
        assert_eq!(plan.per_call, 2);
        // Two rounds of at most 2 elements per block cover every block once.
        let rounds: Vec<Vec<Range<usize>>> = (0..2).map(|k| plan.pieces(k)).collect();
        assert_eq!(rounds[0], [0..2, 4..6, 7..9]);
        assert_eq!(rounds[1], [2..4, 6..7, 9..10]);
        assert_eq!(plan.longest().div_ceil(plan.per_call), 2);
    }
}
