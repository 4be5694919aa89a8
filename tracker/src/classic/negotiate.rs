//! Link negotiation (docs/rabit-protocol.md, *Link negotiation*) of the connection
//! whose turn it is: the assignment, the
//! rounds, the port report, and giving the turn back when a connection fails.

use super::{Action, Classic, ConnId, MAX_ROUNDS, Record};
use crate::maps::Links;
use std::collections::{BTreeMap, BTreeSet};

/// Rounds in a row in which a worker fails to reach the same waiting peer before the
/// tracker stops sending anybody there: that peer's listener is taken to be gone (the
/// peer died, or gave up waiting and will rejoin), and the worker accepts the link
/// instead, from the peer's next negotiation. A live listener is connected to at the
/// first try: it listens before it negotiates, so only a dead one refuses.
pub(crate) const STALE_AFTER: u32 = 3;

/// The assignment message (docs/rabit-protocol.md, *The assignment message*).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// The rank.
    pub(crate) rank: u32,
    /// The world size.
    pub(crate) world: u32,
    /// Tree and ring links.
    pub(crate) links: Links,
}

/// One connection's negotiation in progress (docs/rabit-protocol.md, *Link
/// negotiation*).
#[derive(Clone, Debug)]
pub(crate) struct Negotiation {
    conn: ConnId,
    rank: u32,
    task_id: Option<String>,
    host: String,
    links: Vec<u32>,
    handed: BTreeSet<u32>,
    /// The peers sent to in the last round.
    last: Vec<u32>,
    /// Rounds in a row in which each peer sent to was not reached.
    failures: BTreeMap<u32, u32>,
    accept: u32,
    rounds: u32,
}

/// One round's answer: peers to connect to, and how many will connect instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Round {
    /// (host, port, rank) of each peer to connect to.
    pub(crate) connect: Vec<(String, u16, u32)>,
    /// How many connections to accept.
    pub(crate) accept: u32,
}

impl Classic {
    /// Starts the negotiation of `rank` on its turn; the assignment to send.
    pub(crate) fn begin(
        &self,
        conn: ConnId,
        rank: u32,
    ) -> Result<(Assignment, Negotiation), String> {
        let holder = self
            .held
            .get(&rank)
            .filter(|h| h.conn == conn && self.current == Some(conn))
            .ok_or_else(|| format!("connection {conn} does not hold the turn for rank {rank}"))?;
        let links = self
            .maps
            .get(rank as usize)
            .cloned()
            .ok_or_else(|| format!("rank {rank} is outside the world of {}", self.n))?;
        let neg = Negotiation {
            conn,
            rank,
            task_id: holder.task_id.clone(),
            host: holder.host.clone(),
            links: links.link_set(),
            handed: BTreeSet::new(),
            last: Vec::new(),
            failures: BTreeMap::new(),
            accept: 0,
            rounds: 0,
        };
        Ok((
            Assignment {
                rank,
                world: self.n,
                links,
            },
            neg,
        ))
    }

    /// One round (docs/rabit-protocol.md, *Link negotiation*, steps 1–3): `good` are
    /// the links the worker has. A peer it failed to reach [`STALE_AFTER`] rounds in a
    /// row is forgotten (its port is not handed to anybody again; it did not lose the
    /// link) and the worker accepts from it.
    pub(crate) fn round(&mut self, neg: &mut Negotiation, good: &[i32]) -> Result<Round, String> {
        neg.rounds += 1;
        if neg.rounds > MAX_ROUNDS {
            return Err(format!(
                "rank {} took more than {MAX_ROUNDS} negotiation rounds",
                neg.rank
            ));
        }
        let mut have = BTreeSet::new();
        for &g in good {
            if g < 0 || !neg.links.contains(&(g as u32)) {
                return Err(format!(
                    "rank {} reports a link to {g}, which is not one of its links {:?}",
                    neg.rank, neg.links
                ));
            }
            have.insert(g as u32);
        }
        for r in std::mem::take(&mut neg.last) {
            if have.contains(&r) {
                neg.failures.remove(&r);
                continue;
            }
            let failed = neg.failures.entry(r).or_insert(0);
            *failed += 1;
            if *failed >= STALE_AFTER {
                tracing::warn!(
                    rank = neg.rank,
                    peer = r,
                    rounds = *failed,
                    "the peer's listener does not answer: its port is forgotten, \
                     the link will be accepted from its next negotiation"
                );
                self.wait_conn.remove(&r);
                neg.handed.remove(&r);
                neg.failures.remove(&r);
            }
        }
        let missing: Vec<u32> = neg
            .links
            .iter()
            .copied()
            .filter(|r| !have.contains(r))
            .collect();
        let connect: Vec<(String, u16, u32)> = missing
            .iter()
            .filter_map(|r| self.wait_conn.get(r).map(|w| (w.host.clone(), w.port, *r)))
            .collect();
        neg.handed.extend(connect.iter().map(|c| c.2));
        neg.last = connect.iter().map(|c| c.2).collect();
        neg.accept = (missing.len() - connect.len()) as u32;
        Ok(Round {
            connect,
            accept: neg.accept,
        })
    }

    /// The worker reported its listening port (docs/rabit-protocol.md, *Link
    /// negotiation*, step 6): the negotiation is over.
    pub(crate) fn finish(&mut self, neg: Negotiation, port: i32) -> Result<Vec<Action>, String> {
        let port = match u16::try_from(port) {
            Ok(p) if p > 0 => p,
            _ if neg.accept == 0 => 0,
            _ => return Err(format!("rank {} reported listening port {port}", neg.rank)),
        };
        let record = Record::Linked {
            rank: neg.rank,
            task_id: neg.task_id,
            host: neg.host,
            port,
            accept: neg.accept,
            reached: neg.handed.into_iter().collect(),
        };
        let mut actions = Vec::new();
        self.apply(&record);
        if self.current == Some(neg.conn) {
            self.current = None;
        }
        actions.push(Action::Record(record));
        self.advance(&mut actions);
        Ok(actions)
    }

    /// A connection holding `rank` failed before it finished: the rank is released (and
    /// goes back to the batch if it never finished a negotiation), the next turn starts.
    pub(crate) fn abandon(&mut self, conn: ConnId, rank: u32, actions: &mut Vec<Action>) {
        if self.held.get(&rank).is_some_and(|h| h.conn == conn) {
            let holder = self.held.remove(&rank);
            if !self.linked.contains(&rank) {
                self.todo.insert(rank);
                if let Some(t) = holder.and_then(|h| h.task_id) {
                    self.job_map.remove(&t);
                }
            }
        }
        self.turns.retain(|&(c, _)| c != conn);
        if self.current == Some(conn) {
            self.current = None;
        }
        self.advance(actions);
    }
}
