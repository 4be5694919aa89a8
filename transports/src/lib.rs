//! Dealer/Router sockets for switchyard messages, over in-process queues, ZeroMQ and MPI.
//!
//! A [`DealerSocket`] connects to one router; a [`RouterSocket`] binds an endpoint and
//! talks to many dealers by [`PeerId`]. Both implement [`Socket`] (send, receive with
//! deadlines) and are chosen by the endpoint string:
//!
//! | endpoint | backend | feature |
//! |---|---|---|
//! | `local://name` | crossbeam queues between threads | always |
//! | `inproc://name` | libzmq inproc | `zmq` (default) |
//! | `tcp://host:port` | libzmq tcp; port 0 picks one | `zmq` (default) |
//! | `mpi://rank` | MPI, under `mpirun` | `mpi` |
//!
//! Every send is bounded by a high-water mark and a deadline; a failed send returns
//! the message ([`SendError::msg`]). Malformed input from a peer is dropped with a
//! `warn` trace and counted ([`Router::dropped_malformed`]); it never stops a socket.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use switchyard_msg::{Addr, Kind, Msg};
//! use switchyard_transports::{Dealer, DealerSocket, Router, RouterSocket, Socket, SocketOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut router = RouterSocket::bind("local://tour", SocketOptions::default())?;
//! let mut dealer = DealerSocket::connect("local://tour", SocketOptions::default())?;
//! assert_eq!(router.await_peers(1, Duration::from_secs(5))?, 1);
//! dealer.send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get).with_seq(1))?;
//! let (peer, msg) = router.recv_from_timeout(Duration::from_secs(5))?;
//! assert_eq!(&peer, dealer.identity());
//! assert_eq!(msg.header.seq, 1);
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod dispatch;
mod endpoint;
mod error;
mod options;
mod peer;
mod poller;
mod socket;

pub use dispatch::{DealerSocket, RouterSocket};

/// The MPI job this process belongs to (feature `mpi`).
#[cfg(feature = "mpi")]
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
pub mod mpi {
    pub use crate::backend::mpi::{CallError, Collectives, Datatype, Operation, with_collectives};
    pub use crate::backend::mpi::{
        ENV_FINALIZE_TIMEOUT, ENV_MPI_DIRECT, MpiWorld, ThreadLevel, error_string,
        run_on_progress_thread, world,
    };
}
pub use endpoint::Endpoint;

/// The ZeroMQ backend's process-wide settings (feature `zmq`).
#[cfg(feature = "zmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "zmq")))]
pub mod zmq {
    pub use crate::backend::zmq::heap::ENV_MALLOC_TUNING;
}

/// Entry points for the fuzz targets in `fuzz/`. Not part of the stable API: hidden
/// from the docs, and may change or go in any release.
///
/// They reach decoders that are otherwise crate-private, in every build (the MPI
/// wire codec is pure Rust, so it is built without the `mpi` feature too).
#[doc(hidden)]
pub mod fuzzing {
    use crate::backend::mpi::wire;
    use switchyard_msg::{Limits, Msg};

    /// Decodes one MPI data message as a receiving rank does: the sender's tag and
    /// the message, or why it would be dropped as malformed.
    pub fn decode_mpi_message(buffer: Vec<u8>, limits: &Limits) -> Result<(i32, Msg), String> {
        wire::decode(buffer.into(), limits).map_err(|e| e.to_string())
    }

    /// Lays out `msg` as the MPI backend sends a message of up to 16 KiB from the
    /// socket with tag `source_tag`: one buffer, the frames packed after the head,
    /// whatever its size here (larger ones go as a head and a message per frame).
    pub fn encode_mpi_message(msg: &Msg, source_tag: i32) -> Result<Vec<u8>, String> {
        wire::encode_packing_below(msg, source_tag, usize::MAX).map(|encoded| encoded.head)
    }

    /// Decodes one MPI control note (HELLO, READY, BYE) and encodes it again, so that
    /// a fuzz target can check that every accepted note survives a round trip.
    pub fn round_trip_mpi_control(buffer: &[u8]) -> Result<Vec<u8>, String> {
        wire::Control::decode(buffer).map(|note| note.encode())
    }
}
pub use error::{RecvError, SendError, SendErrorKind, TransportError};
pub use options::SocketOptions;
pub use peer::PeerId;
pub use poller::{Pollable, Poller};
pub use socket::{Dealer, Router, Socket};
pub use switchyard_msg::{Limits, Msg};
