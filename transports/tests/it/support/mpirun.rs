//! `mpirun` commands and the harness that runs this test binary's ignored tests as MPI
//! ranks, from the workspace's one helper (`switchyard-mpirun`).

#[allow(unused_imports)]
pub(crate) use switchyard_mpirun::*;
