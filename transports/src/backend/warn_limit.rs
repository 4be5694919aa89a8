//! Rate limiting for the warnings a peer can trigger at will.
//!
//! A peer decides how much malformed input it sends, so a warning per malformed message
//! lets it fill the logs (a flood of 200,000 bad messages once wrote 46 MB of stderr).
//! [`WarnLimit`] lets the first [`WarnLimit::BURST`] warnings of each peer through in
//! every [`WarnLimit::WINDOW`], counts the rest, and hands back one summary (the count)
//! per peer and window. The counters the sockets report (`dropped_malformed`) are kept
//! by the callers and stay exact; only the log lines are limited.
//!
//! The clock is a parameter (`now`), so the limiter is a pure state machine and its
//! tests need no sleeps.

use std::collections::HashMap;
use std::fmt::Display;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A [`WarnLimit`] for one socket that logs its own summaries: the shape every backend
/// uses for the warnings a peer can trigger (malformed input, a HELLO that cannot be
/// answered).
#[derive(Debug)]
pub(crate) struct PeerWarnings<K: Hash + Eq + Clone + Display> {
    limit: WarnLimit<K>,
    /// Names the socket in the summary lines.
    endpoint: String,
    /// When other peers' windows were last checked: at most once a second, so that a
    /// flood costs no walk over the table per message.
    swept: Instant,
}

impl<K: Hash + Eq + Clone + Display> PeerWarnings<K> {
    /// The default limits, for the socket at `endpoint`.
    pub(crate) fn new(endpoint: &str) -> Self {
        PeerWarnings {
            limit: WarnLimit::new(),
            endpoint: endpoint.to_string(),
            swept: Instant::now(),
        }
    }

    /// Counts one warning about `peer` and says whether to log it in full. Summaries
    /// that have come due (this peer's and others') are logged first.
    pub(crate) fn admit(&mut self, peer: &K) -> bool {
        let now = Instant::now();
        let verdict = self.limit.note(peer, now);
        if let Some(summary) = verdict.summary {
            log_summary(&self.endpoint, Some(peer), summary);
        }
        if now.saturating_duration_since(self.swept) >= Duration::from_secs(1) {
            self.swept = now;
            for (peer, summary) in self.limit.take_due(now) {
                log_summary(&self.endpoint, peer.as_ref(), summary);
            }
        }
        verdict.log
    }
}

impl<K: Hash + Eq + Clone + Display> Drop for PeerWarnings<K> {
    fn drop(&mut self) {
        for (peer, summary) in self.limit.take_all(Instant::now()) {
            log_summary(&self.endpoint, peer.as_ref(), summary);
        }
    }
}

/// The summary line: how many warnings about `peer` (`None`: peers past the tracked
/// ones) were counted but not logged.
fn log_summary<K: Display>(endpoint: &str, peer: Option<&K>, summary: Summary) {
    let over_ms = u64::try_from(summary.over.as_millis()).unwrap_or(u64::MAX);
    match peer {
        Some(peer) => tracing::warn!(endpoint, %peer, suppressed = summary.suppressed, over_ms,
            "more warnings about this peer were not logged (rate limit)"),
        None => tracing::warn!(
            endpoint,
            peer = "(other peers)",
            suppressed = summary.suppressed,
            over_ms,
            "more warnings about peers were not logged (rate limit)"
        ),
    }
}

/// What to log for one warning a peer triggered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Log this warning in full.
    pub(crate) log: bool,
    /// Before it, log that this many earlier warnings of the same peer were not logged.
    pub(crate) summary: Option<Summary>,
}

/// Warnings of one peer (or of the overflow bucket) that were counted, not logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    /// How many warnings were not logged.
    pub(crate) suppressed: u64,
    /// The time from the start of their window to the summary.
    pub(crate) over: Duration,
}

/// One peer's current window.
#[derive(Clone, Copy, Debug)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

impl Window {
    fn new(now: Instant) -> Window {
        Window {
            started: now,
            logged: 0,
            suppressed: 0,
        }
    }

    /// Counts one warning at `now`, opening a new window first if this one has ended.
    fn note(&mut self, now: Instant, window: Duration, burst: u32) -> Verdict {
        let mut summary = None;
        if now.saturating_duration_since(self.started) >= window {
            summary = self.close(now);
            *self = Window::new(now);
        }
        let log = self.logged < burst;
        if log {
            self.logged += 1;
        } else {
            self.suppressed += 1;
        }
        Verdict { log, summary }
    }

    fn close(&self, now: Instant) -> Option<Summary> {
        (self.suppressed > 0).then(|| Summary {
            suppressed: self.suppressed,
            over: now.saturating_duration_since(self.started),
        })
    }
}

/// Per-peer limits on warnings, keyed by whatever names a peer (`K`).
///
/// At most `max_peers` peers are tracked one by one; warnings of peers past that share
/// one overflow bucket, so a peer that makes up new identities cannot grow the table
/// without bound.
#[derive(Debug)]
pub(crate) struct WarnLimit<K> {
    burst: u32,
    window: Duration,
    max_peers: usize,
    peers: HashMap<K, Window>,
    overflow: Option<Window>,
}

/// A summary that [`WarnLimit::take_due`] or [`WarnLimit::take_all`] hands back; `peer`
/// is `None` for the overflow bucket.
pub(crate) type Due<K> = (Option<K>, Summary);

impl<K: Hash + Eq + Clone> WarnLimit<K> {
    /// Warnings logged in full per peer and window.
    pub(crate) const BURST: u32 = 5;
    /// The window after which a peer's count is summarised and its burst restored.
    pub(crate) const WINDOW: Duration = Duration::from_secs(10);
    /// Peers tracked one by one.
    pub(crate) const MAX_PEERS: usize = 1024;

    /// A limiter with the defaults above.
    pub(crate) fn new() -> Self {
        WarnLimit::with(Self::BURST, Self::WINDOW, Self::MAX_PEERS)
    }

    /// A limiter with explicit settings (`max_peers` at least 1).
    pub(crate) fn with(burst: u32, window: Duration, max_peers: usize) -> Self {
        WarnLimit {
            burst,
            window,
            max_peers: max_peers.max(1),
            peers: HashMap::new(),
            overflow: None,
        }
    }

    /// Counts one warning of `peer` at `now` and says what to log.
    pub(crate) fn note(&mut self, peer: &K, now: Instant) -> Verdict {
        let (window, burst) = (self.window, self.burst);
        if let Some(state) = self.peers.get_mut(peer) {
            return state.note(now, window, burst);
        }
        if self.peers.len() >= self.max_peers {
            self.forget_quiet(now);
        }
        if self.peers.len() < self.max_peers {
            let mut state = Window::new(now);
            let verdict = state.note(now, window, burst);
            self.peers.insert(peer.clone(), state);
            return verdict;
        }
        self.overflow
            .get_or_insert_with(|| Window::new(now))
            .note(now, window, burst)
    }

    /// Summaries of the windows that have ended by `now` with warnings suppressed;
    /// those peers start afresh. Peers whose window ended with nothing to report are
    /// forgotten.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Due<K>> {
        let window = self.window;
        let ended = |w: &Window| now.saturating_duration_since(w.started) >= window;
        let mut due = Vec::new();
        self.peers.retain(|peer, w| {
            if !ended(w) {
                return true;
            }
            if let Some(summary) = w.close(now) {
                due.push((Some(peer.clone()), summary));
            }
            false
        });
        if let Some(w) = self.overflow.filter(ended) {
            if let Some(summary) = w.close(now) {
                due.push((None, summary));
            }
            self.overflow = None;
        }
        due
    }

    /// Every pending summary, ended window or not (for a socket that is closing).
    pub(crate) fn take_all(&mut self, now: Instant) -> Vec<Due<K>> {
        let mut due: Vec<Due<K>> = self
            .peers
            .drain()
            .filter_map(|(peer, w)| w.close(now).map(|s| (Some(peer), s)))
            .collect();
        if let Some(summary) = self.overflow.take().and_then(|w| w.close(now)) {
            due.push((None, summary));
        }
        due
    }

    /// Drops the peers whose window has ended with nothing suppressed: forgetting them
    /// loses no count.
    fn forget_quiet(&mut self, now: Instant) {
        let window = self.window;
        self.peers
            .retain(|_, w| now.saturating_duration_since(w.started) < window || w.suppressed > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn logged(v: Verdict) -> bool {
        v.log
    }

    #[test]
    fn first_burst_is_logged_then_counted() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(3, 1000 * MS, 8);
        let verdicts: Vec<Verdict> = (0..10).map(|i| limit.note(&"a", t0 + i * MS)).collect();
        assert_eq!(verdicts.iter().filter(|v| logged(**v)).count(), 3);
        assert!(verdicts[..3].iter().all(|v| v.log && v.summary.is_none()));
        assert!(verdicts[3..].iter().all(|v| !v.log && v.summary.is_none()));
        // Nothing is due before the window ends.
        assert!(limit.take_due(t0 + 999 * MS).is_empty());
    }

    #[test]
    fn next_warning_after_the_window_carries_the_summary() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(2, 1000 * MS, 8);
        for i in 0..7 {
            limit.note(&"a", t0 + i * MS);
        }
        let v = limit.note(&"a", t0 + 1500 * MS);
        assert!(v.log, "a new window restores the burst");
        assert_eq!(
            v.summary,
            Some(Summary {
                suppressed: 5,
                over: 1500 * MS
            })
        );
        // The new window has no suppressed warnings, so it has nothing to say.
        let again = limit.note(&"a", t0 + 1501 * MS);
        assert_eq!(
            again,
            Verdict {
                log: true,
                summary: None
            }
        );
    }

    #[test]
    fn peers_are_limited_separately() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(1, 1000 * MS, 8);
        assert!(limit.note(&"a", t0).log);
        assert!(!limit.note(&"a", t0).log);
        assert!(limit.note(&"b", t0).log, "b has its own burst");
        assert!(!limit.note(&"b", t0).log);
    }

    #[test]
    fn take_due_reports_ended_windows_once() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(1, 1000 * MS, 8);
        for _ in 0..4 {
            limit.note(&"a", t0);
        }
        limit.note(&"b", t0 + 500 * MS);
        limit.note(&"b", t0 + 500 * MS);
        let mut due = limit.take_due(t0 + 1000 * MS);
        assert_eq!(
            due,
            vec![(
                Some("a"),
                Summary {
                    suppressed: 3,
                    over: 1000 * MS
                }
            )]
        );
        assert!(limit.take_due(t0 + 1000 * MS).is_empty(), "reported once");
        due = limit.take_due(t0 + 1600 * MS);
        assert_eq!(
            due,
            vec![(
                Some("b"),
                Summary {
                    suppressed: 1,
                    over: 1100 * MS
                }
            )]
        );
        // "a" was forgotten when its summary was taken: its next warning is logged.
        assert_eq!(
            limit.note(&"a", t0 + 1700 * MS),
            Verdict {
                log: true,
                summary: None
            }
        );
    }

    #[test]
    fn take_all_reports_open_windows() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(1, 1000 * MS, 8);
        limit.note(&"a", t0);
        limit.note(&"a", t0 + MS);
        limit.note(&"b", t0);
        let due = limit.take_all(t0 + 10 * MS);
        assert_eq!(
            due,
            vec![(
                Some("a"),
                Summary {
                    suppressed: 1,
                    over: 10 * MS
                }
            )]
        );
        assert!(limit.take_all(t0 + 20 * MS).is_empty());
    }

    #[test]
    fn made_up_identities_share_the_overflow_bucket() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(2, 1000 * MS, 4);
        let mut logged_lines = 0;
        for peer in 0..1000u32 {
            if limit.note(&peer, t0).log {
                logged_lines += 1;
            }
        }
        // Four tracked peers, one line each, then the overflow bucket's burst of two.
        assert_eq!(logged_lines, 4 + 2);
        assert!(limit.peers.len() <= 4);
        let due = limit.take_all(t0 + MS);
        assert_eq!(
            due,
            vec![(
                None,
                Summary {
                    suppressed: 994,
                    over: MS
                }
            )]
        );
    }

    #[test]
    fn quiet_peers_make_room_for_new_ones() {
        let t0 = Instant::now();
        let mut limit = WarnLimit::with(2, 1000 * MS, 2);
        limit.note(&1, t0);
        limit.note(&2, t0);
        // Both windows have ended with nothing suppressed: peer 3 gets its own window.
        let v = limit.note(&3, t0 + 1000 * MS);
        assert_eq!(
            v,
            Verdict {
                log: true,
                summary: None
            }
        );
        assert!(limit.peers.contains_key(&3));
        assert!(limit.overflow.is_none());
    }

    #[test]
    fn a_sustained_flood_logs_a_bounded_number_of_lines() {
        // 200,000 malformed messages over 100 s from one peer: 5 lines and one summary
        // per 10 s window, and the summaries add up to everything that was not logged.
        let t0 = Instant::now();
        let mut limit = WarnLimit::<&str>::new();
        let (mut lines, mut summarised) = (0u64, 0u64);
        for i in 0..200_000u32 {
            let v = limit.note(&"flood", t0 + Duration::from_micros(u64::from(i) * 500));
            lines += u64::from(v.log);
            if let Some(s) = v.summary {
                lines += 1;
                summarised += s.suppressed;
            }
        }
        for (_, s) in limit.take_all(t0 + Duration::from_secs(100)) {
            lines += 1;
            summarised += s.suppressed;
        }
        let logged_in_full = 10 * u64::from(WarnLimit::<&str>::BURST);
        assert_eq!(lines, logged_in_full + 10);
        assert_eq!(summarised + logged_in_full, 200_000);
    }
}
