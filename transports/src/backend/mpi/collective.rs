//! MPI's own collectives, as safe functions on the collectives' communicator.
//!
//! The facade's MPI engine decides what to call (argument checks, cutting buffers
//! whose counts do not fit MPI's `int`); the raw calls live here, next to the rest of
//! the crate's MPI FFI, so that every `unsafe` MPI call is in one crate. Each function
//! checks the lengths, counts and ranks it hands to MPI, so that no argument a caller
//! can pass makes MPI read or write outside the slices it was given.
//!
//! Results are in place: with `MPI_IN_PLACE` where the library's value for it is
//! known (Open MPI), through a scratch copy of the input otherwise, because rsmpi does
//! not export `MPI_IN_PLACE` (a macro in `mpi.h`).

use super::ffi::error_string;
use crate::TransportError;
use mpi::ffi as sys;
use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::OnceLock;

/// Open MPI's `MPI_IN_PLACE`: `((void *) 1)` in its `mpi.h`, part of its ABI since 1.0.
const OPEN_MPI_IN_PLACE: usize = 1;

/// An element type of MPI's built-in reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Datatype {
    /// `float` (`f32`).
    F32,
    /// `double` (`f64`).
    F64,
    /// `int32_t`.
    I32,
    /// `int64_t`.
    I64,
    /// `uint32_t`.
    U32,
    /// `uint64_t`.
    U64,
    /// `uint8_t`.
    U8,
}

impl Datatype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Datatype::U8 => 1,
            Datatype::F32 | Datatype::I32 | Datatype::U32 => 4,
            Datatype::F64 | Datatype::I64 | Datatype::U64 => 8,
        }
    }

    fn raw(self) -> sys::MPI_Datatype {
        // SAFETY: reading link-time constants of the MPI library.
        unsafe {
            match self {
                Datatype::F32 => sys::RSMPI_FLOAT,
                Datatype::F64 => sys::RSMPI_DOUBLE,
                Datatype::I32 => sys::RSMPI_INT32_T,
                Datatype::I64 => sys::RSMPI_INT64_T,
                Datatype::U32 => sys::RSMPI_UINT32_T,
                Datatype::U64 => sys::RSMPI_UINT64_T,
                Datatype::U8 => sys::RSMPI_UINT8_T,
            }
        }
    }
}

/// One of MPI's built-in reduction operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// `MPI_SUM`.
    Sum,
    /// `MPI_PROD`.
    Prod,
    /// `MPI_MAX`.
    Max,
    /// `MPI_MIN`.
    Min,
    /// `MPI_BOR`.
    BitOr,
}

impl Operation {
    fn raw(self) -> sys::MPI_Op {
        // SAFETY: reading link-time constants of the MPI library.
        unsafe {
            match self {
                Operation::Sum => sys::RSMPI_SUM,
                Operation::Prod => sys::RSMPI_PROD,
                Operation::Max => sys::RSMPI_MAX,
                Operation::Min => sys::RSMPI_MIN,
                Operation::BitOr => sys::RSMPI_BOR,
            }
        }
    }
}

/// An MPI collective that failed or was refused before it reached MPI.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{function} failed: {reason}")]
pub struct CallError {
    /// The MPI function.
    pub function: &'static str,
    /// MPI's text for its error code, or why the arguments were refused.
    pub reason: String,
}

/// The collectives' communicator (see [`run_on_progress_thread`](super::run_on_progress_thread)),
/// lent to a closure on the MPI progress thread. It cannot leave the closure or the
/// thread, so every call through it is made where MPI calls may be made.
#[derive(Debug)]
pub struct Collectives<'a> {
    comm: sys::MPI_Comm,
    /// The library's `MPI_IN_PLACE`, where it is known.
    in_place: Option<usize>,
    /// Neither `Send` nor `Sync`, and bound to the closure's borrow.
    _here: PhantomData<&'a *const ()>,
}

/// Runs `f` on the MPI progress thread with the collectives' communicator and returns
/// what it returns: [`run_on_progress_thread`](super::run_on_progress_thread) with a
/// safe handle instead of the raw communicator.
///
/// # Errors
///
/// As [`run_on_progress_thread`](super::run_on_progress_thread): MPI cannot start, the
/// progress thread has stopped, or the communicator cannot be made.
pub fn with_collectives<R, F>(f: F) -> Result<R, TransportError>
where
    F: for<'c> FnOnce(&Collectives<'c>) -> R + Send,
    R: Send,
{
    super::run_on_progress_thread(move |comm| {
        static IN_PLACE: OnceLock<Option<usize>> = OnceLock::new();
        let in_place = *IN_PLACE.get_or_init(|| {
            library_version()
                .ok()
                .and_then(|library| in_place_for(&library))
        });
        f(&Collectives {
            comm,
            in_place,
            _here: PhantomData,
        })
    })
}

/// The library's `MPI_IN_PLACE`, if we know it from its version string.
fn in_place_for(library: &str) -> Option<usize> {
    library
        .trim_start()
        .starts_with("Open MPI")
        .then_some(OPEN_MPI_IN_PLACE)
}

/// `MPI_Get_library_version`; on the progress thread only.
fn library_version() -> Result<String, CallError> {
    let mut text = [0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: the buffer is longer than MPI_MAX_LIBRARY_VERSION_STRING (256 in Open
    // MPI, 8192 in MPICH).
    let code = unsafe { sys::MPI_Get_library_version(text.as_mut_ptr(), &mut len) };
    check("MPI_Get_library_version", code)?;
    let bytes: Vec<u8> = text[..usize::try_from(len).unwrap_or(0).min(text.len())]
        .iter()
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `Ok` for `MPI_SUCCESS`; anything else with MPI's text.
fn check(function: &'static str, code: c_int) -> Result<(), CallError> {
    if code == sys::MPI_SUCCESS as c_int {
        return Ok(());
    }
    Err(CallError {
        function,
        reason: error_string(code),
    })
}

/// `value` as an MPI count, or why not.
fn count(function: &'static str, value: usize) -> Result<c_int, CallError> {
    c_int::try_from(value).map_err(|_| refused(function, format!("{value} exceeds an int")))
}

fn refused(function: &'static str, reason: String) -> CallError {
    CallError { function, reason }
}

/// The number of `ty` elements in `bytes` bytes, or why they are not whole.
fn elements(function: &'static str, bytes: usize, ty: Datatype) -> Result<c_int, CallError> {
    if bytes % ty.size() != 0 {
        return Err(refused(
            function,
            format!("{bytes} bytes are not whole {ty:?} elements"),
        ));
    }
    count(function, bytes / ty.size())
}

impl Collectives<'_> {
    /// This rank in the communicator.
    pub fn rank(&self) -> Result<usize, CallError> {
        let mut rank: c_int = 0;
        // SAFETY: a plain query with a valid out-pointer, on the progress thread.
        check("MPI_Comm_rank", unsafe {
            sys::MPI_Comm_rank(self.comm, &mut rank)
        })?;
        Ok(usize::try_from(rank).unwrap_or(0))
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> Result<usize, CallError> {
        let mut size: c_int = 0;
        // SAFETY: as in `rank`.
        check("MPI_Comm_size", unsafe {
            sys::MPI_Comm_size(self.comm, &mut size)
        })?;
        Ok(usize::try_from(size).unwrap_or(0))
    }

    /// `MPI_Get_library_version`.
    pub fn library_version(&self) -> Result<String, CallError> {
        library_version()
    }

    /// Whether this library's `MPI_IN_PLACE` is known, so that the `in_place`
    /// arguments below take effect and [`Collectives::reduce_scatter_in_place`] works.
    pub fn has_in_place(&self) -> bool {
        self.in_place.is_some()
    }

    /// The send buffer for an in-place call: `MPI_IN_PLACE` where allowed and known,
    /// else a copy of `input` kept in `scratch`.
    fn input(&self, in_place: bool, input: &[u8], scratch: &mut Vec<u8>) -> *const c_void {
        match self.in_place {
            Some(sentinel) if in_place => sentinel as *const c_void,
            _ => {
                scratch.clear();
                scratch.extend_from_slice(input);
                scratch.as_ptr().cast()
            }
        }
    }

    /// `MPI_Allreduce` of `buf` (whole elements of `ty`) in place.
    pub fn allreduce(
        &self,
        buf: &mut [u8],
        ty: Datatype,
        op: Operation,
        in_place: bool,
    ) -> Result<(), CallError> {
        const F: &str = "MPI_Allreduce";
        let n = elements(F, buf.len(), ty)?;
        let mut scratch = Vec::new();
        let send = self.input(in_place, buf, &mut scratch);
        // SAFETY: `buf` holds `n` elements of `ty`; `send` is MPI_IN_PLACE or a copy
        // of `buf` that does not alias it.
        let code = unsafe {
            sys::MPI_Allreduce(
                send,
                buf.as_mut_ptr().cast(),
                n,
                ty.raw(),
                op.raw(),
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Bcast` of `buf` from `root`.
    pub fn broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), CallError> {
        const F: &str = "MPI_Bcast";
        let (n, root) = (count(F, buf.len())?, self.rank_arg(F, root)?);
        // SAFETY: `buf` holds `n` bytes; `root` is inside the communicator.
        let code = unsafe {
            sys::MPI_Bcast(
                buf.as_mut_ptr().cast(),
                n,
                sys::RSMPI_UINT8_T,
                root,
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Allgather` of `mine` from every rank into `all`, in rank order.
    pub fn allgather_u64(&self, mine: &[u64], all: &mut [u64]) -> Result<(), CallError> {
        const F: &str = "MPI_Allgather";
        let size = self.size()?;
        if Some(all.len()) != mine.len().checked_mul(size) {
            return Err(refused(
                F,
                format!("{} slots for {size} ranks x {}", all.len(), mine.len()),
            ));
        }
        let n = count(F, mine.len())?;
        count(F, all.len())?;
        // SAFETY: `mine` holds `n` u64 and `all` `n` per rank.
        let code = unsafe {
            sys::MPI_Allgather(
                mine.as_ptr().cast(),
                n,
                sys::RSMPI_UINT64_T,
                all.as_mut_ptr().cast(),
                n,
                sys::RSMPI_UINT64_T,
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Allgatherv` in place over bytes: `blocks[r]` is rank `r`'s range of
    /// `out`, and this rank's block is already filled.
    pub fn allgatherv(
        &self,
        out: &mut [u8],
        blocks: &[Range<usize>],
        in_place: bool,
    ) -> Result<(), CallError> {
        const F: &str = "MPI_Allgatherv";
        let (rank, size) = (self.rank()?, self.size()?);
        disjoint_blocks(F, out.len(), blocks, size)?;
        let counts = blocks
            .iter()
            .map(|b| count(F, b.len()))
            .collect::<Result<Vec<_>, _>>()?;
        let displs = blocks
            .iter()
            .map(|b| count(F, b.start))
            .collect::<Result<Vec<_>, _>>()?;
        let mut scratch = Vec::new();
        let send = self.input(in_place, &out[blocks[rank].clone()], &mut scratch);
        // SAFETY: `counts` and `displs` have one entry per rank and describe disjoint
        // ranges inside `out`; `send` is MPI_IN_PLACE or a copy of this rank's block
        // (`counts[rank]` bytes) that does not alias `out`.
        let code = unsafe {
            sys::MPI_Allgatherv(
                send,
                counts[rank],
                sys::RSMPI_UINT8_T,
                out.as_mut_ptr().cast(),
                counts.as_ptr(),
                displs.as_ptr(),
                sys::RSMPI_UINT8_T,
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Reduce_scatter` with `MPI_IN_PLACE`: `buf` holds every rank's block
    /// (`counts[r]` elements of `ty` each, in rank order); afterwards this rank's
    /// reduced block is at the start of `buf`. Needs [`Collectives::has_in_place`].
    pub fn reduce_scatter_in_place(
        &self,
        buf: &mut [u8],
        counts: &[usize],
        ty: Datatype,
        op: Operation,
    ) -> Result<(), CallError> {
        const F: &str = "MPI_Reduce_scatter";
        let Some(sentinel) = self.in_place else {
            return Err(refused(F, "this library's MPI_IN_PLACE is unknown".into()));
        };
        let counts = self.scatter_counts(F, buf.len(), counts, ty)?;
        // SAFETY: `buf` holds the sum of `counts` elements of `ty` (checked); in
        // place, MPI reads all of it and writes this rank's block at its start.
        let code = unsafe {
            sys::MPI_Reduce_scatter(
                sentinel as *const c_void,
                buf.as_mut_ptr().cast(),
                counts.as_ptr(),
                ty.raw(),
                op.raw(),
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Reduce_scatter` from `send` (every rank's block, `counts[r]` elements of
    /// `ty` each, in rank order) into `mine` (this rank's count).
    pub fn reduce_scatter(
        &self,
        send: &[u8],
        mine: &mut [u8],
        counts: &[usize],
        ty: Datatype,
        op: Operation,
    ) -> Result<(), CallError> {
        const F: &str = "MPI_Reduce_scatter";
        let counts = self.scatter_counts(F, send.len(), counts, ty)?;
        let rank = self.rank()?;
        if elements(F, mine.len(), ty)? != counts[rank] {
            return Err(refused(
                F,
                format!(
                    "{} bytes for this rank's {} elements",
                    mine.len(),
                    counts[rank]
                ),
            ));
        }
        // SAFETY: `send` holds the sum of `counts` elements and `mine` this rank's
        // count (both checked); they are distinct slices, so they do not alias.
        let code = unsafe {
            sys::MPI_Reduce_scatter(
                send.as_ptr().cast(),
                mine.as_mut_ptr().cast(),
                counts.as_ptr(),
                ty.raw(),
                op.raw(),
                self.comm,
            )
        };
        check(F, code)
    }

    /// `counts` as MPI counts, one per rank, summing to `bytes` of `ty`.
    fn scatter_counts(
        &self,
        function: &'static str,
        bytes: usize,
        counts: &[usize],
        ty: Datatype,
    ) -> Result<Vec<c_int>, CallError> {
        let size = self.size()?;
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        if counts.len() != size || total.and_then(|t| t.checked_mul(ty.size())) != Some(bytes) {
            return Err(refused(
                function,
                format!("counts {counts:?} do not cut {bytes} bytes of {ty:?} among {size} ranks"),
            ));
        }
        counts.iter().map(|&c| count(function, c)).collect()
    }

    /// `MPI_Gatherv` of every rank's `send` into `recv` on `root`, where rank `r`'s
    /// bytes land at the sum of the counts before it. `counts` (one per rank, each
    /// rank's `send` length) and `recv` (their sum) matter on the root only.
    pub fn gatherv(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        root: usize,
    ) -> Result<(), CallError> {
        const F: &str = "MPI_Gatherv";
        let (rank, size) = (self.rank()?, self.size()?);
        let root_arg = self.rank_arg(F, root)?;
        let mut raw_counts = Vec::with_capacity(size);
        let mut displs = Vec::with_capacity(size);
        if rank == root {
            if counts.len() != size || counts.get(rank) != Some(&send.len()) {
                return Err(refused(
                    F,
                    format!(
                        "counts {counts:?} for {size} ranks, this one sending {}",
                        send.len()
                    ),
                ));
            }
            let mut at = 0usize;
            for &c in counts {
                raw_counts.push(count(F, c)?);
                displs.push(count(F, at)?);
                at = at.saturating_add(c);
            }
            if at != recv.len() {
                return Err(refused(F, format!("{} bytes for {at}", recv.len())));
            }
        }
        // SAFETY: `send` holds the count passed; on the root, `recv` holds the sum of
        // `raw_counts` at `displs` (checked); elsewhere MPI ignores the receive side.
        let code = unsafe {
            sys::MPI_Gatherv(
                send.as_ptr().cast(),
                count(F, send.len())?,
                sys::RSMPI_UINT8_T,
                recv.as_mut_ptr().cast(),
                raw_counts.as_ptr(),
                displs.as_ptr(),
                sys::RSMPI_UINT8_T,
                root_arg,
                self.comm,
            )
        };
        check(F, code)
    }

    /// `MPI_Barrier`.
    pub fn barrier(&self) -> Result<(), CallError> {
        // SAFETY: a plain MPI call on the progress thread.
        check("MPI_Barrier", unsafe { sys::MPI_Barrier(self.comm) })
    }

    /// `rank` as an MPI rank of this communicator, or why not.
    fn rank_arg(&self, function: &'static str, rank: usize) -> Result<c_int, CallError> {
        let size = self.size()?;
        if rank >= size {
            return Err(refused(function, format!("rank {rank} of {size}")));
        }
        count(function, rank)
    }
}

/// One block per rank, inside `len`, none overlapping another.
fn disjoint_blocks(
    function: &'static str,
    len: usize,
    blocks: &[Range<usize>],
    size: usize,
) -> Result<(), CallError> {
    if blocks.len() != size {
        return Err(refused(
            function,
            format!("{} blocks for {size} ranks", blocks.len()),
        ));
    }
    if let Some(b) = blocks.iter().find(|b| b.start > b.end || b.end > len) {
        return Err(refused(
            function,
            format!("block {b:?} is not inside {len} bytes"),
        ));
    }
    let mut sorted: Vec<&Range<usize>> = blocks.iter().filter(|b| !b.is_empty()).collect();
    sorted.sort_by_key(|b| b.start);
    if let Some(pair) = sorted.windows(2).find(|w| w[0].end > w[1].start) {
        return Err(refused(
            function,
            format!("blocks {:?} and {:?} overlap", pair[0], pair[1]),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_only_where_known() {
        assert_eq!(in_place_for("Open MPI v4.1.4, package: Debian"), Some(1));
        assert_eq!(in_place_for("MPICH Version: 4.1"), None);
    }

    #[test]
    fn blocks_must_be_inside_and_apart() {
        let ok = [0..2, 2..2, 4..6];
        assert!(disjoint_blocks("f", 6, &ok, 3).is_ok());
        assert!(disjoint_blocks("f", 6, &ok, 2).is_err());
        assert!(disjoint_blocks("f", 5, &ok, 3).is_err());
        assert!(disjoint_blocks("f", 6, &[0..3, 2..4, 4..6], 3).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = [0..2, 3..2, 4..6];
        assert!(disjoint_blocks("f", 6, &backwards, 3).is_err());
    }

    #[test]
    fn counts_must_fit_an_int_and_whole_elements() {
        assert_eq!(count("f", 7), Ok(7));
        assert!(count("f", c_int::MAX as usize + 1).is_err());
        assert_eq!(elements("f", 12, Datatype::F32), Ok(3));
        assert!(elements("f", 10, Datatype::F64).is_err());
    }
}
