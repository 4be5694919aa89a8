//! Running the algorithm [`choose`](super::choice::choose) picked, on a [`Round`]: the
//! one dispatch of the flat algorithms, shared by the mesh engine's calls and the
//! phases of a hierarchical one (`hierarchy.rs`), which run them on a group of the
//! world's ranks. A hierarchical call is the mesh's to run, never picked here, so
//! the mesh and its hierarchy both stand on this module and neither on the other.

use super::accumulate::{HalfInF32, Pairwise};
use super::choice::Algorithm;
use super::{Round, board, direct, doubling, ring, tree};
use crate::collective::element::{DType, ReduceOp, Reducible, in_f32_with};
use crate::collective::error::{Call, CollectiveError};
use crate::collective::options::Tuning;
use half::slice::HalfFloatSliceExt;
use switchyard_msg::payload;

/// Runs `algorithm` for a built-in reduction of `buf`: all of it (`Phase::Both`),
/// or each rank's block ([`ring::Phase::ReduceScatter`]). Flat algorithms only: the
/// mesh runs [`Algorithm::Hierarchical`] itself, whose phases come back here.
pub(crate) fn reduce_as<T: Reducible>(
    round: &mut Round<'_>,
    buf: &mut [T],
    op: ReduceOp,
    algorithm: Algorithm,
    tuning: &Tuning,
) -> Result<(), CollectiveError> {
    let reduce = move |acc: &mut [T], other: &[T]| T::reduce_into(op, acc, other);
    let phase = match round.sig.call {
        Call::ReduceScatter => ring::Phase::ReduceScatter,
        _ => ring::Phase::Both,
    };
    match algorithm {
        Algorithm::Doubling => doubling::allreduce(round, buf, &reduce),
        Algorithm::Board if phase == ring::Phase::ReduceScatter => {
            board::reduce_scatter(round, buf, &mut Pairwise(&reduce), tuning.piece_bytes)
        }
        Algorithm::Board => {
            board::allreduce(round, buf, &mut Pairwise(&reduce), tuning.piece_bytes)
        }
        Algorithm::Direct => {
            direct::allreduce(round, buf, &mut Pairwise(&reduce), tuning.piece_bytes)
        }
        Algorithm::Ring => {
            let plan = ring::RingPlan::even::<T>(
                buf.len(),
                round.size(),
                tuning.piece_bytes,
                tuning.window,
            );
            ring::run(round, buf, &plan, phase, &reduce)
        }
        other => Err(not_for(round.sig.call, other)),
    }
}

/// [`reduce_as`] of two-byte floats ([`DType::is_half`]), which never reduce in their
/// own type: on the host board and in the direct exchange each rank's part travels in
/// the element type and each block is combined in `f32`, in one place, and rounded
/// once ([`HalfInF32`]); every other
/// flat algorithm runs on an `f32` copy of the buffer in `scratch` ([`in_f32_with`]),
/// rounded back once (the mesh runs a hierarchy of hosts on such a copy itself).
pub(crate) fn reduce_half_as<T>(
    round: &mut Round<'_>,
    (buf, dtype): (&mut [T], DType),
    op: ReduceOp,
    (algorithm, tuning): (Algorithm, &Tuning),
    scratch: &mut Vec<f32>,
) -> Result<(), CollectiveError>
where
    T: Reducible,
    [T]: HalfFloatSliceExt,
{
    let mut sum = HalfInF32::new(op);
    match algorithm {
        Algorithm::Board if round.sig.call == Call::ReduceScatter => {
            board::reduce_scatter(round, buf, &mut sum, tuning.piece_bytes)
        }
        Algorithm::Board => board::allreduce(round, buf, &mut sum, tuning.piece_bytes),
        Algorithm::Direct => direct::allreduce(round, buf, &mut sum, tuning.piece_bytes),
        Algorithm::Hierarchical => Err(not_for(round.sig.call, algorithm)),
        other => in_f32_with(
            round.sig.call,
            bytemuck::cast_slice_mut(buf),
            dtype,
            scratch,
            |wide| reduce_as::<f32>(round, wide, op, other, tuning),
        ),
    }
}

/// Runs `algorithm` for a broadcast of `buf` from `root`.
pub(crate) fn broadcast_as(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [u8],
    algorithm: Algorithm,
    piece_bytes: usize,
) -> Result<(), CollectiveError> {
    match algorithm {
        Algorithm::Board => board::broadcast(round, root, buf, piece_bytes),
        Algorithm::Direct => direct::broadcast(round, root, buf, piece_bytes),
        Algorithm::Chain => tree::broadcast_chain(round, root, buf, piece_bytes),
        Algorithm::Tree => {
            let me = round.rank();
            let frame = (me == root).then(|| round.frame_of::<u8>(buf));
            let data = tree::broadcast_frame(round, root, frame)?;
            if me != root {
                payload::frame_copy_into(&data, buf).map_err(|e| CollectiveError::Malformed {
                    call: round.sig.call,
                    rank: root,
                    reason: e.to_string(),
                })?;
            }
            // Back to the link's pool, so that the next broadcast of this size
            // reuses the memory instead of faulting in a fresh buffer (a
            // frame still queued for a child is shared and just drops).
            round.link.recycle(data);
            Ok(())
        }
        other => Err(not_for(round.sig.call, other)),
    }
}

/// The error for an algorithm [`choose`] should never pick for `call`.
pub(crate) fn not_for(call: Call, algorithm: Algorithm) -> CollectiveError {
    CollectiveError::InvalidArgument {
        call,
        reason: format!("the mesh has no {algorithm:?} algorithm for {call}"),
    }
}
