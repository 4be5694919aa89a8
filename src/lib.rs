//! switchyard: message passing for distributed machine-learning programs.
//!
//! Worker and server threads in many processes exchange [`Msg`]s through Dealer/Router
//! sockets; a per-process [`Stub`] routes each message by its destination [`Addr`].
//! This crate is the facade: it re-exports the layers below and adds the launcher and
//! bootstraps ([`launch`]), the collectives ([`collective`], which can also join a
//! rabit/XGBoost tracker) and a ps-lite-style parameter server ([`ps`]). Every
//! communicator is formed by one door, `Communicator::join`, from a `Bootstrap`. The
//! tracker itself is the `switchyard-tracker` crate. Collectives in robust mode
//! (`CommOptions::with_robust`) survive a worker's death with rabit's checkpoints and
//! result replay.
//!
//! The `testing` feature (`collective::testing`: the links under the collectives,
//! meshes built by hand) is for switchyard's own tests; it is not part of the API.
//!
//! | crate | what it holds |
//! |---|---|
//! | [`msg`] | `Addr`, `Msg`, the wire codec, typed payload frames |
//! | [`transports`] | `Socket`, `Dealer`, `Router`, `Poller`; backends `local` and `zmq` |
//! | [`stub`] | `ClusterLayout`, `AddressTable`, `Stub`, `StubSocket` |
//!
//! # Examples
//!
//! A worker and a server thread in one process, talking through the stub:
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
pub mod launch;
pub mod ps;

/// The README's Rust examples, compiled and run as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use switchyard_msg as msg;
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
