//! Starting a job on one machine and letting its processes find each other.
//!
//! [`run_local`] (behind `switchyard launch -n N -- PROG ARGS`) starts `N` copies of
//! a program and serves a small rendezvous on 127.0.0.1; each process calls
//! [`Bootstrap::from_env`] to learn its rank and the job size, binds its stub wherever
//! it likes (port 0 is fine), and [`Bootstrap::exchange`]s its endpoint for everyone's.
//! The environment the launcher sets:
//!
//! | variable | meaning |
//! |---|---|
//! | `SWITCHYARD_RANK` | this process's rank, `0..N` |
//! | `SWITCHYARD_WORLD_SIZE` | `N` |
//! | `SWITCHYARD_RENDEZVOUS` | `host:port` of the launcher's rendezvous |
//!
//! The rendezvous protocol is in [`rendezvous`]. A later issue replaces this with the
//! rabit-compatible tracker; the environment stays.
//!
//! Under `mpirun` (builds with the `mpi` feature) [`Bootstrap::from_env`] takes rank and
//! size from MPI instead, and every endpoint is `mpi://RANK`: the same program runs
//! either way if it binds [`Bootstrap::stub_endpoint`].

mod bootstrap;
mod error;
mod process;
pub mod rendezvous;

pub use bootstrap::{Bootstrap, Rendezvous};
pub use error::LaunchError;
pub use process::{run_local, LaunchOptions};

/// Environment variable holding the rank.
pub const ENV_RANK: &str = "SWITCHYARD_RANK";
/// Environment variable holding the number of processes.
pub const ENV_WORLD_SIZE: &str = "SWITCHYARD_WORLD_SIZE";
/// Environment variable holding the rendezvous address.
pub const ENV_RENDEZVOUS: &str = "SWITCHYARD_RENDEZVOUS";
