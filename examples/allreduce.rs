//! Data-parallel training in miniature: every process computes a "gradient" for its
//! shard, the ranks average it with `allreduce`, rank 0 broadcasts a config, and every
//! rank checks the closed form.
//!
//! ```text
//! cargo run --release --example allreduce            # starts 4 processes itself
//! cargo run --release --example allreduce -- 7       # or 7
//! switchyard launch -n 3 -- target/release/examples/allreduce
//! mpirun -np 3 target/release/examples/allreduce     # built with --features mpi
//! ```

use std::process::ExitCode;
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{Communicator, ReduceOp};
use switchyard_launch::{LaunchOptions, run_local};

type Error = Box<dyn std::error::Error>;

/// Parameters in the model: 1 Mi floats (4 MiB), so that the ring carries them.
const PARAMS: usize = 1 << 20;
const STEPS: usize = 5;

/// Rank `rank`'s gradient at `step`: integers, so that every summation order agrees.
fn gradient(rank: usize, step: usize, i: usize) -> f32 {
    ((rank + 1) * (step + 1) + i % 7) as f32
}

fn train(comm: &mut Communicator) -> Result<(), Error> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut config = if rank == 0 {
        format!("lr=0.5 steps={STEPS}")
    } else {
        String::new()
    };
    comm.broadcast_value(&mut config, 0)?;
    assert_eq!(config, format!("lr=0.5 steps={STEPS}"));
    let mut weights = vec![0.0f32; PARAMS];
    let mut grad = vec![0.0f32; PARAMS];
    for step in 0..STEPS {
        for (i, g) in grad.iter_mut().enumerate() {
            *g = gradient(rank, step, i);
        }
        comm.allreduce(&mut grad, ReduceOp::Sum)?;
        for (w, g) in weights.iter_mut().zip(&grad) {
            *w -= 0.5 * g / n as f32;
        }
        let mut loss = [rank as f64];
        comm.allreduce(&mut loss, ReduceOp::Max)?;
        assert_eq!(loss[0], (n - 1) as f64);
    }
    // Closed form: sum over steps and ranks of 0.5 * gradient / n.
    for (i, w) in weights.iter().enumerate().step_by(997) {
        let sum: f32 = (0..STEPS)
            .map(|s| (0..n).map(|r| gradient(r, s, i)).sum::<f32>())
            .map(|g| 0.5 * g / n as f32)
            .sum();
        if (w + sum).abs() > 1e-3 * sum.abs().max(1.0) {
            return Err(format!("rank {rank}: weight {i} is {w}, expected {}", -sum).into());
        }
    }
    let host = comm.processor_name().to_string();
    let hosts = comm.allgather_varied(host.as_bytes())?;
    comm.barrier()?;
    println!(
        "rank {rank} of {n}: {STEPS} steps of {PARAMS} floats match the closed form (hosts: {})",
        hosts
            .iter()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

fn main() -> ExitCode {
    let result: Result<(), Error> = match Bootstrap::from_env() {
        Ok(Some(_)) => Communicator::from_env()
            .map_err(Error::from)
            .and_then(|mut c| train(&mut c)),
        Ok(None) => (|| {
            let processes: u32 = match std::env::args().nth(1) {
                Some(n) => n.parse().map_err(|_| format!("not a process count: {n}"))?,
                None => 4,
            };
            let program = std::env::current_exe()?.to_string_lossy().into_owned();
            let options =
                LaunchOptions::new(processes, program).with_timeout(Duration::from_secs(300));
            run_local(&options)?;
            println!("allreduce: every rank matched the closed form");
            Ok(())
        })(),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}
