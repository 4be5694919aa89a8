//! `switchyard bench tracker`: how fast the tracker admits and wires a job, and how
//! long `switchyard launch` takes to reach a job's first collective.
//!
//! - `admit_wire` (N = 16, 64, 256): N threads speak the classic protocol as real
//!   workers do (listen, `start`, negotiate, connect to and accept their tree and ring
//!   links); the time runs from releasing them to the last one holding all its links.
//!   Baseline: the same threads against XGBoost 1.7.6's Python `RabitTracker`, started
//!   in a child process by the interpreter named in `SWITCHYARD_XGB17_PYTHON` (skipped,
//!   with a line saying so, when it is unset). Ratio: theirs / ours (above 1: ours
//!   faster).
//! - `launch_first_collective` (n = 4): from spawning `switchyard launch -n 4` to the
//!   last rank finishing its first allreduce, beside spawning the same four processes
//!   with `switchyard launch` running `/bin/true` (what starting processes costs
//!   alone); the ratio says how close to that floor the rendezvous and mesh setup are.

use super::{Common, Row, median};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_tracker::client::{ClientConfig, classic::ClassicClient};
use switchyard_tracker::{Tracker, TrackerConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The line a `--first-collective` worker prints when its first allreduce is done.
const DONE: &str = "first-collective-done";

/// Flags of `bench tracker`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TrackerArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Internal: run as one rank of the launch-to-first-collective job.
    #[arg(long, hide = true)]
    pub(crate) first_collective: bool,
}

pub(crate) fn run(args: TrackerArgs) -> Result<()> {
    if args.first_collective {
        return first_collective_worker();
    }
    let common = &args.common;
    common.times_only("tracker")?;
    let reps = if common.quick { 3 } else { 7 };
    if !common.json {
        super::report::header();
    }
    let python = std::env::var("SWITCHYARD_XGB17_PYTHON").ok();
    if python.is_none() {
        eprintln!(
            "bench tracker: SWITCHYARD_XGB17_PYTHON is unset, so there is no XGBoost 1.7.6 \
             baseline for admit_wire (scripts/xgboost-venvs.sh makes one)"
        );
    }
    let sizes: &[u32] = if common.quick {
        &[16, 64]
    } else {
        &[16, 64, 256]
    };
    for &n in sizes {
        let case = format!("admit_wire_n{n}");
        if !common.selects(&case) {
            continue;
        }
        let Some(python) = &python else {
            let ours = median((0..reps).map(|_| admit_ours(n)).collect::<Result<_>>()?);
            eprintln!("{case}: ours {:.1} ms (no baseline)", ours * 1e3);
            continue;
        };
        let (ours, theirs) = super::paired(reps, || admit_ours(n), || admit_reference(python, n))?;
        Row::lower_better(
            "tracker",
            &case,
            n as u64,
            "time_ms",
            ours * 1e3,
            theirs * 1e3,
            "xgboost-1.7.6 RabitTracker",
        )
        .in_ranks()
        .emit(common.json);
    }
    if common.selects("launch_first_collective") {
        let (ours, floor) = super::paired(
            reps,
            || launch_to_first(4, false),
            || launch_to_first(4, true),
        )?;
        Row::lower_better(
            "tracker",
            "launch_first_collective_n4",
            4,
            "time_ms",
            ours * 1e3,
            floor * 1e3,
            "launch -n 4 -- /bin/true",
        )
        .in_ranks()
        .emit(common.json);
    }
    Ok(())
}

/// N classic workers joining at once against `addr`; seconds until all hold their links.
fn wire(addr: SocketAddr, n: u32) -> Result<f64> {
    let config = ClientConfig::default().with_timeout(Duration::from_secs(120));
    let go = Arc::new(Barrier::new(n as usize + 1));
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let client = ClassicClient::new(
                &addr.ip().to_string(),
                addr.port(),
                Some(format!("w{i}")),
                config.clone(),
            );
            let go = Arc::clone(&go);
            std::thread::spawn(move || -> std::result::Result<_, String> {
                let client = client.map_err(|e| e.to_string())?;
                go.wait();
                let joined = client.start(None, None).map_err(|e| e.to_string())?;
                Ok((Instant::now(), joined))
            })
        })
        .collect();
    go.wait();
    let start = Instant::now();
    let mut last = start;
    let mut sessions = Vec::new();
    for worker in workers {
        let (done, joined) = worker.join().map_err(|_| "a worker thread panicked")??;
        last = last.max(done);
        sessions.push(joined.session);
    }
    // Links close with `joined`; the sessions say goodbye so the tracker's job ends.
    for session in sessions {
        session.shutdown()?;
    }
    Ok((last - start).as_secs_f64())
}

fn admit_ours(n: u32) -> Result<f64> {
    let tracker = Tracker::start(TrackerConfig::new(n))?;
    let secs = wire(tracker.addr(), n)?;
    tracker.wait(Some(Duration::from_secs(60)))?;
    Ok(secs)
}

/// A child process that kills itself on drop: no stray reference tracker.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// XGBoost 1.7.6's tracker serving `n` workers in a child process.
const REFERENCE: &str = "\
import sys
from xgboost.tracker import RabitTracker
t = RabitTracker(host_ip='127.0.0.1', n_workers=int(sys.argv[1]), port=0)
print(t.worker_envs()['DMLC_TRACKER_PORT'], flush=True)
t.start(int(sys.argv[1]))
t.join()
";

fn admit_reference(python: &str, n: u32) -> Result<f64> {
    let mut child = Reaped(
        Command::new(python)
            .args(["-c", REFERENCE, &n.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {python}: {e}"))?,
    );
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or("no stdout from the reference tracker")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| format!("the reference tracker printed {line:?}, not a port"))?;
    let secs = wire(SocketAddr::from(([127, 0, 0, 1], port)), n)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.0.try_wait()?.is_none() {
        if Instant::now() > deadline {
            return Err("the reference tracker did not end after every shutdown".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(secs)
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `switchyard launch -n N` of this command's first-collective worker (or of
/// `/bin/true`); seconds from spawning the launcher to the last rank's first result
/// (or to the launcher's exit).
fn launch_to_first(n: u32, floor: bool) -> Result<f64> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(&exe);
    command.args(["launch", "-n", &n.to_string(), "--"]);
    if floor {
        command.arg("/bin/true");
    } else {
        command
            .arg(&exe)
            .args(["bench", "tracker", "--first-collective"]);
    }
    let started = unix_now();
    let mut child = Reaped(
        command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or("no stdout from switchyard launch")?;
    let mut last = Duration::ZERO;
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(nanos) = line
            .split_once(DONE)
            .and_then(|(_, t)| t.trim().parse::<u64>().ok())
        {
            last = last.max(Duration::from_nanos(nanos));
            seen += 1;
        }
    }
    let status = child.0.wait()?;
    if !status.success() {
        return Err(format!("switchyard launch -n {n} exited with {status}").into());
    }
    if floor {
        return Ok((unix_now() - started).as_secs_f64());
    }
    if seen != n {
        return Err(format!("{seen} of {n} ranks reported their first collective").into());
    }
    Ok((last.saturating_sub(started)).as_secs_f64())
}

/// One rank of the launch job: form the communicator, one allreduce, say when.
fn first_collective_worker() -> Result<()> {
    let mut comm = switchyard::collective::Communicator::from_env()?;
    let mut one = [1.0f32];
    comm.allreduce(&mut one, switchyard::collective::ReduceOp::Sum)?;
    if one[0] != comm.world_size() as f32 {
        return Err(format!(
            "allreduce gave {} in a world of {}",
            one[0],
            comm.world_size()
        )
        .into());
    }
    println!("{DONE} {}", unix_now().as_nanos());
    Ok(())
}
