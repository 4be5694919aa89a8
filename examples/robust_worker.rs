//! rabit's recovery test program (`test/model_recover.cc`, `lazy_recover.cc`,
//! `local_recover.cc`) for switchyard's robust mode: every iteration makes the same
//! calls on every rank, checks every result against its closed form, and checkpoints
//! the model, so that a run with workers killed in the middle must end with a model
//! bit-identical to a run without.
//!
//! ```text
//! switchyard launch -n 10 --max-restarts 2 -- target/debug/examples/robust_worker \
//!     --iters 5 --len 10000 mock=0,0,1,0 mock=1,1,1,0 mock=1,1,1,1
//! ```
//!
//! Arguments: `--iters N` (iterations, one checkpoint each), `--len L` (elements per
//! allreduce), `--lazy` (`lazy_checkpoint` instead of `checkpoint`), `--local` (a
//! local model per rank, checkpointed with the global one), `--pause-ms P` (a sleep
//! before each iteration, so that a test killing processes at random times has a run
//! long enough to aim at), `--fail-at R,V` (rank `R`'s first process returns an
//! error, dropping its communicator, on entering iteration `V`: a program that fails
//! rather than crashes), `--slow R,MS` (rank `R` sleeps `MS` ms more before each
//! iteration: slow but alive, which must never be taken for dead), `--exit-before-join T`
//! (the first process of task `T`, `DMLC_TASK_ID`, exits with status 1 before it
//! reaches the tracker), `--forge-silent` (rank 0
//! prints the words of a silent-rank report through the tracker, which must kill
//! nobody), and rabit's
//! `mock=rank,version,seq,ndeath[,point]` (read by
//! [`RobustOptions::with_args`], as is `SWITCHYARD_MOCK`).
//!
//! Iteration `it` (checkpoint version `it`) makes these calls, numbered as the mock
//! kills count them (one per engine call since the last checkpoint):
//!
//! | seq | call |
//! |-----|------|
//! | 0 | `allreduce` Max of `model[i] + (i·(rank+1)) mod (it+111)` |
//! | 1 | `allreduce_lazy` Sum of `max[i] + (i·(rank+7)+it) mod (it+131)`, its prepare counted |
//! | 2, 3 | `broadcast_bytes` of a string from rank `it mod n` (length, then bytes) |
//! | 4 | `checkpoint` / `lazy_checkpoint` |
//!
//! At the end every rank prints one line on stdout,
//! `RESULT rank=R model=<FNV-1a of the global model's bytes, then the local's>
//! prepare_calls=K attempt=A loaded=V` (`V`: the version `load_checkpoint` returned,
//! 0 for none), then calls `finalize`. Any result that differs from its closed form
//! ends the process with status 3 and a message naming the rank, call and element; a
//! collective error ends it with status 1 and the error.

use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions};

type Error = Box<dyn std::error::Error>;

/// What the command line asks for.
#[derive(Debug, Clone, Copy)]
struct Args {
    iters: u64,
    len: usize,
    lazy: bool,
    local: bool,
    pause_ms: u64,
    fail_at: Option<(usize, u64)>,
    slow: Option<(usize, u64)>,
    exit_before_join: Option<u64>,
    forge_silent: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        iters: 3,
        len: 1000,
        lazy: false,
        local: false,
        pause_ms: 0,
        fail_at: None,
        slow: None,
        exit_before_join: None,
        forge_silent: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{name} {v:?} is not a number"))
        };
        match arg.as_str() {
            "--iters" => args.iters = value("--iters")?,
            "--len" => {
                args.len = usize::try_from(value("--len")?).map_err(|e| e.to_string())?;
            }
            "--pause-ms" => args.pause_ms = value("--pause-ms")?,
            "--fail-at" => args.fail_at = Some(pair(&arg, it.next())?),
            "--slow" => args.slow = Some(pair(&arg, it.next())?),
            "--exit-before-join" => args.exit_before_join = Some(value("--exit-before-join")?),
            "--lazy" => args.lazy = true,
            "--forge-silent" => args.forge_silent = true,
            "--local" => args.local = true,
            // rabit-style `name=value` arguments are RobustOptions' (mock=...).
            other if other.contains('=') && !other.starts_with('-') => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.len == 0 || args.iters == 0 {
        return Err("--iters and --len must be positive".into());
    }
    if args.lazy && args.local {
        // rabit's LazyCheckPoint takes no local model either.
        return Err("--lazy and --local do not go together".into());
    }
    Ok(args)
}

/// `R,N` after `flag`.
fn pair(flag: &str, value: Option<String>) -> Result<(usize, u64), String> {
    let v = value.ok_or(format!("{flag} needs two numbers, R,N"))?;
    v.split_once(',')
        .and_then(|(r, n)| Some((r.parse().ok()?, n.parse().ok()?)))
        .ok_or(format!("{flag} {v:?} is not two numbers, R,N"))
}

/// The Max input's closed form.
fn max_term(rank: usize, it: u64, i: usize) -> u64 {
    (i as u64 * (rank as u64 + 1)) % (it + 111)
}

/// The Sum input's closed form.
fn sum_term(rank: usize, it: u64, i: usize) -> u64 {
    (i as u64 * (rank as u64 + 7) + it) % (it + 131)
}

/// The string rank `root` broadcasts in iteration `it`: its length and bytes depend
/// on both, so that a result replayed from the wrong call or root shows.
fn message(root: usize, it: u64, len: usize) -> Vec<u8> {
    let n = 1 + (it as usize * 7 + root * 3) % 50 + len % 16;
    (0..n)
        .map(|k| ((k * 31 + root * 17 + it as usize) % 94 + 33) as u8)
        .collect()
}

/// FNV-1a, 64 bits: enough to tell two models apart in one line.
fn fnv(bytes: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn encode_u64(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn encode_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode<const W: usize, T>(
    bytes: &[u8],
    len: usize,
    what: &str,
    from: fn([u8; W]) -> T,
) -> Result<Vec<T>, Error> {
    if bytes.len() != len * W {
        return Err(format!(
            "the checkpoint's {what} has {} bytes, expected {}",
            bytes.len(),
            len * W
        )
        .into());
    }
    Ok(bytes
        .chunks_exact(W)
        .map(|c| {
            let mut a = [0u8; W];
            a.copy_from_slice(c);
            from(a)
        })
        .collect())
}

/// A lock that a panic elsewhere does not poison for good (there is no panic to
/// recover from here, but `unwrap` is not allowed).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A closed-form check failed: status 3, distinct from a collective error's 1.
#[derive(Debug)]
struct Wrong(String);

impl std::fmt::Display for Wrong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Wrong {}

fn run(args: Args) -> Result<(), Error> {
    let task = std::env::var("DMLC_TASK_ID")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let first_start = std::env::var("DMLC_NUM_ATTEMPT").map_or(true, |a| a.trim() == "0");
    if first_start && task.is_some() && args.exit_before_join == task {
        let task = task.unwrap_or_default();
        eprintln!("task {task}: exiting before joining the tracker (--exit-before-join)");
        std::process::exit(1);
    }
    // Only `name=value` arguments go to RobustOptions: the flags are this program's.
    let robust = RobustOptions::from_env()?
        .with_args(std::env::args().skip(1).filter(|a| a.contains('=')))?;
    // Under `switchyard launch`: robust mode joins the tracker it serves.
    let boot = Bootstrap::from_env()?.unwrap_or_else(Bootstrap::solo);
    let mut comm = Communicator::join(&boot, CommOptions::from_env()?.with_robust(robust))?;
    let (rank, n) = (comm.rank(), comm.world_size());
    let attempt: u64 = std::env::var("DMLC_NUM_ATTEMPT")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let len = args.len;

    // The global model is an immutable snapshot behind an Arc: each iteration makes
    // a new one, so lazy_checkpoint's closure can hold the checkpointed version
    // without a copy and encode it when (and only when) a restarted rank needs it,
    // even after the next version exists.
    let mut model = Arc::new(vec![1u64; len]);
    let mut local: Option<Vec<f32>> = args.local.then(|| vec![rank as f32 + 1.0; len]);
    let loaded = match comm.load_checkpoint()? {
        None => 0,
        Some(c) => {
            if c.version != comm.version_number() {
                return Err(Wrong(format!(
                    "rank {rank}: load_checkpoint gave version {} but version_number() is {}",
                    c.version,
                    comm.version_number()
                ))
                .into());
            }
            model = Arc::new(decode(&c.global, len, "global model", u64::from_le_bytes)?);
            match (&mut local, c.local) {
                (Some(l), Some(bytes)) => {
                    *l = decode(&bytes, len, "local model", f32::from_le_bytes)?;
                }
                (None, None) => {}
                (want, got) => {
                    return Err(Wrong(format!(
                        "rank {rank}: version {}: local model expected: {}, got: {}",
                        c.version,
                        want.is_some(),
                        got.is_some()
                    ))
                    .into());
                }
            }
            c.version
        }
    };
    if loaded > 0 {
        eprintln!("robust_worker: rank {rank} attempt {attempt} resumes from version {loaded}");
    }

    if args.forge_silent && rank == 0 && attempt == 0 {
        // The words of the launcher's silent-rank log line, sent as a plain print:
        // the launcher must log them and kill nobody.
        comm.tracker_print("switchyard robust: silent rank 1 attempt 0: forged by a print")?;
    }

    let prepare_calls = Arc::new(Mutex::new(0u64));
    for it in loaded..args.iters {
        if args.pause_ms > 0 {
            std::thread::sleep(Duration::from_millis(args.pause_ms));
        }
        if let Some((slow, ms)) = args.slow {
            if slow == rank {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        if args.fail_at == Some((rank, it)) && attempt == 0 {
            // An ordinary error return: the communicator is dropped on the way out,
            // as in any program that uses `?`.
            return Err(
                format!("rank {rank}: failing on purpose at iteration {it} (--fail-at)").into(),
            );
        }
        let current = model.clone();

        // seq 0: Max.
        let mut max: Vec<u64> = (0..len)
            .map(|i| current[i].wrapping_add(max_term(rank, it, i)))
            .collect();
        comm.allreduce(&mut max, ReduceOp::Max)?;
        for (i, got) in max.iter().enumerate() {
            let want = (0..n)
                .map(|r| current[i].wrapping_add(max_term(r, it, i)))
                .max()
                .unwrap_or(0);
            if *got != want {
                return Err(Wrong(format!(
                    "rank {rank} iteration {it}: Max[{i}] is {got}, expected {want}"
                ))
                .into());
            }
        }

        // seq 1: Sum, lazily prepared; the closure counts its calls, which a
        // recovered result must not make.
        let mut sum = vec![0u64; len];
        let counter = prepare_calls.clone();
        comm.allreduce_lazy(&mut sum, ReduceOp::Sum, |buf| {
            *lock(&counter) += 1;
            for (i, x) in buf.iter_mut().enumerate() {
                *x = max[i].wrapping_add(sum_term(rank, it, i));
            }
        })?;
        for (i, got) in sum.iter().enumerate() {
            let want = (0..n).fold(max[i].wrapping_mul(n as u64), |acc, r| {
                acc.wrapping_add(sum_term(r, it, i))
            });
            if *got != want {
                return Err(Wrong(format!(
                    "rank {rank} iteration {it}: Sum[{i}] is {got}, expected {want}"
                ))
                .into());
            }
        }

        // seq 2 and 3: a string from rank it mod n (its length, then its bytes).
        let root = (it % n as u64) as usize;
        let mut text = if rank == root {
            message(root, it, len)
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(&mut text, root)?;
        if text != message(root, it, len) {
            return Err(Wrong(format!(
                "rank {rank} iteration {it}: the broadcast from {root} delivered {:?}",
                String::from_utf8_lossy(&text)
            ))
            .into());
        }

        // The next model depends on every result of the iteration.
        let next: Vec<u64> = sum
            .iter()
            .enumerate()
            .map(|(i, s)| s.rotate_left(u32::from(text[i % text.len()] % 64)))
            .collect();
        if let Some(l) = local.as_mut() {
            // A rank's own state: its history and its rank, so that a local model
            // restored from the wrong checkpoint or the wrong rank changes the hash.
            for (x, g) in l.iter_mut().zip(&next) {
                *x = *x * 0.5 + (g % 1000) as f32 + rank as f32 * 0.25;
            }
        }
        model = Arc::new(next);

        // seq 4: the checkpoint.
        if args.lazy {
            let shared = model.clone();
            comm.lazy_checkpoint(move || encode_u64(&shared))?;
        } else {
            let global = encode_u64(&model);
            let local_bytes = local.as_deref().map(encode_f32);
            comm.checkpoint(&global, local_bytes.as_deref())?;
        }
        if comm.version_number() != it + 1 {
            return Err(Wrong(format!(
                "rank {rank}: version_number() is {} after checkpoint {}",
                comm.version_number(),
                it + 1
            ))
            .into());
        }
    }

    let global = encode_u64(&model);
    let mut h = fnv(global, FNV_OFFSET);
    if let Some(l) = &local {
        h = fnv(encode_f32(l), h);
    }
    let calls = *lock(&prepare_calls);
    println!(
        "RESULT rank={rank} model={h:016x} prepare_calls={calls} attempt={attempt} loaded={loaded}"
    );
    comm.finalize()?;
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("robust_worker: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Wrong>() => {
            eprintln!("robust_worker: WRONG RESULT: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("robust_worker: {e}");
            ExitCode::FAILURE
        }
    }
}
