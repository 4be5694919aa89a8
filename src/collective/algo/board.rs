//! The host board (see the link's `shm/board.rs`): when every rank shares one host,
//! a small allreduce is one write and `n` reads. Each rank puts its buffer in its own
//! slot, then reads every rank's slot, rank 0's first, and combines them in rank
//! order: `((x0 + x1) + x2) + ...`. Every rank computes the same expression, so the
//! results are bit-identical across ranks, floating point included. The barrier is
//! the same with no data.
//!
//! Every rank reads every rank's meta frame straight from its slot, so a rank in
//! another call (length, operation, type) is caught by every rank, as the doubling's
//! chain of checks does: checked mode needs no agreement before it.

use super::Round;
use crate::collective::error::CollectiveError;
use switchyard_msg::payload::Element;

/// Allreduces `buf` in place on the board; `reduce(acc, other)` combines in rank
/// order.
pub(crate) fn allreduce<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    reduce: &dyn Fn(&mut [T], &[T]),
) -> Result<(), CollectiveError> {
    round.algo = "host board";
    let n = round.size();
    let call = round.sig.call;
    let meta = round.meta(0);
    round
        .link
        .board_publish(&meta, bytemuck::cast_slice(buf))
        .map_err(|e| round.link_error(e, 0))?;
    let stamp = round.stamp();
    let expected = std::mem::size_of_val(buf);
    // This rank's own part is read back from its slot like any other: `buf` is
    // overwritten with rank 0's part before it is combined.
    for from in 0..n {
        let mut wrong: Option<String> = None;
        let took = round
            .link
            .board_take(from, &stamp, round.clock, &mut |data| {
                if data.len() != expected {
                    wrong = Some(format!(
                        "{} bytes on the host board, expected {expected}",
                        data.len()
                    ));
                    return;
                }
                match bytemuck::try_cast_slice::<u8, T>(data) {
                    Ok(theirs) if from == 0 => buf.copy_from_slice(theirs),
                    Ok(theirs) => reduce(buf, theirs),
                    Err(e) => wrong = Some(format!("host board slot: {e:?}")),
                }
            });
        took.map_err(|e| round.link_error(e, 0))?;
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

/// Waits until every rank has reached the barrier: an empty part on the board, read
/// from every rank.
pub(crate) fn barrier(round: &mut Round<'_>) -> Result<(), CollectiveError> {
    round.algo = "host board";
    let meta = round.meta(0);
    round
        .link
        .board_publish(&meta, &[])
        .map_err(|e| round.link_error(e, 0))?;
    let stamp = round.stamp();
    for from in 0..round.size() {
        round
            .link
            .board_take(from, &stamp, round.clock, &mut |_| {})
            .map_err(|e| round.link_error(e, 0))?;
    }
    Ok(())
}
