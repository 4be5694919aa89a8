//! The launcher's rendezvous decisions, without sockets.
//!
//! [`Gathering`] is fed each check-in that passed its handshake, together with the
//! connection it came on (any value: the server gives it a `TcpStream`, the tests a
//! number), and answers with a [`Step`]: refuse it, or count the rank as joined and
//! answer these connections with this list. It decides which generation a check-in
//! belongs to, when a generation is complete, what a restarted rank's second check-in
//! replaces, and which check-ins are refused; the serving loop in
//! [`rendezvous_server`](super::rendezvous_server) accepts, reads, writes and logs.
//! So each ordering (a rank restarted before or after its generation was answered, a
//! check-in for another generation arriving in between, the generation limit reached)
//! is a deterministic test below rather than a job that has to be lucky with its
//! timing.
//!
//! No decision here depends on the time: the only clocks of the rendezvous bound one
//! connection's reads and writes, and those stay with the sockets.

use super::rendezvous::CheckIn;
use std::collections::HashMap;

/// At most this many generations of communicators are kept (each holds a list of
/// endpoints), so that check-ins for ever new generations cannot exhaust memory.
pub(crate) const MAX_GENERATIONS: usize = 4096;

/// Why a check-in was refused (its connection is to be closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The process was told another world size than the launcher's.
    WrongWorld {
        /// The world size the check-in named.
        claimed: u32,
    },
    /// The rank is not below the world size.
    RankOutside {
        /// The rank the check-in named.
        rank: u32,
    },
    /// The check-in opens a new generation while [`MAX_GENERATIONS`] are kept.
    TooManyGenerations {
        /// The generation the check-in named.
        generation: u32,
    },
}

/// The endpoint list for one waiting connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answer<C> {
    /// Where to send it.
    pub(crate) conn: C,
    /// The rank that checked in on `conn`.
    pub(crate) rank: u32,
    /// Every rank's endpoint, in rank order.
    pub(crate) endpoints: Vec<String>,
}

/// A check-in counted: what the loop reports, logs and sends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Joined<C> {
    /// The rank that checked in (reported to the launcher as having joined).
    pub(crate) rank: u32,
    /// Its generation.
    pub(crate) generation: u32,
    /// The rank had checked in at this generation before (a restarted process): its
    /// endpoint was replaced.
    pub(crate) replaced: bool,
    /// This check-in was the last one missing: the generation is answered now.
    pub(crate) completed: bool,
    /// The connection of the rank's earlier check-in, still waiting for the list: it
    /// is closed unanswered (its process was restarted).
    pub(crate) superseded: Option<C>,
    /// The lists to send now, in rank order.
    pub(crate) answers: Vec<Answer<C>>,
}

/// What to do with one check-in.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<C> {
    /// Close `conn` unanswered; nothing was counted.
    Refused {
        /// The check-in's connection, handed back to be closed.
        conn: C,
        /// Why.
        refusal: Refusal,
    },
    /// The rank joined.
    Joined(Joined<C>),
}

/// One generation of communicators: the endpoints checked in, and the connections
/// waiting for the list.
#[derive(Debug)]
struct Generation<C> {
    waiting: Vec<Option<C>>,
    endpoints: Vec<Option<String>>,
    answered: bool,
}

impl<C> Generation<C> {
    fn new(world: u32) -> Generation<C> {
        Generation {
            waiting: (0..world).map(|_| None).collect(),
            endpoints: vec![None; world as usize],
            answered: false,
        }
    }

    /// Every slot is filled once the generation is complete, so nothing is defaulted.
    fn list(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|e| e.clone().unwrap_or_default())
            .collect()
    }
}

/// The rendezvous's state between its sockets: see the module documentation.
#[derive(Debug)]
pub(crate) struct Gathering<C> {
    world: u32,
    generations: HashMap<u32, Generation<C>>,
}

impl<C> Gathering<C> {
    /// Nothing checked in yet, for a job of `world` ranks.
    pub(crate) fn new(world: u32) -> Gathering<C> {
        Gathering {
            world,
            generations: HashMap::new(),
        }
    }

    /// A check-in that passed its handshake, on `conn`. One wrong on several counts is
    /// refused for the first of: the world size, the rank, the generation limit.
    pub(crate) fn on_check_in(&mut self, check_in: CheckIn, conn: C) -> Step<C> {
        if let Some(refusal) = self.refusal(&check_in) {
            return Step::Refused { conn, refusal };
        }
        let world = self.world;
        let CheckIn {
            rank,
            generation,
            endpoint,
            ..
        } = check_in;
        let pending = self
            .generations
            .entry(generation)
            .or_insert_with(|| Generation::new(world));
        let slot = &mut pending.endpoints[rank as usize];
        let replaced = slot.is_some();
        *slot = Some(endpoint);
        let mut joined = Joined {
            rank,
            generation,
            replaced,
            completed: false,
            superseded: None,
            answers: Vec::new(),
        };
        if pending.answered {
            joined.answers.push(Answer {
                conn,
                rank,
                endpoints: pending.list(),
            });
            return Step::Joined(joined);
        }
        joined.superseded = pending.waiting[rank as usize].replace(conn);
        if pending.endpoints.iter().all(Option::is_some) {
            pending.answered = true;
            joined.completed = true;
            let list = pending.list();
            joined.answers = pending
                .waiting
                .iter_mut()
                .enumerate()
                .filter_map(|(rank, conn)| {
                    conn.take().map(|conn| Answer {
                        conn,
                        rank: rank as u32,
                        endpoints: list.clone(),
                    })
                })
                .collect();
        }
        Step::Joined(joined)
    }

    /// Why `check_in` is refused, if it is: the world size is checked first, then the
    /// rank, then the generation limit.
    fn refusal(&self, check_in: &CheckIn) -> Option<Refusal> {
        if check_in.world != self.world {
            return Some(Refusal::WrongWorld {
                claimed: check_in.world,
            });
        }
        if check_in.rank >= self.world {
            return Some(Refusal::RankOutside {
                rank: check_in.rank,
            });
        }
        let generation = check_in.generation;
        if !self.generations.contains_key(&generation) && self.generations.len() >= MAX_GENERATIONS
        {
            return Some(Refusal::TooManyGenerations { generation });
        }
        None
    }
}

/// With a job secret, the check-in must name the rank its proof claimed (`claimed`:
/// `None` without a secret).
pub(crate) fn check_claim(claimed: Option<u32>, check_in: &CheckIn) -> Result<(), String> {
    match claimed {
        Some(claimed) if claimed != check_in.rank => Err(format!(
            "check-in for rank {} after authenticating as rank {claimed}",
            check_in.rank
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "rendezvous_state_tests.rs"]
mod tests;
