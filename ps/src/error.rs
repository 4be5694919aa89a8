//! What a parameter-server call can report.

use std::time::Duration;
use switchyard_transports::TransportError;
use thiserror::Error;

/// Everything that can go wrong in a scheduler, server or worker.
///
/// Every variant names the node, key or setting involved, so that the message alone
/// says what to look at.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PsError {
    /// Opening, binding or connecting a socket failed.
    #[error("{what}: {source}")]
    Transport {
        /// What was being done (e.g. "worker 2 connecting to server 1 at tcp://...").
        what: String,
        /// The transport's error.
        source: TransportError,
    },
    /// A message could not be sent.
    #[error("sending to {to} failed: {reason}")]
    Send {
        /// The receiving node.
        to: String,
        /// Why.
        reason: String,
    },
    /// A pull asked for a key that no worker ever pushed or initialised.
    #[error("key {key} was never pushed (asked of {server})")]
    NeverPushed {
        /// The key.
        key: u64,
        /// The server that should hold it.
        server: String,
    },
    /// A push carried a different number of values for a key than the server holds.
    #[error(
        "key {key}: pushed {pushed} values but {server} holds {stored} (a key's length is fixed by its first push)"
    )]
    LengthChanged {
        /// The key.
        key: u64,
        /// The key's whole length as stored (all servers' pieces of a split key).
        stored: u64,
        /// The whole length pushed.
        pushed: u64,
        /// The server.
        server: String,
    },
    /// A push carried a different number of values for a key than another worker's
    /// first push of it, which every server has checked but which has not completed.
    #[error(
        "key {key}: pushed {pushed} values but worker {worker}'s first push of it, checked by {server} and not yet completed, has {held} (a key's length is fixed by its first push)"
    )]
    LengthHeld {
        /// The key.
        key: u64,
        /// The whole length the first push has.
        held: u64,
        /// The whole length pushed.
        pushed: u64,
        /// The worker whose first push holds the length.
        worker: u32,
        /// The server.
        server: String,
    },
    /// A request's element type is not the one the server stores: an `i32` worker
    /// against `f32` servers, say (same width, so the bytes alone would pass).
    #[error("{server} stores {stored} values, the request carries {sent}")]
    TypeMismatch {
        /// The server.
        server: String,
        /// The server's element type.
        stored: String,
        /// The requester's element type.
        sent: String,
    },
    /// A [`Mode::Sync`](super::Mode::Sync) round of a key did not complete within
    /// [`PsConfig::request_timeout`](super::PsConfig::request_timeout): some workers
    /// never pushed the key. The push was withdrawn from every server it reached, so
    /// no server applied any of it; the other pushes of the round wait on.
    #[error(
        "key {key}: its sync round at {server} waited {waited:.1?} for workers {missing:?} (only workers {pushed:?} pushed it); the push was withdrawn from every server, none applied it; in Mode::Sync every worker must push every key of a round (PsConfig::request_timeout)"
    )]
    RoundIncomplete {
        /// The key.
        key: u64,
        /// The server.
        server: String,
        /// Workers whose push of the key was in the round.
        pushed: Vec<u32>,
        /// Workers that never pushed it.
        missing: Vec<u32>,
        /// How long the push had waited.
        waited: Duration,
    },
    /// The arguments of a call do not agree with each other.
    #[error("bad arguments: {0}")]
    BadArguments(String),
    /// A key lies outside the key space the range sharding divides.
    #[error("key {key} is outside the key space 0..{key_space} (PsConfig::sharding)")]
    KeyOutOfRange {
        /// The key.
        key: u64,
        /// The size of the key space.
        key_space: u64,
    },
    /// A server answered a request with an error.
    #[error("{node}: {reason}")]
    Remote {
        /// The node that answered.
        node: String,
        /// Its reason.
        reason: String,
    },
    /// The scheduler ended the job because a node stopped answering or failed.
    #[error("job aborted by the scheduler: {reason}")]
    Aborted {
        /// The scheduler's reason, naming the node.
        reason: String,
    },
    /// The scheduler stopped answering heartbeats.
    #[error("scheduler at {endpoint} silent for {silent:?} (PsConfig::dead_timeout)")]
    SchedulerSilent {
        /// The scheduler's endpoint.
        endpoint: String,
        /// How long nothing was heard.
        silent: Duration,
    },
    /// A node (server or worker) stopped sending heartbeats.
    #[error("{node} silent for {silent:?} (PsConfig::dead_timeout)")]
    NodeSilent {
        /// The node.
        node: String,
        /// How long nothing was heard.
        silent: Duration,
    },
    /// A wait passed its timeout.
    #[error("{what}: no answer within {waited:?} from {owed} ({setting})")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// Who had not answered.
        owed: String,
        /// The setting to change.
        setting: &'static str,
    },
    /// The nodes did not all register with the scheduler in time, or a node that
    /// does not fit the job tried to.
    #[error("registration: {0}")]
    Registration(String),
    /// A peer sent something that does not parse.
    #[error("malformed message from {from}: {reason}")]
    Protocol {
        /// The sender.
        from: String,
        /// What was wrong.
        reason: String,
    },
    /// An environment variable is missing or does not parse: the error names the
    /// variable, its value and what was expected.
    #[error("{0}")]
    Env(#[from] switchyard_net::env::EnvError),
    /// The job is over (the scheduler sent shutdown); no more calls are served.
    #[error("the job is over: the scheduler shut it down")]
    Finished,
}

impl PsError {
    pub(crate) fn transport(what: impl Into<String>, source: TransportError) -> PsError {
        PsError::Transport {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn protocol(from: impl ToString, reason: impl ToString) -> PsError {
        PsError::Protocol {
            from: from.to_string(),
            reason: reason.to_string(),
        }
    }
}
