//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod mpirun;

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
