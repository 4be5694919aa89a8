//! `mpirun` commands for one host, shared by the `switchyard` benchmarks and the
//! workspace's MPI tests. Not published: a helper of this repository, not an API.
//!
//! OpenMPI refuses to start as root (CI containers run as root) and to start more ranks
//! than there are cores (a 2-core machine runs 4-rank jobs) unless told otherwise, and
//! its TCP transport and out-of-band channel route over the machine's external interface
//! unless told to use loopback. [`command`] sets the variables for all
//! three, so no caller, CI script included, has to export them. MPICH ignores them.
//!
//! [`run_ranks`] and [`expect_ranks_pass`] run the calling test binary's own ignored
//! tests as the ranks of a job: the pattern of the MPI integration tests.

mod job;

pub use job::{JobOutput, expect_ranks_pass, expect_ranks_pass_with, run_ranks, run_ranks_with};

use std::process::Command;

/// The OpenMPI variables [`command`] sets, as (name, value).
pub const OPENMPI_ENV: [(&str, &str); 6] = [
    // Root in containers; the second variable confirms the first.
    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    // More ranks than cores: Open MPI 4 reads the first, Open MPI 5 (PRRTE) the second.
    ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
    ("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe"),
    // Every job here runs on one host: loopback for both the data and the launch channel.
    ("OMPI_MCA_btl_tcp_if_include", "lo"),
    ("OMPI_MCA_oob_tcp_if_include", "lo"),
];

/// `mpirun -np {np}` with [`OPENMPI_ENV`] set; the caller adds the program and its
/// arguments (and any further MCA variable, such as `OMPI_MCA_btl`).
pub fn command(np: usize) -> Command {
    let mut command = Command::new("mpirun");
    command.envs(OPENMPI_ENV).arg("-np").arg(np.to_string());
    command
}
