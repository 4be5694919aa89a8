//! The two protocols' state machines and the state file, changed together under one
//! lock, and the rule that a job speaks one protocol.
//!
//! A classic batch and a JSON batch would each wait, silently, for workers that never
//! come, so a job takes one protocol: the first to give a worker a rank. A `start` still
//! waiting for its batch decides nothing, since anyone who reaches the port can send one
//! (XGBoost jobs run without a job secret): a stranger's classic `start` must not lock a
//! job of JSON workers out, nor the reverse. Once one protocol gives a rank, the other's
//! waiting `start`s are refused, saying why, and so is every later `start` of it.

use crate::classic::{self, Classic};
use crate::common::ConnId;
use crate::journal::Journal;
use crate::json::{self, Json};
use crate::record::Protocol;

/// Why a classic `start` is refused in a job of JSON workers.
pub(crate) const MIXED_CLASSIC: &str = "a classic-protocol worker (rabit, XGBoost 2.0 or \
     older) cannot join this job: its workers speak the JSON protocol (XGBoost 2.1 or \
     newer); a job must use one protocol, i.e. one XGBoost generation";

/// Why a JSON `start` is refused in a job of classic workers.
pub(crate) const MIXED_JSON: &str = "a JSON-protocol worker (XGBoost 2.1 or newer) cannot \
     join this job: its workers speak the classic protocol (rabit, XGBoost 2.0 or older); \
     a job must use one protocol, i.e. one XGBoost generation";

/// The state machines and the state file.
#[derive(Debug)]
pub(crate) struct Machines {
    pub(crate) classic: Classic,
    pub(crate) json: Json,
    pub(crate) journal: Option<Journal>,
    /// Test-only: the rule before it was fixed, under which a `start` still waiting
    /// for its batch decided the job's protocol (so that the simulation shows it finds
    /// what that rule breaks).
    #[cfg(test)]
    pub(crate) by_claim: bool,
}

/// A `start` taken in: the machine's actions, and the other protocol's waiting
/// `start`s that must now be refused (with [`MIXED_CLASSIC`] or [`MIXED_JSON`]).
#[derive(Debug)]
pub(crate) struct Taken<A> {
    pub(crate) actions: Vec<A>,
    pub(crate) refused: Vec<ConnId>,
}

impl Machines {
    /// A classic `start` or `recover` (see [`Classic::start`]) under the one-protocol
    /// rule. `Err`: the reason to refuse it.
    pub(crate) fn classic_start(
        &mut self,
        conn: ConnId,
        host: &str,
        hello: &classic::Hello,
    ) -> Result<Taken<classic::Action>, String> {
        if self.json.ranked() || self.claimed_by_waiting(Protocol::Json) {
            return Err(MIXED_CLASSIC.into());
        }
        let actions = self.classic.start(conn, host, hello)?;
        let refused = if self.classic.ranked() {
            self.json.take_pending()
        } else {
            Vec::new()
        };
        Ok(Taken { actions, refused })
    }

    /// A JSON `start` (see [`Json::start`]) under the one-protocol rule. `Err`: the
    /// reason to close it.
    pub(crate) fn json_start(
        &mut self,
        conn: ConnId,
        host: &str,
        hello: &json::Hello,
        port: i64,
        error_port: i64,
    ) -> Result<Taken<json::Action>, String> {
        if self.classic.ranked() || self.claimed_by_waiting(Protocol::Classic) {
            return Err(MIXED_JSON.into());
        }
        let actions = self.json.start(conn, host, hello, port, error_port)?;
        let refused = if self.json.ranked() {
            self.classic.take_pending()
        } else {
            Vec::new()
        };
        Ok(Taken { actions, refused })
    }

    /// Test-only: whether, under the rule before the fix ([`by_claim`](Self::by_claim)),
    /// `protocol`'s waiting `start`s already decided the job.
    #[cfg(test)]
    fn claimed_by_waiting(&self, protocol: Protocol) -> bool {
        self.by_claim
            && match protocol {
                Protocol::Classic => self.classic.pending() > 0,
                Protocol::Json => self.json.pending() > 0,
            }
    }

    /// Waiting `start`s decide nothing.
    #[cfg(not(test))]
    fn claimed_by_waiting(&self, _protocol: Protocol) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::common::SortBy;

    fn machines(n: u32) -> Machines {
        Machines {
            classic: Classic::new(n, SortBy::Host),
            json: Json::new(n, SortBy::Host),
            journal: None,
            by_claim: false,
        }
    }

    fn classic_hello(rank: i32) -> classic::Hello {
        classic::Hello {
            rank,
            world: -1,
            task_id: None,
            command: classic::Command::Start,
        }
    }

    fn json_hello(task: &str) -> json::Hello {
        json::Hello {
            rank: 0,
            task_id: task.into(),
            world_size: -1,
        }
    }

    fn peer_frames(actions: &[json::Action]) -> usize {
        actions
            .iter()
            .filter(|a| matches!(a, json::Action::PeerFrame { .. }))
            .count()
    }

    #[test]
    fn a_waiting_classic_start_does_not_decide_the_protocol() {
        let mut m = machines(2);
        // A stranger's classic `start`: it waits for its batch, without a rank.
        let stranger = m.classic_start(1, "h", &classic_hello(-1)).unwrap();
        assert!(stranger.actions.is_empty() && stranger.refused.is_empty());
        let first = m.json_start(2, "h", &json_hello("w0"), 7000, 0).unwrap();
        assert!(first.refused.is_empty());
        // The batch forms: the JSON workers have ranks, the stranger is refused.
        let second = m.json_start(3, "h", &json_hello("w1"), 7001, 0).unwrap();
        assert_eq!(peer_frames(&second.actions), 2);
        assert_eq!(second.refused, [1]);
        assert_eq!(
            m.classic_start(4, "h", &classic_hello(-1)).unwrap_err(),
            MIXED_CLASSIC
        );
    }

    #[test]
    fn a_waiting_json_start_does_not_decide_the_protocol() {
        let mut m = machines(2);
        assert!(
            m.json_start(1, "h", &json_hello("x"), 7000, 0)
                .unwrap()
                .refused
                .is_empty()
        );
        assert!(
            m.classic_start(2, "h", &classic_hello(-1))
                .unwrap()
                .refused
                .is_empty()
        );
        let second = m.classic_start(3, "h", &classic_hello(-1)).unwrap();
        assert!(!second.actions.is_empty());
        assert_eq!(second.refused, [1]);
        assert_eq!(
            m.json_start(4, "h", &json_hello("y"), 7001, 0).unwrap_err(),
            MIXED_JSON
        );
    }

    #[test]
    fn a_refused_start_of_either_protocol_leaves_the_other_alone() {
        let mut m = machines(2);
        m.json_start(1, "h", &json_hello("x"), 7000, 0).unwrap();
        // A classic world size the job does not have: refused by the machine, and the
        // JSON worker waits on.
        let mut hello = classic_hello(-1);
        hello.world = 5;
        assert!(m.classic_start(2, "h", &hello).is_err());
        let second = m.json_start(3, "h", &json_hello("y"), 7001, 0).unwrap();
        assert_eq!(peer_frames(&second.actions), 2);
        assert!(second.refused.is_empty());
    }
}
