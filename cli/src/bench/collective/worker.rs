//! One rank of a measuring job: the timing loop every engine shares, the mesh's calls,
//! and the baseline's (MPI's own collectives on `MPI_COMM_WORLD`).

use super::{Engine, Op, Result};
use crate::bench::report::human_size;
use crate::bench::{Common, median};
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp};

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![8, 4 << 10, 256 << 10, 4 << 20, 64 << 20]
    } else {
        vec![
            8,
            64,
            512,
            4 << 10,
            32 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
        ]
    }
}

/// Calls per repetition: enough for about 64 MiB of traffic, between 3 and 1000.
fn iterations(size: usize, quick: bool) -> usize {
    let n = ((64usize << 20) / size.max(1)).clamp(3, 1000);
    if quick { (n / 4).max(2) } else { n }
}

fn repetitions(quick: bool) -> usize {
    if quick { 3 } else { 7 }
}

/// The sizes `common` selects, each with its calls per repetition and repetitions,
/// as the Python worker (`python -m switchyard._bench --plan`) reads them:
/// `size:iters:reps,...`.
pub(super) fn plan(common: &Common) -> String {
    let quick = common.quick;
    sizes(quick)
        .into_iter()
        .filter(|&size| common.selects(&human_size(size as u64)))
        .map(|size| format!("{size}:{}:{}", iterations(size, quick), repetitions(quick)))
        .collect::<Vec<_>>()
        .join(",")
}

/// One collective call of `size` bytes (f32 elements) on `comm`.
fn call(comm: &mut Communicator, op: Op, buf: &mut [f32], out: &mut [f32]) -> Result<()> {
    match op {
        Op::Allreduce => comm.allreduce(buf, ReduceOp::Sum)?,
        Op::Broadcast => comm.broadcast(buf, 0)?,
        Op::Allgather => {
            let n = comm.world_size();
            let part = buf.len() / n;
            comm.allgather(&buf[..part], &mut out[..part * n])?
        }
        Op::ReduceScatter => {
            comm.reduce_scatter(buf, ReduceOp::Sum)?;
        }
    }
    Ok(())
}

/// One rank of a measuring job: times every size, and rank 0 writes
/// `size seconds` lines (the slowest rank's median per call) to `out`.
/// `checked` runs the mesh in checked mode ([`CommOptions::check`]).
pub(super) fn work(
    op: Op,
    engine: Engine,
    common: &Common,
    out: &Path,
    checked: bool,
) -> Result<()> {
    match engine {
        Engine::Mesh => {
            let mut options = CommOptions::from_env()?.with_timeout(Duration::from_secs(120));
            if checked {
                options = options.with_check(true);
            }
            // Started by the bench's launch: the environment always names the job.
            let boot = Bootstrap::from_env()?.unwrap_or_else(Bootstrap::solo);
            let mut comm = Communicator::join(&boot, options)?;
            let rank = comm.rank();
            let n = comm.world_size();
            measure(common, rank, n, out, &mut |kind, buf, out_buf| match kind {
                Step::Call => call(&mut comm, op, buf, out_buf),
                Step::Barrier => Ok(comm.barrier()?),
                Step::Max => Ok(comm.allreduce(&mut buf[..1], ReduceOp::Max)?),
            })
        }
        #[cfg(feature = "mpi")]
        Engine::Mpi => raw_mpi::work(op, common, out),
        #[cfg(not(feature = "mpi"))]
        Engine::Mpi => Err("this build has no MPI: build with --features mpi".into()),
    }
}

/// What the timing loop asks of an engine.
#[derive(Clone, Copy)]
enum Step {
    /// One call of the measured collective.
    Call,
    /// A barrier before each repetition.
    Barrier,
    /// Replace `buf[0]` by its maximum over the ranks.
    Max,
}

type Engage<'a> = dyn FnMut(Step, &mut [f32], &mut [f32]) -> Result<()> + 'a;

/// Times every selected size on one rank; rank 0 writes `size seconds` lines (the
/// slowest rank's median time per call) to `out`.
fn measure(
    common: &Common,
    rank: usize,
    n: usize,
    out: &Path,
    engine: &mut Engage<'_>,
) -> Result<()> {
    let quick = common.quick;
    let mut lines = String::new();
    for size in sizes(quick) {
        if !common.selects(&human_size(size as u64)) {
            continue;
        }
        // A multiple of n elements, so that allgather's parts are equal.
        let elements = (size / 4).max(1).div_ceil(n) * n;
        let mut buf = vec![1.0f32; elements];
        let mut out_buf = vec![0.0f32; elements];
        let iters = iterations(size, quick);
        for _ in 0..2.min(iters) {
            engine(Step::Call, &mut buf, &mut out_buf)?;
        }
        let mut times = Vec::new();
        for _ in 0..repetitions(quick) {
            engine(Step::Barrier, &mut buf, &mut out_buf)?;
            let started = Instant::now();
            for _ in 0..iters {
                engine(Step::Call, &mut buf, &mut out_buf)?;
            }
            let mut per_call = [(started.elapsed().as_secs_f64() / iters as f64) as f32];
            engine(Step::Max, &mut per_call, &mut out_buf)?;
            times.push(f64::from(per_call[0]));
        }
        lines.push_str(&format!("{size} {}\n", median(times)));
    }
    if rank == 0 {
        std::fs::write(out, lines)?;
    }
    Ok(())
}

/// The baseline: MPI's own collectives called straight from the main thread on
/// `MPI_COMM_WORLD`, as an MPI program would (no switchyard code on the path).
#[cfg(feature = "mpi")]
mod raw_mpi {
    use super::{Common, Op, Result, Step, measure};
    use mpi::collective::SystemOperation;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use std::path::Path;

    pub(super) fn work(op: Op, common: &Common, out: &Path) -> Result<()> {
        // MPI started here, on this thread, by rsmpi: no switchyard progress thread
        // polls beside the baseline.
        let universe = mpi::initialize().ok_or("MPI was already initialised")?;
        let comm: SimpleCommunicator = universe.world();
        let n = comm.size() as usize;
        let mut scratch = Vec::new();
        measure(
            common,
            comm.rank() as usize,
            n,
            out,
            &mut |step, buf, out_buf| {
                match step {
                    Step::Barrier => comm.barrier(),
                    Step::Max => {
                        let mine = [buf[0]];
                        comm.all_reduce_into(&mine[..], &mut buf[..1], SystemOperation::max());
                    }
                    Step::Call => match op {
                        Op::Allreduce => {
                            scratch.resize(buf.len(), 0.0f32);
                            comm.all_reduce_into(
                                &buf[..],
                                &mut scratch[..],
                                SystemOperation::sum(),
                            );
                        }
                        Op::Broadcast => comm.process_at_rank(0).broadcast_into(&mut buf[..]),
                        Op::Allgather => {
                            let part = buf.len() / n;
                            comm.all_gather_into(&buf[..part], &mut out_buf[..part * n]);
                        }
                        Op::ReduceScatter => {
                            let part = buf.len() / n;
                            comm.reduce_scatter_block_into(
                                &buf[..],
                                &mut out_buf[..part],
                                SystemOperation::sum(),
                            );
                        }
                    },
                }
                Ok(())
            },
        )
    }
}
