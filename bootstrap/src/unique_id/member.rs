//! A rank's decisions, without sockets or clocks: the root's answer and the ring's
//! entries in, what to link and what to send out.
//!
//! The shell (`ring_exchange`) checks in, reads the root's answer, links the ring and
//! moves the entries; each thing it learns is a [`MemberEvent`], and each
//! [`MemberAction`] says what to do next, up to [`MemberAction::Done`]. The
//! simulation (`sim_tests.rs`) drives the same machine.

use super::root::{ACCEPTED, DUPLICATE};
use super::{IdError, LEFT, MAX_TEXT};
use std::net::SocketAddr;

/// What a rank learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MemberEvent {
    /// The root answered `status` with `texts` (those [`Member::answer_texts`]
    /// names).
    Answer {
        /// The answer's status.
        status: u32,
        /// Its texts.
        texts: Vec<String>,
    },
    /// Both ring links are up: the hello went to the successor, and the
    /// predecessor's hello came (see [`Member::predecessor_hello`]).
    Linked,
    /// The predecessor sent the next entry.
    Entry(String),
}

/// What a rank does next.
#[derive(Debug)]
pub(crate) enum MemberAction {
    /// Connect to the successor's ring listener and say hello; wait for the
    /// predecessor's hello, probing its listener to see whether it left.
    Link {
        /// The successor's ring listener.
        successor: SocketAddr,
        /// The predecessor's ring listener.
        predecessor: SocketAddr,
    },
    /// Send this entry to the successor, then wait for the predecessor's.
    Send(String),
    /// The bootstrap is over: every rank's endpoint in rank order, or why not.
    Done(Result<Vec<String>, IdError>),
}

/// Which ring hello a rank's listener takes: its predecessor's, in its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PredecessorHello {
    tag: u64,
    rank: u32,
}

impl PredecessorHello {
    /// Whether a ring hello with `tag` and `rank` is the predecessor's; anything
    /// else is a stranger's (or another rank's probe), closed.
    pub(crate) fn accepts(self, tag: u64, rank: u32) -> bool {
        tag == self.tag && rank == self.rank
    }

    /// The predecessor's rank.
    pub(crate) fn rank(self) -> u32 {
        self.rank
    }
}

/// One rank's part in the bootstrap of job `tag`.
#[derive(Debug)]
pub(crate) struct Member {
    tag: u64,
    rank: u32,
    world: u32,
    root: SocketAddr,
    /// Every rank's endpoint, as far as known.
    all: Vec<String>,
    /// Entries received so far.
    step: usize,
}

impl Member {
    /// Rank `rank` of `world` in the job of `tag` whose root is `root`, with
    /// `endpoint`; refused before any traffic when the rank is outside the world or the
    /// endpoint too long to send.
    pub(crate) fn new(
        tag: u64,
        (rank, world): (u32, u32),
        root: SocketAddr,
        endpoint: &str,
    ) -> Result<Member, IdError> {
        if world == 0 || rank >= world {
            return Err(IdError::BadRank { rank, world });
        }
        if endpoint.len() > MAX_TEXT as usize {
            return Err(IdError::Address(format!(
                "endpoint longer than {MAX_TEXT} bytes"
            )));
        }
        let mut all = vec![String::new(); world as usize];
        all[rank as usize] = endpoint.to_string();
        Ok(Member {
            tag,
            rank,
            world,
            root,
            all,
            step: 0,
        })
    }

    /// This rank.
    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    /// The world size.
    pub(crate) fn world(&self) -> u32 {
        self.world
    }

    /// The successor's rank.
    pub(crate) fn successor(&self) -> u32 {
        (self.rank + 1) % self.world
    }

    /// The predecessor's rank.
    pub(crate) fn predecessor(&self) -> u32 {
        (self.rank + self.world - 1) % self.world
    }

    /// The texts that follow an answer's `status`, by what each is: the two
    /// neighbours' ring addresses, or one reason.
    pub(crate) fn answer_texts(status: u32) -> &'static [&'static str] {
        if status == ACCEPTED {
            &["successor's ring address", "predecessor's ring address"]
        } else {
            &["reason"]
        }
    }

    /// The ring hello this rank's listener waits for: its predecessor's.
    pub(crate) fn predecessor_hello(&self) -> PredecessorHello {
        PredecessorHello {
            tag: self.tag,
            rank: self.predecessor(),
        }
    }

    /// Takes in `event`.
    pub(crate) fn handle(&mut self, event: MemberEvent) -> MemberAction {
        match event {
            MemberEvent::Answer { status, texts } => self.answer(status, &texts),
            MemberEvent::Linked => self.next(),
            MemberEvent::Entry(text) => {
                let n = self.world as usize;
                let r = self.rank as usize;
                self.all[(r + n - self.step - 1) % n] = text;
                self.step += 1;
                self.next()
            }
        }
    }

    /// The entry to send now (at step `k`, entry `rank - k`), or the end.
    fn next(&self) -> MemberAction {
        let n = self.world as usize;
        if self.step + 1 >= n {
            return MemberAction::Done(Ok(self.all.clone()));
        }
        let r = self.rank as usize;
        MemberAction::Send(self.all[(r + n - self.step) % n].clone())
    }

    fn answer(&self, status: u32, texts: &[String]) -> MemberAction {
        let peer = format!("root {} (rank 0)", self.root);
        let text = |i: usize| texts.get(i).cloned().unwrap_or_default();
        let address = |i: usize| {
            text(i)
                .parse::<SocketAddr>()
                .map_err(|_| IdError::Protocol {
                    peer: peer.clone(),
                    reason: format!("ring address {:?} is not an address", text(i)),
                })
        };
        let failed = match status {
            ACCEPTED => match (address(0), address(1)) {
                (Ok(successor), Ok(predecessor)) => {
                    return MemberAction::Link {
                        successor,
                        predecessor,
                    };
                }
                (Err(e), _) | (_, Err(e)) => e,
            },
            DUPLICATE => IdError::DuplicateRank {
                root: self.root,
                rank: self.rank,
                reason: text(0),
            },
            LEFT => match text(0).parse::<u32>() {
                Ok(gone) => IdError::Left {
                    rank: gone,
                    reason: "its connection to the root closed after it checked in (it \
                             died or was interrupted)"
                        .into(),
                },
                Err(_) => IdError::Protocol {
                    peer,
                    reason: format!("departed rank {:?} is not a number", text(0)),
                },
            },
            _ => IdError::WrongWorld {
                root: self.root,
                world: self.world,
                reason: text(0),
            },
        };
        MemberAction::Done(Err(failed))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn root() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    /// Three members pass their entries round the ring, each step what the shell
    /// does: send, then take the predecessor's.
    #[test]
    fn entries_go_round_the_ring() {
        let n = 3u32;
        let mut members: Vec<Member> = (0..n)
            .map(|r| Member::new(9, (r, n), root(), &format!("ep{r}")).unwrap())
            .collect();
        let mut out: Vec<MemberAction> = members
            .iter_mut()
            .map(|m| m.handle(MemberEvent::Linked))
            .collect();
        loop {
            if let Some(MemberAction::Done(_)) = out.first() {
                break;
            }
            let sent: Vec<String> = out
                .iter()
                .map(|a| match a {
                    MemberAction::Send(text) => text.clone(),
                    a => panic!("{a:?}"),
                })
                .collect();
            out = (0..n as usize)
                .map(|r| {
                    let from = (r + n as usize - 1) % n as usize;
                    members[r].handle(MemberEvent::Entry(sent[from].clone()))
                })
                .collect();
        }
        let want: Vec<String> = (0..n).map(|r| format!("ep{r}")).collect();
        for a in out {
            assert!(
                matches!(a, MemberAction::Done(Ok(ref all)) if *all == want),
                "{a:?}"
            );
        }
    }

    #[test]
    fn answers_become_links_or_named_errors() {
        let mut m = Member::new(9, (1, 3), root(), "ep1").unwrap();
        let answer = |status: u32, texts: &[&str]| MemberEvent::Answer {
            status,
            texts: texts.iter().map(|t| t.to_string()).collect(),
        };
        assert!(matches!(
            m.handle(answer(0, &["127.0.0.1:2", "127.0.0.1:3"])),
            MemberAction::Link { .. }
        ));
        assert!(matches!(
            m.handle(answer(0, &["nowhere", "127.0.0.1:3"])),
            MemberAction::Done(Err(IdError::Protocol { .. }))
        ));
        assert!(matches!(
            m.handle(answer(LEFT, &["2"])),
            MemberAction::Done(Err(IdError::Left { rank: 2, .. }))
        ));
        assert!(matches!(
            m.handle(answer(DUPLICATE, &["taken"])),
            MemberAction::Done(Err(IdError::DuplicateRank { rank: 1, .. }))
        ));
        assert!(matches!(
            m.handle(answer(2, &["world"])),
            MemberAction::Done(Err(IdError::WrongWorld { world: 3, .. }))
        ));
        assert!(matches!(
            Member::new(9, (3, 3), root(), ""),
            Err(IdError::BadRank { .. })
        ));
        let hello = m.predecessor_hello();
        assert!(hello.accepts(9, 0) && !hello.accepts(9, 2) && !hello.accepts(8, 0));
    }
}
