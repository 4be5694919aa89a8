//! Benchmark suites. Each prints a table, or with `--json` one object per line:
//! `{"suite","case","size","metric","ours","baseline","baseline_name","ratio"}` where a
//! ratio above 1 means switchyard is better than the baseline measured in the same run.

// Every suite so far compares against libzmq; a build without it has only the shared
// reporting code, unused until a suite that needs no zmq exists.
#![cfg_attr(not(feature = "zmq"), allow(dead_code, unused_imports))]

mod chart;
mod collective;
mod instructions;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "mpi")]
mod mpi_instructions;
mod probe;
#[cfg(feature = "zmq")]
mod ps;
mod report;
mod robust;
mod torch;
mod tracker;
#[cfg(feature = "zmq")]
mod transport;

use clap::{Args, Subcommand};
pub(crate) use report::Row;

/// Flags every suite takes.
#[derive(Args, Debug, Clone)]
pub(crate) struct Common {
    /// Fewer repetitions and messages: finishes in under a minute.
    #[arg(long)]
    pub(crate) quick: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Run only the cases whose name contains this text (for profiling one case).
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// Instructions per message instead of times, counted by valgrind's callgrind
    /// (repeatable on a loaded machine, where times swing): each side of each case runs
    /// in a process of its own, with two message counts, and the difference leaves
    /// start-up out. `bench transport` (its 64 B and 1 KiB rate cases), `bench mpi`
    /// (round trips of 64 B, 64 KiB and 1 MiB through MPI's self-loopback in one
    /// process), `bench robust`
    /// (per allreduce, all ranks) and `bench ps` (per round, all workers and servers).
    #[arg(long)]
    pub(crate) instructions: bool,
}

/// One side of one `bench transport` rate case (see [`Suite::TransportOne`]).
#[derive(clap::Args, Debug)]
pub(crate) struct TransportOneArgs {
    /// `ours` or `baseline` (raw libzmq; a bare crossbeam channel for `local`).
    #[arg(long)]
    pub(crate) side: String,
    /// `local`, `inproc` or `tcp`.
    #[arg(long)]
    pub(crate) transport: String,
    /// Payload bytes per message.
    #[arg(long)]
    pub(crate) size: usize,
    /// Messages.
    #[arg(long)]
    pub(crate) count: usize,
}

/// One side of `bench mpi --instructions` (see [`Suite::MpiOne`]).
#[derive(clap::Args, Debug)]
pub(crate) struct MpiOneArgs {
    /// `ours` or `baseline` (raw MPI_Send/MPI_Recv to this rank itself).
    #[arg(long)]
    pub(crate) side: String,
    /// Messages (half as many round trips).
    #[arg(long)]
    pub(crate) count: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 64)]
    pub(crate) size: usize,
}

/// One side of `bench ps --instructions` (see [`Suite::PsOne`]).
#[derive(clap::Args, Debug)]
pub(crate) struct PsOneArgs {
    /// `push_pull` (the data plane through shared memory), `push_pull-tcp` (the data
    /// plane over TCP), `push_pull-zmq` (values over ZeroMQ), `push+pull` (push then
    /// pull) or `allreduce` / `allreduce-shm` (a 4-rank mesh over TCP or shared memory);
    /// `node`: one process of a job of several, its role from ps-lite's variables.
    #[arg(long)]
    pub(crate) side: String,
    /// Bytes per value (1 KiB: 32 keys per request; 1 MiB: one key).
    #[arg(long)]
    pub(crate) size: usize,
    /// Rounds (each worker's one request of each kind, or one allreduce per rank).
    #[arg(long)]
    pub(crate) count: usize,
}

impl Common {
    /// Refuses `--instructions` in a suite that does not count them.
    pub(crate) fn times_only(&self, suite: &str) -> Result<(), Box<dyn std::error::Error>> {
        if self.instructions {
            return Err(format!(
                "bench {suite} measures times only; --instructions is implemented for bench transport, mpi, robust and ps"
            )
            .into());
        }
        Ok(())
    }

    /// Whether the case named `case` is selected by `--only`.
    pub(crate) fn selects(&self, case: &str) -> bool {
        self.only.as_deref().is_none_or(|only| case.contains(only))
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum Suite {
    /// Dealer->Router message rate and bandwidth over local, inproc and tcp, 64 B
    /// round-trip latency, and the cost of a stub hop, each beside raw libzmq or a bare
    /// crossbeam channel.
    Transport(Common),
    /// Dealer->Router message rate, round-trip latency and idle CPU over MPI, beside
    /// raw MPI_Send/MPI_Recv in the same job. Starts `mpirun -np 2` itself unless it
    /// already runs under an MPI launcher. Needs the `mpi` feature.
    Mpi(Common),
    /// Allreduce (f32 sum) through the mesh engine beside MPI_Allreduce with MPI's
    /// defaults and restricted to TCP: nccl-tests-style table, JSON rows, an SVG chart
    /// with `--svg PATH`.
    /// Starts the N processes itself (`switchyard launch`, then `mpirun`).
    Allreduce(collective::CollectiveArgs),
    /// Broadcast from rank 0, as `allreduce`.
    Broadcast(collective::CollectiveArgs),
    /// Allgather (size = the gathered total), as `allreduce`.
    Allgather(collective::CollectiveArgs),
    /// Reduce-scatter (size = the whole input; MPI_Reduce_scatter_block), as
    /// `allreduce`.
    ReduceScatter(collective::CollectiveArgs),
    /// Time for the tracker to admit and wire N classic-protocol workers beside
    /// XGBoost 1.7.6's tracker (SWITCHYARD_XGB17_PYTHON), and from `switchyard launch
    /// -n 4` to the first collective.
    Tracker(tracker::TrackerArgs),
    /// Parameter server (4 workers, 2 servers, tcp): keys/s and GB/s of fused
    /// push_pull beside push then pull at 1 KiB and 1 MiB values, and both beside a
    /// bare Dealer/Router exchange of the same bytes.
    Ps(Common),
    /// Robust mode (rabit-style recovery) at 4 ranks: allreduce beside the plain mesh
    /// at 8 B, 64 KiB and 4 MiB (threads, then processes); how soon survivors notice a SIGKILLed or
    /// SIGSTOPped worker process; how soon a restarted worker loads a checkpoint of
    /// 1, 10, 100 MB and replays the calls since.
    Robust(robust::RobustArgs),
    /// torch.distributed on CPU tensors with the backend "switchyard" beside Gloo:
    /// all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor from 8 B
    /// to 64 MiB and a DDP training step, at n = 2 and 4, launches of both alternated.
    /// Needs `--python PYTHON` with torch and the switchyard package.
    Torch(torch::TorchArgs),
    /// Internal: one worker process of `bench robust`.
    #[command(hide = true)]
    RobustWorker(robust::WorkerArgs),
    /// Internal: one side of one `bench transport` rate case, which
    /// `bench transport --instructions` runs under callgrind.
    #[command(hide = true)]
    TransportOne(TransportOneArgs),
    /// Internal: one side of `bench mpi --instructions`, run under callgrind.
    #[command(hide = true)]
    MpiOne(MpiOneArgs),
    /// Internal: one side of `bench robust --instructions`, run under callgrind.
    #[command(hide = true)]
    RobustOne(robust::RobustOneArgs),
    /// Internal: one side of `bench ps --instructions`, run under callgrind.
    #[command(hide = true)]
    PsOne(PsOneArgs),
}

impl Suite {
    /// Whether this is a worker whose traces the bench reads, stamped in unix
    /// nanoseconds (see [`UnixNanos`]).
    pub(crate) fn stamps_traces(&self) -> bool {
        matches!(self, Suite::RobustWorker(_))
    }
}

pub(crate) use robust::UnixNanos;

pub(crate) fn run(suite: Suite) -> Result<(), Box<dyn std::error::Error>> {
    match suite {
        #[cfg(feature = "zmq")]
        Suite::Transport(common) => transport::run(common),
        #[cfg(feature = "zmq")]
        Suite::TransportOne(args) => transport::run_one(&args),
        #[cfg(not(feature = "zmq"))]
        Suite::TransportOne(_) => Err("bench transport needs the `zmq` feature".into()),
        #[cfg(not(feature = "zmq"))]
        Suite::Transport(_) => Err("bench transport compares against raw libzmq and needs the `zmq` feature; this build has: local".into()),
        #[cfg(feature = "mpi")]
        Suite::Mpi(common) if common.instructions => mpi_instructions::run(&common),
        #[cfg(feature = "mpi")]
        Suite::Mpi(common) => mpi::run(common),
        #[cfg(feature = "mpi")]
        Suite::MpiOne(args) => mpi_instructions::run_one(&args),
        #[cfg(not(feature = "mpi"))]
        Suite::MpiOne(_) => Err("bench mpi needs the `mpi` feature".into()),
        #[cfg(not(feature = "mpi"))]
        Suite::Mpi(_) => Err("bench mpi needs the `mpi` feature: cargo build --release --features mpi".into()),
        Suite::Allreduce(args) => collective::run(collective::Op::Allreduce, args),
        Suite::Broadcast(args) => collective::run(collective::Op::Broadcast, args),
        Suite::Allgather(args) => collective::run(collective::Op::Allgather, args),
        Suite::ReduceScatter(args) => collective::run(collective::Op::ReduceScatter, args),
        Suite::Tracker(args) => tracker::run(args),
        #[cfg(feature = "zmq")]
        Suite::Ps(common) => ps::run(common),
        #[cfg(not(feature = "zmq"))]
        Suite::Ps(_) => Err("bench ps runs over tcp and needs the `zmq` feature".into()),
        Suite::Robust(args) => robust::run(args),
        Suite::Torch(args) => torch::run(args),
        Suite::RobustOne(args) => robust::run_one(&args),
        #[cfg(feature = "zmq")]
        Suite::PsOne(args) => ps::run_one(&args),
        #[cfg(not(feature = "zmq"))]
        Suite::PsOne(_) => Err("bench ps runs over tcp and needs the `zmq` feature".into()),
        Suite::RobustWorker(args) => robust::worker(args),
    }
}

/// Runs `ours` and `baseline` alternately `reps` times and returns both medians, so
/// that a slow spell on a shared machine hits both sides alike.
pub(crate) fn paired(
    reps: usize,
    mut ours: impl FnMut() -> Result<f64, Box<dyn std::error::Error>>,
    mut baseline: impl FnMut() -> Result<f64, Box<dyn std::error::Error>>,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        a.push(ours()?);
        b.push(baseline()?);
    }
    Ok((median(a), median(b)))
}

/// The median of a non-empty list (the lower middle for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values
        .get((values.len().max(1) - 1) / 2)
        .copied()
        .unwrap_or(f64::NAN)
}
