//! The steps of the endpoint exchange over the tracker's ring, without sockets: what
//! to send next, when the exchange is over, and the check that it closed (`ring.rs`
//! describes the exchange; it does the I/O and the watching).

/// A ring's entry: the identity of the sender's attempt, and its endpoint.
pub(super) type Entry = (u64, String);

/// What to do after a frame came in.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Send this entry to the successor, then read the predecessor's next one.
    Send(Entry),
    /// The exchange is over: every rank's endpoint, in rank order.
    Over(Vec<String>),
}

/// The ring brought back another entry than this attempt's own: the links behind it
/// do not close the ring through it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NotBack {
    /// What came instead.
    pub(super) got: Entry,
}

/// One rank's exchange: at step `k` it sends entry `rank − k` and receives entry
/// `rank − k − 1`, for `world` steps, the last of which brings back its own.
#[derive(Debug)]
pub(super) struct RingSteps {
    rank: usize,
    /// Entry `q` is rank `q`'s, once received (this rank's from the start).
    all: Vec<Entry>,
    /// Frames received so far.
    got: usize,
    /// Whether the last step's entry is checked (always, but in the simulation's
    /// variant that shows what the check catches).
    check: bool,
}

impl RingSteps {
    /// The exchange of `rank` of `world` (at least 2), whose attempt `attempt` listens
    /// at `endpoint`; and the first entry to send (its own).
    pub(super) fn new(
        rank: usize,
        world: usize,
        attempt: u64,
        endpoint: &str,
    ) -> (RingSteps, Entry) {
        let mut all = vec![(0, String::new()); world];
        all[rank] = (attempt, endpoint.to_string());
        let first = all[rank].clone();
        let steps = RingSteps {
            rank,
            all,
            got: 0,
            check: true,
        };
        (steps, first)
    }

    /// The step this rank is at (the frames it has received).
    #[cfg(test)]
    pub(super) fn step(&self) -> usize {
        self.got
    }

    /// The predecessor's frame of the current step.
    pub(super) fn on_frame(&mut self, got: Entry) -> Result<Next, NotBack> {
        let n = self.all.len();
        let from = (self.rank + n - self.got - 1) % n;
        self.got += 1;
        if from != self.rank {
            self.all[from] = got;
        } else if self.check && got != self.all[self.rank] {
            return Err(NotBack { got });
        }
        if self.got == n {
            let all = std::mem::take(&mut self.all);
            return Ok(Next::Over(all.into_iter().map(|(_, e)| e).collect()));
        }
        Ok(Next::Send(self.all[(self.rank + n - self.got) % n].clone()))
    }

    /// Turns the check of the last step off: the simulation's variant without it.
    #[cfg(test)]
    pub(super) fn unchecked(mut self) -> RingSteps {
        self.check = false;
        self
    }
}

#[cfg(test)]
#[path = "ring_sim_tests.rs"]
mod sim_tests;
