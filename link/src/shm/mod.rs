//! Shared memory between two ranks on one host: the [`ShmPipe`] a
//! [`StreamLink`](super::StreamLink) uses instead of a TCP connection when both ranks
//! announced the same host identity.
//!
//! A pipe is a segment with one byte ring each way (`segment.rs`, `ring.rs`) and a
//! Unix socket to the peer. The socket carries no data: a side that writes into a
//! ring whose reader went to sleep sends one byte on it to wake the reader (who sleeps
//! in `poll(2)` on the socket, beside the TCP peers' connections), and it closes when
//! the peer's process ends, however it ends, which is how a SIGKILLed peer is seen at
//! once, as a closed TCP connection is. The segment handed over at setup
//! (`handover.rs`) is anonymous: nothing is left behind after the ranks are gone.
//!
//! When every rank of the world is on one host, rank 0 also shares the host board
//! (`board.rs`): a slot per rank in one segment, for small allreduces and the barrier.
//!
//! Reads and writes behave as on a non-blocking socket (`WouldBlock` when the ring is
//! empty or full, `Ok(0)` once the peer has gone and everything it wrote was read), so
//! the stream link's framing, queues, clocks and heartbeat work over either unchanged.

//!
//! Linux only (`memfd_create`, abstract Unix sockets): elsewhere no rank announces a
//! host identity and every pair talks over TCP (`unsupported.rs`).

#[cfg(target_os = "linux")]
mod board;
#[cfg(target_os = "linux")]
mod handover;
mod host;
#[cfg(target_os = "linux")]
mod pipe;
#[cfg(target_os = "linux")]
mod ring;
#[cfg(target_os = "linux")]
mod segment;
#[cfg(not(target_os = "linux"))]
mod unsupported;

#[cfg(target_os = "linux")]
pub(crate) use board::Board;
#[cfg(target_os = "linux")]
pub(super) use handover::{hand_over, share_board};
pub use host::host_identity;
#[cfg(target_os = "linux")]
pub(crate) use pipe::ShmPipe;
#[cfg(not(target_os = "linux"))]
pub(super) use unsupported::{Board, ShmPipe, hand_over, share_board};
