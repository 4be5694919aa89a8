use crate::wire::Limits;
use std::time::Duration;

/// How a worker connects to its tracker and how long it waits for each step.
///
/// Connecting retries like XGBoost 1.7's worker (the classic rabit protocol): up to
/// [`connect_attempts`](Self::connect_attempts) tries, sleeping
/// `k ×` [`connect_backoff`](Self::connect_backoff) after the `k`-th failure (2, 4, 6,
/// 8 s with the defaults: about 20 s before giving up on a tracker that is not up).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Tries to open each tracker connection (at least 1). Default 5.
    pub connect_attempts: u32,
    /// Sleep unit between tries (see above). Default 2 s.
    pub connect_backoff: Duration,
    /// Limit on one TCP connect (tracker or peer). Default 10 s.
    pub connect_timeout: Duration,
    /// Limit on each exchange with the tracker or a peer that should answer at once
    /// (magic, negotiation rounds, peer handshakes). Default 60 s.
    pub io_timeout: Duration,
    /// How long `start` waits for its rank: the tracker answers only when the whole
    /// batch of workers has arrived. Default 30 min.
    pub batch_timeout: Duration,
    /// How long to wait for the peers that must connect to this worker after the
    /// negotiation (they negotiate one after another). Default 30 min.
    pub accept_timeout: Duration,
    /// Caps on what the tracker or a peer may make us read.
    pub limits: Limits,
    /// Classic joins only: whether a join fails at once, closing its listener, when a
    /// link it already made closes before the join is over (the peer's own join failed,
    /// or it died), rather than wait for the rest of its peers; and whether it then
    /// refuses to shake hands with a peer that connects. The caller must keep every
    /// link open until no peer can still be joining (switchyard's tracker mesh keeps
    /// them until its ring exchange, which every rank must have joined to finish, is
    /// over): a peer that drops a link it no longer needs would fail a join that is
    /// still accepting. A peer that sends anything on a link before the join is over
    /// has left it too, except the ring predecessor, whose first bytes of what follows
    /// the join may come early: switchyard's peers send nothing else there but, once
    /// their own use of the links is over, [`DONE`](super::classic::DONE), which a peer
    /// that is still joining cannot see from a peer of its own set. Default off.
    pub watch_links: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_attempts: 5,
            connect_backoff: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(60),
            batch_timeout: Duration::from_secs(30 * 60),
            accept_timeout: Duration::from_secs(30 * 60),
            limits: Limits::default(),
            watch_links: false,
        }
    }
}

impl ClientConfig {
    /// The same configuration with every wait capped at `limit` (tests, and jobs that
    /// should fail fast rather than wait for stragglers). The connect retries keep
    /// their number, but their sleeps shrink so that all of them together take at
    /// most about `limit`.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        let attempts = self.connect_attempts.max(1);
        // Sleeps are unit × (1 + 2 + … + (attempts − 1)).
        let units = attempts * (attempts - 1) / 2;
        if units > 0 {
            self.connect_backoff = self.connect_backoff.min(limit / units);
        }
        self.connect_timeout = self.connect_timeout.min(limit);
        self.io_timeout = self.io_timeout.min(limit);
        self.batch_timeout = limit;
        self.accept_timeout = limit;
        self
    }

    /// A fresh connect schedule (one per connection to open).
    pub(crate) fn retries(&self) -> Retries {
        Retries {
            attempts: self.connect_attempts.max(1),
            failed: 0,
            backoff: self.connect_backoff,
        }
    }
}

/// The connect schedule of [`ClientConfig`]: fed each failed try, it says how long to
/// sleep before the next, or that there is none. The sleeping and connecting are the
/// caller's.
#[derive(Clone, Debug)]
pub(crate) struct Retries {
    attempts: u32,
    failed: u32,
    backoff: Duration,
}

impl Retries {
    /// Tries allowed in all.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// A try failed: the sleep before the next (`k ×` the backoff after the `k`-th
    /// failure), or `None` when that was the last try.
    pub(crate) fn on_failure(&mut self) -> Option<Duration> {
        self.failed += 1;
        (self.failed < self.attempts).then(|| self.backoff.saturating_mul(self.failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeps(config: &ClientConfig) -> Vec<Duration> {
        let mut r = config.retries();
        std::iter::from_fn(|| r.on_failure()).collect()
    }

    #[test]
    fn the_default_schedule_sleeps_longer_after_each_failure() {
        let config = ClientConfig::default();
        assert_eq!(config.retries().attempts(), 5);
        let s = Duration::from_secs;
        assert_eq!(sleeps(&config), [s(2), s(4), s(6), s(8)]);
    }

    #[test]
    fn a_capped_schedule_keeps_its_tries_and_shrinks_its_sleeps() {
        let config = ClientConfig::default().with_timeout(Duration::from_secs(1));
        let total: Duration = sleeps(&config).iter().sum();
        assert_eq!(sleeps(&config).len(), 4);
        assert!(total <= Duration::from_secs(1), "{total:?}");
    }

    #[test]
    fn no_tries_is_one_try_and_no_sleep() {
        let config = ClientConfig {
            connect_attempts: 0,
            ..ClientConfig::default()
        };
        assert_eq!(config.retries().attempts(), 1);
        assert!(sleeps(&config).is_empty());
    }
}
