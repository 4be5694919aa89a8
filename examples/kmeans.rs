//! rabit's k-means (rabit-learn / wormhole) in switchyard's robust mode: each rank
//! holds a shard of a synthetic data set, every iteration assigns its points to the
//! nearest centroid and sums them with one lazy allreduce, and the new centroids are
//! checkpointed. A worker killed in the middle is restarted by the launcher, loads
//! the last checkpoint from a survivor, gets the results it missed from survivors
//! (without recomputing them), and the job prints the same final centroids as a run
//! without the kill:
//!
//! ```text
//! cargo build --release --example kmeans
//! switchyard launch -n 4 -- target/release/examples/kmeans
//! switchyard launch -n 4 --max-restarts 1 -- target/release/examples/kmeans mock=1,3,1,0
//! ```
//!
//! or both at once, comparing the centroids:
//!
//! ```text
//! diff <(switchyard launch -n 4 -- target/release/examples/kmeans 2>/dev/null | grep '] centroid ') \
//!      <(switchyard launch -n 4 --max-restarts 1 -- target/release/examples/kmeans mock=1,3,1,0 \
//!          2>/dev/null | grep '] centroid ') && echo same centroids
//! ```
//!
//! `mock=1,3,1,0` makes rank 1 exit (status 254) on its first start when it enters
//! call 1 after checkpoint 3: the checkpoint of iteration 3, right after that
//! iteration's allreduce. Its second start resumes from checkpoint 3 and takes the
//! allreduce's result from a survivor, so its line says `prepare_calls` one lower
//! than a rank that ran from the start of iteration 3 would.
//!
//! Arguments: `--k K` clusters (4), `--dim D` (8), `--points P` per rank (5000),
//! `--iters N` (10), `--seed S` (7), and rabit's `mock=rank,version,seq,ndeath`.
//! Every rank prints `FINAL rank=R centroids=<FNV-1a of the centroids' bytes>
//! prepare_calls=K attempt=A`; rank 0 also prints the centroids.
//!
//! Calls per version: version 0 opens with `K` broadcasts (centroid `j` from rank
//! `j mod n`, rabit's initialisation) before iteration 0's allreduce; every iteration
//! is one `allreduce_lazy` (the sums and counts) then the checkpoint.

use std::process::ExitCode;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions};

type Error = Box<dyn std::error::Error>;

#[derive(Debug, Clone, Copy)]
struct Args {
    k: usize,
    dim: usize,
    points: usize,
    iters: u64,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        k: 4,
        dim: 8,
        points: 5000,
        iters: 10,
        seed: 7,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg.contains('=') && !arg.starts_with('-') {
            continue; // mock=... and the like: RobustOptions reads them.
        }
        let v = it.next().ok_or(format!("{arg} needs a value"))?;
        let v: u64 = v
            .parse()
            .map_err(|_| format!("{arg} {v:?} is not a number"))?;
        let size = || usize::try_from(v).map_err(|e| e.to_string());
        match arg.as_str() {
            "--k" => args.k = size()?,
            "--dim" => args.dim = size()?,
            "--points" => args.points = size()?,
            "--iters" => args.iters = v,
            "--seed" => args.seed = v,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.k == 0 || args.dim == 0 || args.points == 0 {
        return Err("--k, --dim and --points must be positive".into());
    }
    Ok(args)
}

/// splitmix64: a seeded generator with no dependency, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Rank `rank`'s shard: points around `k` true centres (the same on every rank),
/// each centre's coordinates in [-10, 10), the noise in [-2, 2).
fn shard(args: &Args, rank: usize) -> Vec<f64> {
    let mut centres = Rng(args.seed);
    let truth: Vec<f64> = (0..args.k * args.dim)
        .map(|_| centres.unit() * 20.0 - 10.0)
        .collect();
    let mut rng = Rng(args.seed ^ (rank as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let mut points = Vec::with_capacity(args.points * args.dim);
    for _ in 0..args.points {
        let c = (rng.next() % args.k as u64) as usize;
        for d in 0..args.dim {
            points.push(truth[c * args.dim + d] + rng.unit() * 4.0 - 2.0);
        }
    }
    points
}

fn nearest(point: &[f64], centroids: &[f64], dim: usize) -> usize {
    let mut best = (f64::INFINITY, 0);
    for (j, c) in centroids.chunks_exact(dim).enumerate() {
        let d: f64 = point.iter().zip(c).map(|(a, b)| (a - b) * (a - b)).sum();
        if d < best.0 {
            best = (d, j);
        }
    }
    best.1
}

fn encode(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn run(args: Args) -> Result<(), Error> {
    let robust = RobustOptions::from_env()?
        .with_args(std::env::args().skip(1).filter(|a| a.contains('=')))?;
    // Under `switchyard launch`: robust mode joins the tracker it serves.
    let boot = Bootstrap::from_env()?.unwrap_or_else(Bootstrap::solo);
    let mut comm = Communicator::join(&boot, CommOptions::from_env()?.with_robust(robust))?;
    let (rank, n) = (comm.rank(), comm.world_size());
    let attempt = std::env::var("DMLC_NUM_ATTEMPT").unwrap_or_else(|_| "0".into());
    let (k, dim) = (args.k, args.dim);
    let points = shard(&args, rank);

    let mut centroids = match comm.load_checkpoint()? {
        Some(c) => {
            if c.global.len() != k * dim * 8 {
                return Err(format!(
                    "rank {rank}: checkpoint {} has {} bytes, expected {}",
                    c.version,
                    c.global.len(),
                    k * dim * 8
                )
                .into());
            }
            c.global
                .chunks_exact(8)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    f64::from_le_bytes(a)
                })
                .collect()
        }
        None => {
            // rabit's initialisation: centroid j is a point of rank j mod n's shard,
            // broadcast by that rank.
            let mut centroids = vec![0.0f64; k * dim];
            for (j, c) in centroids.chunks_exact_mut(dim).enumerate() {
                let root = j % n;
                if rank == root {
                    let p = (j / n) % args.points;
                    c.copy_from_slice(&points[p * dim..(p + 1) * dim]);
                }
                comm.broadcast(c, root)?;
            }
            centroids
        }
    };

    let mut prepare_calls = 0u64;
    for _ in comm.version_number()..args.iters {
        // Per cluster: the sum of its points' coordinates, then their count.
        let mut stats = vec![0.0f64; k * (dim + 1)];
        comm.allreduce_lazy(&mut stats, ReduceOp::Sum, |stats| {
            prepare_calls += 1;
            for p in points.chunks_exact(dim) {
                let j = nearest(p, &centroids, dim);
                let row = &mut stats[j * (dim + 1)..(j + 1) * (dim + 1)];
                for (s, x) in row.iter_mut().zip(p) {
                    *s += x;
                }
                row[dim] += 1.0;
            }
        })?;
        for (c, row) in centroids
            .chunks_exact_mut(dim)
            .zip(stats.chunks_exact(dim + 1))
        {
            // An empty cluster keeps its centroid.
            if row[dim] > 0.0 {
                for (x, s) in c.iter_mut().zip(row) {
                    *x = s / row[dim];
                }
            }
        }
        comm.checkpoint(&encode(&centroids), None)?;
    }

    if rank == 0 {
        for (j, c) in centroids.chunks_exact(dim).enumerate() {
            let coords: Vec<String> = c.iter().map(|x| format!("{x:.6}")).collect();
            println!("centroid {j}: {}", coords.join(" "));
        }
    }
    println!(
        "FINAL rank={rank} centroids={:016x} prepare_calls={prepare_calls} attempt={attempt}",
        fnv(&encode(&centroids))
    );
    comm.finalize()?;
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("kmeans: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kmeans: {e}");
            ExitCode::FAILURE
        }
    }
}
