//! Tuning and deadlines of a [`Communicator`](super::Communicator).

use std::time::Duration;
use switchyard_transports::SocketOptions;

/// Environment variable overriding [`CommOptions::ring_threshold`] (bytes).
pub const ENV_RING_THRESHOLD: &str = "SWITCHYARD_RING_THRESHOLD";
/// Environment variable overriding [`CommOptions::timeout`] (seconds, may be
/// fractional).
pub const ENV_TIMEOUT: &str = "SWITCHYARD_COLLECTIVE_TIMEOUT";

/// How a communicator's mesh engine behaves. The defaults come from
/// `switchyard bench allreduce` on the project machines (see `BENCHMARKS.md`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard::collective::CommOptions;
/// let options = CommOptions::default()
///     .with_timeout(Duration::from_secs(10))
///     .with_ring_threshold(1 << 20);
/// assert_eq!(options.ring_threshold, 1 << 20);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CommOptions {
    /// How long one collective call may wait for a peer before it fails with
    /// `PeerTimeout` (default 300 s; also [`ENV_TIMEOUT`]). A peer that died is noticed
    /// only by this deadline on ZeroMQ links, so keep it as short as your slowest
    /// legitimate gap between ranks allows.
    pub timeout: Duration,
    /// Buffers of at least this many bytes take the ring (allreduce) or the chain
    /// (broadcast); smaller ones recursive doubling or a binomial tree (default
    /// 64 KiB; also [`ENV_RING_THRESHOLD`]).
    pub ring_threshold: usize,
    /// Largest piece the ring and chain send at once (default 256 KiB).
    pub piece_bytes: usize,
    /// Most pieces a rank keeps in flight ahead of what it received (default 16; kept
    /// below half the sockets' high-water mark).
    pub window: usize,
    /// Options of the mesh's sockets.
    pub socket: SocketOptions,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(300),
            ring_threshold: 64 << 10,
            piece_bytes: 256 << 10,
            window: 16,
            socket: SocketOptions::default(),
        }
    }
}

impl CommOptions {
    /// The defaults, with [`ENV_RING_THRESHOLD`] and [`ENV_TIMEOUT`] applied when set.
    /// A value that does not parse is ignored with a warning.
    pub fn from_env() -> CommOptions {
        let mut options = CommOptions::default();
        if let Ok(v) = std::env::var(ENV_RING_THRESHOLD) {
            match v.trim().parse() {
                Ok(bytes) => options.ring_threshold = bytes,
                Err(_) => tracing::warn!(var = ENV_RING_THRESHOLD, value = %v, "not a byte count; ignored"),
            }
        }
        if let Ok(v) = std::env::var(ENV_TIMEOUT) {
            match v.trim().parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok()) {
                Some(timeout) => options.timeout = timeout,
                None => tracing::warn!(var = ENV_TIMEOUT, value = %v, "not a number of seconds; ignored"),
            }
        }
        options
    }

    /// Sets [`CommOptions::timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`CommOptions::ring_threshold`].
    pub fn with_ring_threshold(mut self, bytes: usize) -> Self {
        self.ring_threshold = bytes;
        self
    }

    /// Sets [`CommOptions::piece_bytes`] (at least 1).
    pub fn with_piece_bytes(mut self, bytes: usize) -> Self {
        self.piece_bytes = bytes.max(1);
        self
    }

    /// Sets [`CommOptions::window`] (at least 1).
    pub fn with_window(mut self, pieces: usize) -> Self {
        self.window = pieces.max(1);
        self
    }

    /// Sets [`CommOptions::socket`].
    pub fn with_socket(mut self, socket: SocketOptions) -> Self {
        self.socket = socket;
        self
    }

    /// The window actually used: never more than half the high-water mark.
    pub(crate) fn effective_window(&self) -> usize {
        self.window.min(self.socket.hwm / 2).max(1)
    }
}
