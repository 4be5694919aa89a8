//! The `mpi` backend: Dealer/Router sockets between the ranks of an `mpirun` job.
//!
//! `mpi://R` names rank `R`'s router: a router binds its own rank, a dealer connects
//! to any rank. `mpirun` has already wired the processes, so there is no address to
//! resolve; `connect` only exchanges a HELLO/READY with the remote rank's progress
//! thread (so that, as with ZeroMQ, a dealer's first message cannot race the router's
//! bind). Threads of one process normally talk over `local://` (the stub does this by
//! itself); an `mpi://` dealer of a rank's own router works too, through MPI's
//! self-loopback.
//!
//! How it works and why is in the `engine` module's documentation: sockets post and
//! receive their own messages when MPI grants `MPI_THREAD_MULTIPLE`; one progress
//! thread per process does the rest (and everything at a lower thread level).
//!
//! The wire codec ([`wire`]) is pure Rust and built without the `mpi` feature too, so
//! that it can be fuzzed (`crate::fuzzing`) where no MPI is installed.

pub(crate) mod wire;

#[cfg(feature = "mpi")]
mod collective;
#[cfg(feature = "mpi")]
mod comms;
#[cfg(feature = "mpi")]
mod credits;
#[cfg(feature = "mpi")]
mod engine;
#[cfg(feature = "mpi")]
mod exit;
#[cfg(feature = "mpi")]
mod ffi;
#[cfg(feature = "mpi")]
mod here;
#[cfg(feature = "mpi")]
mod pool;
#[cfg(feature = "mpi")]
mod progress;
#[cfg(feature = "mpi")]
mod run;
#[cfg(feature = "mpi")]
mod shared;
#[cfg(feature = "mpi")]
mod sockets;
#[cfg(all(test, feature = "mpi"))]
mod tests;

#[cfg(feature = "mpi")]
pub use collective::{CallError, Collectives, Datatype, Operation, with_collectives};
#[cfg(feature = "mpi")]
pub use engine::{ENV_MPI_DIRECT, MpiWorld};
#[cfg(feature = "mpi")]
pub use exit::ENV_FINALIZE_TIMEOUT;
#[cfg(feature = "mpi")]
pub use ffi::ThreadLevel;
#[cfg(feature = "mpi")]
pub use run::{error_string, run_on_progress_thread};
#[cfg(feature = "mpi")]
pub(crate) use sockets::{MpiDealer, MpiRouter};

/// Starts MPI (if this process has not yet) and describes the job. Every rank of an
/// `mpirun` job must start MPI, because `MPI_Init` waits for all of them.
#[cfg(feature = "mpi")]
pub fn world() -> Result<MpiWorld, crate::TransportError> {
    Ok(engine::Engine::get()?.world.clone())
}
