//! Helpers shared by the facade's integration tests.
//!
//! The tests that run the `switchyard` binary live with it in `cli/tests`.

/// `mpirun` commands with the OpenMPI settings, and the harness that runs this test
/// binary's ignored tests as MPI ranks: the workspace's one helper for both.
#[allow(unused_imports)]
pub(crate) use switchyard_mpirun as mpirun;

/// The name the test harness gives test `name` of the module at `module` (pass
/// `module_path!()`): its path without the binary's own name. A test that re-runs this
/// binary as a child with `--exact` must name itself so, since every test file is a
/// module of one binary.
pub(crate) fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}
