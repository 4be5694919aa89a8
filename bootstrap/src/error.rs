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
    /// The launcher refused this communicator at once: ranks it needs exited for good
    /// without forming it (a communicator that only some ranks ask for), so it can
    /// never form.
    #[error(
        "rendezvous at {addr}: communicator number {} of this process cannot form: ranks \
         {ranks:?} exited without forming it ({detail}); every rank must form the same \
         communicators, in the same order",
        .generation + 1
    )]
    RanksExited {
        /// The rendezvous address.
        addr: String,
        /// The process's communicator that was refused (0 for its first).
        generation: u32,
        /// The exited ranks it needed, in rank order.
        ranks: Vec<u32>,
        /// How they ended, as the launcher saw it.
        detail: String,
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
