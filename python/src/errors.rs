//! Rust errors as Python exceptions, with the Rust message unchanged (it names the
//! call, this rank and the peer).

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use switchyard::collective::{Call, CollectiveError};

pyo3::create_exception!(
    switchyard,
    SwitchyardError,
    PyRuntimeError,
    "A collective or the communicator's setup failed: a peer died, went silent or aborted, the ranks disagree, or the tracker could not be reached. The message names the call and the rank."
);

/// `e` as a Python exception: arguments of a call that cannot work on any rank are a
/// `ValueError`, the rest a [`SwitchyardError`]. So is every failure to form the
/// communicator: a set-up failure with its cause (a malformed or unreachable launcher
/// environment, a dead tracker), and the arguments of setup the core refuses (a rank
/// outside the world, robust mode without a tracker), which come from the job's
/// setup, not from the arguments of a call.
pub(crate) fn to_py(e: CollectiveError) -> PyErr {
    match e {
        CollectiveError::InvalidArgument {
            call: Call::Setup, ..
        } => SwitchyardError::new_err(e.to_string()),
        CollectiveError::InvalidArgument { .. } => PyValueError::new_err(e.to_string()),
        other => SwitchyardError::new_err(other.to_string()),
    }
}

/// The error of a call on a finalized communicator.
pub(crate) fn finalized() -> PyErr {
    SwitchyardError::new_err("the communicator was finalized")
}
