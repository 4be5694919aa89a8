//! The host board (see the link's `shm/board.rs`): when every rank shares one host,
//! a call is written once into shared memory and read from there, with no message
//! and no per-peer round trip. Each rank puts its part in its own slot, then reads
//! every rank's slot, rank 0's first. A call larger than a slot runs as a sequence of
//! board calls over pieces of the buffer (at most a slot, and at most the tuning's
//! `piece_bytes`, each):
//!
//! - allreduce of at most [`WHOLE_BYTES`]: one board call; every rank combines every
//!   rank's buffer in rank order, `((x0 + x1) + x2) + ...`;
//! - larger allreduces, per piece: every rank publishes its piece; rank `r` combines
//!   block `r` of the piece (the blocks of [`split`]) from every slot, in rank order,
//!   into its own buffer; then every rank publishes its combined block and copies
//!   every other rank's. Each block is combined once, by its owner, with the same
//!   expression as the whole call, so the results are bit-identical across ranks,
//!   floating point included. Per byte of the buffer a rank copies it into its slot,
//!   reads `1 / n` of it from each slot to combine, and copies the result back: three
//!   passes over the buffer, where the pipes' algorithms make four copies and the
//!   reduction;
//! - broadcast: the root's buffer piece by piece, and an empty part from every other
//!   rank in each board call; the root reads nothing and returns once its last piece
//!   is written, the others read only the root's part;
//! - allgather: every rank's block, piece by piece, each copied to its place;
//! - reduce-scatter: in board call `k` every rank publishes piece `k` of every rank's
//!   block (the blocks of [`split`], pieces of a slot's `1 / n` each) and rank `r`
//!   combines piece `k` of block `r` from every slot, in rank order, into its own
//!   buffer: every rank combines in every call, and each block is combined with the
//!   same expression as an allreduce's;
//! - barrier: empty parts.
//!
//! Two-byte floats stay in their own type on the board (half the bytes of `f32`):
//! the rank that combines a block widens each rank's part of it to `f32`, combines
//! there in the same rank order, and rounds the block once
//! ([`HalfInF32`](super::accumulate::HalfInF32)).
//!
//! Every rank publishes a part in every board call, which is what lets the board reuse
//! a slot two calls later without acknowledgements (a rank waits for every part of
//! its last call before it publishes, `Link::board_publish`), and what pipelines the
//! pieces: a rank publishes piece `k + 1` while slower ranks still read piece `k`, and
//! a broadcast's root runs up to a call ahead of the others. In allreduce, allgather
//! and the barrier every rank also reads every rank's meta frame straight from its
//! slot, so a rank in another call (length, operation, type) is caught by every rank:
//! checked mode needs no agreement before these calls. In a broadcast only the
//! other ranks compare their call with the root's; checked mode agrees first.

use super::accumulate::Accumulate;
use super::{Round, split};
use crate::collective::error::CollectiveError;
use std::ops::Range;
use switchyard_msg::copy::{copy_bytes, copy_elements};
use switchyard_msg::payload::Element;

/// The largest allreduce that runs as one board call in which every rank combines
/// the whole buffer: below it, one synchronisation is cheaper than the two of a
/// piece; above it, combining every byte on every rank costs more than a second
/// synchronisation (`docs/benchmarks/log.md`, the host board's 2026-11-27 sections).
pub(crate) const WHOLE_BYTES: usize = 16 << 10;

/// Bytes of one piece: a slot, or the tuning's piece size when smaller; at least 1.
fn piece_bytes(round: &Round<'_>, tuning_piece: usize) -> usize {
    round.link.board_bytes().min(tuning_piece).max(1)
}

/// The part of `block` that goes in board call `k` of pieces of `piece` bytes.
fn part(block: &Range<usize>, k: usize, piece: usize) -> Range<usize> {
    let start = block
        .start
        .saturating_add(k.saturating_mul(piece))
        .min(block.end);
    start..start.saturating_add(piece).min(block.end)
}

/// Refuses a part of `len` bytes where `wanted` belong.
fn wrong_length(len: usize, wanted: usize) -> Result<(), String> {
    if len == wanted {
        Ok(())
    } else {
        Err(format!("{len} bytes on the host board, expected {wanted}"))
    }
}

/// Allreduces `buf` in place on the board; `acc` ([`Accumulate`]) combines in rank
/// order. `tuning_piece` caps the piece size (see the module documentation).
pub(crate) fn allreduce<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    acc: &mut dyn Accumulate<T>,
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    allreduce_from(round, None, buf, acc, tuning_piece)
}

/// [`allreduce`] of `input` into `out` (of the same length), `input` left as it was:
/// the board reads each rank's input once whichever buffer it is in, so this costs
/// what the in-place call costs, where copying the input aside first would add a
/// pass over the buffer (robust mode keeps the input to run a call again).
pub(crate) fn allreduce_into<T: Element>(
    round: &mut Round<'_>,
    input: &[T],
    out: &mut [T],
    acc: &mut dyn Accumulate<T>,
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    allreduce_from(round, Some(input), out, acc, tuning_piece)
}

/// The allreduce of the board, reading this rank's input from `input`, or from `out`
/// itself when `None`, and leaving the result in `out`.
fn allreduce_from<T: Element>(
    round: &mut Round<'_>,
    input: Option<&[T]>,
    out: &mut [T],
    acc: &mut dyn Accumulate<T>,
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    if input.is_some_and(|input| input.len() != out.len()) {
        return Err(CollectiveError::InvalidArgument {
            call: round.sig.call,
            reason: "an allreduce into a buffer of another length than its input".into(),
        });
    }
    let piece_len = piece_bytes(round, tuning_piece);
    if std::mem::size_of_val(out) <= WHOLE_BYTES.min(piece_len) {
        return allreduce_whole(round, input, out, acc);
    }
    let per_piece = (piece_len / std::mem::size_of::<T>().max(1)).max(1);
    let (n, me) = (round.size(), round.rank());
    for start in (0..out.len()).step_by(per_piece) {
        let range = start..(start + per_piece).min(out.len());
        let source = match input {
            Some(input) => &input[range.clone()],
            None => &out[range.clone()],
        };
        publish(round, bytemuck::cast_slice(source))?;
        let piece = &mut out[range];
        let expected = std::mem::size_of_val(piece);
        let mine = split(piece.len(), n, me);
        let mine_bytes = bytes_of::<T>(&mine);
        // Block `mine` of this rank's buffer is overwritten with rank 0's part before
        // anything is combined into it: the original is in this rank's slot.
        take_all(round, &mut |from, data| {
            wrong_length(data.len(), expected)?;
            let theirs = elements::<T>(&data[mine_bytes.clone()])?;
            acc.add(&mut piece[mine.clone()], from, from + 1 == n, theirs);
            Ok(())
        })?;
        publish(round, bytemuck::cast_slice(&piece[mine.clone()]))?;
        take_all(round, &mut |from, data| {
            let block = split(piece.len(), n, from);
            wrong_length(data.len(), std::mem::size_of_val(&piece[block.clone()]))?;
            if from != me {
                copy_elements(&mut piece[block], elements::<T>(data)?);
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Reduces `buf` over every rank and leaves block `rank` of the result (of
/// [`split`]) in place on this rank; the rest of `buf` is left as it was.
/// `acc` ([`Accumulate`]) combines in rank order; `tuning_piece` caps a board call's
/// part, as for the other calls.
pub(crate) fn reduce_scatter<T: Element>(
    round: &mut Round<'_>,
    buf: &mut [T],
    acc: &mut dyn Accumulate<T>,
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    let (n, me) = (round.size(), round.rank());
    let blocks: Vec<Range<usize>> = (0..n).map(|r| split(buf.len(), n, r)).collect();
    // Elements of each block that go in one board call: the part holds one such
    // piece of every block.
    let per_block = (piece_bytes(round, tuning_piece) / n / std::mem::size_of::<T>().max(1)).max(1);
    let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    for k in 0..longest.div_ceil(per_block).max(1) {
        let pieces: Vec<Range<usize>> = blocks.iter().map(|b| part(b, k, per_block)).collect();
        let parts: Vec<&[u8]> = pieces
            .iter()
            .map(|p| bytemuck::cast_slice(&buf[p.clone()]))
            .collect();
        let expected: usize = parts.iter().map(|p| p.len()).sum();
        publish_parts(round, &parts)?;
        // Where this rank's piece lies in every rank's part.
        let at: usize = pieces[..me].iter().map(|p| p.len()).sum();
        let mine = pieces[me].clone();
        let in_part = bytes_of::<T>(&(at..at + mine.len()));
        // This rank's own piece is read back from its slot like any other: it is
        // overwritten with rank 0's before anything is combined into it.
        take_all(round, &mut |from, data| {
            wrong_length(data.len(), expected)?;
            let theirs = elements::<T>(&data[in_part.clone()])?;
            acc.add(&mut buf[mine.clone()], from, from + 1 == n, theirs);
            Ok(())
        })?;
    }
    Ok(())
}

/// `range` of elements of `T` as a range of bytes.
fn bytes_of<T>(range: &Range<usize>) -> Range<usize> {
    let size = std::mem::size_of::<T>();
    range.start * size..range.end * size
}

/// `data`, read from a slot, as elements of `T`.
fn elements<T: Element>(data: &[u8]) -> Result<&[T], String> {
    bytemuck::try_cast_slice::<u8, T>(data).map_err(|e| format!("host board slot: {e:?}"))
}

/// A small allreduce in one board call: every rank combines every rank's buffer
/// (this rank's from `input`, or from `buf` when `None`) into `buf`.
fn allreduce_whole<T: Element>(
    round: &mut Round<'_>,
    input: Option<&[T]>,
    buf: &mut [T],
    acc: &mut dyn Accumulate<T>,
) -> Result<(), CollectiveError> {
    let n = round.size();
    let expected = std::mem::size_of_val(buf);
    publish(round, bytemuck::cast_slice(input.unwrap_or(buf)))?;
    // This rank's own part is read back from its slot like any other: `buf` is
    // overwritten with rank 0's part before anything is combined into it.
    take_all(round, &mut |from, data| {
        wrong_length(data.len(), expected)?;
        acc.add(buf, from, from + 1 == n, elements::<T>(data)?);
        Ok(())
    })
}

/// Copies `root`'s `buf` to every rank on the board, piece by piece.
pub(crate) fn broadcast(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [u8],
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    let piece = piece_bytes(round, tuning_piece);
    let me = round.rank();
    let whole = 0..buf.len();
    for k in 0..buf.len().div_ceil(piece).max(1) {
        let range = part(&whole, k, piece);
        if me == root {
            publish(round, &buf[range])?;
            continue;
        }
        publish(round, &[])?;
        take_from(round, root..root + 1, &mut |_, data| {
            wrong_length(data.len(), range.len())?;
            copy_bytes(&mut buf[range.clone()], data);
            Ok(())
        })?;
    }
    Ok(())
}

/// Allgather where block `r` (already in place on rank `r`) is `blocks[r]` of `out`,
/// piece by piece: board call `k` carries piece `k` of every rank's block.
pub(crate) fn allgather(
    round: &mut Round<'_>,
    out: &mut [u8],
    blocks: &[Range<usize>],
    tuning_piece: usize,
) -> Result<(), CollectiveError> {
    let piece = piece_bytes(round, tuning_piece);
    let me = round.rank();
    let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    for k in 0..longest.div_ceil(piece).max(1) {
        publish(round, &out[part(&blocks[me], k, piece)])?;
        take_all(round, &mut |from, data| {
            let theirs = part(&blocks[from], k, piece);
            wrong_length(data.len(), theirs.len())?;
            if from != me {
                copy_bytes(&mut out[theirs], data);
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Waits until every rank has reached the barrier: an empty part on the board, read
/// from every rank.
pub(crate) fn barrier(round: &mut Round<'_>) -> Result<(), CollectiveError> {
    publish(round, &[])?;
    take_all(round, &mut |_, data| wrong_length(data.len(), 0))
}

/// Puts this rank's part of the call, `mine`, on the board.
fn publish(round: &mut Round<'_>, mine: &[u8]) -> Result<(), CollectiveError> {
    publish_parts(round, &[mine])
}

/// [`publish`] of a part made of `parts`, one after the other.
fn publish_parts(round: &mut Round<'_>, parts: &[&[u8]]) -> Result<(), CollectiveError> {
    round.algo = "host board";
    let meta = round.meta(0);
    round
        .link
        .board_publish(&meta, parts, round.clock)
        .map_err(|e| round.link_error(e, 0))
}

/// What a board call does with rank `from`'s part; `Err` says what is wrong with it.
type Take<'a> = dyn FnMut(usize, &[u8]) -> Result<(), String> + 'a;

/// Hands every rank's part of the call (this rank's too, from its slot) to `each`, in
/// rank order; an `Err` from `each` is a malformed part from that rank.
fn take_all(round: &mut Round<'_>, each: &mut Take<'_>) -> Result<(), CollectiveError> {
    let ranks = 0..round.size();
    take_from(round, ranks, each)
}

/// [`take_all`] for the parts of `ranks` only.
fn take_from(
    round: &mut Round<'_>,
    ranks: Range<usize>,
    each: &mut Take<'_>,
) -> Result<(), CollectiveError> {
    let stamp = round.stamp();
    let call = round.sig.call;
    for from in ranks {
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
                rank: round.world_rank(from),
                reason,
            });
        }
    }
    Ok(())
}
