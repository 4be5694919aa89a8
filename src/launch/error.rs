use std::time::Duration;
use thiserror::Error;

/// Errors from launching a job or bootstrapping a process.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// An environment variable is missing or does not parse.
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value (empty if unset).
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A launch option has a value that cannot work.
    #[error("launch option {option} = {value}: {reason}")]
    InvalidOption {
        /// The option, as [`LaunchOptions`](super::LaunchOptions) names it.
        option: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
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
    /// Not every process checked in before the timeout.
    #[error("rendezvous timed out after {waited:?}: ranks {missing:?} never checked in")]
    Missing {
        /// Ranks that did not arrive.
        missing: Vec<u32>,
        /// How long the launcher waited.
        waited: Duration,
    },
    /// A process could not be started.
    #[error("cannot start {program}: {reason}")]
    Spawn {
        /// The program.
        program: String,
        /// What the system reported.
        reason: String,
    },
    /// A process exited unsuccessfully; the others were stopped.
    #[error("rank {rank} exited with {status}; the other ranks were stopped")]
    RankFailed {
        /// The rank.
        rank: u32,
        /// Its exit status.
        status: String,
    },
    /// The job ran past its time limit; every process was stopped.
    #[error("job still running after {limit:?}; every rank was stopped (LaunchOptions::timeout)")]
    JobTimeout {
        /// The limit.
        limit: Duration,
    },
}
