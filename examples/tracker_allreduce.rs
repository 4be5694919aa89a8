//! A switchyard worker under a rabit/XGBoost tracker: the tracker assigns the rank,
//! the communicator forms its mesh over the tracker's ring, and every rank checks an
//! allreduce and a broadcast against their closed forms, reports to the tracker's log,
//! and finalizes (the tracker ends the job after every rank's `shutdown`).
//!
//! ```text
//! switchyard tracker -n 3 &                     # prints DMLC_TRACKER_URI=… DMLC_TRACKER_PORT=…
//! for i in 0 1 2; do
//!   DMLC_TRACKER_URI=127.0.0.1 DMLC_TRACKER_PORT=<port> DMLC_TASK_ID=$i \
//!     target/debug/examples/tracker_allreduce &
//! done; wait
//! ```
//!
//! The same under XGBoost 1.7's `python -m xgboost.tracker --num-workers 3`, or
//! XGBoost ≥ 2.1's `RabitTracker` with `SWITCHYARD_TRACKER_PROTOCOL=json`.

use std::process::ExitCode;
use switchyard::collective::{Communicator, ReduceOp};

type Error = Box<dyn std::error::Error>;

fn run() -> Result<(), Error> {
    let mut comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.world_size());
    // 100 000 elements: large enough for the ring allreduce.
    let mut ones = vec![1.0f32; 100_000];
    comm.allreduce(&mut ones, ReduceOp::Sum)?;
    if ones.iter().any(|&x| x != n as f32) {
        return Err(format!("rank {rank}: allreduce of ones is not {n}").into());
    }
    let mut ranks = [rank as u64];
    comm.allreduce(&mut ranks, ReduceOp::Sum)?;
    let expected = (n * (n - 1) / 2) as u64;
    if ranks[0] != expected {
        return Err(format!("rank {rank}: sum of ranks {} != {expected}", ranks[0]).into());
    }
    let mut model = if rank == 0 {
        b"model v1".to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(&mut model, 0)?;
    if model != b"model v1" {
        return Err(format!("rank {rank}: broadcast delivered {model:?}").into());
    }
    comm.tracker_print(&format!("rank {rank}/{n}: allreduce and broadcast ok"))?;
    comm.finalize()?;
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tracker_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}
