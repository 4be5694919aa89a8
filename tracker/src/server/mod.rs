//! The tracker server: one listening port for both protocols, one thread per
//! connection, the state machines behind one lock.
//!
//! Every read has a deadline ([`TrackerConfig::read_timeout`]) and every length a cap
//! ([`TrackerConfig::limits`]); a connection that breaks the protocol is dropped with a
//! `tracing` warning naming the peer and the reason, and an [`Event::Dropped`]; serving
//! goes on. `start`s waiting for their batch are watched for end of stream and give up
//! after [`TrackerConfig::batch_timeout`].

mod accept;
pub(crate) mod auth;
mod cap;
mod classic_conn;
mod json_conn;
mod machines;
mod sequence;
mod shared;
#[cfg(test)]
mod sim_tests;

use crate::common::SortBy;
use crate::journal::{Journal, JournalError};
use crate::wire::Limits;
use crossbeam_channel::Receiver;
use shared::{Ending, Shared, lock};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// Append-only state file, so that a restarted tracker picks up the job. One file
    /// per job: a file whose job finished is refused at start.
    pub state_file: Option<PathBuf>,
    /// How long the job may run, from the tracker's start, before it fails (default
    /// `None`: no limit). The protocols cannot tell a worker that died mid-job from a
    /// slow one, so without it a tracker whose worker died after bootstrap waits for
    /// that worker's `shutdown` forever.
    pub job_timeout: Option<Duration>,
    /// Most connections served at once (default 4096). Past it, the oldest
    /// connection that has not started a rank (an idle stranger, or one that sent a
    /// hello and stalled, whatever it claimed to be) is closed to make room. Only when
    /// every open connection is a worker's `start` (waiting for its batch or
    /// negotiating), which needs a cap below about twice the number of workers, is the
    /// newcomer refused.
    pub max_connections: usize,
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
            job_timeout: None,
            max_connections: 4096,
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
    /// A worker finished negotiating its links (and the state file, if any, holds
    /// that): the tracker's part of its bootstrap is over. The protocol has no
    /// acknowledgement for the last step, so only this tells that the tracker heard it.
    Linked {
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
    /// A switchyard robust engine reported a peer as silent (the classic
    /// [`SILENT_COMMAND`](crate::SILENT_COMMAND), never a `print`): the only
    /// event a launcher may act on by killing a process.
    Silent {
        /// The rank the reporter claimed.
        reporter: i32,
        /// The silent rank.
        rank: u32,
        /// Its start number (`DMLC_NUM_ATTEMPT`), so that a late report never names
        /// the process that replaced it.
        attempt: u32,
        /// The reporter's reason.
        reason: String,
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
    /// The state file could not be read or written (see [`TrackerConfig::state_file`]).
    #[error(transparent)]
    StateFile(#[from] JournalError),
    /// The state file holds a job that already finished. Replaying it would end the new
    /// tracker at once, before any worker connects, and report a success that belongs
    /// to the old job: a job script with a fixed state path would call every later run
    /// a success while its workers are refused.
    #[error(
        "state file {path} holds a job that already finished (ranks {shut_down:?} shut \
         down); a new job needs a state file of its own: delete this one or give another path"
    )]
    FinishedState {
        /// The file.
        path: PathBuf,
        /// The ranks that shut down in that job.
        shut_down: Vec<u32>,
    },
    /// The job secret in the environment (`SWITCHYARD_JOB_SECRET` or
    /// `SWITCHYARD_JOB_SECRET_FILE`) cannot be used: too short, both variables set, or an
    /// unreadable file. Refused at start, since a tracker that served on would drop
    /// every connection.
    #[error(transparent)]
    Secret(#[from] switchyard_secret::SecretError),
    /// The serving thread could not be started.
    #[error("cannot start the tracker's thread: {0}")]
    Thread(std::io::Error),
    /// The job failed: a worker signalled an error, or the tracker could not finish it.
    #[error("the job failed: {reason}")]
    JobFailed {
        /// What happened.
        reason: String,
    },
    /// [`Tracker::stop`] was called before the job ended.
    #[error("the tracker was stopped before the job ended")]
    Stopped,
    /// [`Tracker::wait`] gave up; the job goes on.
    #[error("the job had not ended after {waited:?}")]
    WaitTimedOut {
        /// How long it waited.
        waited: Duration,
    },
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobOutcome {
    /// Ranks that shut down.
    pub shut_down: Vec<u32>,
}

/// A running tracker. Dropping it stops it.
///
/// ```
/// # fn main() -> Result<(), switchyard_tracker::TrackerError> {
/// use switchyard_tracker::{Tracker, TrackerConfig};
/// let tracker = Tracker::start(TrackerConfig::new(2))?;
/// let env = tracker.worker_env();
/// assert_eq!(env[0].0, "DMLC_TRACKER_URI");
/// assert_eq!(env[1].1, tracker.addr().port().to_string());
/// tracker.stop();
/// assert!(matches!(tracker.wait(None), Err(switchyard_tracker::TrackerError::Stopped)));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Tracker {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Tracker {
    /// Reads the job secret from the environment, replays the state file if there is
    /// one, binds, and starts serving on background threads.
    ///
    /// Refused before binding: an unusable job secret ([`TrackerError::Secret`]) and a
    /// state file whose job already finished ([`TrackerError::FinishedState`]).
    pub fn start(config: TrackerConfig) -> Result<Tracker, TrackerError> {
        let bind_addr = format!("{}:{}", config.host, config.port);
        let bind_err = |source| TrackerError::Bind {
            addr: bind_addr.clone(),
            source,
        };
        // Read once, here, so that an unusable secret stops the start instead of every
        // connection later (fail closed either way).
        let secret = switchyard_secret::JobSecret::from_env()?;
        let journal = match &config.state_file {
            Some(path) => Some(Journal::open(path, config.workers)?),
            None => None,
        };
        let host = config.host.clone();
        let port = config.port;
        let shared = Arc::new(Shared::new(config, journal, secret));
        // Refused before binding, so that nothing listens for workers it cannot serve.
        if let (Some(Ending::Done(outcome)), Some(path)) =
            (&*lock(&shared.end), &shared.config.state_file)
        {
            return Err(TrackerError::FinishedState {
                path: path.clone(),
                shut_down: outcome.shut_down.clone(),
            });
        }
        // A (host, port) pair, not "host:port" text, so that IPv6 literals and host
        // names both work.
        let listener = TcpListener::bind((host.as_str(), port)).map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let accept = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tracker-accept".into())
                .spawn(move || accept::run(&shared, &listener))
                .map_err(TrackerError::Thread)?
        };
        if let Some(limit) = shared.config.job_timeout {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tracker-job-timeout".into())
                .spawn(move || shared.fail_after(limit))
                .map_err(TrackerError::Thread)?;
        }
        tracing::info!(%addr, workers = shared.config.workers, "tracker listening");
        Ok(Tracker {
            addr,
            shared,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `DMLC_TRACKER_URI` and `DMLC_TRACKER_PORT` for the workers. A tracker bound to
    /// the wildcard address gives the address this machine would use to reach others
    /// (loopback if it has none).
    pub fn worker_env(&self) -> Vec<(String, String)> {
        let ip = if self.addr.ip().is_unspecified() {
            outward_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        } else {
            self.addr.ip()
        };
        vec![
            ("DMLC_TRACKER_URI".into(), ip.to_string()),
            ("DMLC_TRACKER_PORT".into(), self.addr.port().to_string()),
        ]
    }

    /// Events, in order (each receiver gets every event from its subscription on).
    pub fn events(&self) -> Receiver<Event> {
        self.shared.subscribe()
    }

    /// Waits until `n` distinct ranks shut down (Ok) or the job failed (Err), at most
    /// `timeout`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<JobOutcome, TrackerError> {
        let started = Instant::now();
        let mut end = lock(&self.shared.end);
        loop {
            match &*end {
                Some(Ending::Done(outcome)) => return Ok(outcome.clone()),
                Some(Ending::Failed(reason)) => {
                    return Err(TrackerError::JobFailed {
                        reason: reason.clone(),
                    });
                }
                Some(Ending::Stopped) => return Err(TrackerError::Stopped),
                None => {}
            }
            end = match timeout {
                None => self
                    .shared
                    .ended
                    .wait(end)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(t) => {
                    let left = t.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(TrackerError::WaitTimedOut { waited: t });
                    }
                    self.shared
                        .ended
                        .wait_timeout(end, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// Stops serving and closes the port. Connections in progress end at their next
    /// read deadline or wait check.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop with a connection of our own.
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.addr.port())
        } else {
            self.addr
        };
        let _ = std::net::TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(handle) = lock(&self.accept).take() {
            let _ = handle.join();
        }
        self.shared.end_with(Ending::Stopped);
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The address of the interface that would route to the outside (no packet is sent).
fn outward_ip() -> Option<IpAddr> {
    let outside = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 255, 255, 255)), 1);
    switchyard_net::route::local_address_towards(outside).ok()
}
