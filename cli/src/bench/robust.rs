//! `switchyard bench robust`: what robust mode (rabit-style recovery) costs and how
//! fast it reacts, each beside the plain mesh or a first start measured in the same run.
//!
//! - `allreduce_overhead` (8 B, 64 KiB, 4 MiB): f32 Sum allreduce through
//!   `Communicator::join` in robust mode beside the same tracker join without it (the
//!   plain mesh), 4 ranks as threads of this process over tcp 127.0.0.1, each job with a
//!   fresh in-process tracker and the same options. Both communicators live side by
//!   side in the same threads and are timed in alternating blocks (the order rotates
//!   from block to block); figures are medians over blocks of rank 0's time per call.
//!   Ratio: plain / robust (1 = no overhead; the target is above 0.91 at 4 MiB).
//!   Robust mode checkpoints an empty model between blocks (untimed) so that the
//!   results it keeps stay within its budget, as an iterative program's checkpoints do.
//!   Its options come from the environment (`RobustOptions::from_env`:
//!   `SWITCHYARD_GLOBAL_REPLICA`, ...), the defaults without it.
//! - `allreduce_overhead_procs`: the same with the ranks as 4 worker processes (this
//!   executable, `bench robust-worker`), where page faults do not share one memory map.
//! - `agreement_allgather` (48 B per rank): the piece robust mode adds to every call,
//!   a plain-mesh allgather of 48 bytes per rank, beside the plain 8-byte allreduce.
//! - `--pieces` adds `pieces_*` rows: robust mode's per-call costs rebuilt one by one on
//!   the plain mesh (agreement allgather; + copies of input and result; + keeping the
//!   result until the block ends, as robust mode keeps it until the next checkpoint).
//! - `detect_sigkill_*`, `detect_sigstop_*`: 4 worker processes loop 8-byte allreduces
//!   1 ms apart; the bench SIGKILLs (or SIGSTOPs) one and times, on the unix clock,
//!   until the first and the last survivor notice: in robust mode the `robust: mesh
//!   broken, rejoining` warning (its call does not fail, it waits for the restart), in
//!   the baseline, the plain mesh, the call's error. Both get the same options, a 5 s
//!   silence timeout and no heartbeat: robust mode turns its own heartbeat on
//!   (`CommOptions::ROBUST_HEARTBEAT`), the plain mesh sees a stopped process only at
//!   the timeout.
//! - `catchup_load`, `catchup_replay` (global checkpoints of 1, 10, 100 MB): 4 robust
//!   worker processes load (nothing), checkpoint the model, make 5 small allreduces;
//!   the survivors enter a sixth while the bench SIGKILLs rank 1 and starts it again
//!   (attempt 1). Times from spawning the restarted process to its `load_checkpoint`
//!   returning (the model received from a survivor), and to the end of its 5 replayed
//!   calls; the baseline is the same rank's first start to the same points (join and
//!   load nothing; then checkpoint and run the 5 calls for real). Where the time goes
//!   (the survivors' traces: when they noticed, when they held a new mesh) is printed
//!   on stderr.
//!
//! `--instructions` counts instructions per allreduce of `allreduce_overhead` instead
//! (see `instructions`).

mod instructions;
mod worker;

pub(crate) use instructions::{RobustOneArgs, run_one};
pub(crate) use worker::{UnixNanos, WorkerArgs};

use super::report::header;
use super::{Common, Row, median};
use crossbeam_channel::{Receiver, Sender};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions, TrackerJoin};
use switchyard_tracker::{Tracker, TrackerConfig};
use worker::{
    CALL_FAILED, CAUGHT_UP, DONE, LOADED, MESH_BROKEN, NEW_MESH, READY, TIMINGS, unix_ns,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const SUITE: &str = "robust";
const RANKS: usize = 4;
/// The worker that dies in the process jobs.
const VICTIM: usize = 1;
/// Silence timeout of the detection jobs, both modes.
const DETECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Small allreduces after the checkpoint in a catch-up job.
const CATCHUP_CALLS: u64 = 5;
/// How long any one step of a process job may take before the bench gives up.
const STEP_LIMIT: Duration = Duration::from_secs(120);

/// Flags of `bench robust`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct RobustArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Also time robust mode's per-call costs rebuilt one by one on the plain mesh
    /// (`pieces_*` rows): the agreement's allgather, the copies of input and result,
    /// and keeping the result until the next checkpoint.
    #[arg(long)]
    pub(crate) pieces: bool,
}

pub(crate) fn run(args: RobustArgs) -> Result<()> {
    let common = &args.common;
    if common.instructions {
        return instructions::run(common);
    }
    if !common.json {
        header();
        eprintln!(
            "bench robust: {RANKS} ranks on {} cores; the machine is shared, figures are medians",
            std::thread::available_parallelism().map_or(0, usize::from)
        );
    }
    overhead(&args)?;
    detection(common)?;
    catch_up(common)?;
    Ok(())
}

/// The hidden `bench robust-worker` subcommand.
pub(crate) fn worker(args: WorkerArgs) -> Result<()> {
    worker::run(args)
}

// ---------------------------------------------------------------------------------
// Overhead: ranks as threads.

/// One size of the overhead comparison, and how many calls one timed block makes.
#[derive(Clone, Copy)]
struct Size {
    bytes: usize,
    iters: usize,
}

/// What one timed block runs, on rank 0's clock: the two real communicators, then
/// (with `--pieces`) robust mode's costs rebuilt on the plain mesh one by one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Plain,
    Robust,
    /// The plain allreduce after a 48-byte-per-rank allgather (the agreement).
    Agree,
    /// ... plus a copy of the input before and of the result after, both freed at
    /// once (their memory is reused call after call).
    AgreeCopies,
    /// ... with the result's copy kept until the block ends, as robust mode keeps
    /// every result until the next checkpoint (fresh memory for every call).
    AgreeCopiesKept,
}

impl Variant {
    const PIECES: [Variant; 3] = [
        Variant::Agree,
        Variant::AgreeCopies,
        Variant::AgreeCopiesKept,
    ];

    fn case(self) -> &'static str {
        match self {
            Variant::Plain | Variant::Robust => "allreduce_overhead",
            Variant::Agree => "pieces_agree",
            Variant::AgreeCopies => "pieces_copies",
            Variant::AgreeCopiesKept => "pieces_kept",
        }
    }
}

/// Per size and variant (in the order asked), rank 0's seconds per call of every
/// block; then the agreement-sized allgather's seconds per call of every block.
type Timings = (Vec<Vec<Vec<f64>>>, Vec<f64>);

/// The overhead comparison's sizes, variants and number of blocks.
fn overhead_plan(quick: bool, pieces: bool) -> (Vec<Size>, Vec<Variant>, usize) {
    let q = quick;
    let sizes = vec![
        Size {
            bytes: 8,
            iters: if q { 100 } else { 300 },
        },
        Size {
            bytes: 64 << 10,
            iters: if q { 40 } else { 120 },
        },
        Size {
            bytes: 4 << 20,
            iters: if q { 6 } else { 16 },
        },
    ];
    let mut variants = vec![Variant::Plain, Variant::Robust];
    if pieces {
        variants.extend(Variant::PIECES);
    }
    (sizes, variants, if q { 5 } else { 11 })
}

fn overhead(args: &RobustArgs) -> Result<()> {
    let common = &args.common;
    let (sizes, variants, blocks) = overhead_plan(common.quick, args.pieces);
    let run_threads = common.selects("allreduce_overhead") || args.pieces;
    let run_agreement = common.selects("agreement_allgather");
    if run_threads || run_agreement {
        let (per_size, agreement) = overhead_timings(&sizes, &variants, blocks)?;
        let plain_small = overhead_rows(common, &sizes, &variants, per_size, "");
        if run_agreement {
            Row::lower_better(
                SUITE,
                "agreement_allgather",
                (48 * RANKS) as u64,
                "time_us",
                median(agreement) * 1e6,
                plain_small * 1e6,
                "plain allreduce 8 B",
            )
            .emit(common.json);
        }
    }
    if common.selects("allreduce_overhead_procs") {
        let (per_size, _) = overhead_processes(common.quick, args.pieces)?;
        overhead_rows(common, &sizes, &variants, per_size, "_procs");
    }
    Ok(())
}

/// Emits one row per size and variant beside the plain mesh (cases named with
/// `suffix`); returns the plain 8-byte time.
fn overhead_rows(
    common: &Common,
    sizes: &[Size],
    variants: &[Variant],
    per_size: Vec<Vec<Vec<f64>>>,
    suffix: &str,
) -> f64 {
    let mut plain_small = f64::NAN;
    for (size, timings) in sizes.iter().zip(per_size) {
        let medians: Vec<f64> = timings.into_iter().map(median).collect();
        let plain = medians.first().copied().unwrap_or(f64::NAN);
        if size.bytes == 8 {
            plain_small = plain;
        }
        for (&variant, &secs) in variants.iter().zip(&medians).skip(1) {
            Row::lower_better(
                SUITE,
                &format!("{}{suffix}", variant.case()),
                size.bytes as u64,
                "time_us",
                secs * 1e6,
                plain * 1e6,
                "plain mesh (from_tracker)",
            )
            .emit(common.json);
        }
    }
    plain_small
}

/// The overhead comparison with the ranks as processes (this executable, `bench
/// robust-worker --mode overhead`) instead of threads: the threads of one process
/// share its memory map, so its page faults contend where processes' would not.
fn overhead_processes(quick: bool, pieces: bool) -> Result<Timings> {
    let mut job = Job::new()?;
    let robust = Tracker::start(TrackerConfig::new(RANKS as u32))?;
    let mut extra = vec![
        "--mode".to_string(),
        "overhead".into(),
        "--port2".into(),
        robust.addr().port().to_string(),
    ];
    if quick {
        extra.push("--quick".into());
    }
    if pieces {
        extra.push("--pieces".into());
    }
    let slots = (0..RANKS)
        .map(|t| job.spawn(t, &extra))
        .collect::<Result<Vec<_>>>()?;
    job.await_word(TIMINGS, &slots[..1], STEP_LIMIT)?;
    let line = job.history[slots[0]]
        .iter()
        .find(|l| l.starts_with(TIMINGS))
        .ok_or("no timings")?;
    let json = line.splitn(3, ' ').nth(2).ok_or("timings without a body")?;
    let timings: Timings = serde_json::from_str(json)?;
    job.wait_all()?;
    job.tracker.wait(Some(STEP_LIMIT))?;
    robust.wait(Some(STEP_LIMIT))?;
    Ok(timings)
}

/// One rank of [`overhead_processes`]: prints its timings, `timings <ns> <json>`.
pub(crate) fn overhead_worker(args: &WorkerArgs) -> Result<()> {
    let (sizes, variants, blocks) = overhead_plan(args.quick, args.pieces);
    let i: usize = args
        .task
        .trim_start_matches('t')
        .parse()
        .map_err(|_| format!("task {:?} is not t<N>", args.task))?;
    let timings = rank_timings(i, (args.port, args.port2), &sizes, &variants, blocks)?;
    println!(
        "{TIMINGS} {} {}",
        unix_ns(),
        serde_json::to_string(&timings)?
    );
    Ok(())
}

fn overhead_timings(sizes: &[Size], variants: &[Variant], blocks: usize) -> Result<Timings> {
    let plain = Tracker::start(TrackerConfig::new(RANKS as u32))?;
    let robust = Tracker::start(TrackerConfig::new(RANKS as u32))?;
    let (plain_port, robust_port) = (plain.addr().port(), robust.addr().port());
    let threads: Vec<_> = (0..RANKS)
        .map(|i| {
            let (sizes, variants) = (sizes.to_vec(), variants.to_vec());
            std::thread::spawn(move || {
                let ports = (plain_port, robust_port);
                rank_timings(i, ports, &sizes, &variants, blocks).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut first = None;
    let mut failed = None;
    for t in threads {
        match t.join().map_err(|_| "a rank thread panicked")? {
            Ok(timings) => {
                first.get_or_insert(timings);
            }
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    plain.wait(Some(STEP_LIMIT))?;
    robust.wait(Some(STEP_LIMIT))?;
    first.ok_or_else(|| "no rank".into())
}

/// Both communicators of one rank, and what the rebuilt pieces need.
struct Comms {
    plain: Communicator,
    robust: Communicator,
    state: Vec<u8>,
    states: Vec<u8>,
}

impl Comms {
    /// Seconds per call of `iters` calls of `variant` on `buf`.
    fn time(&mut self, variant: Variant, buf: &mut [f32], iters: usize) -> Result<f64> {
        let mut kept = Vec::new();
        let started = Instant::now();
        for _ in 0..iters {
            match variant {
                Variant::Plain => self.plain.allreduce(buf, ReduceOp::Sum)?,
                Variant::Robust => self.robust.allreduce(buf, ReduceOp::Sum)?,
                Variant::Agree => {
                    self.plain.allgather(&self.state, &mut self.states)?;
                    self.plain.allreduce(buf, ReduceOp::Sum)?;
                }
                Variant::AgreeCopies | Variant::AgreeCopiesKept => {
                    self.plain.allgather(&self.state, &mut self.states)?;
                    let input = std::hint::black_box(buf.to_vec());
                    self.plain.allreduce(buf, ReduceOp::Sum)?;
                    let result = std::hint::black_box(buf.to_vec());
                    if variant == Variant::AgreeCopiesKept {
                        kept.push(result);
                    }
                    drop(input);
                }
            }
        }
        let secs = started.elapsed().as_secs_f64() / iters as f64;
        // Freed outside the timing, as robust mode frees its results at a checkpoint.
        drop(kept);
        Ok(secs)
    }
}

/// One rank: joins the plain job, then the robust one, and times every variant alike.
fn rank_timings(
    i: usize,
    (plain_port, robust_port): (u16, u16),
    sizes: &[Size],
    variants: &[Variant],
    blocks: usize,
) -> Result<Timings> {
    let options = CommOptions::default().with_timeout(STEP_LIMIT);
    let task = format!("t{i}");
    let plain = Communicator::join(
        &Bootstrap::tracker(TrackerJoin::new("127.0.0.1", plain_port).with_task_id(task.clone())),
        options.clone(),
    )?;
    // The environment's robust options (SWITCHYARD_GLOBAL_REPLICA, ...), to see what
    // each costs; the defaults without it.
    let robust = Communicator::join(
        &Bootstrap::tracker(TrackerJoin::new("127.0.0.1", robust_port).with_task_id(task)),
        options.with_robust(RobustOptions::from_env()?),
    )?;
    let mut comms = Comms {
        plain,
        robust,
        state: vec![0u8; 48],
        states: vec![0u8; 48 * RANKS],
    };
    comms.robust.load_checkpoint()?;
    let mut per_size = Vec::new();
    for size in sizes {
        let mut buf = vec![1.0f32; size.bytes / 4];
        // Warm-up: connections, buffers, the allocator's pools.
        for &v in variants {
            comms.time(v, &mut buf, 3)?;
            buf.fill(1.0);
        }
        let mut timings = vec![Vec::new(); variants.len()];
        for block in 0..blocks {
            // Dropping the kept results outside the timed blocks, as an iterative
            // program's per-iteration checkpoint does.
            comms.robust.checkpoint(&[], None)?;
            // Each block runs the variants in a rotated order: none is always first
            // after the checkpoint, or always after the same neighbour.
            for k in 0..variants.len() {
                let at = (block + k) % variants.len();
                timings[at].push(comms.time(variants[at], &mut buf, size.iters)?);
                // Sums of ones grow x4 per call: keep them finite and cheap to add.
                buf.fill(1.0);
            }
        }
        per_size.push(timings);
    }
    // What robust mode's per-call agreement costs alone: 48 bytes per rank, gathered.
    let iters = sizes.first().map_or(100, |s| s.iters);
    let mut agreement = Vec::new();
    for _ in 0..blocks {
        let started = Instant::now();
        for _ in 0..iters {
            comms.plain.allgather(&comms.state, &mut comms.states)?;
        }
        agreement.push(started.elapsed().as_secs_f64() / iters as f64);
    }
    comms.plain.finalize()?;
    comms.robust.finalize()?;
    Ok((per_size, agreement))
}

// ---------------------------------------------------------------------------------
// Worker processes.

/// A worker process that is SIGKILLed when dropped, whatever path the bench leaves by.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A job of worker processes around an in-process tracker. Every line the workers
/// write (stdout and stderr) arrives on one channel, tagged with the worker's slot.
struct Job {
    // Dropped before the tracker (field order): no worker outlives its job.
    workers: Vec<Option<Reaped>>,
    spawned: Vec<u128>,
    lines: Receiver<(usize, String)>,
    send: Sender<(usize, String)>,
    /// Every line each slot wrote so far.
    history: Vec<Vec<String>>,
    tracker: Tracker,
}

impl Job {
    fn new() -> Result<Job> {
        let (send, lines) = crossbeam_channel::unbounded();
        Ok(Job {
            workers: Vec::new(),
            spawned: Vec::new(),
            lines,
            send,
            history: Vec::new(),
            tracker: Tracker::start(TrackerConfig::new(RANKS as u32))?,
        })
    }

    /// Starts worker `task` in a new slot and returns the slot.
    fn spawn(&mut self, task: usize, extra: &[String]) -> Result<usize> {
        let slot = self.workers.len();
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["bench", "robust-worker", "--port"])
            .arg(self.tracker.addr().port().to_string())
            .args(["--task", &format!("t{task}")])
            .args(extra)
            // Robust mode's warnings (mesh broken) and notes (new mesh formed), which
            // the bench reads; the worker stamps them in unix ns.
            .env("RUST_LOG", "switchyard=info")
            // Held open by the bench: a worker ends itself when it closes, so that no
            // worker outlives a bench that was killed before it could kill them.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.spawned.push(unix_ns());
        let mut child = Reaped(command.spawn()?);
        let out = child.0.stdout.take().ok_or("no stdout")?;
        let err = child.0.stderr.take().ok_or("no stderr")?;
        self.workers.push(Some(child));
        self.history.push(Vec::new());
        forward(slot, out, self.send.clone());
        forward(slot, err, self.send.clone());
        Ok(slot)
    }

    /// Waits until each of `slots` has written a line saying `word` (or had, before)
    /// and returns each one's stamp; an error if one exits first or time runs out.
    fn await_word(&mut self, word: &str, slots: &[usize], limit: Duration) -> Result<Vec<u128>> {
        let until = Instant::now() + limit;
        loop {
            let found: Vec<Option<u128>> = slots
                .iter()
                .map(|&s| self.history[s].iter().find_map(|l| stamp(l, word)))
                .collect();
            if found.iter().all(Option::is_some) {
                return Ok(found.into_iter().flatten().collect());
            }
            let missing: Vec<usize> = slots
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(&s, _)| s)
                .collect();
            if Instant::now() > until {
                return Err(format!(
                    "waited {limit:?} for {word:?} from worker slots {missing:?}; their last \
                     lines: {:?}",
                    missing.iter().map(|&s| self.tail(s)).collect::<Vec<_>>()
                )
                .into());
            }
            self.exited_early(&missing, word)?;
            if let Ok((slot, line)) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.history[slot].push(line);
            }
        }
    }

    /// The last lines of `slot`, for error messages.
    fn tail(&self, slot: usize) -> &[String] {
        let h = &self.history[slot];
        &h[h.len().saturating_sub(8)..]
    }

    /// An error if a worker the bench waits on has exited unsuccessfully without
    /// saying `word` (a plain survivor's failed call ends it after it said so).
    fn exited_early(&mut self, slots: &[usize], word: &str) -> Result<()> {
        for &s in slots {
            let Some(Some(child)) = self.workers.get_mut(s) else {
                continue;
            };
            if let Some(status) = child.0.try_wait()? {
                if !status.success() {
                    // Let its last words arrive before naming them.
                    std::thread::sleep(Duration::from_millis(50));
                    while let Ok((slot, line)) = self.lines.try_recv() {
                        self.history[slot].push(line);
                    }
                    if self.history[s].iter().any(|l| stamp(l, word).is_some()) {
                        continue;
                    }
                    return Err(format!(
                        "worker slot {s} exited with {status}: {:?}",
                        self.tail(s)
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    fn pid(&self, slot: usize) -> Result<u32> {
        Ok(self
            .workers
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or("no such worker")?
            .0
            .id())
    }

    /// SIGKILLs the worker in `slot` and reaps it.
    fn kill(&mut self, slot: usize) {
        if let Some(w) = self.workers.get_mut(slot) {
            w.take();
        }
    }

    /// Waits for every live worker to exit successfully.
    fn wait_all(&mut self) -> Result<()> {
        let until = Instant::now() + STEP_LIMIT;
        for slot in 0..self.workers.len() {
            while let Some(Some(child)) = self.workers.get_mut(slot) {
                if let Some(status) = child.0.try_wait()? {
                    if !status.success() {
                        return Err(format!("worker slot {slot} exited with {status}").into());
                    }
                    break;
                }
                if Instant::now() > until {
                    return Err(format!("worker slot {slot} did not exit").into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }
}

/// Sends every line of `from` to `send`, tagged with `slot`, until end of file.
fn forward(slot: usize, from: impl Read + Send + 'static, send: Sender<(usize, String)>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if send.send((slot, line)).is_err() {
                break;
            }
        }
    });
}

/// The unix-ns stamp of a line that says `word`: `word <ns> ...` (the workers' own
/// lines), or a trace line `<ns> LEVEL target: ...word...` (robust mode's warning).
fn stamp(line: &str, word: &str) -> Option<u128> {
    if let Some(rest) = line.strip_prefix(word) {
        return rest.split_whitespace().next()?.parse().ok();
    }
    if line.contains(word) {
        return line.split_whitespace().next()?.parse().ok();
    }
    None
}

fn ms(from: u128, to: u128) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

// ---------------------------------------------------------------------------------
// Detection.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Signal {
    Kill,
    Stop,
}

fn detection(common: &Common) -> Result<()> {
    for (signal, name) in [(Signal::Kill, "sigkill"), (Signal::Stop, "sigstop")] {
        let (first_case, last_case) = (
            format!("detect_{name}_first"),
            format!("detect_{name}_last"),
        );
        if !common.selects(&first_case) && !common.selects(&last_case) {
            continue;
        }
        let reps = match (signal, common.quick) {
            (Signal::Kill, true) => 3,
            (Signal::Kill, false) => 7,
            (Signal::Stop, true) => 1,
            (Signal::Stop, false) => 3,
        };
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            ours.push(detect(true, signal)?);
            theirs.push(detect(false, signal)?);
        }
        for (case, pick) in [(&first_case, 0), (&last_case, 1)] {
            let of = |v: &[(f64, f64)]| {
                median(
                    v.iter()
                        .map(|t| if pick == 0 { t.0 } else { t.1 })
                        .collect(),
                )
            };
            Row::lower_better(
                SUITE,
                case,
                8,
                "time_ms",
                of(&ours),
                of(&theirs),
                "plain mesh: the call's error",
            )
            .emit(common.json);
        }
    }
    Ok(())
}

/// One job: milliseconds from the signal to the first and the last survivor noticing.
fn detect(robust: bool, signal: Signal) -> Result<(f64, f64)> {
    let mut job = Job::new()?;
    let mut extra = vec![
        "--mode".to_string(),
        "loop".into(),
        "--timeout-ms".into(),
        DETECT_TIMEOUT.as_millis().to_string(),
    ];
    if robust {
        extra.push("--robust".into());
    }
    let slots = (0..RANKS)
        .map(|t| job.spawn(t, &extra))
        .collect::<Result<Vec<_>>>()?;
    job.await_word(READY, &slots, STEP_LIMIT)?;
    // Let every survivor settle into its loop.
    std::thread::sleep(Duration::from_millis(50));
    let pid = job.pid(VICTIM)?;
    let sent = unix_ns();
    let mut reaped = None;
    match signal {
        Signal::Kill => {
            job.kill(VICTIM);
            // When its exit was complete (its sockets closed): how much of the time
            // survivors take is the kernel's.
            reaped = Some(ms(sent, unix_ns()));
        }
        Signal::Stop => {
            let status = Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()?;
            if !status.success() {
                return Err(format!("kill -STOP {pid}: {status}").into());
            }
        }
    }
    let word = if robust { MESH_BROKEN } else { CALL_FAILED };
    let survivors: Vec<usize> = slots.iter().copied().filter(|&s| s != VICTIM).collect();
    let seen = job.await_word(word, &survivors, DETECT_TIMEOUT + STEP_LIMIT)?;
    let times: Vec<f64> = seen.iter().map(|&ns| ms(sent, ns)).collect();
    let first = times.iter().copied().fold(f64::INFINITY, f64::min);
    let last = times.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "  detect {} {signal:?}: survivors noticed after {times:.1?} ms{}",
        if robust { "robust" } else { "plain" },
        reaped.map_or(String::new(), |r| format!(
            " (victim reaped after {r:.1} ms)"
        ))
    );
    // Dropping the job SIGKILLs every worker, the stopped one too.
    Ok((first, last))
}

// ---------------------------------------------------------------------------------
// Catch-up.

/// Milliseconds from spawn to `load_checkpoint` returning and to the end of the
/// calls after the checkpoint: (first start, restart) of the victim.
struct CatchUp {
    first: (f64, f64),
    restart: (f64, f64),
}

fn catch_up(common: &Common) -> Result<()> {
    if !common.selects("catchup_load") && !common.selects("catchup_replay") {
        return Ok(());
    }
    let sizes: &[usize] = if common.quick {
        &[1_000_000, 10_000_000]
    } else {
        &[1_000_000, 10_000_000, 100_000_000]
    };
    let reps = if common.quick { 1 } else { 3 };
    for &size in sizes {
        let runs = (0..reps)
            .map(|_| catch_up_job(size))
            .collect::<Result<Vec<_>>>()?;
        let of = |f: fn(&CatchUp) -> f64| median(runs.iter().map(f).collect());
        if common.selects("catchup_load") {
            Row::lower_better(
                SUITE,
                "catchup_load",
                size as u64,
                "time_ms",
                of(|c| c.restart.0),
                of(|c| c.first.0),
                "first start: join, load none",
            )
            .emit(common.json);
        }
        if common.selects("catchup_replay") {
            Row::lower_better(
                SUITE,
                "catchup_replay",
                size as u64,
                "time_ms",
                of(|c| c.restart.1),
                of(|c| c.first.1),
                "first start: +ckpt, 5 calls",
            )
            .emit(common.json);
        }
    }
    Ok(())
}

fn catch_up_job(size: usize) -> Result<CatchUp> {
    let mut job = Job::new()?;
    let base = |attempt: u64| {
        vec![
            "--mode".to_string(),
            "catchup".into(),
            "--robust".into(),
            "--size".into(),
            size.to_string(),
            "--calls".into(),
            CATCHUP_CALLS.to_string(),
            "--attempt".into(),
            attempt.to_string(),
            // Survivors wait in their next call through the kill and the restart.
            "--timeout-ms".into(),
            STEP_LIMIT.as_millis().to_string(),
        ]
    };
    let mut slots = Vec::new();
    for t in 0..RANKS {
        let mut extra = base(0);
        if t == VICTIM {
            extra.push("--hold".into());
        }
        slots.push(job.spawn(t, &extra)?);
    }
    let loaded = job.await_word(LOADED, &[VICTIM], STEP_LIMIT)?[0];
    let caught = job.await_word(CAUGHT_UP, &[VICTIM], STEP_LIMIT)?[0];
    job.await_word(READY, &slots, STEP_LIMIT)?;
    let spawned = job.spawned[VICTIM];
    let first = (ms(spawned, loaded), ms(spawned, caught));
    let killed = unix_ns();
    job.kill(VICTIM);
    let again = job.spawn(VICTIM, &base(1))?;
    let loaded = job.await_word(LOADED, &[again], STEP_LIMIT)?[0];
    let caught = job.await_word(CAUGHT_UP, &[again], STEP_LIMIT)?[0];
    let spawned = job.spawned[again];
    let restart = (ms(spawned, loaded), ms(spawned, caught));
    let mut finishing: Vec<usize> = slots.into_iter().filter(|&s| s != VICTIM).collect();
    finishing.push(again);
    job.await_word(DONE, &finishing, STEP_LIMIT)?;
    job.wait_all()?;
    job.tracker.wait(Some(STEP_LIMIT))?;
    // Where the restart's time goes, on the survivors' side: from the kill to the last
    // one noticing, and to the last one holding a new mesh.
    let survivors: Vec<usize> = (0..RANKS).filter(|&s| s != VICTIM).collect();
    let last = |word: &str| {
        survivors
            .iter()
            .filter_map(|&s| job.history[s].iter().find_map(|l| stamp(l, word)))
            .max()
            .map_or(f64::NAN, |ns| ms(killed, ns))
    };
    eprintln!(
        "  catch-up {size} B: first start {:.1}/{:.1} ms, restart {:.1}/{:.1} ms (load/caught \
         up); from the kill: survivors noticed {:.1} ms, held a new mesh {:.1} ms, restart \
         spawned {:.1} ms",
        first.0,
        first.1,
        restart.0,
        restart.1,
        last(MESH_BROKEN),
        last(NEW_MESH),
        ms(killed, spawned),
    );
    Ok(CatchUp { first, restart })
}
