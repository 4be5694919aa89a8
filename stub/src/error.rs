use switchyard_msg::Addr;
use switchyard_transports::TransportError;
use thiserror::Error;

/// Errors from building the address table, starting a stub or handing out sockets.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StubError {
    /// The cluster layout is inconsistent.
    #[error("invalid cluster layout: {reason}")]
    Layout {
        /// What is wrong.
        reason: String,
    },
    /// The endpoint list does not have one endpoint per process.
    #[error("{got} process endpoints given but the layout has {expected} processes")]
    EndpointCount {
        /// Processes in the layout.
        expected: usize,
        /// Endpoints given.
        got: usize,
    },
    /// This process's rank is outside the layout.
    #[error("rank {rank} is outside the layout's {processes} processes")]
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// Processes in the layout.
        processes: usize,
    },
    /// No thread in the layout has this address.
    #[error("no thread has address {addr} in the address table")]
    UnknownAddress {
        /// The address.
        addr: Addr,
    },
    /// The address belongs to a thread of another process.
    #[error("{addr} lives in process {process}, not in this process ({rank})")]
    NotLocal {
        /// The address.
        addr: Addr,
        /// Its process.
        process: usize,
        /// This process.
        rank: usize,
    },
    /// The socket for this address was already handed out.
    #[error("the socket for {addr} was already taken")]
    AlreadyTaken {
        /// The address.
        addr: Addr,
    },
    /// A transport failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
}
