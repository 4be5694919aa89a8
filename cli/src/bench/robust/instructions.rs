//! `switchyard bench robust --instructions`: instructions per allreduce in robust
//! mode beside the plain mesh, counted by callgrind (see `bench::instructions`).
//!
//! Each side runs in a process of its own: 4 ranks as threads joined through an
//! in-process tracker, as `allreduce_overhead` does, making the same f32 Sum
//! allreduces (robust mode checkpointing an empty model once per block, as there).
//! Waits do not spin (`CommOptions::spin` zero): under valgrind the threads run one
//! at a time, and a spinning rank would count the time it waits for the others
//! rather than the work of a call. A wait then costs a `poll(2)` and a wake-up, the
//! same few thousand instructions on both sides. The count is every thread's: all
//! 4 ranks' work per call, robust mode's bookkeeping, copies and agreement included.

use super::super::instructions;
use super::super::report::header;
use super::{RANKS, STEP_LIMIT, SUITE, overhead_plan};
use crate::bench::Common;
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions, TrackerJoin};
use switchyard_tracker::{Tracker, TrackerConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One side of `bench robust --instructions` (see `Suite::RobustOne`).
#[derive(clap::Args, Debug)]
pub(crate) struct RobustOneArgs {
    /// `robust` or `plain` (the plain mesh through the same kind of tracker).
    #[arg(long)]
    pub(crate) side: String,
    /// Bytes per allreduce (f32 values).
    #[arg(long)]
    pub(crate) size: usize,
    /// Allreduces per rank.
    #[arg(long)]
    pub(crate) count: usize,
    /// Calls between robust mode's checkpoints (of an empty model).
    #[arg(long)]
    pub(crate) block: usize,
}

/// One side, once: `count` allreduces of `size` bytes on each of the 4 ranks.
pub(crate) fn run_one(args: &RobustOneArgs) -> Result<()> {
    let robust = match args.side.as_str() {
        "robust" => true,
        "plain" => false,
        other => return Err(format!("unknown side {other:?} (robust, plain)").into()),
    };
    let tracker = Tracker::start(TrackerConfig::new(RANKS as u32))?;
    let port = tracker.addr().port();
    let (size, count, block) = (args.size, args.count, args.block.max(1));
    let ranks: Vec<_> = (0..RANKS)
        .map(|i| {
            std::thread::spawn(move || {
                rank(i, port, robust, size, count, block).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut failed = None;
    for r in ranks {
        if let Err(e) = r.join().map_err(|_| "a rank thread panicked")? {
            failed = failed.or(Some(e));
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    tracker.wait(Some(STEP_LIMIT))?;
    Ok(())
}

fn rank(i: usize, port: u16, robust: bool, size: usize, count: usize, block: usize) -> Result<()> {
    let mut options = CommOptions::default()
        .with_timeout(STEP_LIMIT)
        .with_spin(Duration::ZERO);
    if robust {
        options = options.with_robust(RobustOptions::from_env()?);
    }
    let join = TrackerJoin::new("127.0.0.1", port).with_task_id(format!("t{i}"));
    let mut comm = Communicator::join(&Bootstrap::tracker(join), options)?;
    if robust {
        comm.load_checkpoint()?;
    }
    let mut buf = vec![1.0f32; size / 4];
    for call in 0..count {
        if robust && call % block == 0 {
            comm.checkpoint(&[], None)?;
        }
        comm.allreduce(&mut buf, ReduceOp::Sum)?;
        // As the timed bench: sums of ones grow x4 per call; keep them finite.
        buf.fill(1.0);
    }
    comm.finalize()?;
    Ok(())
}

/// `--instructions`: one row per size of `allreduce_overhead`.
pub(crate) fn run(common: &Common) -> Result<()> {
    if !common.json {
        println!(
            "switchyard bench robust --instructions: instructions per allreduce, all {RANKS} ranks \
             (threads of one process; callgrind; waits do not spin)"
        );
        header();
    }
    let (sizes, _, _) = overhead_plan(true, false);
    for size in sizes {
        if !common.selects(&format!("allreduce_overhead/{}", size.bytes)) {
            continue;
        }
        // One checkpoint per block of the quick timed bench's length; the shorter run
        // is one block (two in a full run), the longer three times as many.
        let counts = instructions::unit_counts(size.iters, common.quick);
        let args = [
            "--size".to_string(),
            size.bytes.to_string(),
            "--block".into(),
            size.iters.to_string(),
        ];
        let (ours, base) =
            instructions::named_sides("robust-one", ["robust", "plain"], &args, counts)?;
        instructions::unit_row(
            SUITE,
            "allreduce_overhead",
            size.bytes as u64,
            "call",
            ours,
            base,
            "plain mesh (from_tracker)",
        )
        .emit(common.json);
    }
    Ok(())
}
