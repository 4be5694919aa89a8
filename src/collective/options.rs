//! Tuning and deadlines of a [`Communicator`](super::Communicator).

use super::robust::RobustOptions;
use std::time::Duration;
use switchyard_link::Interrupt;
use switchyard_net::env::{self, EnvError, Lookup};
use switchyard_transports::SocketOptions;

/// Environment variable overriding [`CommOptions::large_threshold`] (bytes).
pub const ENV_LARGE_THRESHOLD: &str = "SWITCHYARD_LARGE_THRESHOLD";
/// Environment variable overriding [`CommOptions::timeout`] (seconds, may be
/// fractional).
pub const ENV_TIMEOUT: &str = "SWITCHYARD_COLLECTIVE_TIMEOUT";
/// Environment variable setting [`CommOptions::deadline`] (seconds, may be
/// fractional; 0 or unset: no deadline).
pub const ENV_DEADLINE: &str = "SWITCHYARD_CALL_DEADLINE";

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
///     .with_large_threshold(1 << 20);
/// assert_eq!(options.large_threshold, 1 << 20);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CommOptions {
    /// The silence timeout: how long a rank waits for a peer that sends nothing at
    /// all before the call fails with `PeerTimeout` naming that peer (default 300 s;
    /// also [`ENV_TIMEOUT`]). Every byte (TCP path) or message (ZeroMQ path) from the
    /// awaited peer restarts the count, so a call that is making progress never fails
    /// by it, however long it takes. A peer that died is noticed only by this timeout
    /// on ZeroMQ links, so keep it as short as your slowest legitimate gap between
    /// ranks (the longest a rank computes between calls) allows.
    pub timeout: Duration,
    /// The per-call deadline: the longest one call may take from start to end, busy
    /// or not, before it fails with `DeadlineExceeded` (default `None`: no limit;
    /// also [`ENV_DEADLINE`]).
    pub deadline: Option<Duration>,
    /// Allreduces and broadcasts of at least this many bytes take a bandwidth
    /// algorithm (allreduce: the direct exchange up to [`CommOptions::direct_max_ranks`]
    /// ranks, the pipelined ring beyond; broadcast: the pipelined chain); smaller ones
    /// recursive doubling or a binomial tree. Default 512 KiB, between the sizes where
    /// `switchyard bench allreduce -n 4` measured recursive doubling ahead (256 KiB) and
    /// behind (1 MiB) on the project machines: see `BENCHMARKS.md`. Also
    /// [`ENV_LARGE_THRESHOLD`].
    pub large_threshold: usize,
    /// Large allreduces in worlds of at most this many ranks exchange blocks directly
    /// (every rank sends each block straight to its owner, then the owner's result to
    /// everyone: two hops); larger worlds take the pipelined ring, whose messages stay
    /// large and whose links per rank stay two however many ranks there are. Default
    /// 8, the largest world measured (on 2 cores the direct exchange was 1.9x the ring's
    /// speed at 4 MiB with 4 ranks, 1.2x with 8). 0 always takes the ring. Also
    /// `SWITCHYARD_DIRECT_MAX_RANKS`.
    pub direct_max_ranks: usize,
    /// Allgathers gathering fewer bytes than this send every block straight to every
    /// rank (one hop); larger ones take the ring (default 64 MiB: on the project
    /// machines the direct exchange won at every size measured, 8 B to 64 MiB at
    /// n = 4; above that the ring is kept for networks where `n - 1` simultaneous
    /// streams into one host hurt; `SWITCHYARD_GATHER_THRESHOLD`).
    pub gather_threshold: usize,
    /// Allreduces, broadcasts and allgathers of at most this many bytes (the whole
    /// buffer; an allgather's whole output) run on the host board when every rank of
    /// the world shares one host through shared memory: written once into shared
    /// memory and read from there, in pieces of at most a board slot (256 KiB up to
    /// 64 ranks) and [`CommOptions::piece_bytes`]. Larger calls, and every call of a
    /// world spread over several hosts, take the algorithms above over the pipes.
    /// Default: no limit (`usize::MAX`), since the board was ahead of the pipes at
    /// every size measured (`BENCHMARKS.md`); 0 keeps every call but the barrier off
    /// it. Also `SWITCHYARD_BOARD_MAX_BYTES`.
    pub board_max_bytes: usize,
    /// Whether an allreduce of a world spread over several hosts, some with several
    /// ranks, runs hierarchically: within each host first (on its host board, or its
    /// shared-memory pipes), then among one leader per host (the lowest rank) over
    /// TCP, then from each leader to its host; and a broadcast: among one rank per
    /// host (the root on its own), then from it to its host (default true; also
    /// `SWITCHYARD_HIERARCHICAL`). The hosts are the identities the ranks announce
    /// ([`CommOptions::host_id`]); without shared memory nobody announces one and
    /// every call runs flat. Off, every call runs on the whole world at once.
    pub hierarchical: bool,
    /// Largest piece the ring, the chain and the host board move at once (default
    /// 256 KiB).
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
    /// Checked mode (default off; also [`ENV_CHECK`]): before a mesh call moves data,
    /// the ranks agree that every rank made the same call (collective, operation,
    /// element type, length, root, call number, algorithm), so that no rank ever
    /// returns `Ok` from a call another rank made differently. Without it every
    /// message is still checked on arrival, which catches every mismatch some rank
    /// can see; what only checked mode catches is a broadcast root that receives
    /// nothing (ranks naming different roots). Allreduce and barrier need no extra
    /// messages for it (their data already passes every rank's signature to every
    /// rank); the other calls pay one recursive-doubling exchange of empty messages.
    /// Under MPI it turns on the argument check ([`CommOptions::mpi_arg_checks`]).
    /// Every rank must choose the same: a rank in checked mode and one without fail
    /// their first message to each other with a `CallMismatch`.
    pub check: bool,
    /// How long a rank waiting for data on the TCP data path polls its connections
    /// and shared-memory rings before it sleeps in `poll(2)` (default `None`: 50 us,
    /// or 1 ms when every rank is on this host through shared memory and the ranks
    /// fit its cores; also `SWITCHYARD_SPIN_US`). Spinning saves a wake-up (30-70 us
    /// on the project machines) per message; it costs CPU only while a call waits.
    /// Over shared memory the longer spin matters: with a spin shorter than a
    /// wake-up, two ranks can fall into taking turns to sleep, every call paying a
    /// wake-up (measured: 8 B allreduces at 70 us instead of 2.7 us, n = 2). With more
    /// ranks than cores a waiting rank yields its core between polls. A rank whose
    /// peer on the host board was last seen on its own processor (ranks that fit the
    /// cores, put on one core by the scheduler beside other work) spins as usual for
    /// 5 ms, time for the scheduler to move one of them to an idle core, then yields
    /// the core to the peer; once a yield has let other work run first (it took over
    /// 50 us), such waits sleep at once for the next 100 ms, woken by the peer's part.
    pub spin: Option<Duration>,
    /// The heartbeat deadline (default `None`: off; also `SWITCHYARD_HEARTBEAT_MS`,
    /// milliseconds, 0: off). Robust mode turns it on with
    /// [`CommOptions::ROBUST_HEARTBEAT`] (800 ms) unless set otherwise.
    ///
    /// With a deadline, every rank of a mesh on the TCP data path ([`DataPath::Tcp`])
    /// runs a thread that sends a 16-byte UDP datagram to every peer each eighth of
    /// the deadline (at least every 10 ms), from the IP of its data listener. A rank
    /// waiting in a call for a peer that has missed its beats for longer than the
    /// deadline fails at once with `PeerLost` naming it ("no heartbeat for ..."),
    /// instead of after the silence [`timeout`](CommOptions::timeout): the peer's
    /// process is stopped (SIGSTOP, a debugger) or its network is cut without a
    /// reset. Because the beats come from a thread of their own, a rank that is busy
    /// in its own code between calls, for however long, keeps beating and is never
    /// reported; so is a rank that was itself stopped, which does not blame its peers
    /// for the beats it could not hear meanwhile. The peer is detected between the
    /// deadline and the deadline plus an interval after it stopped (under 1 s with
    /// 800 ms).
    ///
    /// The ranks must reach each other over UDP on their data addresses (a firewall
    /// that lets the TCP connections through but drops UDP would make every peer look
    /// silent). A peer that runs no heartbeat is not watched, so ranks may differ; all
    /// beat at the interval of the shortest deadline among them. Meshes over ZeroMQ
    /// only, in-process links and MPI ignore it.
    pub heartbeat: Option<Duration>,
    /// Whether ranks on one host talk through shared memory (default true; also
    /// [`ENV_SHM`]). On the TCP data path ([`DataPath::Tcp`]) every rank announces its
    /// host identity at setup, and each pair that announced the same one swaps its
    /// TCP connection for a pair of rings in a segment they share (an anonymous
    /// `memfd`, handed over a Unix socket: nothing is left behind whatever happens to
    /// the ranks). Ranks on other hosts keep TCP. Everything else stays as on TCP: the
    /// framing, the arrival checks, the silence timeout and heartbeat, robust mode and
    /// the interrupt; a rank whose process dies is seen at once, its socket closing.
    /// Off, every pair uses TCP. Ranks may differ: a pair uses shared memory only when
    /// both sides have it on.
    pub shared_memory: bool,
    /// The host identity announced for [`CommOptions::shared_memory`] (default `None`:
    /// the kernel's boot id and this process's network namespace, so ranks in
    /// different network namespaces of one machine count as different hosts; also
    /// [`ENV_HOST_ID`]). Ranks that announce one identity must be able to reach each
    /// other's abstract Unix sockets (share a network namespace on one machine), or
    /// setup fails saying so.
    pub host_id: Option<String>,
    /// How long forming the mesh may wait for a peer to answer, when shorter than
    /// `timeout`: robust mode forms meshes in short attempts, since a peer that dies
    /// while the mesh forms is otherwise only noticed at the timeout.
    pub(crate) setup_limit: Option<Duration>,
    /// A flag that, once raised, ends this communicator's waiting call with
    /// `Interrupted` (default `None`). See [`Interrupt`].
    pub interrupt: Option<Interrupt>,
    /// Robust mode (default `None`: off): with it,
    /// [`Communicator::join`](super::Communicator::join) forms a communicator whose
    /// collectives survive the death of a rank the launcher restarts, with rabit's
    /// checkpoints and result replay. It joins a tracker (classic protocol, with a
    /// task id); see [`RobustOptions`] and the guide's `docs/guide/robust-mode.md`.
    pub robust: Option<RobustOptions>,
}

/// Environment variable turning on [`CommOptions::check`]: `1` (or `true`) on, `0`
/// (or `false`) off.
pub const ENV_CHECK: &str = "SWITCHYARD_CHECK";
/// Environment variable: [`CommOptions::heartbeat`] in milliseconds (0: off).
pub const ENV_HEARTBEAT: &str = "SWITCHYARD_HEARTBEAT_MS";

/// Environment variable for [`CommOptions::shared_memory`]: `0` (or `false`) turns
/// shared memory between the ranks of one host off.
pub const ENV_SHM: &str = "SWITCHYARD_SHM";
/// Environment variable setting [`CommOptions::host_id`].
pub const ENV_HOST_ID: &str = "SWITCHYARD_HOST_ID";

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
            deadline: None,
            large_threshold: 512 << 10,
            direct_max_ranks: 8,
            gather_threshold: 64 << 20,
            board_max_bytes: usize::MAX,
            hierarchical: true,
            piece_bytes: 256 << 10,
            window: 16,
            socket: SocketOptions::default(),
            mpi_arg_checks: true,
            data_path: DataPath::Tcp,
            check: false,
            spin: None,
            heartbeat: None,
            shared_memory: true,
            host_id: None,
            setup_limit: None,
            interrupt: None,
            robust: None,
        }
    }
}

impl CommOptions {
    /// How long forming the mesh waits for a peer: the setup limit, else the timeout.
    pub(crate) fn setup_timeout(&self) -> Duration {
        self.setup_limit
            .map_or(self.timeout, |l| l.min(self.timeout))
    }

    /// The heartbeat deadline robust mode turns on ([`CommOptions::heartbeat`]): under
    /// a second from a peer's stop to its detection, eight beats of 100 ms of margin
    /// against lost datagrams and late wake-ups.
    pub const ROBUST_HEARTBEAT: Duration = Duration::from_millis(800);

    /// The defaults, with these environment variables applied when set:
    ///
    /// | variable | field |
    /// |---|---|
    /// | `SWITCHYARD_COLLECTIVE_TIMEOUT` ([`ENV_TIMEOUT`]) | `timeout`, seconds |
    /// | `SWITCHYARD_CALL_DEADLINE` ([`ENV_DEADLINE`]) | `deadline`, seconds (0: none) |
    /// | `SWITCHYARD_LARGE_THRESHOLD` ([`ENV_LARGE_THRESHOLD`]) | `large_threshold`, bytes |
    /// | `SWITCHYARD_DIRECT_MAX_RANKS` | `direct_max_ranks` |
    /// | `SWITCHYARD_GATHER_THRESHOLD` | `gather_threshold`, bytes |
    /// | `SWITCHYARD_BOARD_MAX_BYTES` | `board_max_bytes`, bytes |
    /// | `SWITCHYARD_HIERARCHICAL` | `hierarchical`: `1` or `0` (`true` or `false`) |
    /// | `SWITCHYARD_PIECE_BYTES` | `piece_bytes`, bytes (above 0) |
    /// | `SWITCHYARD_SPIN_US` | `spin`, microseconds |
    /// | `SWITCHYARD_DATA_PATH` ([`ENV_DATA_PATH`]) | `data_path`: `tcp` or `zmq` |
    /// | `SWITCHYARD_CHECK` ([`ENV_CHECK`]) | `check`: `1` or `0` (`true` or `false`) |
    /// | `SWITCHYARD_HEARTBEAT_MS` ([`ENV_HEARTBEAT`]) | `heartbeat`, milliseconds (0: off) |
    /// | `SWITCHYARD_SHM` ([`ENV_SHM`]) | `shared_memory`: `1` or `0` (`true` or `false`) |
    /// | `SWITCHYARD_HOST_ID` ([`ENV_HOST_ID`]) | `host_id` |
    ///
    /// # Errors
    ///
    /// A variable that is set but malformed, named with its value and what was
    /// expected: a value is never ignored, since a job that silently runs with its
    /// defaults is harder to find than one that fails at the start.
    pub fn from_env() -> Result<CommOptions, EnvError> {
        CommOptions::from_lookup(&env::ProcessEnv)
    }

    /// As [`CommOptions::from_env`], with variables from `lookup` (a map or a closure
    /// in a test).
    ///
    /// # Errors
    ///
    /// As [`CommOptions::from_env`].
    pub fn from_lookup(lookup: &(impl Lookup + ?Sized)) -> Result<CommOptions, EnvError> {
        let mut o = CommOptions::default();
        if let Some(t) = env::seconds(lookup, ENV_TIMEOUT)? {
            o.timeout = t;
        }
        if let Some(t) = env::seconds(lookup, ENV_DEADLINE)? {
            o.deadline = (!t.is_zero()).then_some(t);
        }
        if let Some(bytes) = env::usize(lookup, ENV_LARGE_THRESHOLD)? {
            o.large_threshold = bytes;
        }
        if let Some(ranks) = env::usize(lookup, "SWITCHYARD_DIRECT_MAX_RANKS")? {
            o.direct_max_ranks = ranks;
        }
        if let Some(bytes) = env::usize(lookup, "SWITCHYARD_GATHER_THRESHOLD")? {
            o.gather_threshold = bytes;
        }
        if let Some(bytes) = env::usize(lookup, "SWITCHYARD_BOARD_MAX_BYTES")? {
            o.board_max_bytes = bytes;
        }
        if let Some(on) = env::flag(lookup, "SWITCHYARD_HIERARCHICAL")? {
            o.hierarchical = on;
        }
        // Zero is refused, not raised to 1: one-byte pieces are a typo's cost, not a choice.
        if let Some(bytes) = env::parse_with(
            lookup,
            "SWITCHYARD_PIECE_BYTES",
            "a positive number of bytes",
            |s| s.parse::<usize>().ok().filter(|&b| b > 0),
        )? {
            o.piece_bytes = bytes;
        }
        if let Some(spin) = env::micros(lookup, "SWITCHYARD_SPIN_US")? {
            o.spin = Some(spin);
        }
        if let Some(beat) = heartbeat_var(lookup)? {
            o.heartbeat = beat;
        }
        if let Some(check) = env::flag(lookup, ENV_CHECK)? {
            o.check = check;
        }
        if let Some(on) = env::flag(lookup, ENV_SHM)? {
            o.shared_memory = on;
        }
        if let Some(id) = env::text(lookup, ENV_HOST_ID) {
            o.host_id = Some(id);
        }
        if let Some(path) = env::one_of(
            lookup,
            ENV_DATA_PATH,
            &[("tcp", DataPath::Tcp), ("zmq", DataPath::Zmq)],
        )? {
            o.data_path = path;
        }
        Ok(o)
    }

    /// Sets [`CommOptions::timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`CommOptions::deadline`] (`None`: no per-call deadline).
    pub fn with_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets [`CommOptions::large_threshold`].
    pub fn with_large_threshold(mut self, bytes: usize) -> Self {
        self.large_threshold = bytes;
        self
    }

    /// Sets [`CommOptions::direct_max_ranks`].
    pub fn with_direct_max_ranks(mut self, ranks: usize) -> Self {
        self.direct_max_ranks = ranks;
        self
    }

    /// Sets [`CommOptions::gather_threshold`].
    pub fn with_gather_threshold(mut self, bytes: usize) -> Self {
        self.gather_threshold = bytes;
        self
    }

    /// Sets [`CommOptions::board_max_bytes`].
    pub fn with_board_max_bytes(mut self, bytes: usize) -> Self {
        self.board_max_bytes = bytes;
        self
    }

    /// Sets [`CommOptions::hierarchical`].
    pub fn with_hierarchical(mut self, on: bool) -> Self {
        self.hierarchical = on;
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

    /// Sets [`CommOptions::shared_memory`].
    pub fn with_shared_memory(mut self, on: bool) -> Self {
        self.shared_memory = on;
        self
    }

    /// Sets [`CommOptions::host_id`].
    pub fn with_host_id(mut self, id: impl Into<String>) -> Self {
        self.host_id = Some(id.into());
        self
    }

    /// The host identity this rank announces at mesh setup: `None` with shared
    /// memory off, or where this host's identity cannot be found.
    pub(crate) fn announced_host(&self) -> Option<String> {
        if !self.shared_memory {
            return None;
        }
        self.host_id
            .clone()
            .or_else(crate::collective::link::host_identity)
    }

    /// Sets [`CommOptions::spin`].
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = Some(spin);
        self
    }

    /// Sets [`CommOptions::heartbeat`] (`None` or zero: off).
    pub fn with_heartbeat(mut self, deadline: Option<Duration>) -> Self {
        self.heartbeat = deadline.filter(|d| !d.is_zero());
        self
    }

    /// Sets [`CommOptions::interrupt`].
    pub fn with_interrupt(mut self, interrupt: Interrupt) -> Self {
        self.interrupt = Some(interrupt);
        self
    }

    /// Sets [`CommOptions::check`].
    pub fn with_check(mut self, on: bool) -> Self {
        self.check = on;
        self
    }

    /// Turns robust mode on ([`CommOptions::robust`]).
    pub fn with_robust(mut self, robust: RobustOptions) -> Self {
        self.robust = Some(robust);
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

    /// The scalars the mesh engine's algorithms use, copied once when the engine is
    /// built (a communicator's options never change afterwards).
    pub(crate) fn tuning(&self) -> Tuning {
        Tuning {
            timeout: self.timeout,
            deadline: self.deadline,
            large_threshold: self.large_threshold,
            direct_max_ranks: self.direct_max_ranks,
            gather_threshold: self.gather_threshold,
            board_max_bytes: self.board_max_bytes,
            hierarchical: self.hierarchical,
            piece_bytes: self.piece_bytes.max(1),
            window: self.effective_window(),
            check: self.check,
        }
    }
}

/// The part of [`CommOptions`] the mesh algorithms and their choice read: see the
/// fields of the same names there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub(crate) timeout: Duration,
    pub(crate) deadline: Option<Duration>,
    pub(crate) large_threshold: usize,
    pub(crate) direct_max_ranks: usize,
    pub(crate) gather_threshold: usize,
    pub(crate) board_max_bytes: usize,
    pub(crate) hierarchical: bool,
    pub(crate) piece_bytes: usize,
    /// [`CommOptions::effective_window`].
    pub(crate) window: usize,
    pub(crate) check: bool,
}

/// [`ENV_HEARTBEAT`]: `None` when unset, `Some(None)` for 0 (off), else the deadline.
/// Robust mode reads it too, to tell "off" from "unset" (whose default it sets).
pub(crate) fn heartbeat_var(
    lookup: &(impl Lookup + ?Sized),
) -> Result<Option<Option<Duration>>, EnvError> {
    Ok(env::millis(lookup, ENV_HEARTBEAT)?.map(|ms| (!ms.is_zero()).then_some(ms)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Off unless asked for; zero is off too (as `SWITCHYARD_HEARTBEAT_MS=0` is, which
    /// `tests/it/heartbeat.rs` runs in child processes: no test here touches the
    /// environment).
    #[test]
    fn the_heartbeat_is_off_by_default_and_zero_turns_it_off() {
        assert_eq!(CommOptions::default().heartbeat, None);
        let on = CommOptions::default().with_heartbeat(Some(CommOptions::ROBUST_HEARTBEAT));
        assert_eq!(on.heartbeat, Some(Duration::from_millis(800)));
        assert_eq!(on.with_heartbeat(Some(Duration::ZERO)).heartbeat, None);
    }

    #[test]
    fn from_lookup_reads_every_variable() {
        let vars = [
            (ENV_TIMEOUT, "2.5"),
            (ENV_DEADLINE, "0"),
            (ENV_LARGE_THRESHOLD, "1024"),
            ("SWITCHYARD_DIRECT_MAX_RANKS", "3"),
            ("SWITCHYARD_GATHER_THRESHOLD", "4096"),
            ("SWITCHYARD_PIECE_BYTES", "7"),
            ("SWITCHYARD_BOARD_MAX_BYTES", "65536"),
            ("SWITCHYARD_HIERARCHICAL", "0"),
            ("SWITCHYARD_SPIN_US", "7"),
            (ENV_HEARTBEAT, "300"),
            (ENV_CHECK, "true"),
            (ENV_DATA_PATH, "zmq"),
        ];
        let o = CommOptions::from_lookup(&vars).unwrap();
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!(o.deadline, None);
        assert_eq!((o.large_threshold, o.direct_max_ranks), (1024, 3));
        assert_eq!((o.gather_threshold, o.piece_bytes), (4096, 7));
        assert_eq!(o.board_max_bytes, 65536);
        assert!(!o.hierarchical);
        assert_eq!(o.spin, Some(Duration::from_micros(7)));
        assert_eq!(o.heartbeat, Some(Duration::from_millis(300)));
        assert!(o.check);
        assert_eq!(o.data_path, DataPath::Zmq);
        let off = CommOptions::from_lookup(&[(ENV_HEARTBEAT, "0")]).unwrap();
        assert_eq!(off.heartbeat, None);
    }

    /// Every variable's malformed value is an error naming it and the value; none is
    /// ignored with a warning any more.
    #[test]
    fn a_malformed_value_is_an_error_naming_variable_and_value() {
        for (var, bad) in [
            (ENV_TIMEOUT, "soon"),
            (ENV_DEADLINE, "-1"),
            (ENV_LARGE_THRESHOLD, "1M"),
            ("SWITCHYARD_DIRECT_MAX_RANKS", "eight"),
            ("SWITCHYARD_GATHER_THRESHOLD", "-5"),
            ("SWITCHYARD_PIECE_BYTES", "1.5"),
            // Zero was raised to 1 without a word.
            ("SWITCHYARD_PIECE_BYTES", "0"),
            ("SWITCHYARD_SPIN_US", "fast"),
            (ENV_HEARTBEAT, "abc"),
            (ENV_CHECK, "yes"),
            (ENV_DATA_PATH, "udp"),
        ] {
            let err = CommOptions::from_lookup(&[(var, bad)]).unwrap_err();
            assert_eq!((err.var(), err.value()), (var, Some(bad)));
            assert!(
                err.to_string()
                    .starts_with(&format!("{var}={bad:?}: expected ")),
                "{err}"
            );
        }
    }
}
