//! Messages in flight.

use crate::{Faults, Rng};

/// What the scheduler does next: deliver a message, or let the clock run.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<C, M> {
    /// Deliver `M` on channel `C` now.
    Deliver(C, M),
    /// Let the clock run; `idle` when no message is due at all (a simulation may then
    /// jump further, past graces and timeouts).
    Advance {
        /// No message was due.
        idle: bool,
    },
}

/// Messages in flight on channels `C` (a connection and its direction, a pair of
/// processes), each due at a time `T`.
///
/// Order is kept per channel, as one TCP connection or ZeroMQ pipe keeps it: a
/// message is never due before the one sent ahead of it on its channel, and only the
/// first of a channel can be delivered. Across channels, any due message may go
/// first: that is the reordering.
///
/// # Examples
///
/// ```
/// use switchyard_sim::{Faults, Network, Rng, Step};
/// let mut net: Network<u8, u32, &str> = Network::default();
/// net.send(1, 50, "late");
/// net.send(1, 10, "after the late one"); // its channel's order holds it back
/// net.send(2, 20, "other channel");
/// assert_eq!(net.next_due_after(0), Some(20));
/// let (mut rng, faults) = (Rng::new(0), Faults { hold: 0, ..Faults::delays(Default::default(), Default::default()) });
/// assert_eq!(net.step(&mut rng, &faults, 5), Step::Advance { idle: true });
/// assert_eq!(net.step(&mut rng, &faults, 20), Step::Deliver(2, "other channel"));
/// assert_eq!(net.step(&mut rng, &faults, 50), Step::Deliver(1, "late"));
/// assert_eq!(net.step(&mut rng, &faults, 50), Step::Deliver(1, "after the late one"));
/// assert!(net.is_empty());
/// ```
#[derive(Debug)]
pub struct Network<C, T, M> {
    flights: Vec<(C, T, M)>,
}

impl<C, T, M> Default for Network<C, T, M> {
    fn default() -> Self {
        Network {
            flights: Vec::new(),
        }
    }
}

impl<C: PartialEq + Copy, T: Ord + Copy, M> Network<C, T, M> {
    /// Sends `message` on `channel`, due at `at` or, if later, when the last message
    /// sent on the channel is due.
    pub fn send(&mut self, channel: C, at: T, message: M) {
        let at = self
            .flights
            .iter()
            .filter(|(c, _, _)| *c == channel)
            .map(|(_, t, _)| *t)
            .max()
            .map_or(at, |last| last.max(at));
        self.flights.push((channel, at, message));
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.flights.is_empty()
    }

    /// How many messages are in flight.
    pub fn len(&self) -> usize {
        self.flights.len()
    }

    /// The messages in flight, in send order: channel, due time, message.
    pub fn iter(&self) -> impl Iterator<Item = &(C, T, M)> {
        self.flights.iter()
    }

    /// The earliest time a message falls due after `now`, to bound a jump of the
    /// clock.
    pub fn next_due_after(&self, now: T) -> Option<T> {
        self.flights
            .iter()
            .map(|(_, t, _)| *t)
            .filter(|t| *t > now)
            .min()
    }

    /// Drops every message in flight on the channels `gone` says (a connection
    /// closed, a process crashed); returns how many.
    pub fn discard(&mut self, mut gone: impl FnMut(&C) -> bool) -> usize {
        let before = self.flights.len();
        self.flights.retain(|(c, _, _)| !gone(c));
        before - self.flights.len()
    }

    /// The next step at `now`: a message that is due and first on its channel, the
    /// seed choosing which, unless [`Faults::holds`] lets the clock run instead.
    pub fn step(&mut self, rng: &mut Rng, faults: &Faults, now: T) -> Step<C, M> {
        let due: Vec<usize> = (0..self.flights.len())
            .filter(|&i| {
                let (channel, at, _) = &self.flights[i];
                *at <= now && !self.flights[..i].iter().any(|(c, _, _)| c == channel)
            })
            .collect();
        if due.is_empty() {
            return Step::Advance { idle: true };
        }
        if faults.holds(rng) {
            return Step::Advance { idle: false };
        }
        let i = due[rng.below(due.len() as u64) as usize];
        let (channel, _, message) = self.flights.remove(i);
        Step::Deliver(channel, message)
    }
}
