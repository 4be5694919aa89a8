use crate::wire::WireError;
use std::net::SocketAddr;
use std::time::Duration;

/// The tracker a client talks to, for errors that name it (both protocols' clients).
pub(crate) struct At(pub(crate) SocketAddr);

impl At {
    /// Reading or writing `step` of an exchange with the tracker failed.
    pub(crate) fn wire(&self, step: &'static str, source: WireError) -> ClientError {
        ClientError::Tracker {
            addr: self.0.to_string(),
            step,
            source,
        }
    }

    /// The tracker's `what` made no sense, for `reason`.
    pub(crate) fn bad(&self, what: &'static str, reason: String) -> ClientError {
        ClientError::BadReply {
            addr: self.0.to_string(),
            what,
            reason,
        }
    }
}

/// Why joining a tracker, or talking to it or to a peer, failed. Every variant names
/// the address involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The tracker address did not resolve.
    #[error("tracker address {addr}: {reason}")]
    Address {
        /// `host:port` as given.
        addr: String,
        /// What the resolver said.
        reason: String,
    },
    /// The job secret in this process's environment (`SWITCHYARD_JOB_SECRET` or
    /// `SWITCHYARD_JOB_SECRET_FILE`) cannot be used: too short, both variables set, or
    /// an unreadable file. Found before anything connects.
    #[error(
        "the job secret cannot be used, so nothing was connected: {0} (fix \
         SWITCHYARD_JOB_SECRET or SWITCHYARD_JOB_SECRET_FILE, or unset both)"
    )]
    Secret(#[source] switchyard_secret::SecretError),
    /// No connection to the tracker after every try.
    #[error(
        "cannot connect to the tracker at {addr} after {attempts} tries: {source} \
         (ClientConfig::connect_attempts, connect_backoff)"
    )]
    Connect {
        /// The tracker address.
        addr: String,
        /// Tries made.
        attempts: u32,
        /// The last failure.
        source: std::io::Error,
    },
    /// A read or write with the tracker failed.
    #[error("tracker {addr}, {step}: {source}")]
    Tracker {
        /// The tracker address.
        addr: String,
        /// What we were doing (`start`, `print`, ...).
        step: &'static str,
        /// The failure.
        source: WireError,
    },
    /// The tracker refused this worker (classic: it assigned rank −1; JSON: it closed
    /// the connection instead of answering).
    #[error("tracker {addr} refused this worker: {reason}")]
    Refused {
        /// The tracker address.
        addr: String,
        /// What it did.
        reason: String,
    },
    /// The tracker sent something that cannot be right (a rank outside the world, a
    /// link to itself, a peer list over the cap, ...).
    #[error("tracker {addr} sent a bad {what}: {reason}")]
    BadReply {
        /// The tracker address.
        addr: String,
        /// The message.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The worker's own listening socket could not be opened.
    #[error("cannot listen for peers on {addr}: {source}")]
    Listen {
        /// The address tried.
        addr: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A peer link failed during its handshake.
    #[error("peer {peer} (rank {rank:?}): {source}")]
    Peer {
        /// The peer's address.
        peer: String,
        /// The rank we expected there, if known.
        rank: Option<u32>,
        /// The failure.
        source: WireError,
    },
    /// A peer said it is another rank than the tracker named, or a rank we do not
    /// expect.
    #[error("peer {peer} says it is rank {got}; {reason}")]
    WrongPeer {
        /// The peer's address.
        peer: String,
        /// The rank it sent.
        got: i32,
        /// What we expected instead.
        reason: String,
    },
    /// Not every expected peer connected in time.
    #[error(
        "only {got} of {expected} peers connected within {waited:?} \
         (ClientConfig::accept_timeout)"
    )]
    AcceptTimeout {
        /// Peers that arrived.
        got: usize,
        /// Peers expected.
        expected: usize,
        /// How long we waited.
        waited: Duration,
    },
    /// A link this worker made closed before its join was over
    /// ([`ClientConfig::watch_links`](super::ClientConfig::watch_links)): that peer's
    /// join failed, so this one cannot complete.
    #[error(
        "the link to rank {rank} closed {during}: that peer left this set of links \
         (its join failed, or it died), so they cannot all form"
    )]
    LinkClosed {
        /// The peer's rank.
        rank: u32,
        /// When (`while negotiating`, `while accepting peers`).
        during: &'static str,
    },
    /// Accepting or configuring a peer socket failed.
    #[error("peer link {what}: {source}")]
    PeerIo {
        /// What was being done.
        what: &'static str,
        /// The failure.
        source: std::io::Error,
    },
}
