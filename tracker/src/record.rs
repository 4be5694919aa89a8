//! What the state machines report: facts about the job that are logged, turned into
//! the server's events and, when durable, appended to the state file.
//!
//! A durable record is everything a restarted tracker needs to serve the calls that
//! workers still make after bootstrap (`print`, `shutdown`, `recover`): who finished
//! link negotiation and where it listens, who shut down, and the JSON batch.

use serde::{Deserialize, Serialize};

/// Which protocol a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Protocol {
    /// The classic rabit protocol.
    Classic,
    /// The JSON protocol of XGBoost 2.1+.
    Json,
}

/// One member of a JSON batch, in rank order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JsonMember {
    /// The IP address text the tracker saw.
    pub(crate) host: String,
    /// Its peer listening port.
    pub(crate) port: u16,
    /// Its error listener's port.
    pub(crate) error_port: u16,
    /// Its task id, if any.
    pub(crate) task_id: Option<String>,
}

/// A fact about the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub(crate) enum Record {
    /// First line of a state file: the job it belongs to.
    Job {
        /// The number of workers.
        workers: u32,
    },
    /// A classic worker got a rank (not durable: it counts once negotiation ends).
    Assigned {
        /// The rank.
        rank: u32,
        /// Its task id.
        task_id: Option<String>,
        /// The peer's IP address text.
        host: String,
        /// Whether it came with `recover`.
        recover: bool,
    },
    /// A classic worker finished link negotiation (durable).
    Linked {
        /// The rank.
        rank: u32,
        /// Its task id, remembered so that a restarted process gets the rank back.
        task_id: Option<String>,
        /// The peer's IP address text.
        host: String,
        /// The listening port it reported.
        port: u16,
        /// How many peers will still connect to it.
        accept: u32,
        /// The ranks it connected to (each expects one incoming link fewer).
        reached: Vec<u32>,
    },
    /// A JSON batch got its ranks (durable).
    JsonBatch {
        /// The members, rank order.
        members: Vec<JsonMember>,
    },
    /// A rank shut down (durable).
    ShutDown {
        /// Which protocol.
        protocol: Protocol,
        /// The rank.
        rank: u32,
    },
}

impl Record {
    /// Whether a restarted tracker needs this record.
    pub(crate) fn is_durable(&self) -> bool {
        !matches!(self, Record::Assigned { .. })
    }
}
