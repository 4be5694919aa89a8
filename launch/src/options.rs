//! What a job is: how many processes of which program, where they run, and how patient
//! and forgiving the launcher is with them.

use super::LaunchError;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How the launcher hands a process to a machine.
///
/// Every kind but [`LauncherKind::Local`] runs one wrapper command per process (see the
/// `remote` module docs of [`crate`] for the exact command lines and what a real
/// cluster needs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LauncherKind {
    /// A child process of the launcher on this machine.
    #[default]
    Local,
    /// `ssh HOST 'cd DIR && exec env VARS PROGRAM ARGS'`, hosts from the hostfile.
    Ssh,
    /// `srun --nodes=1 --ntasks=1 [--nodelist=HOST] env VARS PROGRAM ARGS`.
    Slurm,
    /// `mpirun -np 1 [--host HOST] env VARS PROGRAM ARGS`.
    Mpi,
}

impl LauncherKind {
    /// The name used on the command line and in `DMLC_JOB_CLUSTER`.
    pub fn name(self) -> &'static str {
        match self {
            LauncherKind::Local => "local",
            LauncherKind::Ssh => "ssh",
            LauncherKind::Slurm => "slurm",
            LauncherKind::Mpi => "mpi",
        }
    }
}

impl std::fmt::Display for LauncherKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LauncherKind {
    type Err = LaunchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "local" => Ok(LauncherKind::Local),
            "ssh" => Ok(LauncherKind::Ssh),
            "slurm" => Ok(LauncherKind::Slurm),
            "mpi" => Ok(LauncherKind::Mpi),
            other => Err(LaunchError::InvalidOption {
                option: "launcher",
                value: other.to_string(),
                reason: "expected one of local, ssh, slurm, mpi".into(),
            }),
        }
    }
}

/// What [`run_local`](super::run_local) starts and how long it lets it run.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_launch::LaunchOptions;
/// let opts = LaunchOptions::new(3, "target/release/examples/param_server")
///     .with_timeout(Duration::from_secs(60))
///     .with_max_restarts(2);
/// assert_eq!(opts.processes, 3);
/// assert_eq!(opts.max_restarts, 2);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LaunchOptions {
    /// How many worker processes (ranks `0..processes`).
    pub processes: u32,
    /// How many server processes (`DMLC_ROLE=server`), started after the workers.
    pub servers: u32,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
    /// How long every worker has to join, at the rendezvous or at the tracker
    /// (default 60 s).
    pub rendezvous_timeout: Duration,
    /// How long the whole job may run before every process is stopped (default 1 h).
    pub timeout: Duration,
    /// How often one process may be restarted after an abnormal exit (default 0).
    pub max_restarts: u32,
    /// How the processes are started.
    pub launcher: LauncherKind,
    /// Hosts for [`LauncherKind::Ssh`] (required), `Slurm` and `Mpi` (optional).
    pub hostfile: Option<PathBuf>,
    /// Extra words for the wrapper command, put right after `ssh`, `srun` or `mpirun`
    /// (e.g. `-F cluster_ssh_config`, `--partition=gpu`); ignored by the local
    /// launcher, which refuses them. Default none.
    pub launcher_args: Vec<String>,
    /// The address the tracker and the rendezvous bind and that processes are told.
    /// `None`: `127.0.0.1` for local jobs; for the other launchers, bind every
    /// interface and tell this machine's outward address (the source address of its
    /// route outwards; loopback only when it has none), with the tracker or without.
    pub host: Option<String>,
    /// Serve the rabit tracker and set the `DMLC_*` variables (default true).
    pub tracker: bool,
    /// Show progress on stderr and print the summary at the end (default false; the
    /// `switchyard launch` command turns it on).
    pub progress: bool,
    /// On SIGINT or SIGTERM stop every process and return
    /// [`LaunchError::Interrupted`] (default false; the command turns it on). Installs
    /// signal handlers for the whole program.
    pub stop_on_signals: bool,
    /// How long a stopped process has between SIGTERM and SIGKILL (default 3 s).
    pub grace: Duration,
}

impl LaunchOptions {
    /// `processes` copies of `program`, no arguments, default timeouts.
    pub fn new(processes: u32, program: impl Into<String>) -> Self {
        LaunchOptions {
            processes,
            servers: 0,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            rendezvous_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(3600),
            max_restarts: 0,
            launcher: LauncherKind::Local,
            hostfile: None,
            launcher_args: Vec::new(),
            host: None,
            tracker: true,
            progress: false,
            stop_on_signals: false,
            grace: Duration::from_secs(3),
        }
    }

    /// Sets the arguments.
    pub fn with_args(mut self, args: Vec<String>) -> Self {
        self.args = args;
        self
    }

    /// Adds an environment variable for every process.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets [`LaunchOptions::rendezvous_timeout`].
    pub fn with_rendezvous_timeout(mut self, timeout: Duration) -> Self {
        self.rendezvous_timeout = timeout;
        self
    }

    /// Sets [`LaunchOptions::timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets [`LaunchOptions::servers`].
    pub fn with_servers(mut self, servers: u32) -> Self {
        self.servers = servers;
        self
    }

    /// Sets [`LaunchOptions::max_restarts`].
    pub fn with_max_restarts(mut self, restarts: u32) -> Self {
        self.max_restarts = restarts;
        self
    }

    /// Sets [`LaunchOptions::launcher`] and [`LaunchOptions::hostfile`].
    pub fn with_launcher(mut self, launcher: LauncherKind, hostfile: Option<PathBuf>) -> Self {
        self.launcher = launcher;
        self.hostfile = hostfile;
        self
    }

    /// Sets [`LaunchOptions::launcher_args`].
    pub fn with_launcher_args(mut self, args: Vec<String>) -> Self {
        self.launcher_args = args;
        self
    }

    /// Sets [`LaunchOptions::host`].
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Sets [`LaunchOptions::tracker`].
    pub fn with_tracker(mut self, tracker: bool) -> Self {
        self.tracker = tracker;
        self
    }

    /// Sets [`LaunchOptions::progress`].
    pub fn with_progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }

    /// Sets [`LaunchOptions::stop_on_signals`].
    pub fn with_stop_on_signals(mut self, stop: bool) -> Self {
        self.stop_on_signals = stop;
        self
    }

    /// Sets [`LaunchOptions::grace`].
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}
