//! The MPI engine: MPI's own collectives, for processes started by `mpirun`.
//!
//! # Threading
//!
//! The transports' MPI backend has one progress thread per process that initialised
//! MPI and makes every MPI call of the process. The collectives do not call MPI from
//! the caller's thread, which could race that thread whatever thread level MPI
//! granted: each collective is one closure run on the progress thread
//! ([`switchyard_transports::mpi::run_on_progress_thread`]), on a duplicate of
//! `MPI_COMM_WORLD` of its own (so collective messages never mix with the sockets'),
//! with `MPI_ERRORS_RETURN`, so that every MPI failure comes back as
//! [`CollectiveError::Transport`] with MPI's own text. While a collective runs, the
//! process's socket traffic over MPI waits for it.
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
//! [`MpiEngine::set_check_args`] turned it off, the ranks allgather a pair of `u64`
//! (the call's signature and element count) and every rank fails with the same
//! [`CollectiveError::CallMismatch`] or [`CollectiveError::SizeMismatch`] naming the
//! first rank that disagrees with it. That costs one small `MPI_Allgather` per call.
//!
//! # Large buffers and in-place calls
//!
//! MPI counts are `int`: a buffer of more than `i32::MAX` elements is reduced or
//! broadcast in several calls, and block layouts that do not fit in `int`
//! displacements are moved in rounds or block by block. Results are in place: `MPI_IN_PLACE`
//! where the library's value for it is known (Open MPI), a scratch copy of the input
//! otherwise, because rsmpi does not export `MPI_IN_PLACE` (a macro in `mpi.h`).

use super::element::{DType, ReduceOp, Reducible};
use super::error::{Call, CollectiveError};
use super::USER_OP;
use mpi::ffi as sys;
use std::ffi::{c_char, c_int, c_void};
use std::ops::Range;
use std::time::Duration;
use switchyard_transports::mpi as transport;

/// Environment variable, for tests: the largest element count one MPI call gets
/// (default and maximum `i32::MAX`), so that the splitting of large buffers can be
/// exercised with small ones. Must be the same on every rank.
pub(crate) const ENV_MAX_COUNT: &str = "SWITCHYARD_MPI_MAX_COUNT";

/// Environment variable, for tests: `0` makes the engine copy inputs to scratch
/// buffers instead of passing `MPI_IN_PLACE`, the path libraries other than Open MPI
/// take.
pub(crate) const ENV_IN_PLACE: &str = "SWITCHYARD_MPI_IN_PLACE";

/// Open MPI's `MPI_IN_PLACE`: `((void *) 1)` in its `mpi.h`, part of its ABI since 1.0.
const OPEN_MPI_IN_PLACE: usize = 1;

/// Collectives over `MPI_COMM_WORLD`, run by MPI itself.
#[derive(Debug)]
pub(crate) struct MpiEngine {
    rank: usize,
    size: usize,
    processor_name: String,
    check_args: bool,
    /// Largest element count of one MPI call, at least 1.
    max_count: usize,
    /// The library's `MPI_IN_PLACE`, as an address, where it is known. Kept as an
    /// integer because the closures that use it must be `Send`.
    in_place: Option<usize>,
}

/// An MPI call's failure, in the context of one collective on the progress thread.
struct Ctx {
    comm: sys::MPI_Comm,
    call: Call,
    rank: usize,
}

impl Ctx {
    /// `Ok` for `MPI_SUCCESS`; anything else is a `Transport` error with MPI's text.
    fn check(&self, function: &str, code: c_int) -> Result<(), CollectiveError> {
        if code == sys::MPI_SUCCESS as c_int {
            return Ok(());
        }
        // SAFETY: called inside a closure on the progress thread.
        let text = unsafe { transport::error_string(code) };
        Err(CollectiveError::Transport {
            call: self.call,
            rank: self.rank,
            reason: format!("{function} failed: {text}"),
        })
    }

    /// Every rank's `(signature, count)` pair, in rank order.
    fn allgather_pairs(
        &self,
        pair: [u64; 2],
        size: usize,
    ) -> Result<Vec<[u64; 2]>, CollectiveError> {
        let mut all = vec![[0u64; 2]; size];
        // SAFETY: `pair` holds 2 u64, `all` 2 per rank; the call is on the progress
        // thread.
        let code = unsafe {
            sys::MPI_Allgather(
                pair.as_ptr().cast::<c_void>(),
                2,
                sys::RSMPI_UINT64_T,
                all.as_mut_ptr().cast::<c_void>(),
                2,
                sys::RSMPI_UINT64_T,
                self.comm,
            )
        };
        self.check("MPI_Allgather", code)?;
        Ok(all)
    }

    /// Fails on every rank alike if any rank's signature or count differs from ours.
    fn agree(
        &self,
        pairs: &[[u64; 2]],
        ours: [u64; 2],
        compare_counts: bool,
    ) -> Result<(), CollectiveError> {
        for (rank, theirs) in pairs.iter().enumerate() {
            if theirs[0] != ours[0] {
                return Err(CollectiveError::CallMismatch {
                    call: self.call,
                    rank,
                    ours: describe(ours[0]),
                    theirs: describe(theirs[0]),
                });
            }
            if compare_counts && theirs[1] != ours[1] {
                return Err(CollectiveError::SizeMismatch {
                    call: self.call,
                    rank,
                    me: self.rank,
                    ours: ours[1],
                    theirs: theirs[1],
                });
            }
        }
        Ok(())
    }
}

/// A call's signature as one `u64`, laid out as the mesh engine's: call, operation,
/// element type, root.
fn signature(call: Call, op: u8, dtype: u8, root: usize) -> u64 {
    u64::from(call.code()) | u64::from(op) << 8 | u64::from(dtype) << 16 | (root as u64) << 32
}

/// `call/op/dtype/root`, with names where the codes are known.
fn describe(bits: u64) -> String {
    let (call, op, dtype, root) = (
        (bits & 0xff) as u8,
        (bits >> 8) as u8,
        (bits >> 16) as u8,
        bits >> 32,
    );
    let calls = [
        Call::Allreduce,
        Call::Broadcast,
        Call::Allgather,
        Call::ReduceScatter,
        Call::Barrier,
        Call::Setup,
    ];
    let call = calls
        .iter()
        .find(|c| c.code() == call)
        .map_or_else(|| format!("call {call}"), |c| c.to_string());
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::BitOr,
    ];
    let op = match op {
        0 => "-".to_string(),
        USER_OP => "user".to_string(),
        code => ops
            .iter()
            .find(|o| o.code() == code)
            .map_or_else(|| format!("op {code}"), |o| format!("{o:?}")),
    };
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::U8,
    ];
    let dtype = match dtype {
        0 => "bytes".to_string(),
        code => dtypes
            .iter()
            .find(|d| d.code() == code)
            .map_or_else(|| format!("dtype {code}"), |d| format!("{d:?}")),
    };
    format!("{call}/{op}/{dtype}/root {root}")
}

/// MPI's datatype for `dtype`.
fn datatype(dtype: DType) -> sys::MPI_Datatype {
    // SAFETY: reading link-time constants of the MPI library.
    unsafe {
        match dtype {
            DType::F32 => sys::RSMPI_FLOAT,
            DType::F64 => sys::RSMPI_DOUBLE,
            DType::I32 => sys::RSMPI_INT32_T,
            DType::I64 => sys::RSMPI_INT64_T,
            DType::U32 => sys::RSMPI_UINT32_T,
            DType::U64 => sys::RSMPI_UINT64_T,
            DType::U8 => sys::RSMPI_UINT8_T,
        }
    }
}

/// MPI's built-in operation for `op`.
fn operation(op: ReduceOp) -> sys::MPI_Op {
    // SAFETY: reading link-time constants of the MPI library.
    unsafe {
        match op {
            ReduceOp::Sum => sys::RSMPI_SUM,
            ReduceOp::Prod => sys::RSMPI_PROD,
            ReduceOp::Max => sys::RSMPI_MAX,
            ReduceOp::Min => sys::RSMPI_MIN,
            ReduceOp::BitOr => sys::RSMPI_BOR,
        }
    }
}

/// The library's `MPI_IN_PLACE`, if we know it from its version string.
fn in_place_for(library: &str) -> Option<usize> {
    library
        .trim_start()
        .starts_with("Open MPI")
        .then_some(OPEN_MPI_IN_PLACE)
}

/// `MPI_Get_library_version`, on the progress thread.
fn library_version(ctx: &Ctx) -> Result<String, CollectiveError> {
    let mut text = [0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: the buffer is longer than MPI_MAX_LIBRARY_VERSION_STRING (256 in Open
    // MPI, 8192 in MPICH).
    let code = unsafe { sys::MPI_Get_library_version(text.as_mut_ptr(), &mut len) };
    ctx.check("MPI_Get_library_version", code)?;
    let bytes: Vec<u8> = text[..usize::try_from(len).unwrap_or(0).min(text.len())]
        .iter()
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// This process's rank as the launcher tells it, for errors before MPI could say.
fn launcher_rank() -> usize {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.trim().parse().ok())
        .unwrap_or(0)
}

/// Piece `k` of a block of `len` elements cut into pieces of `piece` elements
/// (empty once the block is exhausted).
fn piece(k: usize, piece: usize, len: usize) -> Range<usize> {
    let start = k.saturating_mul(piece).min(len);
    start..start.saturating_add(piece).min(len)
}

/// `value` as an MPI count; callers have split their buffers to `max_count`.
fn count(value: usize) -> c_int {
    c_int::try_from(value).unwrap_or(c_int::MAX)
}

impl MpiEngine {
    /// Starts MPI if needed and joins the collectives' communicator (collective: every
    /// rank must call it). `timeout` is not enforced: MPI collectives cannot time out,
    /// and a dead rank ends the job through `mpirun` (see the module documentation).
    pub(crate) fn new(timeout: Duration) -> Result<MpiEngine, CollectiveError> {
        let world = transport::world().map_err(|e| CollectiveError::Transport {
            call: Call::Setup,
            rank: launcher_rank(),
            reason: e.to_string(),
        })?;
        let rank = world.rank as usize;
        let size = world.size as usize;
        let (library, comm_rank, comm_size) = run(Call::Setup, rank, move |ctx| {
            let (mut comm_rank, mut comm_size): (c_int, c_int) = (0, 0);
            // SAFETY: plain MPI queries with valid out-pointers, on the progress thread.
            let code = unsafe { sys::MPI_Comm_rank(ctx.comm, &mut comm_rank) };
            ctx.check("MPI_Comm_rank", code)?;
            // SAFETY: as above.
            let code = unsafe { sys::MPI_Comm_size(ctx.comm, &mut comm_size) };
            ctx.check("MPI_Comm_size", code)?;
            Ok((library_version(ctx)?, comm_rank, comm_size))
        })?;
        if usize::try_from(comm_rank).ok() != Some(rank)
            || usize::try_from(comm_size).ok() != Some(size)
        {
            return Err(CollectiveError::Transport {
                call: Call::Setup,
                rank,
                reason: format!(
                    "the collectives' communicator says rank {comm_rank} of {comm_size}, \
                     MPI_COMM_WORLD rank {rank} of {size}"
                ),
            });
        }
        let max_count = std::env::var(ENV_MAX_COUNT)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(usize::MAX)
            .clamp(1, i32::MAX as usize);
        let in_place = match std::env::var(ENV_IN_PLACE) {
            Ok(v) if v.trim() == "0" => None,
            _ => in_place_for(&library),
        };
        tracing::debug!(
            rank,
            size,
            ?timeout,
            library = library.trim(),
            in_place = in_place.is_some(),
            max_count,
            "mpi collectives ready (MPI does not enforce the timeout)"
        );
        Ok(MpiEngine {
            rank,
            size,
            processor_name: world.processor_name,
            check_args: true,
            max_count,
            in_place,
        })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in `MPI_COMM_WORLD`.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// `MPI_Get_processor_name`.
    pub(crate) fn processor_name(&self) -> &str {
        &self.processor_name
    }

    /// Turns the argument check before each call on or off (on by default). Off, a
    /// call costs exactly MPI's collective, and ranks that disagree hang or compute
    /// garbage, as with MPI itself. Every rank must choose the same.
    pub(crate) fn set_check_args(&mut self, on: bool) {
        self.check_args = on;
    }

    /// Runs `body` on the progress thread, after the argument check when it is on.
    fn call<R: Send>(
        &self,
        call: Call,
        check: Option<(u64, u64)>,
        body: impl FnOnce(&Ctx) -> Result<R, CollectiveError> + Send,
    ) -> Result<R, CollectiveError> {
        let (size, check_args) = (self.size, self.check_args);
        run(call, self.rank, move |ctx| {
            if let (true, Some((sig, count))) = (check_args, check) {
                let ours = [sig, count];
                let pairs = ctx.allgather_pairs(ours, size)?;
                ctx.agree(&pairs, ours, true)?;
            }
            body(ctx)
        })
    }

    fn supported<T: Reducible>(&self, call: Call, op: ReduceOp) -> Result<(), CollectiveError> {
        if T::supports(op) {
            return Ok(());
        }
        Err(CollectiveError::InvalidArgument {
            call,
            reason: format!("{op:?} is not defined for {:?}", T::DTYPE),
        })
    }

    /// In-place `MPI_Allreduce` with MPI's built-in `op` on `T`'s MPI datatype.
    pub(crate) fn allreduce<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        self.supported::<T>(call, op)?;
        let sig = signature(call, op.code(), T::DTYPE.code(), 0);
        let (max_count, in_place) = (self.max_count, self.in_place);
        self.call(call, Some((sig, buf.len() as u64)), move |ctx| {
            let (dtype, mpi_op) = (datatype(T::DTYPE), operation(op));
            let mut scratch: Vec<T> = Vec::new();
            for chunk in buf.chunks_mut(max_count) {
                let send = match in_place {
                    Some(sentinel) => sentinel as *const c_void,
                    None => {
                        scratch.clear();
                        scratch.extend_from_slice(chunk);
                        scratch.as_ptr().cast::<c_void>()
                    }
                };
                // SAFETY: `chunk` holds `count` elements of `dtype`; `send` is the
                // library's MPI_IN_PLACE or a copy of `chunk` that does not alias it.
                let code = unsafe {
                    sys::MPI_Allreduce(
                        send,
                        chunk.as_mut_ptr().cast::<c_void>(),
                        count(chunk.len()),
                        dtype,
                        mpi_op,
                        ctx.comm,
                    )
                };
                ctx.check("MPI_Allreduce", code)?;
            }
            Ok(())
        })
    }

    /// `MPI_Bcast` of bytes from `root` (every rank passes the same length).
    pub(crate) fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        let call = Call::Broadcast;
        self.check_root(call, root)?;
        let sig = signature(call, 0, 0, root);
        let max_count = self.max_count;
        self.call(call, Some((sig, buf.len() as u64)), move |ctx| {
            for chunk in buf.chunks_mut(max_count) {
                // SAFETY: `chunk` holds `count` bytes; `root` is inside the world.
                let code = unsafe {
                    sys::MPI_Bcast(
                        chunk.as_mut_ptr().cast::<c_void>(),
                        count(chunk.len()),
                        sys::RSMPI_UINT8_T,
                        count(root),
                        ctx.comm,
                    )
                };
                ctx.check("MPI_Bcast", code)?;
            }
            Ok(())
        })
    }

    fn check_root(&self, call: Call, root: usize) -> Result<(), CollectiveError> {
        if root < self.size {
            return Ok(());
        }
        Err(CollectiveError::InvalidArgument {
            call,
            reason: format!("root {root} is outside a world of {}", self.size),
        })
    }

    /// In-place `MPI_Allgatherv` over bytes: `blocks[r]` is rank `r`'s byte range in
    /// `out`, and this rank's block is already filled.
    pub(crate) fn allgather(
        &mut self,
        out: &mut [u8],
        blocks: Vec<Range<usize>>,
    ) -> Result<(), CollectiveError> {
        let call = Call::Allgather;
        self.check_blocks(call, out.len(), &blocks)?;
        let sig = signature(call, 0, 0, 0);
        let (rank, max_count, in_place) = (self.rank, self.max_count, self.in_place);
        self.call(call, Some((sig, out.len() as u64)), move |ctx| {
            // Every rank sees the same blocks, so every rank takes the same path.
            if blocks.iter().all(|b| b.end <= max_count) {
                let counts: Vec<c_int> = blocks.iter().map(|b| count(b.len())).collect();
                let displs: Vec<c_int> = blocks.iter().map(|b| count(b.start)).collect();
                let scratch: Vec<u8>;
                let (send, send_count) = match in_place {
                    Some(sentinel) => (sentinel as *const c_void, 0),
                    None => {
                        scratch = out[blocks[rank].clone()].to_vec();
                        (scratch.as_ptr().cast::<c_void>(), count(scratch.len()))
                    }
                };
                // SAFETY: `counts` and `displs` have one entry per rank and describe
                // disjoint ranges inside `out` (checked above); `send` is MPI_IN_PLACE or
                // a copy of this rank's block that does not alias `out`.
                let code = unsafe {
                    sys::MPI_Allgatherv(
                        send,
                        send_count,
                        sys::RSMPI_UINT8_T,
                        out.as_mut_ptr().cast::<c_void>(),
                        counts.as_ptr(),
                        displs.as_ptr(),
                        sys::RSMPI_UINT8_T,
                        ctx.comm,
                    )
                };
                return ctx.check("MPI_Allgatherv", code);
            }
            // Offsets past `int`: each block from its owner, in pieces MPI can count.
            for (owner, block) in blocks.iter().enumerate() {
                for chunk in out[block.clone()].chunks_mut(max_count) {
                    // SAFETY: `chunk` holds `count` bytes; `owner` is inside the world.
                    let code = unsafe {
                        sys::MPI_Bcast(
                            chunk.as_mut_ptr().cast::<c_void>(),
                            count(chunk.len()),
                            sys::RSMPI_UINT8_T,
                            count(owner),
                            ctx.comm,
                        )
                    };
                    ctx.check("MPI_Bcast", code)?;
                }
            }
            Ok(())
        })
    }

    /// One block per rank, inside `len`, none overlapping another.
    fn check_blocks(
        &self,
        call: Call,
        len: usize,
        blocks: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        let invalid = |reason: String| CollectiveError::InvalidArgument { call, reason };
        if blocks.len() != self.size {
            return Err(invalid(format!(
                "{} blocks for {} ranks",
                blocks.len(),
                self.size
            )));
        }
        if let Some(b) = blocks.iter().find(|b| b.start > b.end || b.end > len) {
            return Err(invalid(format!(
                "block {b:?} is not inside a buffer of {len}"
            )));
        }
        let mut sorted: Vec<&Range<usize>> = blocks.iter().filter(|b| !b.is_empty()).collect();
        sorted.sort_by_key(|b| b.start);
        if let Some(pair) = sorted.windows(2).find(|w| w[0].end > w[1].start) {
            return Err(invalid(format!(
                "blocks {:?} and {:?} overlap",
                pair[0], pair[1]
            )));
        }
        Ok(())
    }

    /// `MPI_Reduce_scatter`: afterwards `buf[offset_r .. offset_r + counts[r]]` holds
    /// the reduced block `r` on rank `r`, where `offset_r` is the sum of the counts
    /// before `r`; the rest of `buf` is unspecified.
    pub(crate) fn reduce_scatter<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        counts: &[usize],
    ) -> Result<(), CollectiveError> {
        let call = Call::ReduceScatter;
        self.supported::<T>(call, op)?;
        if counts.len() != self.size
            || counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)) != Some(buf.len())
        {
            return Err(CollectiveError::InvalidArgument {
                call,
                reason: format!(
                    "counts {counts:?} do not split {} elements among {} ranks",
                    buf.len(),
                    self.size
                ),
            });
        }
        let offsets: Vec<usize> = counts
            .iter()
            .scan(0, |sum, &c| {
                let start = *sum;
                *sum += c;
                Some(start)
            })
            .collect();
        let sig = signature(call, op.code(), T::DTYPE.code(), 0);
        let (rank, size, max_count, in_place) =
            (self.rank, self.size, self.max_count, self.in_place);
        self.call(call, Some((sig, buf.len() as u64)), move |ctx| {
            let (dtype, mpi_op) = (datatype(T::DTYPE), operation(op));
            // Each call moves at most `per_call` elements of every block, so that its
            // total stays an `int`.
            let per_call = (max_count / size).max(1);
            let longest = counts.iter().copied().max().unwrap_or(0);
            if let (Some(sentinel), true) = (in_place, longest <= per_call) {
                let recv_counts: Vec<c_int> = counts.iter().map(|&c| count(c)).collect();
                // SAFETY: `buf` holds the sum of `recv_counts` elements of `dtype`; in
                // place, MPI reads all of it and writes this rank's block at its start.
                let code = unsafe {
                    sys::MPI_Reduce_scatter(
                        sentinel as *const c_void,
                        buf.as_mut_ptr().cast::<c_void>(),
                        recv_counts.as_ptr(),
                        dtype,
                        mpi_op,
                        ctx.comm,
                    )
                };
                ctx.check("MPI_Reduce_scatter", code)?;
                buf.copy_within(0..counts[rank], offsets[rank]);
                return Ok(());
            }
            // Call `k` reduces piece `k` of every block. It writes only piece `k` of
            // this rank's block, which it has already copied, and later calls read
            // only later pieces.
            let mut scratch: Vec<T> =
                Vec::with_capacity(buf.len().min(per_call.saturating_mul(size)));
            for k in 0..longest.div_ceil(per_call) {
                let pieces: Vec<Range<usize>> = (0..size)
                    .map(|r| {
                        let p = piece(k, per_call, counts[r]);
                        offsets[r] + p.start..offsets[r] + p.end
                    })
                    .collect();
                scratch.clear();
                for p in &pieces {
                    scratch.extend_from_slice(&buf[p.clone()]);
                }
                let recv_counts: Vec<c_int> = pieces.iter().map(|p| count(p.len())).collect();
                let mine = &mut buf[pieces[rank].clone()];
                // SAFETY: `scratch` holds the sum of `recv_counts` elements and does not
                // alias `mine`, which holds this rank's count.
                let code = unsafe {
                    sys::MPI_Reduce_scatter(
                        scratch.as_ptr().cast::<c_void>(),
                        mine.as_mut_ptr().cast::<c_void>(),
                        recv_counts.as_ptr(),
                        dtype,
                        mpi_op,
                        ctx.comm,
                    )
                };
                ctx.check("MPI_Reduce_scatter", code)?;
            }
            Ok(())
        })
    }

    /// Every rank's bytes (lengths may differ) on rank 0, in rank order: `Some` there,
    /// `None` elsewhere. The lengths travel by `MPI_Allgather` rather than
    /// `MPI_Gather`, so that every rank knows how many `MPI_Gatherv` rounds the
    /// longest needs; the same exchange carries the argument check.
    pub(crate) fn gather_to_zero(
        &mut self,
        mine: &[u8],
    ) -> Result<Option<Vec<Vec<u8>>>, CollectiveError> {
        let call = Call::Allreduce;
        let sig = signature(call, USER_OP, 0, 0);
        let (rank, size, max_count, check_args) =
            (self.rank, self.size, self.max_count, self.check_args);
        self.call(call, None, move |ctx| {
            let ours = [sig, mine.len() as u64];
            let pairs = ctx.allgather_pairs(ours, size)?;
            if check_args {
                // Lengths may differ; only the call must agree.
                ctx.agree(&pairs, ours, false)?;
            }
            let lens = pairs
                .iter()
                .enumerate()
                .map(|(r, p)| {
                    usize::try_from(p[1]).map_err(|_| CollectiveError::Malformed {
                        call,
                        rank: r,
                        reason: format!("a length of {} bytes", p[1]),
                    })
                })
                .collect::<Result<Vec<usize>, _>>()?;
            let per_call = (max_count / size).max(1);
            let longest = lens.iter().copied().max().unwrap_or(0);
            let mut gathered: Vec<Vec<u8>> = if rank == 0 {
                lens.iter().map(|&len| Vec::with_capacity(len)).collect()
            } else {
                Vec::new()
            };
            let mut flat: Vec<u8> = Vec::new();
            for k in 0..longest.div_ceil(per_call) {
                let pieces: Vec<Range<usize>> =
                    lens.iter().map(|&len| piece(k, per_call, len)).collect();
                let counts: Vec<c_int> = pieces.iter().map(|p| count(p.len())).collect();
                let displs: Vec<c_int> = pieces
                    .iter()
                    .scan(0usize, |sum, p| {
                        let start = *sum;
                        *sum += p.len();
                        Some(count(start))
                    })
                    .collect();
                if rank == 0 {
                    flat.clear();
                    flat.resize(pieces.iter().map(|p| p.len()).sum(), 0);
                }
                let send = &mine[pieces[rank].clone()];
                // SAFETY: `send` holds `counts[rank]` bytes; on rank 0 `flat` holds the
                // sum of `counts` at `displs` (elsewhere the receive arguments are
                // ignored).
                let code = unsafe {
                    sys::MPI_Gatherv(
                        send.as_ptr().cast::<c_void>(),
                        count(send.len()),
                        sys::RSMPI_UINT8_T,
                        flat.as_mut_ptr().cast::<c_void>(),
                        counts.as_ptr(),
                        displs.as_ptr(),
                        sys::RSMPI_UINT8_T,
                        0,
                        ctx.comm,
                    )
                };
                ctx.check("MPI_Gatherv", code)?;
                if rank == 0 {
                    let mut at = 0;
                    for (whole, p) in gathered.iter_mut().zip(&pieces) {
                        whole.extend_from_slice(&flat[at..at + p.len()]);
                        at += p.len();
                    }
                }
            }
            Ok((rank == 0).then_some(gathered))
        })
    }

    /// `MPI_Barrier` (after the argument check, so that a rank in another call is
    /// named rather than matched with this one).
    pub(crate) fn barrier(&mut self) -> Result<(), CollectiveError> {
        let call = Call::Barrier;
        self.call(call, Some((signature(call, 0, 0, 0), 0)), |ctx| {
            // SAFETY: a plain MPI call on the progress thread.
            let code = unsafe { sys::MPI_Barrier(ctx.comm) };
            ctx.check("MPI_Barrier", code)
        })
    }
}

/// Runs `body` on the progress thread with the collectives' communicator.
fn run<R: Send>(
    call: Call,
    rank: usize,
    body: impl FnOnce(&Ctx) -> Result<R, CollectiveError> + Send,
) -> Result<R, CollectiveError> {
    transport::run_on_progress_thread(move |comm| body(&Ctx { comm, call, rank })).map_err(|e| {
        CollectiveError::Transport {
            call,
            rank,
            reason: e.to_string(),
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_a_block_once() {
        let covered: Vec<usize> = (0..4).flat_map(|k| piece(k, 3, 10)).collect();
        assert_eq!(covered, (0..10).collect::<Vec<_>>());
        assert!(piece(5, 3, 10).is_empty());
        assert!(piece(usize::MAX, usize::MAX, 10).is_empty());
    }

    #[test]
    fn signatures_are_described_by_name() {
        let sig = signature(Call::Allreduce, ReduceOp::Sum.code(), DType::F32.code(), 0);
        assert_eq!(describe(sig), "allreduce/Sum/F32/root 0");
        assert_eq!(
            describe(signature(Call::Broadcast, 0, 0, 2)),
            "broadcast/-/bytes/root 2"
        );
        assert_eq!(
            describe(signature(Call::Allreduce, USER_OP, 0, 0)),
            "allreduce/user/bytes/root 0"
        );
    }

    #[test]
    fn in_place_only_where_known() {
        assert_eq!(in_place_for("Open MPI v4.1.4, package: Debian"), Some(1));
        assert_eq!(in_place_for("MPICH Version: 4.1"), None);
    }
}
