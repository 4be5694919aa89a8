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
//! more (or, in a world with bounded queues, for room nobody can make), the world is
//! deadlocked: one waiting rank (chosen by the schedule) gets [`LinkError::Timeout`]
//! at once instead of at its deadline, as if its deadline had passed, and its abort
//! notice then releases the others.

mod turn;

pub use turn::MemorySchedule;

use super::{Link, Tag};
use crate::LinkError;
use bytes::Bytes;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use turn::{Phase, State, World};

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
/// use bytes::Bytes;
/// use std::time::{Duration, Instant};
/// use switchyard_link::{Link, LinkError, MemoryLink, Tag};
/// let tag = Tag { call: 0, step: 0 };
/// let handles: Vec<_> = MemoryLink::world(3)
///     .into_iter()
///     .map(|mut link| {
///         std::thread::spawn(move || -> Result<Vec<u8>, LinkError> {
///             let deadline = Instant::now() + Duration::from_secs(5);
///             let (rank, size) = (link.rank(), link.world_size());
///             // Round a ring: each rank sends its number on and reads its predecessor's.
///             link.send((rank + 1) % size, tag, vec![Bytes::from(vec![rank as u8])], deadline)?;
///             let frames = link.recv((rank + size - 1) % size, tag, deadline)?;
///             Ok(frames.concat())
///         })
///     })
///     .collect();
/// for (rank, handle) in handles.into_iter().enumerate() {
///     assert_eq!(handle.join().expect("rank thread")?, [((rank + 2) % 3) as u8]);
/// }
/// # Ok::<(), LinkError>(())
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
        MemoryLink::world_bounded(size, schedule, None)
    }

    /// A world where a rank may have at most `capacity` messages queued for another
    /// (`None`: no limit); a send to a full queue waits for the receiver, without
    /// receiving meanwhile, as a send into a full ZeroMQ queue does. For testing how
    /// much buffering an algorithm needs.
    pub fn world_bounded(
        size: usize,
        schedule: MemorySchedule,
        capacity: Option<usize>,
    ) -> Vec<MemoryLink> {
        let state = State::new(size, schedule, capacity);
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
        let timeout = |_: ()| LinkError::Timeout {
            rank: to,
            waited: started.elapsed(),
        };
        let state = self.world.lock();
        let state = self
            .world
            .take_turn(state, me, deadline)
            .map_err(|_| timeout(()))?;
        let mut state = self
            .world
            .preempt(state, me, deadline)
            .map_err(|_| timeout(()))?;
        let slot = to * self.size + me;
        while state
            .capacity
            .is_some_and(|most| state.queued[slot] >= most)
        {
            if state.phases[me] == Phase::Stuck {
                state.phases[me] = Phase::Ready;
                return Err(timeout(()));
            }
            state.phases[me] = Phase::Sending { to };
            state.hand_over(me);
            self.world.turn_moved.notify_all();
            state = match self.world.take_turn(state, me, deadline) {
                Ok(state) => state,
                Err(mut state) => {
                    state.phases[me] = Phase::Ready;
                    return Err(timeout(()));
                }
            };
        }
        state.phases[me] = Phase::Ready;
        state.queued[slot] += 1;
        let bytes: usize = frames.iter().map(Bytes::len).sum();
        state.record([
            2,
            me as u64,
            to as u64,
            tag.call ^ (u64::from(tag.step) << 32),
        ]);
        state.record([bytes as u64, 0, 0, 0]);
        let filed = state.inboxes[to].push(me, tag, frames);
        // A refused message wakes its receiver, which reports it.
        let wakes = !filed && matches!(state.phases[to], Phase::Waiting { .. });
        if wakes || state.phases[to] == (Phase::Waiting { from: me, tag }) {
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
            if let Some(refused) = state.inboxes[me].refusal() {
                state.phases[me] = Phase::Ready;
                return Err(refused);
            }
            if let Some(frames) = state.inboxes[me].pop(from, tag) {
                state.phases[me] = Phase::Ready;
                let slot = me * self.size + from;
                state.queued[slot] = state.queued[slot].saturating_sub(1);
                if state.phases[from] == (Phase::Sending { to: me }) {
                    state.phases[from] = Phase::Ready;
                }
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

    fn expect(&mut self, call: u64, stamp: &[u8]) {
        let me = self.rank;
        self.world.lock().inboxes[me].expect(call, stamp);
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
mod tests;
