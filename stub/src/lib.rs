//! The per-process stub: an address table shared by every process, a socket per
//! thread, and forwarding of messages between processes.
//!
//! Every process of a job computes the same [`AddressTable`] from the
//! [`ClusterLayout`] (Singa's cluster configuration), binds its [`Stub`]'s router,
//! learns every process's endpoint from a bootstrap, and then hands each of its worker
//! and server threads a [`StubSocket`]. A thread addresses messages by [`Addr`] and
//! never needs to know where its peer runs.
//!
//! [`Addr`]: switchyard_msg::Addr
#![doc(test(attr(deny(warnings))))]

mod error;
mod layout;
mod socket;
mod stub;
mod table;

pub use error::StubError;
pub use layout::ClusterLayout;
pub use socket::StubSocket;
pub use stub::{BoundStub, Stub};
pub use table::{AddressTable, Location};
