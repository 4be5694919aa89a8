//! The MPI calls a [`Collectives`] handle makes, one safe function each.

use super::{
    CallError, Collectives, Datatype, Operation, check, count, disjoint_blocks, elements,
    library_version, refused,
};
use mpi::ffi as sys;
use std::ffi::{c_int, c_void};
use std::ops::Range;

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
