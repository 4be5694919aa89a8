//! `switchyard._native`: the Rust side of the `switchyard` Python package. The
//! rabit-shaped API (module functions, pickled objects) is Python, in
//! `switchyard/__init__.py`; this module gives it one class, `Comm`, whose calls
//! run switchyard's collectives on buffers without copying them.

mod buffer;
mod comm;
mod errors;
mod sigint;

use pyo3::prelude::*;

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::Comm>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(comm::new_unique_id, m)?)?;
    m.add(
        "SwitchyardError",
        m.py().get_type::<errors::SwitchyardError>(),
    )?;
    Ok(())
}
