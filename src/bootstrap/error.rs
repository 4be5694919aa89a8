use thiserror::Error;

/// Errors of the worker side: reading the starter's environment, choosing an address,
/// exchanging endpoints at a rendezvous.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// An environment variable is missing or does not parse: the error names the
    /// variable, its value and what was expected.
    #[error("{0}")]
    Env(#[from] switchyard_net::env::EnvError),
    /// The rendezvous could not be reached or failed.
    #[error("rendezvous at {addr}: {reason}")]
    Rendezvous {
        /// The rendezvous address, or the peer's.
        addr: String,
        /// What happened.
        reason: String,
    },
    /// A peer sent a bad rendezvous frame.
    #[error("rendezvous peer {peer}: {reason}")]
    Protocol {
        /// The peer's address.
        peer: String,
        /// What was wrong with what it sent.
        reason: String,
    },
}
