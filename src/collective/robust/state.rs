//! The agreement at the start of every robust call: each rank says where it is
//! ([`State`], 56 bytes, allgathered), and every rank derives the same [`Plan`] from
//! the same states, so that the collectives each plan needs are made by every rank in
//! the same order. A pure function, tested without a network.
//!
//! A rank's place is a point `(version, seq)`: `version` checkpoints committed, `seq`
//! calls made since. The checkpoint itself is the call at `seq` = the number of calls
//! of its version, in two steps: replicate the local models ([`Kind::Checkpoint`]),
//! then commit once every rank has them ([`Kind::Ack`]).

use crate::collective::error::{Call, CollectiveError};
use crate::collective::signature::CallText;

/// Bytes of one encoded [`State`].
pub(crate) const STATE_LEN: usize = 56;

/// What a rank is doing when it enters the agreement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// In `load_checkpoint`.
    Load,
    /// In a collective call.
    Call,
    /// In `checkpoint`, local models not yet replicated.
    Checkpoint,
    /// In `checkpoint`, local models replicated, not yet committed.
    Ack,
    /// In `finalize`: done.
    Finish,
}

impl Kind {
    /// The kind's byte in a [`State`].
    pub(crate) fn code(self) -> u8 {
        match self {
            Kind::Load => 0,
            Kind::Call => 1,
            Kind::Checkpoint => 2,
            Kind::Ack => 3,
            Kind::Finish => 4,
        }
    }

    fn from_code(code: u8) -> Option<Kind> {
        [
            Kind::Load,
            Kind::Call,
            Kind::Checkpoint,
            Kind::Ack,
            Kind::Finish,
        ]
        .into_iter()
        .find(|k| k.code() == code)
    }

    /// In words, for errors.
    fn text(self) -> &'static str {
        match self {
            Kind::Load => "load_checkpoint",
            Kind::Call => "a collective",
            Kind::Checkpoint | Kind::Ack => "checkpoint",
            Kind::Finish => "finalize",
        }
    }
}

/// One rank's place, as allgathered (56 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    /// What it is doing.
    pub kind: Kind,
    /// It has loaded nothing and made no call since its process started.
    pub fresh: bool,
    /// Its last checkpoint has a local model.
    pub has_local: bool,
    /// Checkpoints it committed.
    pub version: u64,
    /// Calls it made since.
    pub seq: u64,
    /// Its process's restart count (`DMLC_NUM_ATTEMPT`), for messages.
    pub attempt: u64,
    /// The call's signature and element count ([`Kind::Call`]), so that ranks in
    /// different calls are found out before any data moves.
    pub call: [u64; 2],
    /// It holds the results of every call from this one on, kept for good or not.
    pub held_from: u64,
}

impl State {
    /// The 56 bytes that go round.
    pub(crate) fn encode(&self) -> [u8; STATE_LEN] {
        let mut out = [0u8; STATE_LEN];
        out[0] = self.kind.code();
        out[1] = u8::from(self.fresh) | (u8::from(self.has_local) << 1);
        out[8..16].copy_from_slice(&self.version.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.attempt.to_le_bytes());
        out[32..40].copy_from_slice(&self.call[0].to_le_bytes());
        out[40..48].copy_from_slice(&self.call[1].to_le_bytes());
        out[48..56].copy_from_slice(&self.held_from.to_le_bytes());
        out
    }

    /// The state in `bytes`, or why they are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<State, String> {
        if bytes.len() != STATE_LEN {
            return Err(format!("{} bytes, not {STATE_LEN}", bytes.len()));
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let kind = Kind::from_code(bytes[0]).ok_or_else(|| format!("kind {}", bytes[0]))?;
        Ok(State {
            kind,
            fresh: bytes[1] & 1 != 0,
            has_local: bytes[1] & 2 != 0,
            version: word(8),
            seq: word(16),
            attempt: word(24),
            call: [word(32), word(40)],
            held_from: word(48),
        })
    }

    /// Where it is, in the order ranks pass through: `(version, seq, step)`, where
    /// the checkpoint's commit step comes after its replication step.
    fn point(&self) -> (u64, u64, u8) {
        (self.version, self.seq, u8::from(self.kind == Kind::Ack))
    }
}

/// What every rank does next, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Everyone is in the same call: run it (a collective, the replication of a
    /// checkpoint, its commit, or the end).
    Run(Kind),
    /// These ranks, in the commit step of a checkpoint that others already
    /// committed, commit it too (no traffic) and return.
    Commit(Vec<usize>),
    /// Restarted ranks in `load_checkpoint`. With `source`, version `version`'s
    /// global model goes from `source` to every rank, then each local model in
    /// `locals` (owner, holder) from its holder; without, there is no checkpoint and
    /// they start from scratch.
    Restore {
        /// The ranks that load.
        to: Vec<usize>,
        /// The checkpoint they get.
        version: u64,
        /// Who sends the global model; `None`: version 0, nothing to send.
        source: Option<usize>,
        /// The local models to send: (whose, from which rank).
        locals: Vec<(usize, usize)>,
    },
    /// The result of call `seq` of version `version`, kept by `from`, goes to every
    /// rank; `to` are the ranks still in that call, which take it and return.
    Replay {
        /// The version.
        version: u64,
        /// The call.
        seq: u64,
        /// The rank that sends it.
        from: usize,
        /// The ranks that take it.
        to: Vec<usize>,
    },
    /// The checkpoint's replication runs again, because `behind` have not done it
    /// (restarted since); ranks in its commit step take part again.
    Replicate {
        /// The ranks still before replication.
        behind: Vec<usize>,
    },
}

/// What the plan depends on besides the states.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// Results of call `seq` are kept on ranks `q` with `q % round == seq % round`.
    pub round: usize,
    /// A rank's local model is held by itself and this many ring successors.
    pub local_replica: usize,
}

impl Rules {
    /// The rules for `world` ranks and these replica counts: `global_replica` copies
    /// of every result (rabit's `result_buffer_round = world / global_replica`).
    pub(crate) fn new(world: usize, global_replica: usize, local_replica: usize) -> Rules {
        Rules {
            round: (world / global_replica.max(1)).max(1),
            local_replica: local_replica.min(world.saturating_sub(1)),
        }
    }

    /// Whether `rank` keeps the result of call `seq`.
    pub(crate) fn keeps(&self, rank: usize, seq: u64) -> bool {
        (rank % self.round) as u64 == seq % self.round as u64
    }

    /// The ranks that hold `owner`'s local model: itself, then its successors.
    pub(crate) fn holders(&self, owner: usize, world: usize) -> Vec<usize> {
        (0..=self.local_replica)
            .map(|k| (owner + k) % world)
            .collect()
    }
}

fn disagree(reason: String) -> CollectiveError {
    CollectiveError::Disagree {
        call: Call::Recovery,
        reason,
    }
}

/// The plan for `states` (index = rank).
pub(crate) fn decide(states: &[State], rules: Rules) -> Result<Plan, CollectiveError> {
    let world = states.len();
    let ranks = |pred: &dyn Fn(&State) -> bool| -> Vec<usize> {
        (0..world).filter(|&r| pred(&states[r])).collect()
    };
    // 1. A checkpoint that some rank committed was replicated everywhere: the ranks
    //    still in its commit step commit too.
    let top = states
        .iter()
        .filter(|s| !s.fresh)
        .map(|s| s.version)
        .max()
        .unwrap_or(0);
    let late = ranks(&|s| s.kind == Kind::Ack && s.version < top);
    if !late.is_empty() {
        return Ok(Plan::Commit(late));
    }
    // 2. Restarted ranks load the checkpoint the others have.
    let loading = ranks(&|s| s.fresh && s.kind == Kind::Load);
    if !loading.is_empty() {
        let keepers = ranks(&|s| !s.fresh && s.version == top);
        if keepers.is_empty() || top == 0 {
            let others = ranks(&|s| !s.fresh && s.version != 0);
            if !others.is_empty() {
                return Err(disagree(format!(
                    "ranks {others:?} hold checkpoints no rank can agree on"
                )));
            }
            return Ok(Plan::Restore {
                to: loading,
                version: 0,
                source: None,
                locals: Vec::new(),
            });
        }
        // Local models travel only if the job uses them (any surviving rank's last
        // checkpoint had one): each restarted rank gets its own and those it holds a
        // copy of, from the first surviving holder.
        let uses_local = states.iter().any(|s| !s.fresh && s.has_local);
        let mut locals: Vec<(usize, usize)> = Vec::new();
        for &fresh in loading.iter().filter(|_| uses_local) {
            for owner in (0..=rules.local_replica).map(|k| (fresh + world - k) % world) {
                if locals.iter().any(|&(o, _)| o == owner) {
                    continue;
                }
                let holders = rules.holders(owner, world);
                let alive = holders
                    .iter()
                    .copied()
                    .find(|&h| !states[h].fresh && states[h].version == top);
                match alive {
                    Some(h) => locals.push((owner, h)),
                    None => {
                        return Err(CollectiveError::LocalModelLost {
                            rank: owner,
                            replicas_tried: holders,
                        });
                    }
                }
            }
        }
        return Ok(Plan::Restore {
            to: loading,
            version: top,
            source: keepers.first().copied(),
            locals,
        });
    }
    // 3. Every rank is past loading. A restarted rank that skipped it cannot catch up.
    let skipped = ranks(&|s| s.fresh && s.version < top);
    if !skipped.is_empty() && top > 0 {
        return Err(disagree(format!(
            "ranks {skipped:?} restarted and called a collective before load_checkpoint, \
             while the others are at checkpoint {top}"
        )));
    }
    let min = states.iter().map(State::point).min().unwrap_or((0, 0, 0));
    let at_min = ranks(&|s| s.point() == min);
    if at_min.len() == world {
        return same_call(states);
    }
    let kind = states[at_min[0]].kind;
    if at_min.iter().any(|&r| states[r].kind != kind) {
        return Err(describe(states));
    }
    let (version, seq, _) = min;
    match kind {
        Kind::Call => {
            // Ranks that made this call and went on: some of them kept its result.
            let passed = ranks(&|s| !s.fresh && s.version == version && s.seq > seq);
            if passed.is_empty() {
                return Err(describe(states));
            }
            let keepers: Vec<usize> = (0..world).filter(|&q| rules.keeps(q, seq)).collect();
            let holds = |q: usize| rules.keeps(q, seq) || seq >= states[q].held_from;
            match passed.iter().copied().find(|&q| holds(q)) {
                Some(from) => Ok(Plan::Replay {
                    version,
                    seq,
                    from,
                    to: at_min,
                }),
                None => Err(CollectiveError::ResultLost {
                    version,
                    seq,
                    keepers,
                }),
            }
        }
        Kind::Checkpoint => {
            // Only ranks in the same checkpoint's commit step may be ahead.
            let ahead_acking = (0..world).filter(|r| !at_min.contains(r)).all(|r| {
                let s = &states[r];
                s.kind == Kind::Ack && s.version == version && s.seq == seq
            });
            if ahead_acking {
                Ok(Plan::Replicate { behind: at_min })
            } else {
                Err(describe(states))
            }
        }
        _ => Err(describe(states)),
    }
}

/// Everyone at one point: it must be one call.
fn same_call(states: &[State]) -> Result<Plan, CollectiveError> {
    let first = &states[0];
    if states
        .iter()
        .all(|s| s.kind == first.kind && (s.kind != Kind::Call || s.call == first.call))
    {
        return Ok(Plan::Run(first.kind));
    }
    Err(describe(states))
}

/// Every rank's place in words.
fn describe(states: &[State]) -> CollectiveError {
    let each: Vec<String> = states
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let what = if s.kind == Kind::Call {
                CallText::new(s.call[0], s.call[1], false).to_string()
            } else {
                s.kind.text().to_string()
            };
            format!(
                "rank {r} in {what} at call {} after checkpoint {}",
                s.seq, s.version
            )
        })
        .collect();
    disagree(each.join("; "))
}

#[cfg(test)]
mod tests;
