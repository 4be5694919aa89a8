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

mod calls;

use super::ffi::error_string;
use crate::TransportError;
use mpi::ffi as sys;
use std::ffi::{c_char, c_int};
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
