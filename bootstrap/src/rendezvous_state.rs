//! The launcher's rendezvous decisions, without sockets.
//!
//! [`Gathering`] is fed each check-in that passed its handshake, together with the
//! connection it came on (any value: the server gives it a `TcpStream`, the tests a
//! number), and answers with a [`Step`]: refuse it, or count the rank as joined and
//! answer these connections with this list. It decides which generation a check-in
//! belongs to, when a generation is complete, what a restarted rank's second check-in
//! replaces, and which check-ins are refused; the serving loop in
//! [`rendezvous_server`](super::rendezvous_server) accepts, reads, writes and logs.
//! It also hears from the launcher which ranks ended for good ([`Gathering::on_exit`]):
//! a generation missing one of them can never form, so its waiting check-ins are
//! refused at once, naming them, instead of each waiting out its timeout (a later
//! communicator that only some ranks ask for).
//! So each ordering (a rank restarted before or after its generation was answered, a
//! check-in for another generation arriving in between, the generation limit reached,
//! a rank exiting before or after the others check in) is a deterministic test below
//! rather than a job that has to be lucky with its timing.
//!
//! No decision here depends on the time: the only clocks of the rendezvous bound one
//! connection's reads and writes, and those stay with the sockets.

use super::rendezvous::CheckIn;
use std::collections::{BTreeMap, HashMap};

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

/// A waiting check-in whose generation can no longer form: ranks it needs ended for
/// good (the launcher saw them exit) without checking in at it. Its connection is
/// answered with the refusal, naming them, instead of waiting out its timeout.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unformable<C> {
    /// Where to send the refusal.
    pub(crate) conn: C,
    /// The rank that checked in on `conn`.
    pub(crate) rank: u32,
    /// Its generation.
    pub(crate) generation: u32,
    /// The exited ranks the generation misses, in rank order, each with how it ended.
    pub(crate) exited: Vec<(u32, String)>,
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
    /// The generation misses ranks that exited: every connection waiting at it (this
    /// one included) is refused now, in rank order.
    pub(crate) unformable: Vec<Unformable<C>>,
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

    /// The waiting connections, taken, when ranks in `exited` never checked in here
    /// (none otherwise): the generation `number` cannot form.
    fn unformable(&mut self, number: u32, exited: &BTreeMap<u32, String>) -> Vec<Unformable<C>> {
        let missing: Vec<(u32, String)> = exited
            .iter()
            .filter(|(r, _)| {
                self.endpoints
                    .get(**r as usize)
                    .is_some_and(Option::is_none)
            })
            .map(|(r, how)| (*r, how.clone()))
            .collect();
        if missing.is_empty() {
            return Vec::new();
        }
        self.waiting
            .iter_mut()
            .enumerate()
            .filter_map(|(rank, conn)| {
                conn.take().map(|conn| Unformable {
                    conn,
                    rank: rank as u32,
                    generation: number,
                    exited: missing.clone(),
                })
            })
            .collect()
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
    /// Ranks that ended for good, with how: a generation missing one cannot form.
    exited: BTreeMap<u32, String>,
}

impl<C> Gathering<C> {
    /// Nothing checked in yet, for a job of `world` ranks.
    pub(crate) fn new(world: u32) -> Gathering<C> {
        Gathering {
            world,
            generations: HashMap::new(),
            exited: BTreeMap::new(),
        }
    }

    /// Rank `rank` ended for good (`how`: its exit, for the refusal's words). Every
    /// generation still gathering that it never checked in at can no longer form: its
    /// waiting connections are returned to be refused, by generation and rank.
    pub(crate) fn on_exit(&mut self, rank: u32, how: String) -> Vec<Unformable<C>> {
        if rank >= self.world {
            return Vec::new();
        }
        self.exited.insert(rank, how);
        let mut generations: Vec<u32> = self
            .generations
            .iter()
            .filter(|(_, g)| !g.answered && g.endpoints[rank as usize].is_none())
            .map(|(n, _)| *n)
            .collect();
        generations.sort_unstable();
        let exited = &self.exited;
        generations
            .into_iter()
            .flat_map(|n| match self.generations.get_mut(&n) {
                Some(pending) => pending.unformable(n, exited),
                None => Vec::new(),
            })
            .collect()
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
            unformable: Vec::new(),
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
        } else {
            // Ranks that already ended will never complete it: say so now rather
            // than at the waiting ranks' timeouts.
            joined.unformable = pending.unformable(generation, &self.exited);
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
