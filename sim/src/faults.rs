//! The world's misbehaviour, each a decision drawn from the seed.

use crate::Rng;
use std::time::Duration;

/// How often, and how badly, the simulated world misbehaves.
///
/// Each field is one kind of fault; each method draws one decision about it from the
/// seed's [`Rng`]. A simulation asks only for the faults its real transport can
/// produce: TCP and ZeroMQ keep order per connection, so reordering is across
/// channels only ([`Network`](crate::Network)); a message is lost only with its
/// connection (a drop is a closed or reset connection, not a missing byte); a
/// duplicate is a replay by someone else, not the transport's.
///
/// A method whose fault is off draws nothing, so turning a fault off does not shift
/// the choices that follow (but turning one on does: the seeds then tell other
/// stories).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_sim::{Faults, Rng};
/// let faults = Faults {
///     crash: 10,
///     pause: (5, Duration::from_secs(2)),
///     ..Faults::delays(Duration::from_millis(2), Duration::from_millis(10))
/// };
/// let mut rng = Rng::new(1);
/// let d = faults.delay(&mut rng);
/// assert!(d >= Duration::from_millis(2) && d < Duration::from_millis(10));
/// assert!(!faults.drops(&mut rng)); // off: always false, nothing drawn
/// let _crashes: bool = faults.crashes(&mut rng);
/// assert!(faults.pause(&mut rng).is_none_or(|p| p < Duration::from_secs(2)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults {
    /// Each message's delay is drawn from `delay.0..delay.1`.
    pub delay: (Duration, Duration),
    /// Percent of chances the scheduler takes to let the clock run although a message
    /// is due (so that timers race deliveries) instead of delivering one.
    pub hold: u64,
    /// Percent of connections that are closed (reset) at a point of the seed's choice.
    pub drop: u64,
    /// Percent of messages that someone sends again (a replay).
    pub duplicate: u64,
    /// Percent of chances a process takes to crash.
    pub crash: u64,
    /// Percent of chances a process takes to stop (SIGSTOP), and the longest stop.
    pub pause: (u64, Duration),
}

impl Faults {
    /// A world that only delays: messages take `lo..hi`, the clock runs past a due
    /// message one time in ten, nothing is lost, repeated, crashed or stopped.
    pub fn delays(lo: Duration, hi: Duration) -> Faults {
        Faults {
            delay: (lo, hi),
            hold: 10,
            drop: 0,
            duplicate: 0,
            crash: 0,
            pause: (0, Duration::ZERO),
        }
    }

    /// One message's delay.
    pub fn delay(&self, rng: &mut Rng) -> Duration {
        rng.between(self.delay.0, self.delay.1)
    }

    /// Whether the scheduler lets the clock run rather than deliver a due message.
    pub fn holds(&self, rng: &mut Rng) -> bool {
        self.hold > 0 && rng.chance(self.hold)
    }

    /// Whether this connection is dropped.
    pub fn drops(&self, rng: &mut Rng) -> bool {
        self.drop > 0 && rng.chance(self.drop)
    }

    /// Whether this message is sent again.
    pub fn duplicates(&self, rng: &mut Rng) -> bool {
        self.duplicate > 0 && rng.chance(self.duplicate)
    }

    /// Whether the process crashes here.
    pub fn crashes(&self, rng: &mut Rng) -> bool {
        self.crash > 0 && rng.chance(self.crash)
    }

    /// How long the process stops here, if it does.
    pub fn pause(&self, rng: &mut Rng) -> Option<Duration> {
        let (percent, longest) = self.pause;
        (percent > 0 && rng.chance(percent)).then(|| rng.up_to(longest))
    }
}
