//! When robust mode tries again to form its mesh, and when it gives up: the decisions
//! of the retry loop in `join.rs`, without sockets or clocks (the caller says what
//! time it is).
//!
//! A failed attempt is tried again after [`PAUSE`] plus a random part whose range
//! doubles after each failure (up to [`SPREAD_MAX`]), drawn from a generator seeded by
//! the worker's identity, so that ranks that failed together do not all come back
//! together, and a test sees the same pauses every run. No pause reaches past the
//! budget (the collective timeout): the last attempt's error is the answer then.

use std::time::{Duration, Instant};

/// The shortest pause between two attempts.
pub(super) const PAUSE: Duration = Duration::from_millis(50);

/// The longest random part of that pause.
pub(super) const SPREAD_MAX: Duration = Duration::from_millis(800);

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum After {
    /// Pause this long, then try again.
    Retry(Duration),
    /// The budget would run out before the next attempt: report the last failure.
    GiveUp,
}

/// The retry loop's state: the budget's end and the pauses drawn so far.
#[derive(Clone, Debug)]
pub(super) struct Retries {
    until: Instant,
    /// The generator's state (SplitMix64).
    state: u64,
    failed: u32,
}

impl Retries {
    /// Attempts that began at `now`, for the worker identified by `seed`, within
    /// `budget` in all.
    pub(super) fn new(seed: &str, now: Instant, budget: Duration) -> Retries {
        // FNV-1a of the seed.
        let state = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Retries {
            until: now + budget,
            state,
            failed: 0,
        }
    }

    /// An attempt failed at `now`.
    pub(super) fn failed(&mut self, now: Instant) -> After {
        let pause = self.next_pause();
        if now + pause >= self.until {
            After::GiveUp
        } else {
            After::Retry(pause)
        }
    }

    /// The pause after another failed attempt.
    fn next_pause(&mut self) -> Duration {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let spread = (PAUSE * 2u32.pow(self.failed.min(5))).min(SPREAD_MAX);
        self.failed += 1;
        let nanos = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
        PAUSE + Duration::from_nanos(z % nanos.max(1))
    }
}

/// How long one attempt waits for an answer, from the collective timeout: a quarter
/// of it, 1 to 5 s, so that an attempt a death broke leaves time for the next ones.
pub(super) fn attempt_limit(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pauses(seed: &str, n: usize) -> Vec<Duration> {
        let now = Instant::now();
        let mut r = Retries::new(seed, now, Duration::from_secs(3600));
        (0..n)
            .map(|_| match r.failed(now) {
                After::Retry(p) => p,
                After::GiveUp => panic!("a budget of an hour ran out"),
            })
            .collect()
    }

    /// Each pause is 50 ms plus a random part below 50, 100, 200, 400, 800, 800, ...
    /// ms: the range doubles with each failure, up to 800 ms.
    #[test]
    fn the_pauses_grow_within_their_ranges() {
        for seed in ["0/Start", "1/Recover { rank: 1 }", "worker-7/Start"] {
            for (k, p) in pauses(seed, 8).into_iter().enumerate() {
                let spread = (PAUSE * 2u32.pow(k.min(5) as u32)).min(SPREAD_MAX);
                assert!(p >= PAUSE && p < PAUSE + spread, "{seed}, pause {k}: {p:?}");
            }
        }
    }

    /// One identity draws the same pauses every run, and two identities different
    /// ones (ranks that failed together do not come back together).
    #[test]
    fn the_pauses_are_the_same_for_one_worker_and_differ_between_workers() {
        assert_eq!(pauses("3/Start", 6), pauses("3/Start", 6));
        assert_ne!(pauses("3/Start", 6), pauses("4/Start", 6));
    }

    /// With attempts that each fail after `took`, the loop gives up before a pause
    /// would end past the budget, and never pauses past it.
    #[test]
    fn no_pause_ends_past_the_budget() {
        let budget = Duration::from_secs(8);
        for took in [
            Duration::ZERO,
            Duration::from_millis(300),
            Duration::from_secs(2),
        ] {
            let began = Instant::now();
            let mut r = Retries::new("2/Recover { rank: 2 }", began, budget);
            let mut now = began;
            let mut attempts = 0;
            loop {
                attempts += 1;
                now += took;
                match r.failed(now) {
                    After::Retry(pause) => {
                        now += pause;
                        assert!(now < began + budget, "paused past the budget: {took:?}");
                    }
                    After::GiveUp => break,
                }
            }
            // Attempts that fail at once are retried until the budget is nearly spent.
            let spent = now.saturating_duration_since(began);
            assert!(
                spent + SPREAD_MAX + PAUSE + took >= budget,
                "{took:?}: {spent:?}"
            );
            assert!(attempts >= 2, "{took:?}: {attempts} attempts");
        }
    }

    #[test]
    fn an_attempt_waits_a_quarter_of_the_timeout_between_1_and_5_s() {
        let s = Duration::from_secs;
        assert_eq!(attempt_limit(s(8)), s(2));
        assert_eq!(attempt_limit(s(2)), s(1));
        assert_eq!(attempt_limit(s(300)), s(5));
    }
}
