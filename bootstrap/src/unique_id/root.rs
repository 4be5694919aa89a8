//! The root's decisions, without sockets or clocks: check-ins in, answers out.
//!
//! The shell (`serve_root`) reads each connection's check-in, feeds it here as a
//! [`RootEvent`], writes the [`RootAction`]s it gets back, watches the connections
//! [`Root::waiting`] names for a close, and asks [`Root::poll`] with the time whether
//! the root is done. Every choice the root makes (whom to refuse, when the job is
//! complete, who left and whom to tell, when to give up) is made here, so the
//! simulation (`sim_tests.rs`) runs the root the threads run.

use super::{IdError, LEFT, LINGER, MAX_REFUSALS_KEPT};
use std::time::Instant;

/// A connection, as the shell numbers them.
pub(crate) type Conn = u64;

/// Status of an answer that accepts the check-in.
pub(crate) const ACCEPTED: u32 = 0;
/// Status: another connection already checked in as this rank.
pub(crate) const DUPLICATE: u32 = 1;
/// Status: the check-in's world size is not the root's.
pub(crate) const WRONG_WORLD: u32 = 2;
/// Status: the rank is outside the world.
pub(crate) const BAD_RANK: u32 = 3;

/// What the root hears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootEvent {
    /// Connection `conn` from `peer` sent a whole check-in.
    CheckIn {
        /// The connection.
        conn: Conn,
        /// Who connected, for the log and the refusals kept.
        peer: String,
        /// The job tag it gave.
        tag: u64,
        /// The rank it claims.
        rank: u32,
        /// Its world size.
        world: u32,
        /// Its ring listener's address.
        ring: String,
    },
    /// Connection `conn`, waiting for its answer, was closed by its peer.
    Closed(Conn),
}

/// What the root does with a connection it is done with: writes the answer, if any
/// (none for a connection of another job), then closes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootAction {
    /// The connection.
    pub(crate) conn: Conn,
    /// What to write on it first.
    pub(crate) answer: Option<Answer>,
}

/// An answer of the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The rank the connection checked in as.
    pub(crate) rank: u32,
    /// [`ACCEPTED`], a refusal, or [`LEFT`].
    pub(crate) status: u32,
    /// The successor's and predecessor's ring addresses, or the reason, or the
    /// departed rank's number.
    pub(crate) texts: Vec<String>,
}

/// A rank that left while others waited: who, whom the root told, since when.
#[derive(Debug)]
struct Left {
    rank: u32,
    told: Vec<bool>,
    seen: Instant,
}

/// The root of one job: which rank checked in with which ring address, who waits for
/// the answer, and whether a rank left.
#[derive(Debug)]
pub(crate) struct Root {
    tag: u64,
    world: u32,
    ring: Vec<Option<String>>,
    /// Ranks checked in and waiting for the answer, in check-in order.
    waiting: Vec<(u32, Conn)>,
    left: Option<Left>,
    /// Refusals, as the root told them, for [`IdError::Missing`].
    refused: Vec<String>,
    started: Instant,
    until: Instant,
    complete: bool,
}

impl Root {
    /// The root of job `tag` with `world` ranks, started at `now`, giving up at `until`.
    pub(crate) fn new(tag: u64, world: u32, now: Instant, until: Instant) -> Root {
        Root {
            tag,
            world,
            ring: vec![None; world as usize],
            waiting: Vec::new(),
            left: None,
            refused: Vec::new(),
            started: now,
            until,
            complete: false,
        }
    }

    /// The connections to watch for a close: those waiting for their answer, until a
    /// rank has left (then none: the others were told).
    pub(crate) fn waiting(&self) -> impl Iterator<Item = Conn> + '_ {
        self.waiting.iter().map(|&(_, conn)| conn)
    }

    /// Takes in `event` at `now`.
    pub(crate) fn handle(&mut self, event: RootEvent, now: Instant) -> Vec<RootAction> {
        if self.complete {
            return Vec::new();
        }
        match event {
            RootEvent::CheckIn {
                conn,
                peer,
                tag,
                rank,
                world,
                ring,
            } => self.check_in(conn, &peer, (tag, rank, world), ring),
            RootEvent::Closed(conn) => self.closed(conn, now),
        }
    }

    fn check_in(
        &mut self,
        conn: Conn,
        peer: &str,
        (tag, rank, world): (u64, u32, u32),
        ring: String,
    ) -> Vec<RootAction> {
        if tag != self.tag {
            tracing::warn!(%peer, tag = format!("{tag:016x}"), "bootstrap root: wrong job tag, connection closed");
            return vec![close(conn)];
        }
        if let Some(left) = &mut self.left {
            // Told at once, so that it does not wait for the timeout.
            if rank < self.world {
                left.told[rank as usize] = true;
                let texts = vec![left.rank.to_string()];
                return vec![answer(conn, rank, LEFT, texts)];
            }
            return vec![close(conn)];
        }
        let refusal = if world != self.world {
            Some((
                WRONG_WORLD,
                format!("the root's world size is {}", self.world),
            ))
        } else {
            match self.ring.get(rank as usize) {
                None => Some((
                    BAD_RANK,
                    format!("rank {rank} is outside a world of {world}"),
                )),
                Some(Some(first)) => Some((
                    DUPLICATE,
                    format!("rank {rank} already checked in (ring {first})"),
                )),
                Some(None) => None,
            }
        };
        if let Some((status, reason)) = refusal {
            tracing::warn!(%peer, rank, world, %reason, "bootstrap root: check-in refused");
            if self.refused.len() < MAX_REFUSALS_KEPT {
                self.refused.push(format!(
                    "rank {rank} from {peer} with world size {world}: {reason}"
                ));
            }
            return vec![answer(conn, rank, status, vec![reason])];
        }
        self.ring[rank as usize] = Some(ring);
        self.waiting.push((rank, conn));
        let all: Vec<String> = self.ring.iter().flatten().cloned().collect();
        if all.len() < self.world as usize {
            return Vec::new();
        }
        self.complete = true;
        let n = all.len();
        self.waiting
            .drain(..)
            .map(|(rank, conn)| {
                let r = rank as usize;
                let texts = vec![all[(r + 1) % n].clone(), all[(r + n - 1) % n].clone()];
                answer(conn, rank, ACCEPTED, texts)
            })
            .collect()
    }

    /// A waiting rank's connection closed: it died or was stopped. Every rank waiting
    /// is told, and so is every rank that checks in within [`LINGER`].
    fn closed(&mut self, conn: Conn, now: Instant) -> Vec<RootAction> {
        if self.left.is_some() {
            return Vec::new();
        }
        let Some(i) = self.waiting.iter().position(|&(_, c)| c == conn) else {
            return Vec::new();
        };
        let (gone, _) = self.waiting.remove(i);
        tracing::warn!(
            rank = gone,
            "bootstrap root: rank left after checking in; telling the others"
        );
        let mut told = vec![false; self.world as usize];
        let actions = self
            .waiting
            .drain(..)
            .map(|(rank, conn)| {
                told[rank as usize] = true;
                answer(conn, rank, LEFT, vec![gone.to_string()])
            })
            .collect();
        self.left = Some(Left {
            rank: gone,
            told,
            seen: now,
        });
        actions
    }

    /// Whether the root is done at `now`: `Ok` once every rank was answered; the
    /// departed rank once every other rank was told it left, or [`LINGER`] after it
    /// left; who never came at the timeout.
    pub(crate) fn poll(&self, now: Instant) -> Option<Result<(), IdError>> {
        if self.complete {
            return Some(Ok(()));
        }
        if let Some(left) = &self.left {
            let all_told = (0..self.world).all(|r| r == left.rank || left.told[r as usize]);
            if all_told || now >= self.until || now.duration_since(left.seen) >= LINGER {
                return Some(Err(IdError::Left {
                    rank: left.rank,
                    reason: "its connection to the root closed after it checked in".into(),
                }));
            }
            return None;
        }
        (now >= self.until).then(|| {
            Err(IdError::Missing {
                waited: now.duration_since(self.started),
                missing: self.missing(),
                refused: self.refused.clone(),
            })
        })
    }

    /// Ranks not checked in yet.
    pub(crate) fn missing(&self) -> Vec<u32> {
        (0..self.world)
            .filter(|&r| self.ring[r as usize].is_none())
            .collect()
    }
}

fn answer(conn: Conn, rank: u32, status: u32, texts: Vec<String>) -> RootAction {
    RootAction {
        conn,
        answer: Some(Answer {
            rank,
            status,
            texts,
        }),
    }
}

fn close(conn: Conn) -> RootAction {
    RootAction { conn, answer: None }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::Duration;

    fn check_in(conn: Conn, tag: u64, rank: u32, world: u32, ring: &str) -> RootEvent {
        RootEvent::CheckIn {
            conn,
            peer: format!("peer {conn}"),
            tag,
            rank,
            world,
            ring: ring.into(),
        }
    }

    #[test]
    fn the_root_refuses_and_completes() {
        let now = Instant::now();
        let mut root = Root::new(7, 3, now, now + Duration::from_secs(5));
        assert_eq!(root.handle(check_in(1, 8, 0, 3, "a"), now), vec![close(1)]);
        let refused = |a: Vec<RootAction>| match &a[..] {
            [
                RootAction {
                    answer: Some(Answer { status, .. }),
                    ..
                },
            ] => *status,
            _ => panic!("{a:?}"),
        };
        assert_eq!(
            refused(root.handle(check_in(2, 7, 0, 4, "a"), now)),
            WRONG_WORLD
        );
        assert_eq!(
            refused(root.handle(check_in(3, 7, 3, 3, "a"), now)),
            BAD_RANK
        );
        assert!(root.handle(check_in(4, 7, 1, 3, "b"), now).is_empty());
        assert_eq!(
            refused(root.handle(check_in(5, 7, 1, 3, "x"), now)),
            DUPLICATE
        );
        assert_eq!(root.missing(), vec![0, 2]);
        assert!(root.handle(check_in(6, 7, 2, 3, "c"), now).is_empty());
        assert!(root.poll(now).is_none());
        let answers = root.handle(check_in(7, 7, 0, 3, "a"), now);
        let texts = |conn: Conn| {
            answers.iter().find_map(|a| match &a.answer {
                Some(Answer {
                    status: ACCEPTED,
                    texts,
                    ..
                }) if a.conn == conn => Some(texts.clone()),
                _ => None,
            })
        };
        assert_eq!(texts(4), Some(vec!["c".to_string(), "a".to_string()]));
        assert_eq!(texts(6), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(texts(7), Some(vec!["b".to_string(), "c".to_string()]));
        assert!(matches!(root.poll(now), Some(Ok(()))));
    }

    #[test]
    fn a_rank_that_leaves_is_told_to_the_others() {
        let now = Instant::now();
        let mut root = Root::new(7, 3, now, now + Duration::from_secs(5));
        root.handle(check_in(1, 7, 0, 3, "a"), now);
        root.handle(check_in(2, 7, 1, 3, "b"), now);
        let told = root.handle(RootEvent::Closed(2), now);
        assert_eq!(told, vec![answer(1, 0, LEFT, vec!["1".into()])]);
        assert!(root.poll(now).is_none());
        assert!(root.waiting().next().is_none());
        // Rank 2, late, is told too; then the root is done.
        let late = root.handle(check_in(3, 7, 2, 3, "c"), now);
        assert_eq!(late, vec![answer(3, 2, LEFT, vec!["1".into()])]);
        assert!(matches!(
            root.poll(now),
            Some(Err(IdError::Left { rank: 1, .. }))
        ));
    }

    #[test]
    fn the_root_gives_up_at_its_timeout_naming_who_never_came() {
        let now = Instant::now();
        let until = now + Duration::from_secs(5);
        let mut root = Root::new(7, 2, now, until);
        root.handle(check_in(1, 7, 1, 2, "b"), now);
        assert!(root.poll(until - Duration::from_millis(1)).is_none());
        assert!(matches!(
            root.poll(until),
            Some(Err(IdError::Missing { missing, .. })) if missing == vec![0]
        ));
    }
}
