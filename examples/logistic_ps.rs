//! Logistic regression on a parameter server: 2 server processes, 4 worker processes
//! and a scheduler, training on a synthetic, linearly separable data set.
//!
//! Every worker makes its own shard of the data (points in `[-1, 1]^64` labelled by
//! the side of a hidden hyperplane they fall on, with a margin), computes the
//! gradient of the mean logistic loss on it, and `push_pull`s it; the servers add the
//! four gradients of each round and take an SGD step on their half of the weights.
//! The weights live under 8 keys of 8 floats, so each server holds 4 of them; a ninth
//! key carries each round's loss and accuracy counts, summed by the same servers.
//! Worker 0 prints the loss, which falls round after round, and the final accuracy on
//! held-out points; the program exits non-zero if that accuracy is under 90%.
//!
//! One command starts everything (the parent process runs the scheduler and starts
//! the six others with ps-lite's environment):
//!
//! ```text
//! cargo run --release --example logistic_ps
//! cargo run --release --example logistic_ps -- --rounds 50 --rate 2 --pause-ms 100
//! ```
//!
//! Each role can also be started by hand or by a launcher, with `DMLC_ROLE`
//! (`scheduler`, `server`, `worker`), `DMLC_NUM_WORKER=4`, `DMLC_NUM_SERVER=2`,
//! `DMLC_PS_ROOT_URI` and `DMLC_PS_ROOT_PORT` (the scheduler's address).

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};
use switchyard::ps::{
    KvServer, KvWorker, Mode, PsConfig, PsEnv, PsError, PsRole, Scheduler, Sharding, Update,
};

const FEATURES: usize = 64;
const KEYS: u64 = 8;
const PER_KEY: usize = FEATURES / KEYS as usize;
/// The key of the per-round metrics: loss sum, points, correct predictions.
const METRICS: u64 = KEYS;
const TRAIN_PER_WORKER: usize = 2000;
const TEST_PER_WORKER: usize = 500;
const THRESHOLD: f32 = 0.90;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug)]
struct Args {
    rounds: u32,
    rate: f64,
    /// Sleep per round, standing in for a heavier model's compute (the failure
    /// tests use it to kill a server mid-run).
    pause: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        rounds: 30,
        rate: 4.0,
        pause: Duration::ZERO,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => {
                args.rounds = value
                    .parse()
                    .map_err(|_| format!("--rounds {value}: not a number"))?
            }
            "--rate" => {
                args.rate = value
                    .parse()
                    .map_err(|_| format!("--rate {value}: not a number"))?
            }
            "--pause-ms" => {
                let ms = value
                    .parse()
                    .map_err(|_| format!("--pause-ms {value}: not a number"))?;
                args.pause = Duration::from_millis(ms);
            }
            _ => {
                return Err(format!(
                    "unknown flag {flag}; flags: --rounds N --rate R --pause-ms MS"
                ));
            }
        }
    }
    Ok(args)
}

/// A small deterministic generator (xorshift64*), so every run sees the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
        bits as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// The hidden hyperplane every worker labels its points by.
fn hidden_weights() -> Vec<f32> {
    let mut rng = Rng(0x5eed);
    (0..FEATURES).map(|_| rng.next()).collect()
}

/// `count` points with labels, at least 0.1 away from the hyperplane.
fn make_points(seed: u64, count: usize) -> Vec<(Vec<f32>, f32)> {
    let truth = hidden_weights();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut points = Vec::with_capacity(count);
    while points.len() < count {
        let x: Vec<f32> = (0..FEATURES).map(|_| rng.next()).collect();
        let margin: f32 = x.iter().zip(&truth).map(|(a, b)| a * b).sum();
        if margin.abs() > 0.1 {
            points.push((x, if margin > 0.0 { 1.0 } else { 0.0 }));
        }
    }
    points
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Gradient of the summed logistic loss, the loss and the correct predictions.
fn evaluate(w: &[f32], points: &[(Vec<f32>, f32)]) -> (Vec<f32>, f32, f32) {
    let mut grad = vec![0.0f32; FEATURES];
    let (mut loss, mut correct) = (0.0f32, 0.0f32);
    for (x, y) in points {
        let p = sigmoid(x.iter().zip(w).map(|(a, b)| a * b).sum());
        loss -= y * p.max(1e-7).ln() + (1.0 - y) * (1.0 - p).max(1e-7).ln();
        correct += f32::from(u8::from((p > 0.5) == (*y > 0.5)));
        grad.iter_mut()
            .zip(x)
            .for_each(|(g, xi)| *g += (p - y) * xi);
    }
    (grad, loss, correct)
}

fn config(workers: usize, servers: usize) -> PsConfig {
    // Keys 0..8 hold the weights, key 8 the metrics: a key space of 9 gives server 0
    // keys 0..5 and server 1 keys 5..9.
    PsConfig::new(workers, servers).with_sharding(Sharding::Range {
        key_space: Some(KEYS + 1),
    })
}

/// SGD on the weights; the metrics key keeps the round's sum as it is.
fn update(rate: f64) -> Update<f32> {
    Update::custom(move |key, stored: &mut [f32], sum: &[f32]| {
        if key == METRICS {
            stored.copy_from_slice(sum);
        } else {
            stored
                .iter_mut()
                .zip(sum)
                .for_each(|(w, g)| *w -= rate as f32 * g);
        }
    })
}

fn worker(env: &PsEnv, args: Args) -> Result<(), Error> {
    let mut ps = KvWorker::<f32>::join(&env.scheduler, &env.config)?;
    let rank = ps.rank() as u64;
    let total_points = (TRAIN_PER_WORKER * ps.num_workers()) as f32;
    let train = make_points(rank * 2 + 1, TRAIN_PER_WORKER);
    let test = make_points(rank * 2 + 2, TEST_PER_WORKER);
    let keys: Vec<u64> = (0..=KEYS).collect();
    let lens: Vec<usize> = (0..=KEYS)
        .map(|k| if k == METRICS { 3 } else { PER_KEY })
        .collect();
    let mut w = vec![0.0f32; FEATURES];
    let mut first_loss = None;
    let mut last_loss = f32::INFINITY;
    for round in 0..args.rounds {
        let (grad, loss, correct) = evaluate(&w, &train);
        // The mean gradient over every worker's points: each sends its share.
        let mut message: Vec<f32> = grad.iter().map(|g| g / total_points).collect();
        message.extend([loss, TRAIN_PER_WORKER as f32, correct]);
        let answer = ps.push_pull(&keys, &lens, message)?;
        let values = answer.values();
        w.copy_from_slice(&values[..FEATURES]);
        let metrics = &values[FEATURES..];
        let (mean_loss, accuracy) = (metrics[0] / metrics[1], metrics[2] / metrics[1]);
        if rank == 0 {
            println!(
                "round {round:>3}: loss {mean_loss:.4}, training accuracy {:.1}%",
                accuracy * 100.0
            );
        }
        first_loss.get_or_insert(mean_loss);
        std::thread::sleep(args.pause);
        last_loss = mean_loss;
    }
    let (_, _, correct) = evaluate(&w, &test);
    let mut message = vec![0.0f32; FEATURES];
    message.extend([0.0, TEST_PER_WORKER as f32, correct]);
    // One more round with zero gradients: the weights stay, the test counts add up.
    let answer = ps.push_pull(&keys, &lens, message)?;
    let metrics = &answer.values()[FEATURES..];
    let accuracy = metrics[2] / metrics[1];
    ps.finish()?;
    if rank == 0 {
        println!(
            "test accuracy {:.1}% on {} held-out points",
            accuracy * 100.0,
            metrics[1]
        );
    }
    if first_loss.is_some_and(|first| last_loss >= first) {
        return Err(format!(
            "worker {rank}: the loss did not fall ({first_loss:?} -> {last_loss})"
        )
        .into());
    }
    if accuracy < THRESHOLD {
        return Err(
            format!("worker {rank}: test accuracy {accuracy:.3} is under {THRESHOLD}").into(),
        );
    }
    Ok(())
}

fn run_role(env: &PsEnv, args: Args) -> Result<(), Error> {
    match env.role {
        PsRole::Scheduler => {
            let report = Scheduler::bind(&env.scheduler, &env.config)?.run()?;
            eprintln!(
                "scheduler: job done ({} workers, {} servers)",
                report.workers, report.servers
            );
        }
        PsRole::Server => {
            let report =
                KvServer::<f32>::join(&env.scheduler, &env.config, Mode::Sync, update(args.rate))?
                    .run()?;
            // The report counts key rounds: each key this server holds completes one
            // per push_pull round (the training rounds and the test round), so the
            // count is the job's rounds times the keys held, not the job's rounds.
            let job_rounds = u64::from(args.rounds) + 1;
            if report.rounds % job_rounds == 0 {
                eprintln!(
                    "server {}: {} key rounds = {job_rounds} rounds ({} training + 1 test) x {} keys it holds",
                    report.rank,
                    report.rounds,
                    args.rounds,
                    report.rounds / job_rounds
                );
            } else {
                eprintln!(
                    "server {}: {} key rounds (each key it holds counts once per round)",
                    report.rank, report.rounds
                );
            }
        }
        PsRole::Worker => worker(env, args)?,
        other => return Err(format!("DMLC_ROLE: this program has no {other:?} part").into()),
    }
    Ok(())
}

/// Kills the children still running when it goes out of scope.
struct Children(Vec<(String, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs the scheduler here and starts the servers and workers as child processes.
fn run_job(args: Args) -> Result<(), Error> {
    let (workers, servers) = (4usize, 2usize);
    let config = config(workers, servers);
    let scheduler = Scheduler::bind("tcp://127.0.0.1:0", &config)?;
    let endpoint = scheduler.endpoint().to_string();
    let port = endpoint.rsplit(':').next().unwrap_or_default().to_string();
    println!(
        "logistic_ps: {workers} workers, {servers} servers, scheduler at {endpoint}, {} rounds",
        args.rounds
    );
    let program = std::env::current_exe()?;
    let mut children = Children(Vec::new());
    for (role, count) in [("server", servers), ("worker", workers)] {
        for i in 0..count {
            let child = Command::new(&program)
                .args(std::env::args().skip(1))
                .env("DMLC_ROLE", role)
                .env("DMLC_NUM_WORKER", workers.to_string())
                .env("DMLC_NUM_SERVER", servers.to_string())
                .env("DMLC_PS_ROOT_URI", "127.0.0.1")
                .env("DMLC_PS_ROOT_PORT", &port)
                .spawn()?;
            children.0.push((format!("{role} process {i}"), child));
        }
    }
    let started = Instant::now();
    let outcome = scheduler.run();
    let mut failed = Vec::new();
    for (name, child) in &mut children.0 {
        // Every role ends by itself once the scheduler has; give them a moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            match child.try_wait()? {
                Some(status) => break Some(status),
                None if Instant::now() > deadline => break None,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        match status {
            Some(s) if s.success() => {}
            Some(s) => failed.push(format!("{name} exited with {s}")),
            None => failed.push(format!("{name} still running 30 s after the job ended")),
        }
    }
    outcome?;
    if !failed.is_empty() {
        return Err(failed.join("; ").into());
    }
    println!("logistic_ps: done in {:.1?}", started.elapsed());
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("logistic_ps: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match PsEnv::from_env() {
        Ok(Some(mut env)) => {
            env.config.sharding = config(1, 1).sharding;
            run_role(&env, args)
        }
        Ok(None) => run_job(args),
        Err(e) => Err(PsError::into(e)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("logistic_ps: {e}");
            ExitCode::FAILURE
        }
    }
}
