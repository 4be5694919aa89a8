//! The classic join's decisions, apart from its sockets and its clock: whether the
//! assignment is one this worker can use, which peer to connect to next in a
//! negotiation round and what to report, whether a peer that answered is the one the
//! tracker named, and when the wait for the peers that connect to this worker is over.
//!
//! [`Negotiation`] is fed the tracker's offers and the outcome of each connect and
//! answers with the next [`Step`]; [`Accepting`] is fed the ranks that accepted peers
//! say they are, and the time. The driver in [`super`] only reads, writes, connects
//! and accepts, so the orderings that matter (a connect that fails and is offered
//! again, a rank offered twice, a peer that stays away past the deadline) are unit
//! tests below rather than jobs.

use super::assignment::Assignment;
use crate::client::ClientError;
use crate::client::error::At;
use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The tracker's refusal: the assigned rank is −1 (checked on the first field, which
/// the tracker sends alone when it refuses).
pub(super) fn refused(at: SocketAddr, rank: i32) -> Option<ClientError> {
    (rank == -1).then(|| ClientError::Refused {
        addr: at.to_string(),
        reason: "it assigned rank -1 (duplicate rank, wrong world size, a full job, or a \
                 recover for a rank that never joined or already shut down)"
            .into(),
    })
}

/// The assignment message's fields as read (docs/rabit-protocol.md, *The assignment
/// message*).
#[derive(Clone, Debug)]
pub(super) struct Fields {
    pub(super) rank: i32,
    pub(super) parent: i32,
    pub(super) world: i32,
    pub(super) tree: Vec<i32>,
    pub(super) prev: i32,
    pub(super) next: i32,
}

/// The assignment, checked, for a worker that asked for rank `wanted` (if any).
pub(super) fn assignment(
    at: SocketAddr,
    wanted: Option<u32>,
    f: Fields,
) -> Result<Assignment, ClientError> {
    let a = Assignment::check(f.rank, f.parent, f.world, f.tree, f.prev, f.next)
        .map_err(|reason| At(at).bad("assignment", reason))?;
    if let Some(wanted) = wanted.filter(|&r| r != a.rank) {
        return Err(At(at).bad(
            "assignment",
            format!("asked for rank {wanted}, got {}", a.rank),
        ));
    }
    Ok(a)
}

/// One round's offer from the tracker (docs/rabit-protocol.md, *Link negotiation*):
/// the peers to connect to, as sent (host, port, rank), and how many peers will
/// connect to this worker instead.
#[derive(Clone, Debug)]
pub(super) struct Offer {
    pub(super) connect: Vec<(String, i32, i32)>,
    pub(super) accept: usize,
}

/// What the driver does next in the negotiation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Open a round: send these linked ranks (count, then each).
    SendLinked(Vec<u32>),
    /// Read the tracker's offer (each count at most `cap`) and feed it to
    /// [`Negotiation::on_offer`].
    ReadOffer {
        /// The most peers an offer may name: this worker's links.
        cap: usize,
    },
    /// Connect to `rank` at `host:port` and shake hands; feed the outcome to
    /// [`Negotiation::on_dialled`].
    Dial {
        /// As the tracker sent it.
        host: String,
        /// The peer's listening port.
        port: u16,
        /// The rank the tracker says listens there.
        rank: u32,
    },
    /// Close the round: send how many connects failed. With 0 the negotiation is over
    /// and the next step is [`Step::Accept`]; otherwise another round opens.
    SendFailed(i32),
    /// The negotiation is over: send the listening port, then accept this many peers.
    Accept(usize),
}

/// How a connect the driver was told to make went.
#[derive(Clone, Copy, Debug)]
pub(super) enum Dialled {
    /// No connection, or no handshake: the tracker is told and offers the peer again.
    Unreachable,
    /// The peer at `peer` answered the handshake with rank `rank`.
    Answered {
        /// The peer's address.
        peer: SocketAddr,
        /// The rank it sent.
        rank: i32,
    },
}

#[derive(Clone, Debug)]
enum Phase {
    Open,
    WaitOffer,
    Dialling {
        pending: VecDeque<(String, i32, i32)>,
        current: Option<(String, u16, u32)>,
        failed: i32,
        accept: usize,
    },
    Done {
        accept: usize,
    },
}

/// The worker's side of the link negotiation: see the module documentation.
#[derive(Clone, Debug)]
pub(super) struct Negotiation {
    at: SocketAddr,
    links: BTreeSet<u32>,
    linked: BTreeSet<u32>,
    phase: Phase,
}

impl Negotiation {
    /// The negotiation of the links of assignment `a`, from the tracker at `at`.
    pub(super) fn new(at: SocketAddr, a: &Assignment) -> Negotiation {
        Negotiation {
            at,
            links: a.link_set.clone(),
            linked: BTreeSet::new(),
            phase: Phase::Open,
        }
    }

    /// The ranks linked so far.
    #[cfg(test)]
    pub(super) fn linked(&self) -> &BTreeSet<u32> {
        &self.linked
    }

    /// What to do next. An offered peer that is not one of this worker's links, is
    /// linked already, or has no valid port ends the join.
    pub(super) fn next(&mut self) -> Result<Step, ClientError> {
        match &mut self.phase {
            Phase::Open => {
                self.phase = Phase::WaitOffer;
                Ok(Step::SendLinked(self.linked.iter().copied().collect()))
            }
            Phase::WaitOffer => Ok(Step::ReadOffer {
                cap: self.links.len(),
            }),
            Phase::Dialling {
                current: Some((host, port, rank)),
                ..
            } => Ok(Step::Dial {
                host: host.clone(),
                port: *port,
                rank: *rank,
            }),
            Phase::Dialling {
                pending,
                current,
                failed,
                accept,
            } => {
                let Some((host, port, rank)) = pending.pop_front() else {
                    let failed = *failed;
                    self.phase = if failed == 0 {
                        Phase::Done { accept: *accept }
                    } else {
                        Phase::Open
                    };
                    return Ok(Step::SendFailed(failed));
                };
                let rank = peer_rank(&self.links, &self.linked, rank)
                    .map_err(|reason| At(self.at).bad("peer", reason))?;
                let port = u16::try_from(port)
                    .map_err(|_| At(self.at).bad("peer", format!("rank {rank} has port {port}")))?;
                *current = Some((host.clone(), port, rank));
                Ok(Step::Dial { host, port, rank })
            }
            Phase::Done { accept } => Ok(Step::Accept(*accept)),
        }
    }

    /// The tracker's offer for the round just opened. Its counts must add up, with the
    /// links already made, to this worker's links.
    pub(super) fn on_offer(&mut self, offer: Offer) -> Result<(), ClientError> {
        let cap = self.links.len();
        let num_conn = offer.connect.len();
        if self.linked.len() + num_conn + offer.accept != cap {
            return Err(At(self.at).bad(
                "negotiation round",
                format!(
                    "{num_conn} to connect + {} to accept + {} linked != {cap} links",
                    offer.accept,
                    self.linked.len()
                ),
            ));
        }
        self.phase = Phase::Dialling {
            pending: offer.connect.into(),
            current: None,
            failed: 0,
            accept: offer.accept,
        };
        Ok(())
    }

    /// How the last [`Step::Dial`] went; whether to keep the connection as the link
    /// to that rank. A peer that answers as another rank than the tracker named ends
    /// the join.
    pub(super) fn on_dialled(&mut self, outcome: Dialled) -> Result<bool, ClientError> {
        let Phase::Dialling {
            current, failed, ..
        } = &mut self.phase
        else {
            return Ok(false);
        };
        let Some((_, _, rank)) = current.take() else {
            return Ok(false);
        };
        match outcome {
            Dialled::Unreachable => {
                *failed += 1;
                Ok(false)
            }
            Dialled::Answered { rank: got, .. } if got == rank as i32 => {
                self.linked.insert(rank);
                Ok(true)
            }
            Dialled::Answered { peer, rank: got } => Err(ClientError::WrongPeer {
                peer: peer.to_string(),
                got,
                reason: format!("the tracker named rank {rank} there"),
            }),
        }
    }

    /// The accepting that follows the negotiation, which started at `now` and lasts at
    /// most `limit`.
    pub(super) fn accepting(self, limit: Duration, now: Instant) -> Accepting {
        let expected = match self.phase {
            Phase::Done { accept } => accept,
            _ => 0,
        };
        Accepting {
            at: self.at,
            links: self.links,
            linked: self.linked,
            expected,
            got: 0,
            started: now,
            until: now + limit,
        }
    }
}

/// `rank` as a peer to link now: one of `links`, not in `linked` yet.
fn peer_rank(links: &BTreeSet<u32>, linked: &BTreeSet<u32>, rank: i32) -> Result<u32, String> {
    match u32::try_from(rank) {
        Ok(r) if links.contains(&r) && !linked.contains(&r) => Ok(r),
        Ok(r) if linked.contains(&r) => Err(format!("rank {r} is already linked")),
        _ => Err(format!(
            "rank {rank} is not one of this worker's links {links:?}"
        )),
    }
}

/// After the negotiation: the peers that connect to this worker, each of which must
/// be a linked rank not yet connected, until a deadline.
#[derive(Clone, Debug)]
pub(super) struct Accepting {
    at: SocketAddr,
    links: BTreeSet<u32>,
    linked: BTreeSet<u32>,
    expected: usize,
    got: usize,
    started: Instant,
    until: Instant,
}

impl Accepting {
    /// Whether another peer is to be accepted.
    pub(super) fn wants_more(&self) -> bool {
        self.got < self.expected
    }

    /// Until when to wait for the next peer.
    pub(super) fn deadline(&self) -> Instant {
        self.until
    }

    /// No peer came by the deadline; checked at `now`.
    pub(super) fn on_timeout(&self, now: Instant) -> ClientError {
        ClientError::AcceptTimeout {
            got: self.got,
            expected: self.expected,
            waited: now.saturating_duration_since(self.started),
        }
    }

    /// A peer at `peer` connected and said it is rank `rank`: the rank to keep its
    /// link as.
    pub(super) fn on_accepted(&mut self, peer: SocketAddr, rank: i32) -> Result<u32, ClientError> {
        let r = peer_rank(&self.links, &self.linked, rank).map_err(|reason| {
            ClientError::WrongPeer {
                peer: peer.to_string(),
                got: rank,
                reason,
            }
        })?;
        self.linked.insert(r);
        self.got += 1;
        Ok(r)
    }

    /// Every link made, or the ranks missing.
    pub(super) fn finish(self) -> Result<(), ClientError> {
        let missing: Vec<u32> = self.links.difference(&self.linked).copied().collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(At(self.at).bad(
                "negotiation",
                format!("it ended with links to ranks {missing:?} missing"),
            ))
        }
    }
}

#[cfg(test)]
#[path = "negotiate_tests.rs"]
mod tests;
