//! switchyard: message passing for distributed machine-learning programs.
//!
//! This crate is the facade a worker or server program depends on. Every communicator
//! is formed by one door, `Communicator::join`, from a `Bootstrap`. A map of the whole
//! library, top to bottom:
//!
//! | where | what it holds |
//! |---|---|
//! | [`collective`] | `Communicator`: allreduce, broadcast, allgather, ... over a TCP or ZeroMQ mesh, or MPI's own collectives under `mpirun`; it can join a rabit/XGBoost tracker (`Bootstrap::tracker`), and in **robust mode** (`CommOptions::with_robust`) survives a worker's death with rabit's checkpoints and result replay |
//! | [`bootstrap`] | the worker side of starting a job: rank, job size and the other ranks' endpoints from `switchyard launch`, a tracker, torchrun's or a scheduler's variables, `mpirun`, or a shared `UniqueId` |
//! | [`ps`] | a ps-lite-style parameter server (scheduler, key-range servers, push/pull workers, replication): the `switchyard-ps` crate, re-exported |
//! | `switchyard-tracker` | the rabit/XGBoost tracker (classic and JSON protocols), a crate of its own: the collectives join it as clients, the launcher serves it |
//! | `switchyard-launch` | the job launcher behind the `switchyard launch` command: starts and supervises processes (locally, over ssh, slurm or mpirun), serves their rendezvous, tracker and parameter-server scheduler. A worker program does not link it |
//! | [`msg`] | `Addr`, `Msg`, the wire codec, typed payload frames |
//! | [`transports`] | `Socket`, `Dealer`, `Router`, `Poller`; backends `local`, `zmq` and `mpi`: what the collectives' ZeroMQ path and the parameter server send through |
//! | [`stub`] | the Singa-style messaging layer: a per-process [`Stub`] routes [`Msg`]s between worker and server threads of many processes by their destination [`Addr`] (`ClusterLayout`, `AddressTable`, `StubSocket`). User programs may use it directly; neither the collectives nor the parameter server are built on it |
//! | [`secret`] | the optional job secret: challenge-response on the rendezvous and data links |
//!
//! The `testing` feature (`collective::testing`: the links under the collectives,
//! meshes built by hand) is for switchyard's own tests; it is not part of the API.
//!
//! # Examples
//!
//! A worker and a server thread in one process, exchanging parameters through the stub:
//!
//! ```
//! use std::time::Duration;
//! use switchyard::prelude::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layout = ClusterLayout::new(1, 1, 1, 1).with_separate_servers(false);
//! let bound = Stub::bind(layout, 0, "local://facade-doc", SocketOptions::default())?;
//! let endpoints = vec![bound.endpoint().to_string()];
//! let stub = bound.start(endpoints)?;
//! let mut server = stub.server(0, 0)?;
//! let mut worker = stub.worker(0, 0)?;
//! let server_thread = std::thread::spawn(move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//!     let get = server.recv_timeout(Duration::from_secs(5))?;
//!     server.send(get.reply(Kind::Put).with_frame(payload::frame_from_vec(vec![1.5f32, 2.5])))?;
//!     Ok(())
//! });
//! worker.send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get).with_target(Target::Param(0)))?;
//! let put = worker.recv_timeout(Duration::from_secs(5))?;
//! assert_eq!(payload::frame_to_vec::<f32>(&put.frames()[0])?, [1.5, 2.5]);
//! server_thread.join().expect("server thread").map_err(|e| e.to_string())?;
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]

pub mod collective;
#[doc(hidden)]
pub mod fuzzing;

/// The README's Rust examples, compiled and run as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's Rust examples (`docs/guide/`, one item per page), compiled and run as
/// doc tests like the README's.
#[cfg(doctest)]
pub mod guide {
    #[doc = include_str!("../docs/guide/README.md")]
    pub struct Index;
    #[doc = include_str!("../docs/guide/launching.md")]
    pub struct Launching;
    #[doc = include_str!("../docs/guide/collectives.md")]
    pub struct Collectives;
    #[doc = include_str!("../docs/guide/parameter-server.md")]
    pub struct ParameterServer;
    #[doc = include_str!("../docs/guide/several-hosts.md")]
    pub struct SeveralHosts;
    #[doc = include_str!("../docs/guide/tracker.md")]
    pub struct Tracker;
    #[doc = include_str!("../docs/guide/robust-mode.md")]
    pub struct RobustMode;
    #[doc = include_str!("../docs/guide/python.md")]
    pub struct Python;
    #[doc = include_str!("../docs/guide/job-secret.md")]
    pub struct JobSecret;
    #[doc = include_str!("../docs/guide/mpi.md")]
    pub struct Mpi;
    #[doc = include_str!("../docs/guide/sockets.md")]
    pub struct Sockets;
}

/// The `half` crate, whose [`f16`](half::f16) and [`bf16`](half::bf16) are element
/// types of the payloads and the collectives: a program can name them through
/// `switchyard::half` without depending on a matching version itself.
///
/// ```
/// use switchyard::collective::{Communicator, ReduceOp};
/// use switchyard::half::bf16;
/// let mut comm = Communicator::solo();
/// let mut grads = [bf16::from_f32(0.5), bf16::from_f32(-2.0)];
/// comm.allreduce(&mut grads, ReduceOp::Sum)?;
/// assert_eq!(grads[1].to_f32(), -2.0);
/// # Ok::<(), switchyard::collective::CollectiveError>(())
/// ```
pub use half;
/// The worker side of starting a job (the `switchyard-bootstrap` crate): rank, job
/// size and the other ranks' endpoints from `switchyard launch`, a tracker, torchrun's
/// or a scheduler's variables, `mpirun`, or a shared [`UniqueId`](bootstrap::UniqueId).
pub use switchyard_bootstrap as bootstrap;
pub use switchyard_msg as msg;
/// Reading environment variables: the [`Lookup`](env::Lookup) every `from_lookup`
/// takes, and [`EnvError`](env::EnvError), what every `from_env` reports for a
/// malformed value (the `switchyard-net` crate's module).
pub use switchyard_net::env;
/// The parameter server (the `switchyard-ps` crate).
pub use switchyard_ps as ps;
/// The optional job secret (`SWITCHYARD_JOB_SECRET` / `SWITCHYARD_JOB_SECRET_FILE`).
pub use switchyard_secret as secret;
pub use switchyard_stub as stub;
pub use switchyard_transports as transports;

pub use switchyard_msg::{Addr, Header, Kind, Msg, Role, Target, payload};
pub use switchyard_stub::{ClusterLayout, Stub, StubSocket};

/// Everything a worker or server program usually needs, in one `use`.
pub mod prelude {
    pub use crate::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
    pub use switchyard_msg::{Addr, Kind, Msg, Role, Target, payload};
    pub use switchyard_stub::{ClusterLayout, Stub, StubSocket};
    pub use switchyard_transports::{
        Dealer, DealerSocket, Poller, Router, RouterSocket, Socket, SocketOptions,
    };
}
