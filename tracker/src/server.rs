//! The tracker server: API fixed here so that the launcher can be written against it.
//! OWNER: helper `tracker` replaces the bodies (and may split this file into a folder).

use crate::wire::Limits;
use crossbeam_channel::Receiver;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How a batch of `start`s is ordered into ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortBy {
    /// By the peer's IP address text, then task id (the default).
    #[default]
    Host,
    /// By task id.
    Task,
}

/// What a [`Tracker`] serves and how patient it is.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TrackerConfig {
    /// The number of workers, `n`.
    pub workers: u32,
    /// Address to bind (default `127.0.0.1`).
    pub host: String,
    /// Port to bind (default 0: the OS picks).
    pub port: u16,
    /// Rank order within a batch.
    pub sort_by: SortBy,
    /// Caps on lengths.
    pub limits: Limits,
    /// Deadline on each read of a connection that is in the middle of a message.
    pub read_timeout: Duration,
    /// How long a `start` may wait for the rest of its batch.
    pub batch_timeout: Duration,
    /// Append-only state file, so that a restarted tracker picks up the job.
    pub state_file: Option<PathBuf>,
}

impl TrackerConfig {
    /// `workers` workers on 127.0.0.1, an OS-chosen port, default limits and timeouts.
    pub fn new(workers: u32) -> Self {
        TrackerConfig {
            workers,
            host: "127.0.0.1".into(),
            port: 0,
            sort_by: SortBy::Host,
            limits: Limits::default(),
            read_timeout: Duration::from_secs(30),
            batch_timeout: Duration::from_secs(3600),
            state_file: None,
        }
    }
}

/// Something the tracker saw, for launchers and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A worker got its rank.
    Assigned {
        /// The rank.
        rank: u32,
        /// Its task id (`None` for `NULL`/empty).
        task_id: Option<String>,
        /// The peer's IP address text.
        host: String,
    },
    /// A worker asked for its links again (`recover`).
    Recovered {
        /// The rank.
        rank: u32,
    },
    /// A `print` from a worker.
    Print {
        /// The rank it claimed.
        rank: i32,
        /// The text, trimmed.
        text: String,
    },
    /// A rank shut down.
    Shutdown {
        /// The rank.
        rank: u32,
    },
    /// A connection was dropped.
    Dropped {
        /// The peer address.
        peer: String,
        /// Why.
        reason: String,
    },
}

/// Why the tracker failed (to start, or the job).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrackerError {
    /// Binding failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobOutcome {
    /// Ranks that shut down.
    pub shut_down: Vec<u32>,
}

/// A running tracker.
#[derive(Debug)]
pub struct Tracker {
    addr: SocketAddr,
}

impl Tracker {
    /// Binds and starts serving on background threads.
    pub fn start(config: TrackerConfig) -> Result<Tracker, TrackerError> {
        let _ = config;
        unimplemented!("helper `tracker`")
    }
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// `DMLC_TRACKER_URI` and `DMLC_TRACKER_PORT` for the workers.
    pub fn worker_env(&self) -> Vec<(String, String)> {
        unimplemented!("helper `tracker`")
    }
    /// Events, in order (each receiver gets every event from its subscription on).
    pub fn events(&self) -> Receiver<Event> {
        unimplemented!("helper `tracker`")
    }
    /// Waits until `n` distinct ranks shut down (Ok) or the job failed (Err), at most
    /// `timeout`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<JobOutcome, TrackerError> {
        let _ = timeout;
        unimplemented!("helper `tracker`")
    }
    /// Stops serving and closes the port.
    pub fn stop(&self) {
        unimplemented!("helper `tracker`")
    }
}
