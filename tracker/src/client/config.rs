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

    /// The sleep after the `k`-th failed connect (`k` from 1).
    pub(crate) fn backoff_after(&self, k: u32) -> Duration {
        self.connect_backoff.saturating_mul(k)
    }
}
