//! The host board (see the link's `shm/board.rs`): when every rank shares one host,
//! a small call is one write and `n` reads. Each rank puts its part in its own slot,
//! then reads every rank's slot, rank 0's first:
//!
//! - allreduce: every rank's buffer, combined in rank order, `((x0 + x1) + x2) + ...`.
//!   Every rank computes the same expression, so the results are bit-identical across
//!   ranks, floating point included;
//! - broadcast: the root's buffer, and an empty part from every other rank;
//! - allgather: every rank's block, copied to its place;
//! - barrier: empty parts.
//!
//! Every call reads every slot, which is what lets the board reuse a slot two calls
//! later without acknowledgements. It also means every rank reads every rank's meta
//! frame straight from its slot, so a rank in another call (length, operation, type,
//! root) is caught by every rank: checked mode needs no agreement before these calls.

use super::Round;
use crate::collective::error::CollectiveError;
use std::ops::Range;
use switchyard_msg::payload::Element;

/// Allreduces `buf` in place on the board; `reduce(acc, other)` combines in rank
/// order.
pub(crate) fn allreduce<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    reduce: &dyn Fn(&mut [T], &[T]),
) -> Result<(), CollectiveError> {
    let expected = std::mem::size_of_val(buf);
    publish(round, bytemuck::cast_slice(buf))?;
    // This rank's own part is read back from its slot like any other: `buf` is
    // overwritten with rank 0's part before anything is combined into it.
    take_all(round, &mut |from, data| {
        if data.len() != expected {
            return Err(format!(
                "{} bytes on the host board, expected {expected}",
                data.len()
            ));
        }
        let theirs = bytemuck::try_cast_slice::<u8, T>(data)
            .map_err(|e| format!("host board slot: {e:?}"))?;
        if from == 0 {
            buf.copy_from_slice(theirs);
        } else {
            reduce(buf, theirs);
        }
        Ok(())
    })
}

/// Copies `root`'s `buf` to every rank on the board.
pub(crate) fn broadcast(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [u8],
) -> Result<(), CollectiveError> {
    let me = round.rank();
    let expected = buf.len();
    publish(round, if me == root { buf } else { &[] })?;
    take_all(round, &mut |from, data| {
        let wanted = if from == root { expected } else { 0 };
        if data.len() != wanted {
            return Err(format!(
                "{} bytes on the host board, expected {wanted}",
                data.len()
            ));
        }
        if from == root && me != root {
            buf.copy_from_slice(data);
        }
        Ok(())
    })
}

/// Allgather where block `r` (already in place on rank `r`) is `blocks[r]` of `out`.
pub(crate) fn allgather(
    round: &mut Round<'_>,
    out: &mut [u8],
    blocks: &[Range<usize>],
) -> Result<(), CollectiveError> {
    let me = round.rank();
    publish(round, &out[blocks[me].clone()])?;
    take_all(round, &mut |from, data| {
        let block = blocks[from].clone();
        if data.len() != block.len() {
            return Err(format!(
                "{} bytes on the host board, expected {}",
                data.len(),
                block.len()
            ));
        }
        if from != me {
            out[block].copy_from_slice(data);
        }
        Ok(())
    })
}

/// Waits until every rank has reached the barrier: an empty part on the board, read
/// from every rank.
pub(crate) fn barrier(round: &mut Round<'_>) -> Result<(), CollectiveError> {
    publish(round, &[])?;
    take_all(round, &mut |_, data| {
        if data.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} bytes on the host board, expected none",
                data.len()
            ))
        }
    })
}

/// Puts this rank's part of the call, `mine`, on the board.
fn publish(round: &mut Round<'_>, mine: &[u8]) -> Result<(), CollectiveError> {
    round.algo = "host board";
    let meta = round.meta(0);
    round
        .link
        .board_publish(&meta, mine)
        .map_err(|e| round.link_error(e, 0))
}

/// What a board call does with rank `from`'s part; `Err` says what is wrong with it.
type Take<'a> = dyn FnMut(usize, &[u8]) -> Result<(), String> + 'a;

/// Hands every rank's part of the call (this rank's too, from its slot) to `each`, in
/// rank order; an `Err` from `each` is a malformed part from that rank.
fn take_all(round: &mut Round<'_>, each: &mut Take<'_>) -> Result<(), CollectiveError> {
    let stamp = round.stamp();
    let call = round.sig.call;
    for from in 0..round.size() {
        let mut wrong = None;
        round
            .link
            .board_take(from, &stamp, round.clock, &mut |data| {
                wrong = each(from, data).err();
            })
            .map_err(|e| round.link_error(e, 0))?;
        if let Some(reason) = wrong {
            return Err(CollectiveError::Malformed {
                call,
                rank: from,
                reason,
            });
        }
    }
    Ok(())
}
