//! [`MemoryLink`]: every rank of a world in one process, with no sockets, run one
//! rank at a time in an order fixed by a [`MemorySchedule`].
//!
//! The algorithms are blocking functions, so each rank still needs a thread of its
//! own; what makes the world deterministic is a turn that only one rank holds at a
//! time. A rank runs until it waits for a message that has not been sent (or, under
//! [`MemorySchedule::Seeded`], until the schedule preempts it at a link call), then hands
//! the turn to the next ready rank. Since nothing else decides who runs, the same
//! program on the same schedule makes the same calls in the same order every time.
//!
//! When every rank that has not finished waits for a message nobody can send any
//! more, the world is deadlocked: one waiting rank (chosen by the schedule) gets
//! [`LinkError::Timeout`] at once instead of at its deadline, as if its deadline had
//! passed, and its abort notice then releases the others.

use super::{Link, Pending, Tag};
use crate::collective::error::LinkError;
use bytes::Bytes;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// In which order the ranks of a [`MemoryLink`] world take turns.
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
enum Phase {
    /// Running, or able to run when it gets the turn.
    Ready,
    /// Waiting for a message from `from` with `tag`.
    Waiting { from: usize, tag: Tag },
    /// Was waiting when the world deadlocked: its wait ends in a timeout.
    Stuck,
    /// Its link is dropped.
    Done,
}

/// The state every rank's link shares.
#[derive(Debug)]
struct State {
    /// The rank that may run (`None` once every rank is done).
    turn: Option<usize>,
    phases: Vec<Phase>,
    /// Each rank's messages not yet received.
    inboxes: Vec<Pending>,
    /// The first abort notice each rank got: who sent it and why.
    aborts: Vec<Option<(usize, String)>>,
    schedule: MemorySchedule,
    /// The seeded schedule's generator state.
    random: u64,
    /// A digest of every send, receive and hand-over, in order.
    fingerprint: u64,
}

impl State {
    /// The seeded schedule's next number (splitmix64).
    fn next_random(&mut self) -> u64 {
        self.random = self.random.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.random;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn record(&mut self, event: [u64; 4]) {
        for word in event {
            self.fingerprint = (self.fingerprint ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Among the ranks for which `pick` holds, the one after `me` in round-robin
    /// order, or a drawn one under a seeded schedule.
    fn choose(&mut self, me: usize, pick: impl Fn(Phase) -> bool) -> Option<usize> {
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
    fn hand_over(&mut self, me: usize) {
        let next = match self.choose(me, |p| p == Phase::Ready) {
            Some(next) => Some(next),
            None => {
                let stuck = self.choose(me, |p| matches!(p, Phase::Waiting { .. }));
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
struct World {
    state: Mutex<State>,
    turn_moved: Condvar,
}

impl World {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left consistent state behind:
        // every update is completed before any call that could panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `me` has the turn (taking it if nobody has it), at most until
    /// `deadline`. `Err` with the lock at the deadline.
    fn take_turn<'a>(
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
    fn preempt<'a>(
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

/// A [`Link`] between threads of one process: messages move through shared queues,
/// and only one rank runs at a time, in the order a [`MemorySchedule`] fixes. For tests of
/// code above the link (the collectives, and programs using them) that must not
/// depend on sockets, ports or timing.
///
/// Each rank needs its own thread. Every wait ends by its deadline; a wait that no
/// rank can ever satisfy ends at once in [`LinkError::Timeout`]. A rank that keeps
/// the turn while it does something other than link calls (sleeps, computes) holds
/// up the others, whose waits for the turn end at their deadlines.
///
/// # Examples
///
/// ```
/// use switchyard::collective::{CommOptions, Communicator, MemoryLink, ReduceOp};
/// let handles: Vec<_> = MemoryLink::world(3)
///     .into_iter()
///     .map(|link| {
///         std::thread::spawn(move || {
///             let mut comm = Communicator::over_link(Box::new(link), CommOptions::default());
///             let mut grad = vec![comm.rank() as f32; 2];
///             comm.allreduce(&mut grad, ReduceOp::Sum).map(|()| grad)
///         })
///     })
///     .collect();
/// for handle in handles {
///     assert_eq!(handle.join().expect("rank thread")?, [3.0, 3.0]);
/// }
/// # Ok::<(), switchyard::collective::CollectiveError>(())
/// ```
pub struct MemoryLink {
    rank: usize,
    size: usize,
    world: Arc<World>,
}

impl std::fmt::Debug for MemoryLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLink")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl MemoryLink {
    /// The links of a world of `size` ranks (rank `r`'s at index `r`), taking turns
    /// round-robin.
    pub fn world(size: usize) -> Vec<MemoryLink> {
        MemoryLink::world_with(size, MemorySchedule::RoundRobin)
    }

    /// The links of a world of `size` ranks, taking turns as `schedule` says.
    pub fn world_with(size: usize, schedule: MemorySchedule) -> Vec<MemoryLink> {
        let mut state = State {
            turn: None,
            phases: vec![Phase::Ready; size],
            inboxes: (0..size).map(|_| Pending::default()).collect(),
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
        let world = Arc::new(World {
            state: Mutex::new(state),
            turn_moved: Condvar::new(),
        });
        (0..size)
            .map(|rank| MemoryLink {
                rank,
                size,
                world: world.clone(),
            })
            .collect()
    }

    /// A digest of everything the world did so far (every send, receive and change
    /// of turn, in order): equal digests of two runs mean equal schedules.
    #[cfg(test)]
    pub(crate) fn fingerprint(&self) -> u64 {
        self.world.lock().fingerprint
    }
}

impl Link for MemoryLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        if to >= self.size || to == self.rank {
            return Err(LinkError::Transport {
                rank: to,
                reason: format!("no link to rank {to}"),
            });
        }
        let started = Instant::now();
        let me = self.rank;
        let timeout = |_| LinkError::Timeout {
            rank: to,
            waited: started.elapsed(),
        };
        let state = self.world.lock();
        let state = self.world.take_turn(state, me, deadline).map_err(timeout)?;
        let mut state = self.world.preempt(state, me, deadline).map_err(timeout)?;
        let bytes: usize = frames.iter().map(Bytes::len).sum();
        state.record([
            2,
            me as u64,
            to as u64,
            tag.call ^ (u64::from(tag.step) << 32),
        ]);
        state.record([bytes as u64, 0, 0, 0]);
        state.inboxes[to].push(me, tag, frames);
        if state.phases[to] == (Phase::Waiting { from: me, tag }) {
            state.phases[to] = Phase::Ready;
        }
        Ok(())
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        let started = Instant::now();
        let me = self.rank;
        let timeout = |_| LinkError::Timeout {
            rank: from,
            waited: started.elapsed(),
        };
        let state = self.world.lock();
        let state = self.world.take_turn(state, me, deadline).map_err(timeout)?;
        let mut state = self.world.preempt(state, me, deadline).map_err(timeout)?;
        loop {
            if let Some((rank, reason)) = state.aborts[me].clone() {
                state.phases[me] = Phase::Ready;
                return Err(LinkError::Aborted { rank, reason });
            }
            if let Some(frames) = state.inboxes[me].pop(from, tag) {
                state.phases[me] = Phase::Ready;
                state.record([
                    3,
                    me as u64,
                    from as u64,
                    tag.call ^ (u64::from(tag.step) << 32),
                ]);
                return Ok(frames);
            }
            if state.phases[me] == Phase::Stuck {
                state.phases[me] = Phase::Ready;
                return Err(LinkError::Timeout {
                    rank: from,
                    waited: started.elapsed(),
                });
            }
            state.phases[me] = Phase::Waiting { from, tag };
            state.hand_over(me);
            self.world.turn_moved.notify_all();
            state = match self.world.take_turn(state, me, deadline) {
                Ok(state) => state,
                Err(mut state) => {
                    state.phases[me] = Phase::Ready;
                    return Err(LinkError::Timeout {
                        rank: from,
                        waited: started.elapsed(),
                    });
                }
            };
        }
    }

    fn abort(&mut self, _call: u64, reason: &str) {
        let me = self.rank;
        let mut state = self.world.lock();
        for rank in (0..self.size).filter(|&r| r != me) {
            if state.aborts[rank].is_none() {
                state.aborts[rank] = Some((me, reason.to_string()));
            }
            if matches!(state.phases[rank], Phase::Waiting { .. }) {
                state.phases[rank] = Phase::Ready;
            }
        }
        state.record([4, me as u64, 0, 0]);
    }
}

impl Drop for MemoryLink {
    fn drop(&mut self) {
        let me = self.rank;
        let mut state = self.world.lock();
        state.phases[me] = Phase::Done;
        if state.turn.is_none() || state.turn == Some(me) {
            state.hand_over(me);
            self.world.turn_moved.notify_all();
        }
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
