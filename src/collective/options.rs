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
    /// Whether the MPI engine checks, before each call, that every rank passes the
    /// same length and call (one small `MPI_Allgather`; default true). MPI itself
    /// would hang or truncate instead. The mesh engine checks on every message for
    /// free and ignores this.
    pub mpi_arg_checks: bool,
    /// How a mesh over `tcp://` endpoints moves collective data (default
    /// [`DataPath::Tcp`]; also [`ENV_DATA_PATH`]).
    pub data_path: DataPath,
    /// How long a rank waiting for data on the TCP path polls its connections before
    /// it sleeps in `poll(2)` (default 50 us). Spinning saves a wake-up (about 30 us
    /// on the project machines) per message; it costs CPU only while a call waits.
    pub spin: Duration,
}

/// Environment variable overriding [`CommOptions::data_path`]: `tcp` or `zmq`.
pub const ENV_DATA_PATH: &str = "SWITCHYARD_DATA_PATH";

/// How a mesh over `tcp://` endpoints moves collective data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataPath {
    /// One plain TCP connection per pair of ranks, written and read by the calling
    /// thread; ZeroMQ carries setup and abort notices only.
    Tcp,
    /// Everything through the ZeroMQ sockets.
    Zmq,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(300),
            ring_threshold: 64 << 10,
            piece_bytes: 256 << 10,
            window: 16,
            socket: SocketOptions::default(),
            mpi_arg_checks: true,
            data_path: DataPath::Tcp,
            spin: Duration::from_micros(50),
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
                Err(_) => {
                    tracing::warn!(var = ENV_RING_THRESHOLD, value = %v, "not a byte count; ignored")
                }
            }
        }
        if let Ok(v) = std::env::var("SWITCHYARD_PIECE_BYTES") {
            if let Ok(b) = v.trim().parse::<usize>() {
                options.piece_bytes = b.max(1);
            }
        }
        if let Ok(v) = std::env::var("SWITCHYARD_SPIN_US") {
            if let Ok(us) = v.trim().parse::<u64>() {
                options.spin = Duration::from_micros(us);
            }
        }
        match std::env::var(ENV_DATA_PATH).as_deref().map(str::trim) {
            Ok("zmq") => options.data_path = DataPath::Zmq,
            Ok("tcp") => options.data_path = DataPath::Tcp,
            Ok(other) => {
                tracing::warn!(var = ENV_DATA_PATH, value = %other, "expected tcp or zmq; ignored")
            }
            Err(_) => {}
        }
        if let Ok(v) = std::env::var(ENV_TIMEOUT) {
            match v
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
            {
                Some(timeout) => options.timeout = timeout,
                None => {
                    tracing::warn!(var = ENV_TIMEOUT, value = %v, "not a number of seconds; ignored")
                }
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

    /// Sets [`CommOptions::data_path`].
    pub fn with_data_path(mut self, path: DataPath) -> Self {
        self.data_path = path;
        self
    }

    /// Sets [`CommOptions::spin`].
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
    }

    /// Sets [`CommOptions::mpi_arg_checks`].
    pub fn with_mpi_arg_checks(mut self, on: bool) -> Self {
        self.mpi_arg_checks = on;
        self
    }

    /// The window actually used: never more than half the high-water mark.
    pub(crate) fn effective_window(&self) -> usize {
        self.window.min(self.socket.hwm / 2).max(1)
    }
}
