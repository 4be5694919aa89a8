//! The pipelined, chunked ring: reduce-scatter, then allgather.
//!
//! The buffer is cut into one block per rank and every block into the same number of
//! pieces. In reduce-scatter step `s` rank `r` sends block `r-s-1` to rank `r+1` and
//! receives block `r-s-2` from rank `r-1`, adding it into its own copy; after `n-1`
//! steps block `r` is complete on rank `r`. Allgather then passes the complete blocks
//! around the ring for another `n-1` steps.
//!
//! The block a rank sends in step `s+1` is the one it received in step `s`, so the
//! work is pipelined per piece: as soon as piece `j` of a step is reduced it is sent
//! on, while the next piece is still on the wire. In the allgather steps the received
//! frame itself is forwarded, without a copy. At most `window` pieces a rank sent are
//! ahead of what it received, so no send waits on a full queue while its receiver
//! waits on it.

use super::{Round, split};
use crate::collective::error::CollectiveError;
use bytes::Bytes;
use std::collections::VecDeque;
use std::ops::Range;
use switchyard_msg::payload::Element;

/// Which steps of the ring to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reduce-scatter then allgather: an allreduce.
    Both,
    /// Only reduce-scatter: block `r` ends complete on rank `r`.
    ReduceScatter,
    /// Only allgather: block `r` must be complete on rank `r` at the start.
    Allgather,
}

/// How the buffer is cut.
#[derive(Clone, Debug)]
pub(crate) struct RingPlan {
    /// Block `i`'s element range (block `i` belongs to rank `i`).
    pub(crate) blocks: Vec<Range<usize>>,
    /// Pieces per block.
    pub(crate) pieces: usize,
    /// Most pieces sent ahead of those received.
    pub(crate) window: usize,
}

impl RingPlan {
    /// Blocks of `len / n` (+1) elements, pieces of at most `piece_bytes`.
    pub(crate) fn even<T>(len: usize, n: usize, piece_bytes: usize, window: usize) -> RingPlan {
        let blocks: Vec<_> = (0..n).map(|i| split(len, n, i)).collect();
        RingPlan::with_blocks::<T>(blocks, piece_bytes, window)
    }

    /// Given blocks, pieces of at most `piece_bytes`.
    pub(crate) fn with_blocks<T>(
        blocks: Vec<Range<usize>>,
        piece_bytes: usize,
        window: usize,
    ) -> RingPlan {
        let largest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
        let per_piece = (piece_bytes / std::mem::size_of::<T>().max(1)).max(1);
        RingPlan {
            pieces: largest.div_ceil(per_piece).max(1),
            blocks,
            window: window.max(1),
        }
    }

    pub(crate) fn piece(&self, block: usize, j: usize) -> Range<usize> {
        let b = &self.blocks[block];
        let r = split(b.len(), self.pieces, j);
        b.start + r.start..b.start + r.end
    }
}

/// Runs `phase` of the ring on `buf`; `reduce(acc, incoming)` combines pieces.
pub(crate) fn run<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    plan: &RingPlan,
    phase: Phase,
    reduce: &dyn Fn(&mut [T], &[T]),
) -> Result<(), CollectiveError> {
    round.algo = "ring";
    let n = round.size();
    let r = round.rank();
    if n == 1 {
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let rs_steps = n - 1;
    let (first, last) = match phase {
        Phase::Both => (0, 2 * rs_steps),
        Phase::ReduceScatter => (0, rs_steps),
        Phase::Allgather => (rs_steps, 2 * rs_steps),
    };
    let block = |offset: usize| (r + 2 * n - offset) % n;
    // Step g sends block send_block(g) and receives block send_block(g + 1).
    let send_block = |g: usize| {
        if g < rs_steps {
            block(g + 1)
        } else {
            block(g - rs_steps)
        }
    };
    let k = plan.pieces;
    let mut ready: VecDeque<(usize, usize, Option<Bytes>)> =
        (0..k).map(|j| (first, j, None)).collect();
    let (mut sent, mut received) = (0usize, 0usize);
    let send_one = |round: &mut Round<'_>,
                    buf: &[T],
                    (g, j, forward): (usize, usize, Option<Bytes>)|
     -> Result<(), CollectiveError> {
        let range = plan.piece(send_block(g), j);
        let offset = range.start as u64;
        let frame = match forward {
            Some(frame) => frame,
            None => round.frame_of(&buf[range]),
        };
        round.send(next, g as u32, offset, frame)
    };
    for g in first..last {
        let incoming = send_block(g + 1);
        for j in 0..k {
            while sent < received + plan.window {
                let Some(item) = ready.pop_front() else { break };
                send_one(round, buf, item)?;
                sent += 1;
            }
            let range = plan.piece(incoming, j);
            let target = &mut buf[range.clone()];
            let mut forward = None;
            round.recv_elements::<T>(
                prev,
                g as u32,
                range.start as u64,
                range.len(),
                |piece, frame| {
                    if g < rs_steps {
                        reduce(target, piece);
                    } else {
                        switchyard_msg::copy::copy_elements(target, piece);
                        forward = Some(frame.clone());
                    }
                },
            )?;
            received += 1;
            if g + 1 < last {
                ready.push_back((g + 1, j, forward));
            }
        }
    }
    while let Some(item) = ready.pop_front() {
        send_one(round, buf, item)?;
    }
    Ok(())
}
