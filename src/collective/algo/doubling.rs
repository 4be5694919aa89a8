//! Recursive doubling: the latency-optimal allreduce for small buffers and
//! commutative operations, `ceil(log2 n)` exchanges (plus two for a world that is not
//! a power of two).
//!
//! With `p` the largest power of two not above `n` and `extra = n - p`, the first
//! `2 * extra` ranks pair up: each even one hands its buffer to the odd one above it
//! and sits out. The `p` remaining ranks exchange whole buffers with the partner whose
//! (renumbered) rank differs in one bit, for each bit; the sitters-out then get the
//! result back. Both partners of an exchange combine the same two values, so every
//! rank ends with bit-identical results even in floating point.

use super::Round;
use crate::collective::error::CollectiveError;
use switchyard_msg::payload::Element;

/// Allreduces `buf` in place; `reduce(acc, incoming)` must be commutative.
pub(crate) fn allreduce<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    reduce: &dyn Fn(&mut [T], &[T]),
) -> Result<(), CollectiveError> {
    round.algo = "recursive doubling";
    let n = round.size();
    let r = round.rank();
    if n == 1 {
        return Ok(());
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let extra = n - p;
    let len = buf.len();
    // Step numbers: 0 for the fold-in, 1.. for the exchanges, 63 for the hand-back.
    const FOLD: u32 = 0;
    const UNFOLD: u32 = 63;
    let folded_rank = if r < 2 * extra {
        if r % 2 == 0 {
            let frame = round.frame_of(buf);
            round.send(r + 1, FOLD, 0, frame)?;
            None
        } else {
            round.recv_elements::<T>(r - 1, FOLD, 0, len, |theirs, _| reduce(buf, theirs))?;
            Some(r / 2)
        }
    } else {
        Some(r - extra)
    };
    if let Some(me) = folded_rank {
        let actual = |folded: usize| {
            if folded < extra {
                folded * 2 + 1
            } else {
                folded + extra
            }
        };
        let mut mask = 1;
        let mut step = 1;
        while mask < p {
            let partner = actual(me ^ mask);
            let frame = round.frame_of(buf);
            round.send(partner, step, 0, frame)?;
            round.recv_elements::<T>(partner, step, 0, len, |theirs, _| reduce(buf, theirs))?;
            mask <<= 1;
            step += 1;
        }
        if r < 2 * extra {
            let frame = round.frame_of(buf);
            round.send(r - 1, UNFOLD, 0, frame)?;
        }
    } else {
        round.recv_elements::<T>(r + 1, UNFOLD, 0, len, |theirs, _| {
            buf.copy_from_slice(theirs)
        })?;
    }
    Ok(())
}
