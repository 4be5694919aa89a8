//! The JSON protocol's tracker side (XGBoost 2.1+) as a state machine without sockets.
//!
//! Section names in italics are those of docs/xgboost-protocol.md. `start`s wait in a
//! batch of exactly n; when it is full they are sorted (*Rank assignment*) and each
//! gets the peer frame of its ring successor. Differences from the reference, each
//! fixing one of its *Weaknesses of the reference tracker*:
//! - a `start` after bootstrap is refused (the connection is closed) instead of
//!   putting the tracker into restart mode for good (*A start after bootstrap*);
//! - a pending `start` whose connection closes leaves the batch (*Workers that vanish
//!   while pending*);
//! - `shutdown` counts distinct ranks of the batch only (*Unchecked shutdowns*);
//! - `error` tells every worker of the batch, with i32 `1`, then the job fails (*An
//!   error path that stops nobody*).

use crate::common::{ConnId, SortBy};
use crate::order::sort_batch;
use crate::record::{JsonMember, Protocol, Record};
use std::collections::BTreeSet;

/// The hello frame (docs/xgboost-protocol.md, *The hello frame*).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct Hello {
    /// The rank the worker claims (0 before it has one).
    pub(crate) rank: i64,
    /// Its task id, `""` for none.
    pub(crate) task_id: String,
    /// The world size; `-1` on `start`.
    pub(crate) world_size: i64,
}

/// What the server must do for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send `conn` the peer frame of its successor, then close it.
    PeerFrame {
        /// The connection.
        conn: ConnId,
        /// The successor's IP address text.
        host: String,
        /// The successor's listening port.
        port: u16,
        /// The successor's rank.
        rank: u32,
    },
    /// Send i32 `1` to each (host, error port): the job failed.
    SignalError {
        /// Every worker's error listener.
        targets: Vec<(String, u16)>,
    },
    /// A fact to log, publish and (if durable) keep.
    Record(Record),
}

#[derive(Clone, Debug)]
struct Pending {
    conn: ConnId,
    member: JsonMember,
}

/// The JSON tracker's state.
#[derive(Debug)]
pub(crate) struct Json {
    n: u32,
    sort_by: SortBy,
    pending: Vec<Pending>,
    batch: Option<Vec<JsonMember>>,
    shut_down: BTreeSet<u32>,
    failed: Option<String>,
}

impl Json {
    /// A job of `n` workers, batches ordered by `sort_by`.
    pub(crate) fn new(n: u32, sort_by: SortBy) -> Json {
        Json {
            n,
            sort_by,
            pending: Vec::new(),
            batch: None,
            shut_down: BTreeSet::new(),
            failed: None,
        }
    }

    /// Whether `n` distinct ranks of the batch have shut down.
    pub(crate) fn is_done(&self) -> bool {
        self.shut_down.len() as u32 >= self.n
    }

    /// Why the job failed, if it did.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The ranks that shut down, ascending.
    pub(crate) fn shut_down(&self) -> Vec<u32> {
        self.shut_down.iter().copied().collect()
    }

    /// How many `start`s wait for the batch.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether JSON workers were given ranks (the batch formed): a job has one
    /// protocol, so a classic `start` is then refused. A `start` still waiting for its
    /// batch does not count, so that one stranger's `start` cannot decide a job of
    /// classic workers.
    pub(crate) fn ranked(&self) -> bool {
        self.batch.is_some() || !self.shut_down.is_empty()
    }

    /// Takes every `start` still waiting for the batch out of it, returning their
    /// connections (to close: the job's protocol was decided by the other one).
    pub(crate) fn take_pending(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|p| p.conn)
            .collect()
    }

    /// A `start` (docs/xgboost-protocol.md, *start*) with its ports. `Ok`: answer
    /// `{"world_size": n}` and wait for a peer frame (maybe among the actions). `Err`:
    /// close the connection, for that reason.
    pub(crate) fn start(
        &mut self,
        conn: ConnId,
        host: &str,
        hello: &Hello,
        port: i64,
        error_port: i64,
    ) -> Result<Vec<Action>, String> {
        if hello.world_size != -1 {
            return Err(format!(
                "start with world_size {} (must be -1; this job has {} workers)",
                hello.world_size, self.n
            ));
        }
        let port = u16::try_from(port)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("start with port {port}"))?;
        let error_port =
            u16::try_from(error_port).map_err(|_| format!("start with error_port {error_port}"))?;
        if self.batch.is_some() {
            return Err("start after the job's batch was formed: every rank is taken".into());
        }
        self.pending.push(Pending {
            conn,
            member: JsonMember {
                host: host.to_string(),
                port,
                error_port,
                task_id: Some(hello.task_id.clone()).filter(|t| !t.is_empty()),
            },
        });
        let mut actions = Vec::new();
        if self.pending.len() as u32 == self.n {
            let mut batch = std::mem::take(&mut self.pending);
            sort_batch(&mut batch, self.sort_by, |p| {
                (p.member.host.as_str(), p.member.task_id.as_deref())
            });
            let n = batch.len();
            for (r, p) in batch.iter().enumerate() {
                let next = &batch[(r + 1) % n].member;
                actions.push(Action::PeerFrame {
                    conn: p.conn,
                    host: next.host.clone(),
                    port: next.port,
                    rank: ((r + 1) % n) as u32,
                });
            }
            let record = Record::JsonBatch {
                members: batch.into_iter().map(|p| p.member).collect(),
            };
            self.apply(&record);
            actions.push(Action::Record(record));
        }
        Ok(actions)
    }

    /// A pending `start` whose connection closed: it leaves the batch.
    pub(crate) fn vanish(&mut self, conn: ConnId) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.conn != conn);
        before != self.pending.len()
    }

    /// A `shutdown` (docs/xgboost-protocol.md, *shutdown*) from the rank in its hello.
    /// `Err` says why it does not count.
    pub(crate) fn shutdown(&mut self, rank: i64) -> Result<Vec<Action>, String> {
        if self.batch.is_none() {
            return Err(format!(
                "shutdown from rank {rank} before the batch was formed"
            ));
        }
        let r = u32::try_from(rank)
            .ok()
            .filter(|&r| r < self.n)
            .ok_or_else(|| format!("shutdown from rank {rank}, not in 0..{}", self.n))?;
        if self.shut_down.contains(&r) {
            return Err(format!("second shutdown from rank {rank}"));
        }
        let record = Record::ShutDown {
            protocol: Protocol::Json,
            rank: r,
        };
        self.apply(&record);
        Ok(vec![Action::Record(record)])
    }

    /// An `error` (docs/xgboost-protocol.md, *error*): every worker of the batch (or,
    /// before it, of the pending `start`s) is told, and the job fails.
    pub(crate) fn error(&mut self, rank: i64, code: i64, msg: &str) -> Vec<Action> {
        let members: Vec<&JsonMember> = match &self.batch {
            Some(b) => b.iter().collect(),
            None => self.pending.iter().map(|p| &p.member).collect(),
        };
        let targets = members
            .into_iter()
            .filter(|m| m.error_port > 0)
            .map(|m| (m.host.clone(), m.error_port))
            .collect();
        self.failed
            .get_or_insert_with(|| format!("rank {rank} signalled an error (code {code}): {msg}"));
        vec![Action::SignalError { targets }]
    }

    /// Applies a durable record (also how a state file is replayed).
    pub(crate) fn apply(&mut self, record: &Record) {
        match record {
            // A state file is input too: a batch or rank that does not fit is ignored.
            Record::JsonBatch { members } if members.len() == self.n as usize => {
                self.batch = Some(members.clone())
            }
            Record::ShutDown {
                protocol: Protocol::Json,
                rank,
            } if *rank < self.n => {
                self.shut_down.insert(*rank);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
