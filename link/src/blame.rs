//! Following abort notices back to where a failure began, for a rank whose wait
//! failed on a peer: the peer may only have given up after a failure of its own (a
//! dead rank further on), or after waiting in vain for this very rank (which was
//! stopped). Used by the mesh engine's calls and by the mesh set-up alike.
//!
//! Every rank that fails sends one notice (call 0 at set-up, the call's number in a
//! call), blaming the peer its wait failed on, or no one when the failure began on it
//! (a mismatch, a misconfiguration). A rank that gives up while its connections are
//! still open sends its notice before they close, so that a peer that sees them close
//! finds the notice that explains why.

use crate::{Link, LinkError, Notice};
use std::time::{Duration, Instant};

/// How long a rank waits for the answer when it asks whether a peer is alive
/// ([`Link::alive`]); a waiting rank reads its control messages every 20 ms.
pub const PROBE_WAIT: Duration = Duration::from_millis(250);
/// How often a failed rank looks at the abort notices that arrived.
const EXPLAIN_SLICE: Duration = Duration::from_millis(20);

/// How a rank's wait on a peer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The peer's connection closed: its process is gone or it gave up.
    Gone,
    /// Nothing came from the peer for this rank's whole timeout.
    Silent,
    /// The peer sent an abort notice.
    Aborted,
}

/// What the abort notices say about a failure that blamed a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Explained {
    /// Nothing beyond the error itself.
    Nothing,
    /// This notice explains it: its sender gave up for the reason it gives.
    By(Notice),
    /// The blame comes back to this rank: the peers gave up waiting for it while it
    /// was not waiting out a timeout of its own (its process was stopped or starved,
    /// or its messages did not reach them). This notice is the one that blames it.
    OnThisRank(Notice),
}

impl Explained {
    /// The rank and reason of the abort to report instead of this rank's own error,
    /// rank `me`'s: the notice's sender aborted, for the reason it gives, or because
    /// it gave up waiting for this rank (an abort still, so that whoever treats a
    /// peer's abort as a broken mesh, robust mode among them, treats this one alike).
    /// `None`: report the own error.
    pub fn abort(self, me: usize) -> Option<(usize, String)> {
        match self {
            Explained::Nothing => None,
            Explained::By(n) => Some((n.rank, n.reason)),
            Explained::OnThisRank(n) => Some((
                n.rank,
                format!(
                    "it gave up waiting for this rank (rank {me}), which was silent to it \
                     (was this process stopped or starved?): {}",
                    n.reason
                ),
            )),
        }
    }

    /// The link error rank `me` reports for `e`, as explained.
    pub fn into_link_error(self, me: usize, e: LinkError) -> LinkError {
        match self.abort(me) {
            Some((rank, reason)) => LinkError::Aborted { rank, reason },
            None => e,
        }
    }
}

/// Where blame leads, seen from rank `me` that blames rank `blamed`. Returns the
/// last notice on the way and the rank where the chain ends (one that sent no
/// notice: dead, stopped, or not yet timed out itself): `blamed`'s notice blames
/// `q`, `q`'s blames `s`, and `s` sent none. A notice from a rank that failed on its
/// own (a mismatch, a bad argument) ends the chain at once, with no rank. A chain that
/// comes back to `me` ends at `me`, with the notice that blames it; one that runs in
/// a circle elsewhere explains nothing.
pub fn follow(me: usize, blamed: usize, notices: &[Notice]) -> (Option<Notice>, Option<usize>) {
    if let Some(first) = notices.iter().find(|n| n.blames.is_none()) {
        return (Some(first.clone()), None);
    }
    let mut seen = vec![me];
    let mut at = blamed;
    let mut found = None;
    loop {
        let Some(notice) = notices.iter().find(|n| n.rank == at) else {
            return (found, Some(at));
        };
        seen.push(at);
        found = Some(notice.clone());
        match notice.blames {
            Some(next) if next == me => return (found, Some(me)),
            Some(next) if seen.contains(&next) => return (None, None),
            Some(next) => at = next,
            None => return (found, None),
        }
    }
}

/// Reads the abort notices on `link` until they explain this rank's failure on
/// `blamed` (seen as `seen`), or until it is clear they will not: `blamed` is gone
/// (its connection closed, or it does not answer [`Link::alive`]) and sent no
/// notice, or `limit` passed. A silent peer that answers is itself waiting for
/// someone and will say for whom within its own timeout, so the wait for its notice
/// goes on until `limit`.
///
/// A chain that comes back to this rank is taken as the peers giving up on it only
/// when this rank did not time out itself: two ranks that each waited their whole
/// timeout for the other (a cut between them) each report their own silence.
pub fn explain(link: &mut dyn Link, blamed: usize, seen: Seen, limit: Instant) -> Explained {
    let me = link.rank();
    let mut probed = false;
    loop {
        let slice = (Instant::now() + EXPLAIN_SLICE).min(limit);
        let Some(notices) = link.notices(slice) else {
            return Explained::Nothing;
        };
        let (found, end) = follow(me, blamed, &notices);
        match (found, end) {
            (Some(notice), Some(end)) if end == me => {
                return match seen {
                    Seen::Silent => Explained::Nothing,
                    Seen::Gone | Seen::Aborted => Explained::OnThisRank(notice),
                };
            }
            // A chain that reached a notice ends where that notice's sender confirmed.
            (Some(notice), _) => return Explained::By(notice),
            (None, None) => return Explained::Nothing,
            (None, Some(_)) if Instant::now() >= limit => return Explained::Nothing,
            (None, Some(_)) => {}
        }
        if !probed {
            probed = true;
            let gone = seen == Seen::Gone || link.alive(blamed, PROBE_WAIT) != Some(true);
            if gone {
                return Explained::Nothing;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(rank: usize, blames: Option<usize>) -> Notice {
        Notice {
            rank,
            reason: format!("rank {rank}"),
            blames,
        }
    }

    /// Rank 3 lost rank 2, which exited after losing rank 1 (killed, no notice):
    /// the chain ends at rank 1, explained by rank 2's notice.
    #[test]
    fn blame_is_followed_to_the_rank_that_sent_no_notice() {
        let notices = [notice(2, Some(1)), notice(3, Some(2))];
        let (found, end) = follow(0, 3, &notices);
        assert_eq!((found.map(|n| n.rank), end), (Some(2), Some(1)));
        assert_eq!(follow(0, 1, &notices), (None, Some(1)));
    }

    /// A failure that began on a rank (a mismatch) explains every other notice.
    #[test]
    fn a_failure_of_its_own_ends_the_chain() {
        let notices = [notice(2, Some(1)), notice(1, None)];
        assert_eq!(follow(0, 2, &notices), (Some(notice(1, None)), None));
    }

    /// Ranks blaming each other away from this rank explain nothing.
    #[test]
    fn a_circle_of_blame_explains_nothing() {
        let notices = [notice(1, Some(2)), notice(2, Some(1))];
        assert_eq!(follow(0, 1, &notices), (None, None));
        assert_eq!(follow(0, 2, &notices), (None, None));
    }

    /// Rank 0 lost rank 2, which gave up on rank 1, which gave up on rank 0: the
    /// chain comes back to rank 0, with rank 1's notice.
    #[test]
    fn a_chain_back_to_this_rank_ends_here() {
        let notices = [notice(1, Some(0)), notice(2, Some(1))];
        assert_eq!(follow(0, 2, &notices), (Some(notice(1, Some(0))), Some(0)));
        assert_eq!(follow(0, 1, &notices), (Some(notice(1, Some(0))), Some(0)));
    }
}
