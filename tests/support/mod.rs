//! Helpers shared by the facade's integration tests.
//!
//! The tests that run the `switchyard` binary live with it in `cli/tests`.

/// `mpirun` commands with the OpenMPI settings, and the harness that runs this test
/// binary's ignored tests as MPI ranks: the workspace's one helper for both.
#[allow(unused_imports)]
pub(crate) use switchyard_mpirun as mpirun;
