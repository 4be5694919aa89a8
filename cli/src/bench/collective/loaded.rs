//! `bench allreduce`'s loaded rows (case `nN-loaded`): the same jobs while a load
//! generator keeps every core of this host busy, as a laptop running a build or a
//! data loader beside the job does.
//!
//! Three jobs run under the same load, one after the other: the mesh as users get
//! it (`ours`), MPI's shared memory, and the mesh with its waits spinning only 50 us
//! before they sleep (`SWITCHYARD_SPIN_US=50`; the mesh chooses 1 ms when its ranks
//! fit the host's cores, whatever other work shares them), both as baselines.

use super::{Mesh, Op, Result, Series, run_mesh, run_mpi};
use crate::bench::Row;
use crate::bench::report::human_size;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// One busy thread per core of this host while it lives.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl Load {
    fn start() -> Load {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    // Arithmetic the optimiser cannot drop, checked against the flag
                    // now and then.
                    let mut x = 0x9e37_79b9_7f4a_7c15u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = x.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d);
                        }
                    }
                    x
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = std::hint::black_box(t.join());
        }
    }
}

/// The loaded jobs' times: the mesh, and its baselines.
pub(super) struct Loaded {
    mesh: Series,
    baselines: Vec<Series>,
}

/// Runs the loaded jobs (`with_mpi`: MPI's too) with `n` ranks.
pub(super) fn run(
    op: Op,
    n: usize,
    common: &crate::bench::Common,
    with_mpi: bool,
    scratch: &Path,
) -> Result<Loaded> {
    let _load = Load::start();
    let mesh = Series {
        name: "mesh loaded",
        times: run_mesh(op, n, common, &scratch.join("loaded"), Mesh::Default)?,
    };
    let mut baselines = Vec::new();
    if with_mpi {
        baselines.push(Series {
            name: "MPI shm loaded",
            times: run_mpi(op, n, common, false, &scratch.join("loaded-mpi"))?,
        });
    }
    baselines.push(Series {
        name: "mesh 50 us spin loaded",
        times: run_mesh(op, n, common, &scratch.join("loaded-50us"), Mesh::ShortSpin)?,
    });
    Ok(Loaded { mesh, baselines })
}

/// Prints the loaded rows: JSON rows of case `nN-loaded`, or a table of their own.
pub(super) fn report(suite: &str, n: usize, json: bool, loaded: &Loaded) {
    let case = format!("n{n}-loaded");
    if !json {
        println!("# {suite}, {n} processes, every core also busy with a load generator");
        print!("{:>9} | {:>12}", "size", "mesh us");
        for base in &loaded.baselines {
            print!(" | {:>28}", format!("{} us", base.name));
        }
        println!();
    }
    for (&size, &ours) in &loaded.mesh.times {
        if json {
            for base in &loaded.baselines {
                if let Some(&theirs) = base.times.get(&size) {
                    let baseline = format!("{} {suite}", base.name);
                    Row::lower_better(
                        suite,
                        &case,
                        size as u64,
                        "time_us",
                        ours * 1e6,
                        theirs * 1e6,
                        &baseline,
                    )
                    .emit(true);
                }
            }
        } else {
            print!("{:>9} | {:>12.1}", human_size(size as u64), ours * 1e6);
            for base in &loaded.baselines {
                match base.times.get(&size) {
                    Some(&t) => print!(" | {:>28.1}", t * 1e6),
                    None => print!(" | {:>28}", "-"),
                }
            }
            println!();
        }
    }
}
