//! The MPI engine: MPI's own collectives, for processes started by `mpirun`.
//!
//! # Threading
//!
//! The transports' MPI backend has one progress thread per process, which initialised
//! MPI and makes every MPI call of the process but the sockets' own sends and receives
//! (their threads make those when MPI granted `MPI_THREAD_MULTIPLE`). The collectives
//! do not call MPI from the caller's thread, which could race the progress thread at a
//! lower thread level: each collective is one closure run on the progress thread
//! ([`switchyard_transports::mpi::with_collectives`]), on a duplicate of
//! `MPI_COMM_WORLD` of its own (so collective messages never mix with the sockets'),
//! with `MPI_ERRORS_RETURN`, so that every MPI failure comes back as
//! [`CollectiveError::Transport`] with MPI's own text. While a collective runs, the
//! process's sockets keep sending and receiving on their own threads under
//! `MPI_THREAD_MULTIPLE`; below it, their traffic waits for the collective. The raw MPI calls are the
//! transports' ([`switchyard_transports::mpi::Collectives`]); this engine decides
//! which to make.
//!
//! # Timeouts
//!
//! MPI collectives cannot time out, so [`CommOptions::timeout`](super::CommOptions)
//! does not bound them. A rank that dies ends the whole job instead: `mpirun` kills
//! the other ranks when a process dies, and a rank that fails exits without
//! `MPI_Finalize` so that `mpirun` notices (the transports' exit hook), rather than
//! leaving the others blocked in a collective.
//!
//! # Argument checks
//!
//! MPI does not notice ranks that pass different lengths or call different
//! collectives; it hangs or computes garbage. So before each call, unless
//! [`CommOptions::mpi_arg_checks`](super::CommOptions::mpi_arg_checks) turned it off,
//! the ranks allgather a pair of `u64` (the call's [`Signature`] and element count)
//! and every rank fails with the same [`CollectiveError::CallMismatch`] or
//! [`CollectiveError::SizeMismatch`] naming the first rank that disagrees with it.
//! That costs one small `MPI_Allgather` per call. Checked mode
//! ([`CommOptions::check`](super::CommOptions::check)) turns this check on whatever
//! `mpi_arg_checks` says: it is the same guarantee as the mesh's checked mode (no rank
//! returns `Ok` from a call another rank made differently), since every rank sees
//! every rank's signature and count before any data moves.
//!
//! # Two-byte floats
//!
//! MPI has no standard type for [`DType::F16`] and [`DType::BF16`] (`MPI_FLOAT16`
//! and the like are extensions of some libraries). Their reductions run as on the
//! mesh ([`DType::is_half`]): each rank widens its buffer to `f32`, `MPI_Allreduce`
//! (or `MPI_Reduce_scatter`) runs on `MPI_FLOAT` with MPI's built-in operation, and
//! each result element is rounded once to the element type. The result is then
//! bit-identical across ranks wherever MPI's `f32` results are (MPI's
//! recommendation, which Open MPI's algorithms keep), and the call moves twice the
//! bytes of the buffer. Broadcast and allgather move halves as bytes.
//!
//! # Large buffers
//!
//! MPI counts are `int`: a buffer of more than `i32::MAX` elements is reduced or
//! broadcast in several calls, and block layouts that do not fit in `int`
//! displacements are moved in rounds or block by block (see [`split`]).

mod split;

use super::element::{DType, ReduceOp, in_f32_with};
use super::engine::{Collective, Combine, Elem, Engine, Prepare, share_fold_result};
use super::error::{Call, CollectiveError};
use super::signature::Signature;
use std::time::Duration;
use switchyard_net::env::{self, EnvError, Lookup};
use switchyard_transports::mpi::{self as transport, CallError, Collectives, Datatype, Operation};

/// Environment variable, for tests: the largest element count one MPI call gets
/// (default and maximum `i32::MAX`), so that the splitting of large buffers can be
/// exercised with small ones. Must be the same on every rank.
pub(crate) const ENV_MAX_COUNT: &str = "SWITCHYARD_MPI_MAX_COUNT";

/// Environment variable, for tests: `0` makes the engine copy inputs to scratch
/// buffers instead of passing `MPI_IN_PLACE`, the path libraries other than Open MPI
/// take.
pub(crate) const ENV_IN_PLACE: &str = "SWITCHYARD_MPI_IN_PLACE";

/// The engine's variables, read before MPI starts so that a malformed one fails the
/// setup instead of being taken for its default: whether to pass `MPI_IN_PLACE`
/// ([`ENV_IN_PLACE`]), the largest count of one call ([`ENV_MAX_COUNT`]), and the
/// finalize timeout that the exit path reads again later
/// ([`ENV_FINALIZE_TIMEOUT`](switchyard_transports::mpi::ENV_FINALIZE_TIMEOUT)).
fn engine_vars(lookup: &(impl Lookup + ?Sized)) -> Result<(bool, usize), EnvError> {
    let in_place = env::flag(lookup, ENV_IN_PLACE)?.unwrap_or(true);
    let max_count = env::usize(lookup, ENV_MAX_COUNT)?
        .unwrap_or(usize::MAX)
        .clamp(1, i32::MAX as usize);
    env::u64(lookup, transport::ENV_FINALIZE_TIMEOUT)?;
    Ok((in_place, max_count))
}

/// Collectives over `MPI_COMM_WORLD`, run by MPI itself.
#[derive(Debug)]
pub(crate) struct MpiEngine {
    rank: usize,
    size: usize,
    processor_name: String,
    check_args: bool,
    /// Largest element count of one MPI call, at least 1.
    max_count: usize,
    /// Whether to pass `MPI_IN_PLACE` where the library's value is known.
    in_place: bool,
}

/// MPI's datatype for `dtype`.
fn datatype(dtype: DType) -> Datatype {
    match dtype {
        DType::F32 => Datatype::F32,
        DType::F64 => Datatype::F64,
        DType::I32 => Datatype::I32,
        DType::I64 => Datatype::I64,
        DType::U32 => Datatype::U32,
        DType::U64 => Datatype::U64,
        DType::U8 => Datatype::U8,
        // MPI has no standard two-byte float: halves are reduced as the `f32` they
        // widen to ([`in_f32_with`]) and move as bytes otherwise.
        DType::F16 | DType::BF16 => Datatype::F32,
    }
}

/// Whether `op` on `dtype` runs widened (see [`split::widened_u8`]): sums and
/// products of bytes, which OpenMPI's `op/avx` saturates.
fn wraps_u8(dtype: DType, op: ReduceOp) -> bool {
    dtype == DType::U8 && matches!(op, ReduceOp::Sum | ReduceOp::Prod)
}

/// MPI's built-in operation for `op`.
fn operation(op: ReduceOp) -> Operation {
    match op {
        ReduceOp::Sum => Operation::Sum,
        ReduceOp::Prod => Operation::Prod,
        ReduceOp::Max => Operation::Max,
        ReduceOp::Min => Operation::Min,
        ReduceOp::BitOr => Operation::BitOr,
    }
}

/// This process's rank as the launcher tells it, for errors before MPI could say.
fn launcher_rank() -> usize {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// What an MPI failure is, in the context of one call on one rank.
pub(super) fn failed(call: Call, rank: usize) -> impl Fn(CallError) -> CollectiveError {
    move |e| CollectiveError::Transport {
        call,
        rank,
        reason: e.to_string(),
    }
}

/// Runs `body` on the progress thread with the collectives' communicator.
fn run<R: Send>(
    call: Call,
    rank: usize,
    body: impl FnOnce(&Collectives<'_>) -> Result<R, CollectiveError> + Send,
) -> Result<R, CollectiveError> {
    transport::with_collectives(body).map_err(|e| CollectiveError::Transport {
        call,
        rank,
        reason: e.to_string(),
    })?
}

impl MpiEngine {
    /// Starts MPI if needed and joins the collectives' communicator (collective: every
    /// rank must call it). `timeout` is not enforced: MPI collectives cannot time out,
    /// and a dead rank ends the job through `mpirun` (see the module documentation).
    /// `check_args` turns the argument check before each call on or off; every rank
    /// must choose the same.
    pub(crate) fn new(timeout: Duration, check_args: bool) -> Result<MpiEngine, CollectiveError> {
        let (in_place, max_count) = engine_vars(&env::ProcessEnv)
            .map_err(|e| CollectiveError::setup("reading the environment", e))?;
        let world = transport::world().map_err(|e| CollectiveError::Transport {
            call: Call::Setup,
            rank: launcher_rank(),
            reason: e.to_string(),
        })?;
        let rank = world.rank as usize;
        let size = world.size as usize;
        let (library, comm_rank, comm_size, in_place_known) = run(Call::Setup, rank, |c| {
            let failed = failed(Call::Setup, rank);
            Ok((
                c.library_version().map_err(&failed)?,
                c.rank().map_err(&failed)?,
                c.size().map_err(&failed)?,
                c.has_in_place(),
            ))
        })?;
        if comm_rank != rank || comm_size != size {
            return Err(CollectiveError::Transport {
                call: Call::Setup,
                rank,
                reason: format!(
                    "the collectives' communicator says rank {comm_rank} of {comm_size}, \
                     MPI_COMM_WORLD rank {rank} of {size}"
                ),
            });
        }
        tracing::debug!(
            rank,
            size,
            ?timeout,
            library = library.trim(),
            in_place = in_place && in_place_known,
            max_count,
            "mpi collectives ready (MPI does not enforce the timeout)"
        );
        Ok(MpiEngine {
            rank,
            size,
            processor_name: world.processor_name,
            check_args,
            max_count,
            in_place,
        })
    }

    /// `MPI_Get_processor_name`.
    pub(crate) fn processor_name(&self) -> &str {
        &self.processor_name
    }

    /// Runs `body` on the progress thread, after the argument check when it is on
    /// (`count` `None`: only the signature must agree).
    fn call<R: Send>(
        &self,
        sig: Signature,
        count: u64,
        compare_counts: bool,
        body: impl FnOnce(&Collectives<'_>, &[[u64; 2]]) -> Result<R, CollectiveError> + Send,
    ) -> Result<R, CollectiveError> {
        let (rank, size, check_args) = (self.rank, self.size, self.check_args);
        run(sig.call, rank, move |c| {
            // Every rank's (signature, count), when checking or when the body needs
            // the counts.
            let pairs = if check_args || !compare_counts {
                let mut all = vec![0u64; 2 * size];
                c.allgather_u64(&[sig.encode(), count], &mut all)
                    .map_err(failed(sig.call, rank))?;
                all.chunks_exact(2).map(|p| [p[0], p[1]]).collect()
            } else {
                Vec::new()
            };
            if check_args {
                for (peer, theirs) in pairs.iter().enumerate() {
                    let their_count = compare_counts.then_some(theirs[1]);
                    sig.agree(count, rank, peer, theirs[0], their_count)?;
                }
            }
            body(c, &pairs)
        })
    }

    /// A rank-ordered user reduction: every rank's bytes to rank 0, combined there in
    /// rank order, then the result to every rank.
    fn fold(
        &mut self,
        buf: &mut Vec<u8>,
        count: u64,
        elem: Elem,
        combine: &Combine<'_>,
    ) -> Result<(), CollectiveError> {
        let sig = Signature::user(elem);
        let (rank, size, max_count) = (self.rank, self.size, self.max_count);
        let mine = buf.as_slice();
        // Lengths may differ (encoded values); only the call must agree. The lengths
        // travel in the same exchange as the check.
        let gathered = self.call(sig, mine.len() as u64, false, move |c, pairs| {
            split::gather_to_zero(c, mine, pairs, rank, size, max_count)
        })?;
        if let Some(frames) = gathered {
            for (from, frame) in frames.iter().enumerate().skip(1) {
                combine(buf, frame, from)?;
            }
        }
        share_fold_result(buf, elem, sig, count, |buf, sig, count| {
            self.broadcast(buf, sig, count, 0)
        })
    }

    fn broadcast(
        &self,
        buf: &mut [u8],
        sig: Signature,
        count: u64,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let (rank, max_count) = (self.rank, self.max_count);
        self.call(sig, count, true, move |c, _| {
            split::broadcast(c, buf, root, max_count).map_err(failed(sig.call, rank))
        })
    }
}

impl Engine for MpiEngine {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        "mpi"
    }

    /// MPI's collectives cannot be aborted halfway, so every rank first says whether
    /// its `prepare` succeeded (one small allgather, only for lazy calls): if any
    /// failed, no rank runs the call, the failed rank returns its own error and every
    /// other rank `Aborted` naming the lowest failed rank. Without this a failed rank
    /// would leave its peers waiting in MPI forever.
    fn run_prepared(
        &mut self,
        request: &mut Collective<'_>,
        prepare: &mut Prepare<'_>,
    ) -> Result<(), CollectiveError> {
        let call = request.call();
        let outcome = prepare(request.result_buffer());
        let (rank, size) = (self.rank, self.size);
        let mine = if outcome.is_ok() {
            size as u64
        } else {
            rank as u64
        };
        let lowest_failed = run(call, rank, move |c| {
            let mut all = vec![0u64; size];
            c.allgather_u64(&[mine], &mut all)
                .map_err(failed(call, rank))?;
            Ok(all.into_iter().min().unwrap_or(size as u64))
        })?;
        match outcome {
            Err(reason) => Err(CollectiveError::PrepareFailed { call, rank, reason }),
            Ok(()) if lowest_failed < size as u64 => Err(CollectiveError::Aborted {
                call,
                rank: lowest_failed as usize,
                reason: format!("rank {lowest_failed}: prepare failed"),
            }),
            Ok(()) => self.run(request),
        }
    }

    /// The failures every rank reaches together before any data moves leave the
    /// ranks in step, so the communicator stays usable after them: the argument
    /// check's `CallMismatch` and `SizeMismatch` (every rank saw every rank's
    /// signature and count, and none ran the call), and the `prepare` agreement's
    /// `PrepareFailed` and `Aborted` (no rank ran the call). Anything else (MPI's own
    /// failures, a user reduction that failed on one rank) poisons it.
    fn usable_after(&self, e: &CollectiveError) -> bool {
        matches!(
            e,
            CollectiveError::CallMismatch { .. }
                | CollectiveError::SizeMismatch { .. }
                | CollectiveError::PrepareFailed { .. }
                | CollectiveError::Aborted { .. }
        )
    }

    fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        let (sig, count) = (Signature::of(request), request.count());
        let failed = failed(sig.call, self.rank);
        let (rank, size, max_count, in_place) =
            (self.rank, self.size, self.max_count, self.in_place);
        match request {
            Collective::Allreduce { buf, dtype, op } => {
                let (ty, wrap_u8, op) = (datatype(*dtype), wraps_u8(*dtype, *op), operation(*op));
                let dtype = *dtype;
                self.call(sig, count, true, move |c, _| {
                    if dtype.is_half() {
                        return in_f32_with(sig.call, buf, dtype, &mut Vec::new(), |wide| {
                            let wide = bytemuck::cast_slice_mut(wide);
                            split::allreduce(c, wide, ty, op, max_count, in_place).map_err(failed)
                        });
                    }
                    if wrap_u8 {
                        return split::widened_u8(buf, |wide| {
                            split::allreduce(c, wide, Datatype::U32, op, max_count, in_place)
                        })
                        .map_err(failed);
                    }
                    split::allreduce(c, buf, ty, op, max_count, in_place).map_err(failed)
                })
            }
            Collective::ReduceScatter { buf, dtype, op } => {
                let (ty, wrap_u8, op) = (datatype(*dtype), wraps_u8(*dtype, *op), operation(*op));
                let dtype = *dtype;
                self.call(sig, count, true, move |c, _| {
                    let elements = buf.len() / dtype.size();
                    let plan = split::Scatter::even(elements, rank, size, max_count);
                    if dtype.is_half() {
                        return in_f32_with(sig.call, buf, dtype, &mut Vec::new(), |wide| {
                            let wide = bytemuck::cast_slice_mut(wide);
                            split::reduce_scatter(c, wide, &plan, ty, op, in_place).map_err(failed)
                        });
                    }
                    if wrap_u8 {
                        return split::widened_u8(buf, |wide| {
                            split::reduce_scatter(c, wide, &plan, Datatype::U32, op, in_place)
                        })
                        .map_err(failed);
                    }
                    split::reduce_scatter(c, buf, &plan, ty, op, in_place).map_err(failed)
                })
            }
            Collective::Broadcast { buf, root, .. } => self.broadcast(buf, sig, count, *root),
            Collective::Allgather { out, width, blocks } => {
                let width = *width;
                let blocks: Vec<_> = blocks
                    .iter()
                    .map(|b| b.start * width..b.end * width)
                    .collect();
                self.call(sig, count, true, move |c, _| {
                    split::allgather(c, out, &blocks, max_count, in_place).map_err(failed)
                })
            }
            Collective::Barrier => {
                self.call(sig, count, true, move |c, _| c.barrier().map_err(failed))
            }
            Collective::Fold {
                buf,
                count,
                elem,
                combine,
            } => self.fold(buf, *count, *elem, *combine),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Silent before: a malformed value ran the engine with its default.
    #[test]
    fn a_malformed_engine_variable_is_named_with_its_value() {
        let none: [(&str, &str); 0] = [];
        assert_eq!(engine_vars(&none).unwrap(), (true, i32::MAX as usize));
        assert_eq!(
            engine_vars(&[(ENV_IN_PLACE, "0"), (ENV_MAX_COUNT, "7")]).unwrap(),
            (false, 7)
        );
        for (var, bad) in [
            (ENV_IN_PLACE, "off"),
            (ENV_MAX_COUNT, "many"),
            (transport::ENV_FINALIZE_TIMEOUT, "1m"),
        ] {
            let err = engine_vars(&[(var, bad)]).unwrap_err();
            assert_eq!((err.var(), err.value()), (var, Some(bad)));
        }
    }
}
