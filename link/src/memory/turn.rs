//! The turn that makes a [`MemoryLink`](super::MemoryLink) world deterministic: who
//! may run, who waits for what, and who runs next.

use crate::{Pending, Tag};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// In which order the ranks of a [`MemoryLink`](super::MemoryLink) world take turns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemorySchedule {
    /// Rank 0 starts; a rank that waits hands the turn to the next ready rank above
    /// it (wrapping around). Nobody is preempted.
    #[default]
    RoundRobin,
    /// The next rank is drawn from the ready ones by a pseudo-random sequence with
    /// this seed, and at every send and receive the running rank may be preempted:
    /// other interleavings than round-robin, each reproducible from its seed.
    Seeded(u64),
}

/// Where a rank stands with the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Running, or able to run when it gets the turn.
    Ready,
    /// Waiting for a message from `from` with `tag`.
    Waiting { from: usize, tag: Tag },
    /// Waiting for room in its queue to `to` (bounded worlds only).
    Sending { to: usize },
    /// Was waiting when the world deadlocked: its wait ends in a timeout.
    Stuck,
    /// Its link is dropped.
    Done,
}

/// The state every rank's link shares.
#[derive(Debug)]
pub(super) struct State {
    /// The rank that may run (`None` once every rank is done).
    pub(super) turn: Option<usize>,
    pub(super) phases: Vec<Phase>,
    /// Each rank's messages not yet received.
    pub(super) inboxes: Vec<Pending>,
    /// Messages sent and not yet received, by receiver and sender (`to * n + from`).
    pub(super) queued: Vec<usize>,
    /// Most messages one rank may have queued for another, if bounded.
    pub(super) capacity: Option<usize>,
    /// The first abort notice each rank got: who sent it and why.
    pub(super) aborts: Vec<Option<(usize, String)>>,
    pub(super) schedule: MemorySchedule,
    /// The seeded schedule's generator state.
    pub(super) random: u64,
    /// A digest of every send, receive and hand-over, in order.
    pub(super) fingerprint: u64,
}

impl State {
    /// The state of a fresh world of `size` ranks: nobody done, the turn with the
    /// first rank `schedule` picks.
    pub(super) fn new(size: usize, schedule: MemorySchedule, capacity: Option<usize>) -> State {
        let mut state = State {
            turn: None,
            phases: vec![Phase::Ready; size],
            inboxes: (0..size).map(|_| Pending::default()).collect(),
            queued: vec![0; size * size],
            capacity,
            aborts: vec![None; size],
            schedule,
            random: match schedule {
                MemorySchedule::Seeded(seed) => seed,
                MemorySchedule::RoundRobin => 0,
            },
            fingerprint: 0xcbf2_9ce4_8422_2325,
        };
        state.turn = match size {
            0 => None,
            _ => state.choose(size - 1, |p| p == Phase::Ready),
        };
        state
    }

    /// The seeded schedule's next number (splitmix64).
    pub(super) fn next_random(&mut self) -> u64 {
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Folds one event (a send, a receive, a change of turn) into the fingerprint.
    pub(super) fn record(&mut self, event: [u64; 4]) {
        for word in event {
            self.fingerprint = (self.fingerprint ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Among the ranks for which `pick` holds, the one after `me` in round-robin
    /// order, or a drawn one under a seeded schedule.
    pub(super) fn choose(&mut self, me: usize, pick: impl Fn(Phase) -> bool) -> Option<usize> {
        let n = self.phases.len();
        let candidates: Vec<usize> = (1..=n)
            .map(|k| (me + k) % n)
            .filter(|&r| pick(self.phases[r]))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let at = match self.schedule {
            MemorySchedule::RoundRobin => 0,
            MemorySchedule::Seeded(_) => (self.next_random() % candidates.len() as u64) as usize,
        };
        Some(candidates[at])
    }

    /// Gives the turn away from `me`: to a ready rank if there is one, else (a
    /// deadlock) to a waiting rank whose wait then times out.
    pub(super) fn hand_over(&mut self, me: usize) {
        let next = match self.choose(me, |p| p == Phase::Ready) {
            Some(next) => Some(next),
            None => {
                let blocked = |p| matches!(p, Phase::Waiting { .. } | Phase::Sending { .. });
                let stuck = self.choose(me, blocked);
                if let Some(rank) = stuck {
                    self.phases[rank] = Phase::Stuck;
                }
                stuck
            }
        };
        self.turn = next;
        self.record([0, me as u64, next.map_or(u64::MAX, |r| r as u64), 0]);
    }
}

/// The world's state and the signal that the turn moved.
#[derive(Debug)]
pub(super) struct World {
    pub(super) state: Mutex<State>,
    pub(super) turn_moved: Condvar,
}

impl World {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left consistent state behind:
        // every update is completed before any call that could panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `me` has the turn (taking it if nobody has it), at most until
    /// `deadline`. `Err` with the lock at the deadline.
    pub(super) fn take_turn<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        me: usize,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, State>, MutexGuard<'a, State>> {
        loop {
            match state.turn {
                Some(rank) if rank == me => return Ok(state),
                None => {
                    state.turn = Some(me);
                    return Ok(state);
                }
                Some(_) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(state);
            }
            state = match self.turn_moved.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Under a seeded schedule, may give the turn to another ready rank and wait for
    /// it to come back (at most until `deadline`).
    pub(super) fn preempt<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        me: usize,
        deadline: Instant,
    ) -> Result<MutexGuard<'a, State>, MutexGuard<'a, State>> {
        if !matches!(state.schedule, MemorySchedule::Seeded(_)) || state.next_random() % 2 == 0 {
            return Ok(state);
        }
        let Some(next) = state.choose(me, |p| p == Phase::Ready) else {
            return Ok(state);
        };
        state.turn = Some(next);
        state.record([1, me as u64, next as u64, 0]);
        self.turn_moved.notify_all();
        self.take_turn(state, me, deadline)
    }
}
