//! The classic rabit protocol's tracker side (as rabit and XGBoost 1.7 speak it) as a
//! state machine without sockets.
//!
//! The server feeds it what connections say (a hello, a good-link list, a port) and
//! acts on what it returns: refusals, [`Action::Turn`]s (a connection holding a rank
//! may now send its assignment and negotiate) and [`Record`]s.
//!
//! Section names in italics are those of docs/rabit-protocol.md. Differences from the
//! reference, each fixing one of its *Weaknesses of the reference tracker*:
//! - the world size is fixed by the configuration; another one is refused (*Asserts
//!   as validation*);
//! - refusals are the protocol's polite one (rank −1), never a crash (*Asserts as
//!   validation*, *Refusals*): unknown task after every rank is out, `recover` without
//!   a rank or for a rank that never joined (e.g. before the first `start`), a rank
//!   ≥ n, a rank held by a connection that has not finished negotiating (*Trusted task
//!   ids*), a rank already shut down;
//! - an explicit rank is taken out of the batch's ranks (*Explicit ranks outside the
//!   batch*);
//! - a worker that vanishes before it finishes negotiating gives its rank back
//!   (*Workers that vanish while pending*);
//! - every rank handed out in any round loses one expected link (*Links reached in
//!   earlier rounds*);
//! - `shutdown` counts only ranks that finished negotiating, once each (*Unchecked
//!   shutdowns*); one that arrives before the port report of a peer linking to it is
//!   accepted (*Serving connections concurrently*);
//! - a rank that negotiates again (`recover`, or a restarted process) forgets the port
//!   it reported before, so no peer is sent to a listener of an earlier generation;
//!   and a peer that a worker fails to reach [`STALE_AFTER`](negotiate::STALE_AFTER)
//!   rounds in a row (it died after its negotiation) is forgotten too: the worker
//!   accepts the link from the peer's next negotiation instead of failing after
//!   [`MAX_ROUNDS`] rounds.
//!
//! Negotiations run one at a time, in the order ranks were decided (a batch in rank
//! order), as in the reference: that keeps every pair's connect/accept choice
//! consistent, since each side's choice depends on whether the other already reported
//! its port.

use crate::common::{ConnId, SILENT_COMMAND, SortBy};
use crate::maps::{Links, link_maps};
use crate::order::sort_batch;
use crate::record::{Protocol, Record};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

mod negotiate;
pub(crate) use negotiate::Assignment;
#[cfg(test)]
pub(crate) use negotiate::Negotiation;
#[cfg(test)]
use negotiate::{Round, STALE_AFTER};

/// The most negotiation rounds one connection may take: a worker that cannot reach a
/// peer would otherwise hold every later negotiation forever.
pub(crate) const MAX_ROUNDS: u32 = 64;

/// A classic command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Command {
    /// Join the job.
    Start,
    /// Rejoin with a known rank and repair links.
    Recover,
    /// Print a message.
    Print,
    /// Leave the job.
    Shutdown,
    /// A switchyard robust engine reports a silent peer (wire name
    /// [`SILENT_COMMAND`]). A command of its own, not a `print`: a launcher that kills
    /// a reported process must act on a message whose form no worker's log text can
    /// take.
    Silent,
}

impl Command {
    /// The command named `s`, if it is one of rabit's four or [`SILENT_COMMAND`].
    pub(crate) fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "start" => Command::Start,
            "recover" => Command::Recover,
            "print" => Command::Print,
            "shutdown" => Command::Shutdown,
            SILENT_COMMAND => Command::Silent,
            _ => return None,
        })
    }
}

/// The fields of a classic hello (docs/rabit-protocol.md, *The hello*).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The rank the worker claims, −1 for none.
    pub(crate) rank: i32,
    /// The world size it wants, −1 for "the tracker's".
    pub(crate) world: i32,
    /// Its task id; `None` for `NULL` or empty.
    pub(crate) task_id: Option<String>,
    /// The command.
    pub(crate) command: Command,
}

/// Normalises a task id as sent: `NULL` and empty mean none.
pub(crate) fn task_id(raw: String) -> Option<String> {
    if raw.is_empty() || raw == "NULL" {
        None
    } else {
        Some(raw)
    }
}

/// What the server must do for the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Connection `conn` holds `rank`: send the assignment and negotiate now.
    Turn {
        /// The connection.
        conn: ConnId,
        /// Its rank.
        rank: u32,
    },
    /// A fact to log, publish and (if durable) keep.
    Record(Record),
}

#[derive(Clone, Debug)]
struct Pending {
    conn: ConnId,
    host: String,
    task_id: Option<String>,
}

#[derive(Clone, Debug)]
struct Waiting {
    host: String,
    port: u16,
    remaining: u32,
}

#[derive(Clone, Debug)]
struct Holder {
    conn: ConnId,
    host: String,
    task_id: Option<String>,
}

/// The classic tracker's state.
#[derive(Debug)]
pub(crate) struct Classic {
    n: u32,
    sort_by: SortBy,
    maps: Vec<Links>,
    todo: BTreeSet<u32>,
    pending: Vec<Pending>,
    job_map: HashMap<String, u32>,
    wait_conn: BTreeMap<u32, Waiting>,
    linked: BTreeSet<u32>,
    shut_down: BTreeSet<u32>,
    held: BTreeMap<u32, Holder>,
    turns: VecDeque<(ConnId, u32)>,
    current: Option<ConnId>,
}

impl Classic {
    /// A job of `n` workers, batches ordered by `sort_by`.
    pub(crate) fn new(n: u32, sort_by: SortBy) -> Classic {
        Classic {
            n,
            sort_by,
            maps: link_maps(n as usize),
            todo: (0..n).collect(),
            pending: Vec::new(),
            job_map: HashMap::new(),
            wait_conn: BTreeMap::new(),
            linked: BTreeSet::new(),
            shut_down: BTreeSet::new(),
            held: BTreeMap::new(),
            turns: VecDeque::new(),
            current: None,
        }
    }

    /// Whether `n` distinct ranks have shut down.
    pub(crate) fn is_done(&self) -> bool {
        self.shut_down.len() as u32 >= self.n
    }

    /// The ranks that shut down, ascending.
    pub(crate) fn shut_down(&self) -> Vec<u32> {
        self.shut_down.iter().copied().collect()
    }

    /// How many `start`s wait for their batch.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether a classic worker was given a rank (negotiating, linked or shut down): a
    /// job has one protocol, so a JSON `start` is then refused. A `start` still waiting
    /// for its batch does not count: one stranger's `start` must not decide a job of
    /// JSON workers.
    pub(crate) fn ranked(&self) -> bool {
        !self.held.is_empty() || !self.linked.is_empty() || !self.shut_down.is_empty()
    }

    /// Takes every `start` still waiting for its batch out of it, returning their
    /// connections (to refuse: the job's protocol was decided by the other one).
    pub(crate) fn take_pending(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|p| p.conn)
            .collect()
    }

    /// A `start` or `recover` from `conn` at `host`. `Ok` with actions, the caller's
    /// connection either gets a [`Action::Turn`] now or later, or waits in the batch;
    /// `Err` with the reason to refuse it (assignment rank −1).
    pub(crate) fn start(
        &mut self,
        conn: ConnId,
        host: &str,
        hello: &Hello,
    ) -> Result<Vec<Action>, String> {
        let recover = hello.command == Command::Recover;
        if hello.world != -1 && hello.world != self.n as i32 {
            return Err(format!(
                "world size {} in the hello, but this job has {} workers",
                hello.world, self.n
            ));
        }
        if recover && hello.rank < 0 {
            return Err(format!(
                "recover with rank {}: it needs the worker's rank",
                hello.rank
            ));
        }
        let decided = if hello.rank >= 0 {
            if hello.rank as u32 >= self.n {
                return Err(format!(
                    "rank {} is not below the world size {}",
                    hello.rank, self.n
                ));
            }
            let rank = hello.rank as u32;
            if recover && !self.linked.contains(&rank) {
                return Err(format!(
                    "recover from rank {rank}, which never joined this job"
                ));
            }
            Some(rank)
        } else {
            hello
                .task_id
                .as_ref()
                .and_then(|t| self.job_map.get(t).copied())
        };
        let mut actions = Vec::new();
        match decided {
            Some(rank) => {
                if let Some(h) = self.held.get(&rank) {
                    return Err(format!(
                        "rank {rank} is held by a connection from {} that has not finished negotiating",
                        h.host
                    ));
                }
                if self.shut_down.contains(&rank) {
                    return Err(format!("rank {rank} has already shut down"));
                }
                // A rank that negotiates again (a `recover`, or a restarted process)
                // listens on a new port: the one it reported before belongs to an
                // earlier generation of links and must not be handed to peers, even
                // if this negotiation fails before it reports the new one.
                self.wait_conn.remove(&rank);
                if self.todo.remove(&rank) && self.pending.len() == self.todo.len() {
                    self.run_batch(&mut actions);
                }
                if let Some(t) = &hello.task_id {
                    self.job_map.insert(t.clone(), rank);
                }
                self.hold(
                    conn,
                    rank,
                    host,
                    hello.task_id.clone(),
                    recover,
                    &mut actions,
                );
            }
            None => {
                if self.todo.len() <= self.pending.len() {
                    return Err(format!(
                        "every rank is handed out and task id {:?} is not known",
                        hello.task_id.as_deref().unwrap_or("NULL")
                    ));
                }
                self.pending.push(Pending {
                    conn,
                    host: host.to_string(),
                    task_id: hello.task_id.clone(),
                });
                if self.pending.len() == self.todo.len() {
                    self.run_batch(&mut actions);
                }
            }
        }
        Ok(actions)
    }

    /// Gives the pending batch the smallest ranks left, in sorted order
    /// (docs/rabit-protocol.md, *Rank assignment*).
    fn run_batch(&mut self, actions: &mut Vec<Action>) {
        let mut batch = std::mem::take(&mut self.pending);
        sort_batch(&mut batch, self.sort_by, |p| {
            (p.host.as_str(), p.task_id.as_deref())
        });
        for p in batch {
            let Some(rank) = self.todo.pop_first() else {
                break;
            };
            if let Some(t) = &p.task_id {
                self.job_map.insert(t.clone(), rank);
            }
            self.hold(p.conn, rank, &p.host, p.task_id, false, actions);
        }
    }

    fn hold(
        &mut self,
        conn: ConnId,
        rank: u32,
        host: &str,
        task_id: Option<String>,
        recover: bool,
        actions: &mut Vec<Action>,
    ) {
        actions.push(Action::Record(Record::Assigned {
            rank,
            task_id: task_id.clone(),
            host: host.to_string(),
            recover,
        }));
        self.held.insert(
            rank,
            Holder {
                conn,
                host: host.to_string(),
                task_id,
            },
        );
        self.turns.push_back((conn, rank));
        self.advance(actions);
    }

    fn advance(&mut self, actions: &mut Vec<Action>) {
        if self.current.is_none() {
            if let Some((conn, rank)) = self.turns.pop_front() {
                self.current = Some(conn);
                actions.push(Action::Turn { conn, rank });
            }
        }
    }

    /// A waiting `start` whose connection closed or timed out: it leaves the batch.
    /// Returns whether it was waiting.
    pub(crate) fn vanish(&mut self, conn: ConnId) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.conn != conn);
        before != self.pending.len()
    }

    /// A `shutdown` from `rank` (docs/rabit-protocol.md, *Print and shutdown*). `Err`
    /// says why it does not count.
    pub(crate) fn shutdown(&mut self, rank: i32) -> Result<Vec<Action>, String> {
        let r = u32::try_from(rank).map_err(|_| format!("shutdown from rank {rank}"))?;
        if !self.linked.contains(&r) {
            return Err(format!(
                "shutdown from rank {rank}, which never finished negotiating"
            ));
        }
        if self.held.contains_key(&r) {
            return Err(format!("shutdown from rank {rank} while it is negotiating"));
        }
        if self.shut_down.contains(&r) {
            return Err(format!("second shutdown from rank {rank}"));
        }
        let record = Record::ShutDown {
            protocol: Protocol::Classic,
            rank: r,
        };
        self.apply(&record);
        Ok(vec![Action::Record(record)])
    }

    /// Applies a durable record: what [`finish`](Self::finish) and
    /// [`shutdown`](Self::shutdown) do to the state, and how a state file is replayed.
    pub(crate) fn apply(&mut self, record: &Record) {
        // A state file is input too: a rank outside this world is ignored.
        match record {
            Record::Linked { rank, .. } | Record::ShutDown { rank, .. } if *rank >= self.n => {
                return;
            }
            _ => {}
        }
        match record {
            Record::Linked {
                rank,
                task_id,
                host,
                port,
                accept,
                reached,
            } => {
                let rank = *rank;
                self.todo.remove(&rank);
                self.held.remove(&rank);
                self.linked.insert(rank);
                if let Some(t) = task_id {
                    self.job_map.insert(t.clone(), rank);
                }
                for r in reached {
                    if let Some(w) = self.wait_conn.get_mut(r) {
                        w.remaining = w.remaining.saturating_sub(1);
                        if w.remaining == 0 {
                            self.wait_conn.remove(r);
                        }
                    }
                }
                if *accept > 0 {
                    self.wait_conn.insert(
                        rank,
                        Waiting {
                            host: host.clone(),
                            port: *port,
                            remaining: *accept,
                        },
                    );
                } else {
                    self.wait_conn.remove(&rank);
                }
            }
            Record::ShutDown {
                protocol: Protocol::Classic,
                rank,
            } => {
                // Its peers are done linking to it, whatever order the tracker heard.
                self.wait_conn.remove(rank);
                self.shut_down.insert(*rank);
            }
            _ => {}
        }
    }

    /// Whether `conn` holds a rank (assigned and not finished).
    pub(crate) fn holds(&self, conn: ConnId) -> Option<u32> {
        self.held
            .iter()
            .find(|(_, h)| h.conn == conn)
            .map(|(r, _)| *r)
    }

    /// Whether a connection holds `rank` (assigned, negotiation not finished).
    pub(crate) fn is_held(&self, rank: u32) -> bool {
        self.held.contains_key(&rank)
    }
}

#[cfg(test)]
mod tests;
