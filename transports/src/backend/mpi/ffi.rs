//! The few raw MPI calls the progress thread makes, each wrapped so that a failure
//! comes back as the MPI library's own error string.
//!
//! rsmpi's safe request API ties a request's lifetime to a scope, which does not fit a
//! progress loop that keeps hundreds of sends in flight across iterations; so the loop
//! uses the bindings rsmpi re-exports (`mpi::ffi`) and keeps every buffer alive in the
//! same slot as its request until MPI reports it complete. Every function here is
//! called on the thread that initialised MPI (the progress thread), or, when MPI
//! granted `MPI_THREAD_MULTIPLE`, on a socket's thread inside the engine's open gate
//! (`here`).

use mpi::ffi as sys;
use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr;

/// MPI's `MPI_SUCCESS`, which every implementation defines as 0.
const SUCCESS: c_int = 0;

/// An MPI call that failed, with the library's explanation.
#[derive(Debug, Clone)]
pub(crate) struct MpiError {
    pub(crate) call: &'static str,
    pub(crate) reason: String,
}

impl std::fmt::Display for MpiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.reason)
    }
}

fn check(call: &'static str, code: c_int) -> Result<(), MpiError> {
    if code == SUCCESS {
        return Ok(());
    }
    Err(MpiError {
        call,
        reason: error_string(code),
    })
}

/// The MPI library's text for the error code `code` (`MPI_Error_string`), or the bare
/// number if MPI does not know it. Like every function here, called on the progress
/// thread only.
pub(crate) fn error_string(code: c_int) -> String {
    let mut text = [0 as c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer is larger than MPI_MAX_ERROR_STRING (256 in OpenMPI and MPICH).
    unsafe {
        if sys::MPI_Error_string(code, text.as_mut_ptr(), &mut len) == SUCCESS {
            let bytes: Vec<u8> = text[..len.clamp(0, 511) as usize]
                .iter()
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            format!("MPI error code {code}")
        }
    }
}

/// A duplicate of `MPI_COMM_WORLD` that returns error codes instead of aborting.
/// Collective over `MPI_COMM_WORLD`: every rank must call it, in the same order
/// relative to other collectives on it.
pub(crate) fn dup_world() -> Result<sys::MPI_Comm, MpiError> {
    // SAFETY: plain MPI calls with valid out-pointers, on the thread that
    // initialised MPI.
    unsafe {
        let mut comm = MaybeUninit::<sys::MPI_Comm>::uninit();
        check(
            "MPI_Comm_dup",
            sys::MPI_Comm_dup(sys::RSMPI_COMM_WORLD, comm.as_mut_ptr()),
        )?;
        let comm = comm.assume_init();
        // Errors come back as codes (and so as typed errors) instead of aborting.
        check(
            "MPI_Comm_set_errhandler",
            sys::MPI_Comm_set_errhandler(comm, sys::RSMPI_ERRORS_RETURN),
        )?;
        Ok(comm)
    }
}

/// The thread support MPI granted (`MPI_Query_thread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SINGLE`
    Single,
    /// `MPI_THREAD_FUNNELED`
    Funneled,
    /// `MPI_THREAD_SERIALIZED`
    Serialized,
    /// `MPI_THREAD_MULTIPLE`
    Multiple,
}

fn thread_level(provided: c_int) -> ThreadLevel {
    // SAFETY: reading link-time constants of the MPI library.
    unsafe {
        if provided == sys::RSMPI_THREAD_MULTIPLE {
            ThreadLevel::Multiple
        } else if provided == sys::RSMPI_THREAD_SERIALIZED {
            ThreadLevel::Serialized
        } else if provided == sys::RSMPI_THREAD_FUNNELED {
            ThreadLevel::Funneled
        } else {
            ThreadLevel::Single
        }
    }
}

/// What `init` learned about the job.
pub(crate) struct Started {
    pub(crate) comm: sys::MPI_Comm,
    pub(crate) rank: c_int,
    pub(crate) size: c_int,
    pub(crate) level: ThreadLevel,
    pub(crate) processor: String,
    /// Whether this call initialised MPI (and so must finalize it).
    pub(crate) owns_mpi: bool,
}

/// Initialises MPI asking for `MPI_THREAD_MULTIPLE` (or adopts an MPI the program
/// already initialised) and duplicates `MPI_COMM_WORLD`, so that switchyard's traffic
/// can never match the program's own receives.
pub(crate) fn init() -> Result<Started, MpiError> {
    // SAFETY: plain MPI calls with valid out-pointers, made on one thread.
    unsafe {
        let mut already: c_int = 0;
        check("MPI_Initialized", sys::MPI_Initialized(&mut already))?;
        let mut provided: c_int = 0;
        if already == 0 {
            check(
                "MPI_Init_thread",
                sys::MPI_Init_thread(
                    ptr::null_mut(),
                    ptr::null_mut(),
                    sys::RSMPI_THREAD_MULTIPLE,
                    &mut provided,
                ),
            )?;
        } else {
            check("MPI_Query_thread", sys::MPI_Query_thread(&mut provided))?;
        }
        let comm = dup_world()?;
        let (mut rank, mut size) = (0, 0);
        check("MPI_Comm_rank", sys::MPI_Comm_rank(comm, &mut rank))?;
        check("MPI_Comm_size", sys::MPI_Comm_size(comm, &mut size))?;
        let mut name = [0 as c_char; 512];
        let mut len: c_int = 0;
        check(
            "MPI_Get_processor_name",
            sys::MPI_Get_processor_name(name.as_mut_ptr(), &mut len),
        )?;
        let bytes: Vec<u8> = name[..len.clamp(0, 511) as usize]
            .iter()
            .map(|&c| c as u8)
            .collect();
        Ok(Started {
            comm,
            rank,
            size,
            level: thread_level(provided),
            processor: String::from_utf8_lossy(&bytes).into_owned(),
            owns_mpi: already == 0,
        })
    }
}

/// `MPI_Finalize`.
pub(crate) fn finalize() -> Result<(), MpiError> {
    // SAFETY: called once, by the thread that initialised MPI, after every request
    // it posted has completed or been abandoned with its buffers leaked.
    unsafe { check("MPI_Finalize", sys::MPI_Finalize()) }
}

/// A posted send. The buffers it reads must stay alive and unmoved until [`test_some`]
/// reports it complete.
pub(crate) type Request = sys::MPI_Request;

/// Posts a send of `bytes` as one message, without copying them.
///
/// # Safety
///
/// `bytes` must stay alive and unmoved until the returned request completes.
pub(crate) unsafe fn isend(
    comm: sys::MPI_Comm,
    bytes: &[u8],
    dest: c_int,
    tag: c_int,
) -> Result<Request, MpiError> {
    let count = c_int::try_from(bytes.len()).map_err(|_| MpiError {
        call: "MPI_Isend",
        reason: format!("{} bytes do not fit MPI's C int count", bytes.len()),
    })?;
    // MPI may not accept a null buffer even for an empty message.
    let buffer = if bytes.is_empty() {
        ptr::NonNull::<u8>::dangling().as_ptr() as *const c_void
    } else {
        bytes.as_ptr() as *const c_void
    };
    let mut request = MaybeUninit::<sys::MPI_Request>::uninit();
    // SAFETY: a valid buffer of `count` bytes (the caller keeps it alive) and
    // out-pointer.
    unsafe {
        check(
            "MPI_Isend",
            sys::MPI_Isend(
                buffer,
                count,
                sys::RSMPI_UINT8_T,
                dest,
                tag,
                comm,
                request.as_mut_ptr(),
            ),
        )?;
        Ok(request.assume_init())
    }
}

/// Tests one request: `true` once complete (MPI then sets it to `MPI_REQUEST_NULL`).
pub(crate) fn test(request: &mut Request) -> Result<bool, MpiError> {
    let mut done: c_int = 0;
    // SAFETY: a valid request and out-pointer; the status is ignored.
    unsafe {
        check(
            "MPI_Test",
            sys::MPI_Test(request, &mut done, sys::RSMPI_STATUS_IGNORE),
        )?;
    }
    Ok(done != 0)
}

/// Tests every request in `requests`, returning the indices of those that completed
/// (MPI sets each completed slot to `MPI_REQUEST_NULL`).
pub(crate) fn test_some(requests: &mut [Request]) -> Result<Vec<usize>, MpiError> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let mut indices = vec![0 as c_int; requests.len()];
    let mut done: c_int = 0;
    // SAFETY: the arrays are as long as `incount`; statuses are ignored.
    unsafe {
        check(
            "MPI_Testsome",
            sys::MPI_Testsome(
                requests.len() as c_int,
                requests.as_mut_ptr(),
                &mut done,
                indices.as_mut_ptr(),
                sys::RSMPI_STATUSES_IGNORE,
            ),
        )?;
    }
    // MPI_UNDEFINED (negative) means no active request was left.
    let done = usize::try_from(done).unwrap_or(0);
    Ok(indices[..done].iter().map(|&i| i as usize).collect())
}

/// A matched, not yet received message (`MPI_Improbe`).
pub(crate) struct Matched {
    message: sys::MPI_Message,
    pub(crate) source: c_int,
    pub(crate) len: usize,
}

/// Matches the next message from `source` (or any) with `tag` (or any), if one has
/// arrived. A matched message belongs to the caller, who must [`receive`] it.
pub(crate) fn probe(
    comm: sys::MPI_Comm,
    source: Option<c_int>,
    tag: Option<c_int>,
) -> Result<Option<Matched>, MpiError> {
    // SAFETY: valid out-pointers; the status is fully written when flag is set.
    unsafe {
        let mut flag: c_int = 0;
        let mut message = MaybeUninit::<sys::MPI_Message>::uninit();
        let mut status = MaybeUninit::<sys::MPI_Status>::zeroed();
        check(
            "MPI_Improbe",
            sys::MPI_Improbe(
                source.unwrap_or(sys::RSMPI_ANY_SOURCE),
                tag.unwrap_or(sys::RSMPI_ANY_TAG),
                comm,
                &mut flag,
                message.as_mut_ptr(),
                status.as_mut_ptr(),
            ),
        )?;
        if flag == 0 {
            return Ok(None);
        }
        let status = status.assume_init();
        let mut count: c_int = 0;
        check(
            "MPI_Get_count",
            sys::MPI_Get_count(&status, sys::RSMPI_UINT8_T, &mut count),
        )?;
        Ok(Some(Matched {
            message: message.assume_init(),
            source: status.MPI_SOURCE,
            len: usize::try_from(count).unwrap_or(0),
        }))
    }
}

/// Receives a matched message into a new buffer of exactly its length.
pub(crate) fn receive(matched: Matched) -> Result<Vec<u8>, MpiError> {
    let mut buffer: Vec<u8> = Vec::new();
    receive_into(matched, &mut buffer)?;
    Ok(buffer)
}

/// Receives a matched message into `buffer`, replacing what it held (it grows if it
/// is too small).
pub(crate) fn receive_into(mut matched: Matched, buffer: &mut Vec<u8>) -> Result<(), MpiError> {
    buffer.clear();
    buffer.reserve(matched.len);
    // SAFETY: MPI writes exactly `len` bytes (the matched message's size) into the
    // buffer's capacity before `set_len` exposes them.
    unsafe {
        check(
            "MPI_Mrecv",
            sys::MPI_Mrecv(
                buffer.as_mut_ptr() as *mut c_void,
                matched.len as c_int,
                sys::RSMPI_UINT8_T,
                &mut matched.message,
                sys::RSMPI_STATUS_IGNORE,
            ),
        )?;
        buffer.set_len(matched.len);
    }
    Ok(())
}
