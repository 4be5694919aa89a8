//! Allreduces in a loop until one fails, then exits through `?` in `main`: the
//! program the fault tests stop and kill (`cli/tests/it/collective_faults.rs`), and a
//! way to watch the collectives' two clocks by hand.
//!
//! ```text
//! SWITCHYARD_COLLECTIVE_TIMEOUT=1 switchyard launch -n 4 -- target/release/examples/fault_drill
//! kill -STOP <pid of one rank>     # every other rank names it about 1 s later
//! ```
//!
//! `DRILL_ELEMS` sets the f32s per allreduce (default 262144, 1 MiB), `DRILL_SECONDS`
//! how long to loop before leaving successfully (default 60), and `DRILL_ODD_RANK`
//! a rank that passes one element more from its fifth call on (a programming error
//! the others must hear about, not a lost connection).

use std::io::Write;
use std::time::{Duration, Instant};
use switchyard::collective::{Communicator, ReduceOp};

type Error = Box<dyn std::error::Error>;

/// The number in environment variable `var`, or `default`.
fn setting(var: &str, default: u64) -> Result<u64, Error> {
    match std::env::var(var) {
        Ok(v) => Ok(v
            .trim()
            .parse()
            .map_err(|_| format!("{var}={v}: not a number"))?),
        Err(_) => Ok(default),
    }
}

fn main() -> Result<(), Error> {
    let elems = usize::try_from(setting("DRILL_ELEMS", 1 << 18)?)?;
    let limit = Duration::from_secs(setting("DRILL_SECONDS", 60)?);
    let mut comm = Communicator::from_env()?;
    let rank = comm.rank();
    let odd = setting("DRILL_ODD_RANK", u64::MAX)?;
    let mut buf = vec![1.0f32; elems];
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < limit {
        if let Err(e) = comm.allreduce(&mut buf, ReduceOp::Max) {
            eprintln!("rank {rank} failed after {calls} calls: {e}");
            return Err(e.into());
        }
        calls += 1;
        if calls == 4 && odd == rank as u64 {
            buf.push(1.0);
        }
        if calls == 3 {
            // The fault tests wait for this line from every rank before they strike.
            println!("ready");
            std::io::stdout().flush()?;
        }
    }
    println!("rank {rank}: {calls} calls");
    Ok(())
}
