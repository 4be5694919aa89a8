//! Direct exchange: every rank sends its block straight to every other rank. One hop
//! of latency instead of the ring's `n - 1` chained hops, at the price of `n - 1`
//! messages per rank: the choice for small allgathers.

use super::Round;
use super::accumulate::Accumulate;
use crate::collective::error::CollectiveError;
use std::ops::Range;
use switchyard_msg::payload::Element;

/// Allgather where block `r` (already in place on rank `r`) is `blocks[r]` of `out`.
pub(crate) fn allgather<T: Element>(
    round: &mut Round<'_>,
    out: &mut [T],
    blocks: &[Range<usize>],
) -> Result<(), CollectiveError> {
    round.algo = "direct exchange";
    share(round, out, &|p| blocks[p].clone(), 0, None)
}

/// Sends this rank's part of `buf` (`part(rank)`) to every other rank but `skip`, then
/// copies every other rank's part into `buf` as it arrives (`skip` sends too, but
/// receives nothing).
fn share<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    part: &dyn Fn(usize) -> Range<usize>,
    step: u32,
    skip: Option<usize>,
) -> Result<(), CollectiveError> {
    let n = round.size();
    let r = round.rank();
    let mine = part(r);
    let frame = round.frame_of(&buf[mine.clone()]);
    for k in 1..n {
        let to = (r + k) % n;
        if Some(to) != skip {
            round.send(to, step, mine.start as u64, frame.clone())?;
        }
    }
    if Some(r) == skip {
        return Ok(());
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        let range = part(from);
        let target = &mut buf[range.clone()];
        round.recv_elements::<T>(from, step, range.start as u64, range.len(), |piece, _| {
            switchyard_msg::copy::copy_elements(target, piece)
        })?;
    }
    Ok(())
}

/// Allreduce by direct exchange: every rank sends piece `j` of block `p` straight to
/// rank `p`, which adds up the `n - 1` contributions to its block; then every rank
/// sends its finished block to every other. The same bytes per rank as the ring, but
/// two hops of latency instead of `2 (n - 1)`. Each block is reduced by one rank in a
/// fixed order (its own part, then rank `p + 1`'s, `p + 2`'s, ...; see
/// [`Accumulate`]), so every rank ends with identical results.
pub(crate) fn allreduce<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    sum: &mut dyn Accumulate<T>,
    piece_bytes: usize,
) -> Result<(), CollectiveError> {
    round.algo = "direct exchange";
    let n = round.size();
    let r = round.rank();
    let plan = super::ring::RingPlan::even::<T>(buf.len(), n, piece_bytes, 1);
    // Reduce-scatter, piece by piece so that at most one piece per peer is queued
    // ahead of what this rank has taken in.
    for j in 0..plan.pieces {
        for k in 1..n {
            let to = (r + k) % n;
            let range = plan.piece(to, j);
            let frame = round.frame_of(&buf[range.clone()]);
            round.send(to, 0, range.start as u64, frame)?;
        }
        let mine = plan.piece(r, j);
        sum.start_in_place(&buf[mine.clone()]);
        for k in 1..n {
            let from = (r + k) % n;
            let target = &mut buf[mine.clone()];
            round.recv_elements::<T>(from, 0, mine.start as u64, mine.len(), |piece, _| {
                sum.add(target, k, k + 1 == n, piece)
            })?;
        }
    }
    // Allgather of the finished blocks.
    for j in 0..plan.pieces {
        share(round, buf, &|p| plan.piece(p, j), 1, None)?;
    }
    Ok(())
}

/// Broadcast by scatter, then direct allgather: the root sends block `p` of the
/// buffer to rank `p`, and every rank (the root with its own block) then sends its
/// block to every rank but the root. The root sends about twice the buffer in all, in
/// `n - 1` streams at once, instead of the chain's one stream through every rank in
/// turn.
pub(crate) fn broadcast<T: Element>(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [T],
    piece_bytes: usize,
) -> Result<(), CollectiveError> {
    round.algo = "direct broadcast";
    let n = round.size();
    let r = round.rank();
    let plan = super::ring::RingPlan::even::<T>(buf.len(), n, piece_bytes, 1);
    for j in 0..plan.pieces {
        if r == root {
            for k in 1..n {
                let to = (root + k) % n;
                let range = plan.piece(to, j);
                let frame = round.frame_of(&buf[range.clone()]);
                round.send(to, 0, range.start as u64, frame)?;
            }
        } else {
            let mine = plan.piece(r, j);
            let target = &mut buf[mine.clone()];
            round.recv_elements::<T>(root, 0, mine.start as u64, mine.len(), |piece, _| {
                switchyard_msg::copy::copy_elements(target, piece)
            })?;
        }
    }
    // Every rank's block, the root's included, goes to every rank but the root.
    for j in 0..plan.pieces {
        share(round, buf, &|p| plan.piece(p, j), 1, Some(root))?;
    }
    Ok(())
}
