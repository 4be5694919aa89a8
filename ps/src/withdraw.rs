//! A worker's decision about a push that outwaited the request timeout, without
//! sockets or clocks: the worker feeds it the time and the servers' answers and sends
//! what it says.
//!
//! A push is applied by every server it reaches or by none. Servers keep no clock, so
//! a push whose sync rounds do not complete is withdrawn by its worker, in two phases:
//!
//! 1. At [`PsConfig::request_timeout`](crate::PsConfig::request_timeout), if no
//!    server has answered the push, every server of it is asked to hold it
//!    ([`wire::HOLD`]): no round with the push in it completes until the worker
//!    decides, and the answer says whether some of the push is applied already.
//! 2. If every server held it and none had applied any of it, each is told to take it
//!    out of its rounds ([`wire::WITHDRAW`]) and the call fails with the round's
//!    state; if one had applied it, every other is told to keep it
//!    ([`wire::LET_GO`]) and the call waits one more timeout for their rounds.
//!
//! A push that a server answered before the timeout was applied there, so it is never
//! withdrawn either.

use super::wire::{self, HoldAnswer, RoundState};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_msg::Kind;

/// Where an overdue push stands.
#[derive(Debug, Default)]
pub(crate) enum Withdrawal {
    /// Within the timeout.
    #[default]
    OnTime,
    /// Every server of the push was asked to hold it (at the instant given); their
    /// answers so far.
    Holding {
        since: Instant,
        held: HashMap<usize, Option<RoundState>>,
        applied: HashSet<usize>,
    },
    /// Some server has applied the push, so every other must: the worker waits up to
    /// twice the request timeout in all.
    Applied,
}

/// How an overdue push ended.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Withdrawn from every server: none applied any of it. `round` is a round it
    /// waited in, at `server`, as that server described it.
    Withdrawn {
        server: usize,
        round: Option<RoundState>,
    },
    /// No verdict in time; `what` the worker was waiting for. Every server that held
    /// the push has been told to let go of it.
    TimedOut { what: &'static str },
}

/// What the worker sends and whether the call is over.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Step {
    /// Messages to send: the kind ([`wire::HOLD`], [`wire::LET_GO`] or
    /// [`wire::WITHDRAW`]) and the server.
    pub(crate) send: Vec<(Kind, usize)>,
    /// The call's end, if it ended.
    pub(crate) verdict: Option<Verdict>,
}

/// What a push's servers have done so far, as the worker knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress<'a> {
    /// The servers the push went to.
    pub(crate) parts: &'a [usize],
    /// Those that have not answered it.
    pub(crate) owed: &'a HashSet<usize>,
    /// How long the push has waited.
    pub(crate) waited: Duration,
}

impl Withdrawal {
    /// Moves the push on at `now`: `timeout` is the request timeout, `hold_grace` how
    /// long the servers have to answer a hold.
    pub(crate) fn step(
        &mut self,
        push: Progress<'_>,
        now: Instant,
        timeout: Duration,
        hold_grace: Duration,
    ) -> Step {
        match self {
            Withdrawal::OnTime if push.waited <= timeout => Step::default(),
            Withdrawal::OnTime if push.owed.len() == push.parts.len() => {
                *self = Withdrawal::Holding {
                    since: now,
                    held: HashMap::new(),
                    applied: HashSet::new(),
                };
                Step {
                    send: push.parts.iter().map(|&s| (wire::HOLD, s)).collect(),
                    verdict: None,
                }
            }
            Withdrawal::OnTime => {
                // A server answered, so it applied the push: the others must too.
                *self = Withdrawal::Applied;
                Step::default()
            }
            Withdrawal::Holding {
                since,
                held,
                applied,
            } => {
                let answered = held.len() + applied.len() == push.parts.len();
                if answered && !applied.is_empty() {
                    let send = self.end(wire::LET_GO);
                    *self = Withdrawal::Applied;
                    return Step {
                        send,
                        verdict: None,
                    };
                }
                if answered {
                    let (server, round) = push
                        .parts
                        .iter()
                        .find_map(|s| Some((*s, held.get(s)?.clone()?)))
                        .map_or(
                            (push.parts.first().copied().unwrap_or(0), None),
                            |(s, r)| (s, Some(r)),
                        );
                    return Step {
                        send: self.end(wire::WITHDRAW),
                        verdict: Some(Verdict::Withdrawn { server, round }),
                    };
                }
                if now.saturating_duration_since(*since) <= hold_grace {
                    return Step::default();
                }
                Step {
                    send: self.end(wire::LET_GO),
                    verdict: Some(Verdict::TimedOut {
                        what: "to answer whether the push can be withdrawn",
                    }),
                }
            }
            Withdrawal::Applied if push.waited <= timeout * 2 => Step::default(),
            Withdrawal::Applied => Step {
                send: Vec::new(),
                verdict: Some(Verdict::TimedOut {
                    what: "to apply a push that other servers have applied (its rounds wait for workers that have not pushed)",
                }),
            },
        }
    }

    /// Notes server `server`'s answer to the hold; answers that come when no hold
    /// is waited on are ignored (the caller lets go of a late `Held`).
    pub(crate) fn on_answer(&mut self, server: usize, answer: HoldAnswer) {
        if let Withdrawal::Holding { held, applied, .. } = self {
            match answer {
                HoldAnswer::Applied => {
                    applied.insert(server);
                }
                HoldAnswer::Held { round } => {
                    held.insert(server, round);
                }
            }
        }
    }

    /// Whether server `server` was asked to hold the push and has not answered.
    pub(crate) fn awaits(&self, server: usize) -> bool {
        matches!(self, Withdrawal::Holding { held, applied, .. }
            if !held.contains_key(&server) && !applied.contains(&server))
    }

    /// Ends the hold with `kind` ([`wire::LET_GO`] or [`wire::WITHDRAW`]) on every
    /// server that answered it held: the messages to send. Nothing for a push that is
    /// not being held. The withdrawal is over afterwards.
    pub(crate) fn end(&mut self, kind: Kind) -> Vec<(Kind, usize)> {
        let Withdrawal::Holding { held, .. } = std::mem::take(self) else {
            return Vec::new();
        };
        let mut servers: Vec<usize> = held.into_keys().collect();
        servers.sort_unstable();
        servers.into_iter().map(|s| (kind, s)).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);
    const GRACE: Duration = Duration::from_secs(1);

    fn progress<'a>(parts: &'a [usize], owed: &'a HashSet<usize>, waited: u64) -> Progress<'a> {
        Progress {
            parts,
            owed,
            waited: Duration::from_millis(waited),
        }
    }

    fn round(key: u64) -> RoundState {
        RoundState {
            key,
            pushed: vec![0],
            missing: vec![1],
        }
    }

    #[test]
    fn a_push_no_server_answered_is_held_then_withdrawn_when_every_server_held_it() {
        let now = Instant::now();
        let (parts, owed) = ([0, 1], HashSet::from([0, 1]));
        let mut w = Withdrawal::default();
        assert_eq!(
            w.step(progress(&parts, &owed, 1000), now, TIMEOUT, GRACE),
            Step::default()
        );
        let step = w.step(progress(&parts, &owed, 2001), now, TIMEOUT, GRACE);
        assert_eq!(step.send, [(wire::HOLD, 0), (wire::HOLD, 1)]);
        w.on_answer(
            1,
            HoldAnswer::Held {
                round: Some(round(5)),
            },
        );
        assert!(w.awaits(0) && !w.awaits(1));
        assert_eq!(
            w.step(progress(&parts, &owed, 2002), now, TIMEOUT, GRACE),
            Step::default()
        );
        w.on_answer(0, HoldAnswer::Held { round: None });
        let step = w.step(progress(&parts, &owed, 2003), now, TIMEOUT, GRACE);
        assert_eq!(step.send, [(wire::WITHDRAW, 0), (wire::WITHDRAW, 1)]);
        assert_eq!(
            step.verdict,
            Some(Verdict::Withdrawn {
                server: 1,
                round: Some(round(5))
            })
        );
    }

    #[test]
    fn a_push_one_server_applied_is_let_go_everywhere_and_waited_for() {
        let now = Instant::now();
        let (parts, owed) = ([0, 1], HashSet::from([0, 1]));
        let mut w = Withdrawal::default();
        w.step(progress(&parts, &owed, 2001), now, TIMEOUT, GRACE);
        w.on_answer(0, HoldAnswer::Held { round: None });
        w.on_answer(1, HoldAnswer::Applied);
        let step = w.step(progress(&parts, &owed, 2002), now, TIMEOUT, GRACE);
        assert_eq!((step.send, step.verdict), (vec![(wire::LET_GO, 0)], None));
        // Waited for up to twice the timeout, then given up on without a withdrawal.
        assert_eq!(
            w.step(progress(&parts, &owed, 3999), now, TIMEOUT, GRACE),
            Step::default()
        );
        let step = w.step(progress(&parts, &owed, 4001), now, TIMEOUT, GRACE);
        assert!(step.send.is_empty());
        assert!(matches!(step.verdict, Some(Verdict::TimedOut { .. })));
    }

    #[test]
    fn a_push_a_server_answered_in_time_is_never_held() {
        let now = Instant::now();
        let (parts, owed) = ([0, 1], HashSet::from([1]));
        let mut w = Withdrawal::default();
        assert_eq!(
            w.step(progress(&parts, &owed, 2001), now, TIMEOUT, GRACE),
            Step::default()
        );
        assert!(matches!(w, Withdrawal::Applied));
    }

    #[test]
    fn a_hold_not_answered_in_time_lets_go_of_the_servers_that_held() {
        let now = Instant::now();
        let (parts, owed) = ([0, 1], HashSet::from([0, 1]));
        let mut w = Withdrawal::default();
        w.step(progress(&parts, &owed, 2001), now, TIMEOUT, GRACE);
        w.on_answer(0, HoldAnswer::Held { round: None });
        let later = now + GRACE + Duration::from_millis(1);
        let step = w.step(progress(&parts, &owed, 3002), later, TIMEOUT, GRACE);
        assert_eq!(step.send, [(wire::LET_GO, 0)]);
        assert!(matches!(step.verdict, Some(Verdict::TimedOut { .. })));
    }
}
