//! Binomial trees (order-preserving reduce, broadcast) and the pipelined chain
//! broadcast for large buffers.

use super::{Round, split};
use crate::collective::engine::Combine;
use crate::collective::error::CollectiveError;
use bytes::Bytes;
use switchyard_msg::payload::Element;

/// Reduces every rank's `acc` onto rank 0 in rank order: the result is
/// `((v0 * v1) * v2) * ...` for `combine(acc, next, from)` = `acc * next`, so the
/// operation need only be associative. Returns whether this rank holds the result
/// (rank 0); elsewhere `acc` ends holding a partial result.
///
/// In round `k` a rank whose bit `k` is set sends what it holds (the combination of
/// ranks `r .. r + 2^k`) to `r - 2^k`, which appends it after its own.
pub(crate) fn ordered_reduce(
    round: &mut Round<'_>,
    acc: &mut Vec<u8>,
    combine: &Combine<'_>,
) -> Result<bool, CollectiveError> {
    round.algo = "tree";
    let n = round.size();
    let r = round.rank();
    let mut mask = 1usize;
    let mut step = 0u32;
    while mask < n {
        if r & mask != 0 {
            let frame = round.frame_of::<u8>(acc);
            round.send(r - mask, step, 0, frame)?;
            return Ok(false);
        }
        if r + mask < n {
            let frame = round.recv(r + mask, step, Some(0))?;
            combine(acc, &frame, r + mask)?;
            round.link.recycle(frame);
        }
        mask <<= 1;
        step += 1;
    }
    Ok(true)
}

/// Broadcasts one frame from `root` down a binomial tree; `frame` must be `Some` on
/// the root. Returns the frame on every rank.
pub(crate) fn broadcast_frame(
    round: &mut Round<'_>,
    root: usize,
    frame: Option<Bytes>,
) -> Result<Bytes, CollectiveError> {
    round.algo = "tree";
    let n = round.size();
    let r = round.rank();
    let relative = (r + n - root) % n;
    let actual = |v: usize| (v + root) % n;
    let mut mask = 1usize;
    let mut data = frame;
    while mask < n {
        if relative & mask != 0 {
            data = Some(round.recv(actual(relative - mask), 0, Some(0))?);
            break;
        }
        mask <<= 1;
    }
    let data = data.unwrap_or_default();
    mask >>= 1;
    while mask > 0 {
        if relative + mask < n {
            round.send(actual(relative + mask), 0, 0, data.clone())?;
        }
        mask >>= 1;
    }
    Ok(data)
}

/// Broadcasts `buf` from `root` along the chain `root, root+1, ...`, in pieces of
/// `piece_bytes`, each forwarded as soon as it arrives (no copy on the way).
pub(crate) fn broadcast_chain<T: Element>(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [T],
    piece_bytes: usize,
) -> Result<(), CollectiveError> {
    round.algo = "chain";
    let n = round.size();
    let r = round.rank();
    let relative = (r + n - root) % n;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let per_piece = (piece_bytes / std::mem::size_of::<T>().max(1)).max(1);
    let pieces = buf.len().div_ceil(per_piece).max(1);
    for j in 0..pieces {
        let range = split(buf.len(), pieces, j);
        let offset = range.start as u64;
        let frame = if relative == 0 {
            round.frame_of(&buf[range])
        } else {
            let target = &mut buf[range.clone()];
            let mut forward = Bytes::new();
            round.recv_elements::<T>(prev, 0, offset, range.len(), |piece, frame| {
                switchyard_msg::copy::copy_elements(target, piece);
                forward = frame.clone();
            })?;
            forward
        };
        if relative + 1 < n {
            round.send(next, 0, offset, frame)?;
        }
    }
    Ok(())
}
