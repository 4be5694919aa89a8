//! Direct exchange: every rank sends its block straight to every other rank. One hop
//! of latency instead of the ring's `n - 1` chained hops, at the price of `n - 1`
//! messages per rank: the choice for small allgathers.

use super::Round;
use crate::collective::error::CollectiveError;
use std::ops::Range;
use switchyard_msg::payload::Element;

/// Allgather where block `r` (already in place on rank `r`) is `blocks[r]` of `out`.
pub(crate) fn allgather<T: Element>(
    round: &mut Round<'_>,
    out: &mut [T],
    blocks: &[Range<usize>],
) -> Result<(), CollectiveError> {
    let n = round.size();
    let r = round.rank();
    let mine = blocks[r].clone();
    let frame = round.frame_of(&out[mine.clone()]);
    for k in 1..n {
        round.send((r + k) % n, 0, mine.start as u64, frame.clone())?;
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        let block = blocks[from].clone();
        let target = &mut out[block.clone()];
        round.recv_elements::<T>(from, 0, block.start as u64, block.len(), |piece, _| {
            target.copy_from_slice(piece)
        })?;
    }
    Ok(())
}
