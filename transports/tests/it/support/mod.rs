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

/// The factor by which soaks and sweeps repeat or grow: `SWITCHYARD_TEST_SCALE`, 1
/// (what CI runs) when unset. A nightly-style run raises it; a value that is not a
/// positive integer fails the test rather than quietly running at scale 1.
pub(crate) fn scale() -> u64 {
    match std::env::var("SWITCHYARD_TEST_SCALE") {
        Err(_) => 1,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("SWITCHYARD_TEST_SCALE={text:?}: expected a positive integer"),
        },
    }
}
