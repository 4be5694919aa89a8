use std::time::Duration;
use switchyard_bootstrap::BootstrapError;
use thiserror::Error;

/// Errors from launching and supervising a job.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The worker-side bootstrap failed: an environment variable, or the rendezvous
    /// (which the launcher serves with the same protocol its processes speak).
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// A launch option has a value that cannot work. Shown as the `switchyard launch`
    /// flag of the same name: `--hostfile /etc/hosts: ...`, or `--hostfile: ...` for an
    /// option left out.
    #[error("{}", option_text(option, value, reason))]
    InvalidOption {
        /// The option, as [`LaunchOptions`](super::LaunchOptions) and the
        /// `switchyard launch` flag `--OPTION` name it.
        option: &'static str,
        /// Its value (empty when the option was left out).
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not every worker joined (checked in at the rendezvous or got a rank from the
    /// tracker) before the timeout.
    #[error(
        "rendezvous timed out after {waited:?}: ranks {missing:?} never checked in (at the rendezvous or the tracker; --rendezvous-timeout)"
    )]
    Missing {
        /// Ranks that did not arrive.
        missing: Vec<u32>,
        /// How long the launcher waited.
        waited: Duration,
    },
    /// A process could not be started.
    #[error("cannot start {program}: {reason}")]
    Spawn {
        /// The program.
        program: String,
        /// What the system reported.
        reason: String,
    },
    /// A process exited unsuccessfully with no restarts left; the others were stopped.
    #[error("{process} exited with {status}{}; every other process was stopped", restarts_text(*.restarts))]
    RankFailed {
        /// `rank N` for worker `N`, `server N` for server `N`, then ` on HOST` when
        /// it ran on a host of the hostfile.
        process: String,
        /// Its last exit status (for `ssh`'s own status 255, with what it means).
        status: String,
        /// How often it had been restarted before (`--max-restarts`).
        restarts: u32,
    },
    /// SIGINT or SIGTERM arrived; every process was stopped.
    #[error("interrupted by {signal}; every process was stopped")]
    Interrupted {
        /// The signal's name.
        signal: &'static str,
    },
    /// The hostfile cannot be read or has a bad line.
    #[error("hostfile {path}, line {line}: {reason}")]
    Hostfile {
        /// The file.
        path: String,
        /// The line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The embedded tracker could not start.
    #[error("cannot start the tracker: {reason}")]
    Tracker {
        /// What it reported.
        reason: String,
    },
    /// The job ran past its time limit; every process was stopped.
    #[error(
        "job still running after {limit:?}, its time limit (--timeout); every rank was stopped"
    )]
    JobTimeout {
        /// The limit.
        limit: Duration,
    },
}

/// An invalid option as its `switchyard launch` flag: `--option value: reason`, or
/// `--option: reason` when the value is empty (the option was left out).
fn option_text(option: &str, value: &str, reason: &str) -> String {
    if value.is_empty() {
        format!("--{option}: {reason}")
    } else {
        format!("--{option} {value}: {reason}")
    }
}

/// ` after N restart(s)` when there were any.
fn restarts_text(restarts: u32) -> String {
    match restarts {
        0 => String::new(),
        1 => " after 1 restart".into(),
        n => format!(" after {n} restarts"),
    }
}
