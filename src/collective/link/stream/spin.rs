//! How long a waiting rank polls before it sleeps, and how it notices that this host's
//! cores are shared with other work.
//!
//! On a host whose ranks have a core each, a long spin keeps two ranks from taking
//! turns to sleep (every call paying a wake-up). On a host whose cores are shared
//! with other work (another job, a data loader, a compiler), the same spin takes the
//! core the peer needs to send what this rank waits for: calls then run 5-30 times
//! slower than with no spin at all. The rank cannot count the other work, but it can
//! see its effect: a spinning rank that loses its core finds a gap between two of its
//! polls far longer than a poll takes. After such a gap it stops that spin; after a
//! second one within [`SEEN_WITHIN`] (one alone may be the launcher's own thread or
//! the hypervisor, which an idle host has too) its waits go straight to sleep for
//! [`SHARED_FOR`], which a woken rank's scheduler priority then makes fast; after that
//! the full spin is tried again.

use std::time::{Duration, Instant};

/// A gap between two polls of one spinning wait that means the rank lost its core:
/// a poll without progress takes a few microseconds, a time slice of another thread
/// a millisecond or more.
pub(super) const PREEMPTED: Duration = Duration::from_micros(200);

/// How close two preemptions must be for the cores to count as shared.
pub(super) const SEEN_WITHIN: Duration = Duration::from_millis(100);

/// How long the waits stay short once the cores count as shared.
pub(super) const SHARED_FOR: Duration = Duration::from_secs(1);

/// The spin of a link's waits: fixed when the user set it, else the chosen length
/// on an unshared host and none while its cores are seen shared.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spin {
    /// The spin on an unshared host, or the one the user set.
    full: Duration,
    /// Whether the user set it (then it is kept whatever the host does).
    fixed: bool,
    /// Until when the cores count as shared.
    shared_until: Option<Instant>,
    /// When a spinning wait last lost its core.
    last_preempted: Option<Instant>,
}

impl Spin {
    /// A spin the user set: kept as it is.
    pub(super) fn fixed(spin: Duration) -> Spin {
        Spin {
            full: spin,
            fixed: true,
            shared_until: None,
            last_preempted: None,
        }
    }

    /// A spin the link chose: `full`, unless the host's cores are seen shared.
    pub(super) fn chosen(full: Duration) -> Spin {
        Spin {
            full,
            fixed: false,
            shared_until: None,
            last_preempted: None,
        }
    }

    /// How long a wait that starts at `now` spins.
    pub(super) fn length(&self, now: Instant) -> Duration {
        match self.shared_until {
            Some(until) if now < until => Duration::ZERO,
            _ => self.full,
        }
    }

    /// Notes that two polls of a spinning wait were `gap` apart, the second at
    /// `now`. Returns true when the wait should stop spinning: the rank lost its
    /// core (unless the user set the spin); the second time within [`SEEN_WITHIN`],
    /// the cores count as shared.
    pub(super) fn preempted(&mut self, gap: Duration, now: Instant) -> bool {
        if self.fixed || gap < PREEMPTED {
            return false;
        }
        if self
            .last_preempted
            .is_some_and(|last| now.saturating_duration_since(last) <= SEEN_WITHIN)
        {
            self.shared_until = Some(now + SHARED_FOR);
        }
        self.last_preempted = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: Duration = Duration::from_millis(1);

    #[test]
    fn a_chosen_spin_stops_after_a_preemption_and_comes_back_later() {
        let start = Instant::now();
        let mut spin = Spin::chosen(FULL);
        assert_eq!(spin.length(start), FULL);
        // Polls a few microseconds apart: the core is this rank's.
        assert!(!spin.preempted(Duration::from_micros(5), start));
        assert_eq!(spin.length(start), FULL);
        // A time slice of someone else: stop this spin; one alone changes nothing
        // else.
        let later = start + Duration::from_micros(900);
        assert!(spin.preempted(Duration::from_micros(800), later));
        assert_eq!(spin.length(later), FULL);
        // A second one soon after: the cores are shared, do not spin for a while.
        let later = later + SEEN_WITHIN / 2;
        assert!(spin.preempted(Duration::from_micros(800), later));
        assert_eq!(spin.length(later), Duration::ZERO);
        assert_eq!(spin.length(later + SHARED_FOR / 2), Duration::ZERO);
        // Then the full spin is tried again.
        assert_eq!(spin.length(later + SHARED_FOR), FULL);
    }

    #[test]
    fn preemptions_far_apart_leave_the_spin_as_it_is() {
        let start = Instant::now();
        let mut spin = Spin::chosen(FULL);
        let mut at = start;
        for _ in 0..5 {
            at += SEEN_WITHIN * 2;
            assert!(spin.preempted(Duration::from_millis(2), at));
            assert_eq!(spin.length(at), FULL);
        }
    }

    #[test]
    fn a_spin_the_user_set_is_kept_whatever_the_host_does() {
        let start = Instant::now();
        let mut spin = Spin::fixed(FULL);
        assert!(!spin.preempted(Duration::from_millis(5), start));
        assert_eq!(spin.length(start), FULL);
    }
}
