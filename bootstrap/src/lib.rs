//! The worker side of starting a job: how a process learns its rank, the job size and
//! the other ranks' endpoints from whoever started it.
//!
//! [`Bootstrap::from_env`] recognises `switchyard launch` (the `SWITCHYARD_*` variables
//! below and its [`rendezvous`]), a rabit/XGBoost tracker (`DMLC_TRACKER_*`), torchrun's
//! and batch schedulers' variables ([`conventions`], rooted at rank 0 through a
//! [`UniqueId`]) and `mpirun`; [`Bootstrap::exchange`] then swaps this process's
//! endpoint for everyone's, through an [`EndpointExchange`] (the launcher's, the
//! unique id's, or one the program brings: [`Bootstrap::from_exchange`],
//! [`MemoryExchange`]). Without any starter, ranks share a [`UniqueId`] by their
//! own means ([`unique_id`]).
//!
//! The launcher itself (process supervision, ssh/slurm/mpirun, the embedded tracker)
//! is the `switchyard-launch` crate behind the `switchyard launch` command; a worker
//! program does not link it. Its one piece here is the [`RendezvousServer`], the other
//! end of the rendezvous protocol, kept beside the client so that the wire format has
//! a single home.
//!
//! The facade re-exports this crate as `switchyard::bootstrap`, and forms a
//! communicator from a [`Bootstrap`] with its `Communicator::join`.
//!
//! What a worker reads:
//!
//! | variable | meaning |
//! |---|---|
//! | [`ENV_RANK`] `SWITCHYARD_RANK` | worker's rank, `0..N` |
//! | [`ENV_WORLD_SIZE`] `SWITCHYARD_WORLD_SIZE` | `N` |
//! | [`ENV_RENDEZVOUS`] `SWITCHYARD_RENDEZVOUS` | `host:port` of the launcher's rendezvous |
//! | [`ENV_TRACKER_URI`], [`ENV_TRACKER_PORT`] | the tracker (`DMLC_TRACKER_URI`, `DMLC_TRACKER_PORT`) |
//! | [`ENV_TRACKER_PROTOCOL`] | `classic` (default) or `json` |
//! | [`ENV_NUM_ATTEMPT`] `DMLC_NUM_ATTEMPT` | `0`, then `1, 2, ...` on each restart of that process |
//! | [`ENV_IFNAME`] | the network interface to bind (see [`bind_address`]) |
//! | [`watchdog::ENV_SILENT_REPORTS`] | `1`: the tracker takes robust mode's silent-rank reports |
//!
//! # MPI programs
//!
//! Under `mpirun` (builds with the `mpi` feature) [`Bootstrap::from_env`] takes rank and
//! size from MPI instead, and every endpoint is `mpi://RANK`: the same program runs
//! either way if it binds [`Bootstrap::stub_endpoint`].

#![doc(test(attr(deny(warnings))))]

pub mod conventions;
mod env;
mod error;
mod exchange;
mod iface;
pub mod rendezvous;
mod rendezvous_server;
mod rendezvous_state;
pub mod slurm;
mod tracker_join;
pub mod unique_id;
pub mod watchdog;

pub use env::{Bootstrap, Rendezvous};
pub use env::{split_host_port, tcp_any_port};
pub use error::BootstrapError;
pub use exchange::{
    EndpointExchange, LauncherExchange, MemoryExchange, SharedExchange, UniqueIdExchange,
};
pub use iface::{ENV_IFNAME, bind_address, ifname_address};
pub use rendezvous_server::{RankExits, RendezvousServer};
pub use tracker_join::TrackerJoin;
pub use unique_id::{IdError, UniqueId};

/// Which protocol a rabit/XGBoost tracker speaks (chosen by [`ENV_TRACKER_PROTOCOL`]).
pub use switchyard_tracker::client::Protocol as TrackerProtocol;

/// Environment variable choosing the tracker protocol: `classic` (the default: rabit,
/// XGBoost ≤ 2.0's tracker, switchyard's tracker) or `json` (XGBoost ≥ 2.1's tracker;
/// switchyard's tracker serves it too).
pub const ENV_TRACKER_PROTOCOL: &str = "SWITCHYARD_TRACKER_PROTOCOL";
/// Environment variable holding the rank.
pub const ENV_RANK: &str = "SWITCHYARD_RANK";
/// Environment variable holding the number of processes.
pub const ENV_WORLD_SIZE: &str = "SWITCHYARD_WORLD_SIZE";
/// Environment variable holding the rendezvous address.
pub const ENV_RENDEZVOUS: &str = "SWITCHYARD_RENDEZVOUS";
/// Environment variable holding the tracker's host (rabit's name).
pub const ENV_TRACKER_URI: &str = "DMLC_TRACKER_URI";
/// Environment variable holding the tracker's port (rabit's name).
pub const ENV_TRACKER_PORT: &str = "DMLC_TRACKER_PORT";
/// Environment variable holding how often this process was restarted (rabit's name).
pub const ENV_NUM_ATTEMPT: &str = "DMLC_NUM_ATTEMPT";
