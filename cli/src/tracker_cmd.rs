//! `switchyard tracker`: a standalone tracker for rabit / XGBoost jobs (both the classic
//! protocol of XGBoost ≤ 2.0 and the JSON protocol of 2.1+, on one port).
//!
//! As soon as it listens it prints `DMLC_TRACKER_URI=…` and `DMLC_TRACKER_PORT=…` on
//! standard output (for 1.x workers' environment, or 3.x's `dmlc_tracker_uri` /
//! `dmlc_tracker_port` arguments), then logs workers' prints and its events on standard
//! error. It exits 0 once every rank has shut down, non-zero with the reason if the job
//! failed. With `--state FILE` a tracker killed mid-job and started again with the same
//! port and file finishes the job.
//!
//! With `SWITCHYARD_JOB_SECRET` or `SWITCHYARD_JOB_SECRET_FILE` in its environment the
//! tracker demands the secret's challenge-response on every connection (and the peer
//! links it negotiates); XGBoost's own workers cannot answer it, so XGBoost jobs must
//! leave both unset ([`SECRET_HELP`]).

use std::error::Error;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use switchyard_tracker::{Event, SortBy, Tracker, TrackerConfig, TrackerError};

/// How a batch of workers is ordered into ranks.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub(crate) enum SortArg {
    /// By the worker's IP address, then task id (numeric task ids by value).
    Host,
    /// By task id only.
    Task,
}

/// The job secret's part of `switchyard tracker --help`.
pub(crate) const SECRET_HELP: &str = "\
Job secret: with SWITCHYARD_JOB_SECRET (the secret) or SWITCHYARD_JOB_SECRET_FILE (a file
holding it) set, the tracker honours the job secret: every connection must first prove it
(HMAC challenge-response), and strangers are dropped and logged. Switchyard workers with the
same variable answer it. A secret shorter than 16 bytes, both variables set or an unreadable
file stops the tracker at start (exit 1). XGBoost's own workers (rabit, collective) cannot
answer the challenge: for XGBoost jobs leave both variables unset.";

/// The arguments of `switchyard tracker`.
#[derive(clap::Args, Debug)]
#[command(after_help = SECRET_HELP)]
pub(crate) struct TrackerArgs {
    /// Number of workers.
    #[arg(short = 'n', long = "workers", value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Address to listen on (the workers must reach it there).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 lets the system choose.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Rank order within a batch.
    #[arg(long, value_enum, default_value = "host")]
    sort_by: SortArg,
    /// Append-only state file: replayed at start, so that a tracker restarted on the same
    /// port resumes the job. One file per job: a file whose job finished is refused (exit
    /// 1, naming the file); delete it or pass a new path for the next job.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Seconds a worker may take for each message.
    #[arg(long, default_value_t = 30)]
    read_timeout: u64,
    /// Seconds a worker may wait for the rest of its batch.
    #[arg(long, default_value_t = 3600)]
    batch_timeout: u64,
    /// Fail the job (exit 1, naming the ranks that never shut down) if it has not ended
    /// this many seconds after the tracker started. Default: no limit. A worker that
    /// dies after bootstrap never sends `shutdown`, so without it the tracker waits
    /// for that worker forever.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    job_timeout: Option<u64>,
}

/// Runs the tracker until the job ends.
pub(crate) fn run(args: TrackerArgs) -> Result<(), Box<dyn Error>> {
    let mut config = TrackerConfig::new(args.workers);
    config.host = args.host;
    config.port = args.port;
    config.sort_by = match args.sort_by {
        SortArg::Host => SortBy::Host,
        SortArg::Task => SortBy::Task,
    };
    config.state_file = args.state;
    config.read_timeout = Duration::from_secs(args.read_timeout.max(1));
    config.batch_timeout = Duration::from_secs(args.batch_timeout.max(1));
    config.job_timeout = args.job_timeout.map(Duration::from_secs);
    let tracker = Tracker::start(config)?;
    let events = tracker.events();
    let mut out = std::io::stdout().lock();
    for (k, v) in tracker.worker_env() {
        writeln!(out, "{k}={v}")?;
    }
    out.flush()?;
    drop(out);
    // Events are printed here, not on a thread of their own, so that none is lost when
    // the job ends and the process exits.
    loop {
        if let Ok(e) = events.recv_timeout(Duration::from_millis(100)) {
            eprintln!("[tracker] {}", describe(&e));
        }
        match tracker.wait(Some(Duration::ZERO)) {
            Err(TrackerError::WaitTimedOut { .. }) => continue,
            ended => {
                for e in events.try_iter() {
                    eprintln!("[tracker] {}", describe(&e));
                }
                let outcome = ended?;
                eprintln!(
                    "[tracker] job finished: ranks {:?} shut down",
                    outcome.shut_down
                );
                return Ok(());
            }
        }
    }
}

fn describe(e: &Event) -> String {
    match e {
        Event::Assigned {
            rank,
            task_id,
            host,
        } => format!(
            "rank {rank} assigned to task {} at {host}",
            task_id.as_deref().unwrap_or("(none)")
        ),
        Event::Recovered { rank } => format!("rank {rank} recovers its links"),
        Event::Linked { rank } => format!("rank {rank} linked"),
        Event::Print { rank, text } => format!("rank {rank}: {text}"),
        Event::Silent {
            reporter,
            rank,
            attempt,
            reason,
        } => format!("rank {reporter} reports rank {rank} (attempt {attempt}) silent: {reason}"),
        Event::Shutdown { rank } => format!("rank {rank} shut down"),
        Event::Dropped { peer, reason } => format!("dropped {peer}: {reason}"),
        other => format!("{other:?}"),
    }
}
