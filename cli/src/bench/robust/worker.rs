//! `switchyard bench robust-worker`: one worker process of `bench robust`'s detection
//! and catch-up jobs, started by the bench from its own executable.
//!
//! It speaks to the bench in lines on stdout, each `<word> <unix ns>`:
//! `ready` (joined and warmed up, or, in a catch-up job, done with its calls),
//! `loaded` (`load_checkpoint` returned), `caught-up` (the calls after the checkpoint
//! are done, replayed or run), `done` (the job's last call returned). A plain-mesh
//! worker whose call fails writes `call-failed <ns> <error>` on stderr; a robust one
//! cannot (its call waits for the restart), so the bench reads robust mode's own
//! `robust: mesh broken, rejoining` warning from stderr, which this process stamps in
//! unix nanoseconds (see [`UnixNanos`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions, TrackerJoin};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The stdout line of a worker that has joined and warmed up.
pub(crate) const READY: &str = "ready";
/// `load_checkpoint` returned.
pub(crate) const LOADED: &str = "loaded";
/// The calls after the checkpoint are done.
pub(crate) const CAUGHT_UP: &str = "caught-up";
/// The job's last call returned.
pub(crate) const DONE: &str = "done";
/// An overhead worker's timings (JSON after the stamp).
pub(crate) const TIMINGS: &str = "timings";
/// A plain-mesh worker's failed call (stderr).
pub(crate) const CALL_FAILED: &str = "call-failed";
/// Robust mode's warning when this rank sees its mesh break.
pub(crate) const MESH_BROKEN: &str = "robust: mesh broken, rejoining";
/// Robust mode's note when this rank holds a new mesh after a failure.
pub(crate) const NEW_MESH: &str = "robust: formed a new mesh after a failure";

/// Small allreduces a detection worker makes before it says it is ready.
const WARM_CALLS: u64 = 50;

/// What the worker process does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Small allreduces forever, 1 ms apart, until it is killed or a call fails.
    Loop,
    /// Load, checkpoint `--size` bytes, `--calls` small allreduces, then one more
    /// call and `finalize` (or, with `--hold`, sleep until killed).
    Catchup,
    /// One rank of the overhead comparison as a process: joins the plain job
    /// (`--port`) and the robust one (`--port2`), times both, prints `timings`.
    Overhead,
}

/// Flags of the hidden `bench robust-worker` subcommand.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct WorkerArgs {
    /// The in-process tracker's port on 127.0.0.1.
    #[arg(long)]
    pub(crate) port: u16,
    /// This worker's task id (the same across restarts).
    #[arg(long)]
    pub(crate) task: String,
    #[arg(long, value_enum)]
    pub(crate) mode: Mode,
    /// Robust mode (else the plain mesh through the same tracker).
    #[arg(long)]
    pub(crate) robust: bool,
    /// This process's restart count (`RobustOptions::attempt`).
    #[arg(long, default_value_t = 0)]
    pub(crate) attempt: u64,
    /// Bytes of the global model a catch-up worker checkpoints.
    #[arg(long, default_value_t = 0)]
    pub(crate) size: usize,
    /// Allreduces a catch-up worker makes after the checkpoint.
    #[arg(long, default_value_t = 5)]
    pub(crate) calls: u64,
    /// The silence timeout (`CommOptions::timeout`), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub(crate) timeout_ms: u64,
    /// Catch-up job: after the calls, wait to be killed instead of going on.
    #[arg(long)]
    pub(crate) hold: bool,
    /// Overhead job: the robust job's tracker port.
    #[arg(long, default_value_t = 0)]
    pub(crate) port2: u16,
    /// Overhead job: `bench robust --quick`'s sizes and blocks.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Overhead job: `bench robust --pieces`' variants too.
    #[arg(long)]
    pub(crate) pieces: bool,
}

/// Unix time now, in nanoseconds: the bench and its workers share the clock.
pub(crate) fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// Trace timestamps in unix nanoseconds, so that the bench can read when robust mode
/// logged that the mesh broke on the same clock as its own kill.
pub(crate) struct UnixNanos;

impl tracing_subscriber::fmt::time::FormatTime for UnixNanos {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{}", unix_ns())
    }
}

fn say(word: &str) {
    // Rust's stdout is line-buffered: the line leaves at once, even into a pipe.
    println!("{word} {}", unix_ns());
}

fn join(args: &WorkerArgs) -> Result<Communicator> {
    let boot = Bootstrap::tracker(
        TrackerJoin::new("127.0.0.1", args.port).with_task_id(args.task.clone()),
    );
    let mut options = CommOptions::default().with_timeout(Duration::from_millis(args.timeout_ms));
    if args.robust {
        let mut robust = RobustOptions::default();
        robust.attempt = args.attempt;
        options = options.with_robust(robust);
    }
    Ok(Communicator::join(&boot, options)?)
}

pub(crate) fn run(args: WorkerArgs) -> Result<()> {
    // The bench holds this process's stdin open; end of file means the bench is gone
    // (killed before it could kill this worker), and a looping worker must not stay.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(3);
    });
    if args.mode == Mode::Overhead {
        return super::overhead_worker(&args);
    }
    let mut comm = join(&args)?;
    match args.mode {
        Mode::Loop => looping(&mut comm, args.robust),
        Mode::Catchup => catch_up(comm, &args),
        Mode::Overhead => Err("the overhead worker joins two jobs".into()),
    }
}

/// 8-byte allreduces 1 ms apart (a stand-in for computing between calls, and room for
/// the bench on two cores), until killed; a failed call is reported and ends it.
fn looping(comm: &mut Communicator, robust: bool) -> Result<()> {
    if robust {
        comm.load_checkpoint()?;
    }
    let mut calls = 0u64;
    loop {
        let mut v = [1.0f32; 2];
        if let Err(e) = comm.allreduce(&mut v, ReduceOp::Sum) {
            eprintln!("{CALL_FAILED} {} {e}", unix_ns());
            return Err(e.into());
        }
        calls += 1;
        if calls == WARM_CALLS {
            say(READY);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The catch-up job's worker: every process of the job, first starts and the restart.
fn catch_up(mut comm: Communicator, args: &WorkerArgs) -> Result<()> {
    let checkpoint = comm.load_checkpoint()?;
    say(LOADED);
    if checkpoint.is_none() {
        // The model's bytes do not matter; their number does.
        let model = vec![7u8; args.size];
        comm.checkpoint(&model, None)?;
    } else if checkpoint.as_ref().map(|c| c.global.len()) != Some(args.size) {
        return Err(format!(
            "the loaded checkpoint has {:?} bytes, not {}",
            checkpoint.map(|c| c.global.len()),
            args.size
        )
        .into());
    }
    let n = comm.world_size() as f32;
    // A restarted worker gets these results from survivors instead of running them.
    for _ in 0..args.calls {
        small_sum(&mut comm, n)?;
    }
    say(CAUGHT_UP);
    if args.hold {
        say(READY);
        // The survivors wait in their next call for this rank, which the bench kills.
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    say(READY);
    small_sum(&mut comm, n)?;
    say(DONE);
    comm.finalize()?;
    Ok(())
}

fn small_sum(comm: &mut Communicator, n: f32) -> Result<()> {
    let mut v = [1.0f32; 2];
    comm.allreduce(&mut v, ReduceOp::Sum)?;
    if v != [n; 2] {
        return Err(format!("allreduce gave {v:?} in a world of {n}").into());
    }
    Ok(())
}
