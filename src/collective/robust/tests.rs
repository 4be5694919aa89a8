//! The recovery engine with ranks as threads: a rank "dies" by dropping its
//! communicator (its TCP connections close, as a killed process's do) and a new
//! thread takes its place with a fresh engine, as a restarted process would. Meshes
//! are formed by an in-process rendezvous standing in for the tracker's `recover`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::engine::RobustEngine;
use super::mock::{MockDeath, UNWIND};
use super::{Checkpoint, MockKill, RobustOptions};
use crate::collective::engine::Engine;
use crate::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// Generations of meshes: every rank that asks joins the open generation, which
/// forms once all ranks asked.
struct Generations {
    world: usize,
    state: Mutex<Open>,
    formed: Condvar,
}

/// The open generation's number and endpoints so far, and those of formed ones.
struct Open {
    generation: usize,
    endpoints: Vec<Option<String>>,
    formed: Vec<Vec<String>>,
}

impl Generations {
    fn new(world: usize) -> Arc<Generations> {
        Arc::new(Generations {
            world,
            state: Mutex::new(Open {
                generation: 0,
                endpoints: vec![None; world],
                formed: Vec::new(),
            }),
            formed: Condvar::new(),
        })
    }

    /// This rank's engine in the next mesh.
    fn join(&self, rank: usize) -> Result<Box<dyn Engine>, CollectiveError> {
        let options = CommOptions::default().with_timeout(Duration::from_secs(5));
        let builder = Communicator::bind_mesh(rank, self.world, "tcp://127.0.0.1:0", options)?;
        let endpoints = {
            let mut open = self.state.lock().unwrap();
            let generation = open.generation;
            open.endpoints[rank] = Some(builder.endpoint().to_string());
            if open.endpoints.iter().all(Option::is_some) {
                let all = std::mem::replace(&mut open.endpoints, vec![None; self.world]);
                open.formed.push(all.into_iter().flatten().collect());
                open.generation += 1;
                self.formed.notify_all();
            }
            let until = Instant::now() + WAIT;
            while open.generation == generation {
                let left = until.saturating_duration_since(Instant::now());
                assert!(
                    !left.is_zero(),
                    "rank {rank}: generation {generation} never formed"
                );
                open = self.formed.wait_timeout(open, left).unwrap().0;
            }
            open.formed[generation].clone()
        };
        let mut comm = builder.connect(&endpoints)?;
        Ok(std::mem::replace(
            &mut comm.engine,
            Box::new(crate::collective::engine::Solo),
        ))
    }
}

/// A robust communicator for `rank`, process start number `attempt`.
fn robust(
    gens: &Arc<Generations>,
    rank: usize,
    attempt: u64,
    options: RobustOptions,
) -> Communicator {
    let first = gens.join(rank).expect("first mesh");
    let again = Arc::clone(gens);
    let rejoin = Box::new(move || again.join(rank));
    let engine = RobustEngine::new(first, rejoin, None, RobustOptions { attempt, ..options });
    Communicator::with_engine(Box::new(engine), CommOptions::default(), "test".into())
}

/// What a rank's run ends with: its model, and how many `prepare`s it ran.
#[derive(Debug, PartialEq)]
struct Outcome {
    model: Vec<f64>,
    local: Vec<f64>,
    prepares: usize,
}

/// Where a rank dies: in iteration `iter`, after `after` of its three calls
/// (allreduce, broadcast, checkpoint), or ([`IN_PREPARE`]) when the allreduce's
/// `prepare` fails.
#[derive(Clone, Copy)]
struct Death {
    iter: u64,
    after: usize,
}

/// [`Death::after`] for a rank whose allreduce's `prepare` fails: its call must fail
/// with `PrepareFailed`, and then the rank dies.
const IN_PREPARE: usize = usize::MAX;

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Rabit's test program: per iteration an allreduce (lazy) of `grad_len` values, a
/// broadcast, a checkpoint with a local model (a lazy one without, when `lazy`).
/// Returns `None` where the rank dies.
fn program_as(
    comm: &mut Communicator,
    iters: u64,
    death: Option<Death>,
    (lazy, grad_len): (bool, usize),
) -> Result<Option<Outcome>, CollectiveError> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let (mut model, mut local, start) = match comm.load_checkpoint()? {
        None if lazy => (vec![0.0f64; 4], Vec::new(), 0),
        None => (vec![0.0f64; 4], vec![rank as f64], 0),
        Some(Checkpoint {
            version,
            global,
            local,
        }) => (
            f64s(&global),
            local.map_or_else(Vec::new, |l| f64s(&l)),
            version,
        ),
    };
    assert_eq!(comm.version_number(), start);
    let mut prepares = 0;
    for iter in start..iters {
        let dies = |after: usize| death.is_some_and(|d| d.iter == iter && d.after == after);
        if dies(0) {
            return Ok(None);
        }
        let mut grad = vec![0.0f64; grad_len];
        let prepared = comm.try_allreduce_lazy(&mut grad, ReduceOp::Sum, |g| {
            prepares += 1;
            if dies(IN_PREPARE) {
                // Half-written: what the peers would sum if the call went on.
                g[0] = 1e9;
                return Err("prepare raised");
            }
            for (i, x) in g.iter_mut().enumerate() {
                *x = (rank * 10 + i) as f64 + iter as f64;
            }
            Ok(())
        });
        match prepared {
            Err(CollectiveError::PrepareFailed { rank: r, .. }) if dies(IN_PREPARE) => {
                assert_eq!(r, rank);
                return Ok(None);
            }
            other => other?,
        }
        for (i, x) in grad.iter().enumerate() {
            let expected: f64 = (0..n).map(|r| (r * 10 + i) as f64 + iter as f64).sum();
            assert_eq!(*x, expected, "rank {rank} iteration {iter} element {i}");
        }
        if dies(1) {
            return Ok(None);
        }
        let root = (iter as usize) % n;
        let mut note = if rank == root {
            format!("iteration {iter}").into_bytes()
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(&mut note, root)?;
        assert_eq!(note, format!("iteration {iter}").into_bytes());
        if dies(2) {
            return Ok(None);
        }
        for (m, g) in model.iter_mut().zip(&grad) {
            *m = *m * 0.5 + g;
        }
        if lazy {
            let snapshot = model.clone();
            comm.lazy_checkpoint(move || bytemuck::cast_slice(&snapshot).to_vec())?;
        } else {
            local[0] += (rank + 1) as f64 * grad[0];
            comm.checkpoint(
                bytemuck::cast_slice(&model),
                Some(bytemuck::cast_slice(&local)),
            )?;
        }
    }
    Ok(Some(Outcome {
        model,
        local,
        prepares,
    }))
}

/// How one rank's job went: its outcome and final start number, or the error that
/// ended it.
type Ended = Result<(Outcome, u64), String>;

/// Runs `world` ranks; `deaths[r]` lists rank r's deaths in order (one per start).
fn job(world: usize, iters: u64, deaths: Vec<Vec<Death>>) -> Vec<(Outcome, u64)> {
    job_with(world, iters, deaths, RobustOptions::default())
        .into_iter()
        .enumerate()
        .map(|(r, e)| e.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

/// [`job`] with `options` (mock kills strike by unwinding the rank's thread), each
/// rank's end as it came.
fn job_with(
    world: usize,
    iters: u64,
    deaths: Vec<Vec<Death>>,
    options: RobustOptions,
) -> Vec<Ended> {
    job_as(world, iters, deaths, options, false)
}

/// [`job_with`], the program checkpointing lazily when `lazy`.
fn job_as(
    world: usize,
    iters: u64,
    deaths: Vec<Vec<Death>>,
    options: RobustOptions,
    lazy: bool,
) -> Vec<Ended> {
    job_of(world, iters, deaths, options, (lazy, 4))
}

/// [`job_as`] with gradients of `grad_len` values.
fn job_of(
    world: usize,
    iters: u64,
    deaths: Vec<Vec<Death>>,
    options: RobustOptions,
    shape: (bool, usize),
) -> Vec<Ended> {
    let gens = Generations::new(world);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            let deaths = deaths.get(rank).cloned().unwrap_or_default();
            let options = options.clone();
            // The caller's tracing subscriber, so that a test can read the ranks' logs.
            let dispatch = tracing::dispatcher::get_default(Clone::clone);
            std::thread::spawn(move || -> Ended {
                let _logs = tracing::dispatcher::set_default(&dispatch);
                UNWIND.set(true);
                let mut attempt = 0u64;
                loop {
                    let death = deaths.get(attempt as usize).copied();
                    let life = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        let mut comm = robust(&gens, rank, attempt, options.clone());
                        let outcome = program_as(&mut comm, iters, death, shape)?;
                        if outcome.is_some() {
                            comm.engine.as_mut().finish()?;
                        }
                        Ok::<_, CollectiveError>(outcome)
                    }));
                    match life {
                        Ok(Ok(Some(outcome))) => return Ok((outcome, attempt)),
                        Ok(Err(e)) => return Err(e.to_string()),
                        // Died (returned early or a mock kill unwound): its links
                        // closed with its communicator; a new "process" takes the rank.
                        Ok(Ok(None)) => {}
                        Err(payload) if payload.is::<MockDeath>() => {}
                        Err(payload) => std::panic::resume_unwind(payload),
                    }
                    attempt += 1;
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

fn kill(spec: &str) -> MockKill {
    MockKill::parse(spec).unwrap()
}

fn assert_same(failed: &[(Outcome, u64)], clean: &[(Outcome, u64)]) {
    for (r, (f, c)) in failed.iter().zip(clean).enumerate() {
        assert_eq!(f.0.model, c.0.model, "rank {r}");
        assert_eq!(f.0.local, c.0.local, "rank {r}'s local model");
    }
}

#[test]
fn without_failures_every_rank_ends_with_the_same_model() {
    let outcomes = job(3, 4, Vec::new());
    for (o, attempt) in &outcomes {
        assert_eq!(o.model, outcomes[0].0.model);
        assert_eq!(o.prepares, 4);
        assert_eq!(*attempt, 0);
    }
}

#[test]
fn a_rank_that_dies_between_calls_catches_up_to_the_same_model() {
    let clean = job(3, 4, Vec::new());
    let deaths = vec![Vec::new(), vec![Death { iter: 2, after: 1 }]];
    let failed = job(3, 4, deaths);
    for r in 0..3 {
        assert_eq!(failed[r].0.model, clean[r].0.model, "rank {r}");
        assert_eq!(
            failed[r].0.local, clean[r].0.local,
            "rank {r}'s local model"
        );
    }
    assert_eq!(failed[1].1, 1, "rank 1 restarted once");
    // Its second life resumed at checkpoint 2 and got iteration 2's allreduce from a
    // survivor: it prepared only iteration 3's.
    assert_eq!(failed[1].0.prepares, 1);
}

/// Rank 1's `prepare` fails in iteration 2 and the rank then
/// exits, as a Python program whose `prepare_fun` raised. No rank keeps a result of
/// that call: the restarted rank prepares it again and every rank ends with the
/// model of a run without failures.
/// Gradients of 100 000 values (800 KB) run on the host board in pieces, the result
/// written into the buffer robust mode keeps and the input read where the caller put
/// it; a rank that dies before a checkpoint's first call makes the others fail in
/// the agreement before it.
#[test]
fn large_allreduces_recover_like_small_ones() {
    let shape = (false, 100_000);
    let clean: Vec<(Outcome, u64)> = job_of(3, 3, Vec::new(), RobustOptions::default(), shape)
        .into_iter()
        .map(|e| e.unwrap())
        .collect();
    let deaths = vec![Vec::new(), vec![Death { iter: 1, after: 0 }]];
    let failed: Vec<(Outcome, u64)> = job_of(3, 3, deaths, RobustOptions::default(), shape)
        .into_iter()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(failed[1].1, 1, "rank 1 was restarted once");
    assert_same(&failed, &clean);
}

/// The survivors are in the middle of a large allreduce, run directly (no agreement
/// since the one before the first call), when rank 1 dies: their pieces are on the
/// host board and the call fails half-way. They must run it again from their
/// untouched input, after replaying the first call's result (kept without a copy of
/// its own) to the restarted rank, and every rank must get the exact sums.
#[test]
fn a_death_in_the_middle_of_a_large_direct_allreduce_loses_no_input() {
    const WORLD: usize = 3;
    const LEN: usize = 100_000;
    let value = |rank: usize, call: usize, i: usize| (rank * 1000 + call * 7 + i % 13) as f64;
    let sums = |call: usize| -> Vec<f64> {
        (0..LEN)
            .map(|i| (0..WORLD).map(|r| value(r, call, i)).sum())
            .collect()
    };
    let gens = Generations::new(WORLD);
    let handles: Vec<_> = (0..WORLD)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            std::thread::spawn(move || -> Result<Vec<Vec<f64>>, CollectiveError> {
                let mut attempt = 0;
                loop {
                    let mut comm = robust(&gens, rank, attempt, RobustOptions::default());
                    comm.load_checkpoint()?;
                    let mut results = Vec::new();
                    for call in 0..2 {
                        let mut buf: Vec<f64> = (0..LEN).map(|i| value(rank, call, i)).collect();
                        comm.allreduce(&mut buf, ReduceOp::Sum)?;
                        results.push(buf);
                        if rank == 1 && attempt == 0 && call == 0 {
                            // Dies between the calls: its links close with it, while
                            // the others already wait in the second call.
                            break;
                        }
                    }
                    if results.len() == 2 {
                        comm.engine.as_mut().finish()?;
                        return Ok(results);
                    }
                    drop(comm);
                    attempt += 1;
                }
            })
        })
        .collect();
    for (rank, handle) in handles.into_iter().enumerate() {
        let results = handle.join().expect("rank thread").expect("rank's calls");
        for (call, got) in results.iter().enumerate() {
            assert!(*got == sums(call), "rank {rank}, call {call}: wrong sums");
        }
    }
}

#[test]
fn a_failed_prepare_leaves_no_result_to_replay() {
    let clean = job(3, 4, Vec::new());
    let deaths = vec![
        Vec::new(),
        vec![Death {
            iter: 2,
            after: IN_PREPARE,
        }],
    ];
    let failed = job(3, 4, deaths);
    assert_same(&failed, &clean);
    assert_eq!(failed[1].1, 1, "rank 1 restarted once");
    // Its second life resumed at checkpoint 2 and prepared iterations 2 and 3.
    assert_eq!(failed[1].0.prepares, 2);
}

#[test]
fn several_deaths_including_rank_0_and_the_same_rank_twice() {
    let clean = job(4, 5, Vec::new());
    let deaths = vec![
        vec![Death { iter: 0, after: 1 }],
        vec![Death { iter: 1, after: 2 }, Death { iter: 3, after: 0 }],
        Vec::new(),
        vec![Death { iter: 3, after: 2 }],
    ];
    let failed = job(4, 5, deaths);
    for r in 0..4 {
        assert_eq!(failed[r].0.model, clean[r].0.model, "rank {r}");
        assert_eq!(
            failed[r].0.local, clean[r].0.local,
            "rank {r}'s local model"
        );
    }
    assert_eq!(failed[1].1, 2);
}

#[test]
fn a_death_after_replication_and_before_the_commit() {
    let clean = job(4, 4, Vec::new());
    // Rank 2 in checkpoint 2 (version 1, after its 3 engine calls: the allreduce and
    // the broadcast's length and bytes), local models replicated.
    let options = RobustOptions::default().with_mock(vec![kill("2,1,3,0,replicate")]);
    let failed: Vec<_> = job_with(4, 4, Vec::new(), options)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_same(&failed, &clean);
    assert_eq!(failed[2].1, 1);
}

#[test]
fn a_death_inside_recovery() {
    let clean = job(4, 4, Vec::new());
    // Rank 1 dies in iteration 1; rank 3 dies again while rejoining for it.
    let deaths = vec![Vec::new(), vec![Death { iter: 1, after: 1 }]];
    let options = RobustOptions::default().with_mock(vec![kill("3,1,1,0,recover")]);
    let failed: Vec<_> = job_with(4, 4, deaths, options)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_same(&failed, &clean);
    assert_eq!((failed[1].1, failed[3].1), (1, 1));
}

#[test]
fn three_ranks_die_at_one_call_and_the_model_is_exact() {
    let clean = job(6, 4, Vec::new());
    let at = Death { iter: 2, after: 1 };
    let deaths = vec![vec![at], vec![at], Vec::new(), Vec::new(), vec![at]];
    let failed = job(6, 4, deaths);
    assert_same(&failed, &clean);
}

#[test]
fn a_rank_and_its_replicas_dying_together_is_an_error_naming_the_lost_model() {
    // Ranks 1, 2, 3 hold rank 1's local model (itself and 2 successors).
    let at = Death { iter: 2, after: 2 };
    let deaths = vec![Vec::new(), vec![at], vec![at], vec![at]];
    let ends = job_with(5, 4, deaths, RobustOptions::default());
    for (r, end) in ends.iter().enumerate() {
        let err = end.as_ref().expect_err("no rank may finish");
        assert!(
            err.contains("rank 1's local model is lost"),
            "rank {r}: {err}"
        );
    }
}

#[test]
fn lazy_checkpoints_recover_the_same_model() {
    let run = |deaths| -> Vec<(Outcome, u64)> {
        job_as(3, 4, deaths, RobustOptions::default(), true)
            .into_iter()
            .map(Result::unwrap)
            .collect()
    };
    let clean = run(Vec::new());
    let failed = run(vec![
        Vec::new(),
        Vec::new(),
        vec![Death { iter: 2, after: 2 }],
    ]);
    assert_same(&failed, &clean);
    assert_eq!(failed[2].1, 1);
}

#[test]
fn serde_values_checkpoint_and_come_back_to_a_restarted_rank() {
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
    struct Model {
        weights: Vec<f32>,
        name: String,
    }
    let gens = Generations::new(2);
    let model = |v: u64| Model {
        weights: vec![v as f32; 3],
        name: format!("model {v}"),
    };
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            std::thread::spawn(move || {
                let mut comm = robust(&gens, rank, 0, RobustOptions::default());
                let none: Option<(u64, Model, Option<u32>)> = comm.load_checkpoint_value().unwrap();
                assert!(none.is_none());
                comm.checkpoint_value(&model(1), Some(&(rank as u32 * 7)))
                    .unwrap();
                let mut one = [1u8];
                comm.allreduce(&mut one, ReduceOp::Sum).unwrap();
                if rank == 1 {
                    // Dies; its successor loads the checkpoint from rank 0.
                    drop(comm);
                    let mut comm = robust(&gens, rank, 1, RobustOptions::default());
                    let (version, global, local): (u64, Model, Option<u32>) =
                        comm.load_checkpoint_value().unwrap().expect("a checkpoint");
                    assert_eq!((version, global, local), (1, model(1), Some(7)));
                    comm.allreduce(&mut one, ReduceOp::Sum).unwrap();
                    comm.engine.as_mut().finish().unwrap();
                } else {
                    comm.engine.as_mut().finish().unwrap();
                }
                one[0]
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("rank"), 2);
    }
}

/// A writer into a shared buffer, for reading what the ranks logged.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Mock kills that cannot fire are accepted, but each is named in a warning (on stderr and
/// in the log) at the end of the job with the reason; the kill that struck is not.
#[test]
fn mock_kills_that_never_fire_are_warned_about_at_the_end() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // Each version has 3 engine calls (the allreduce, the broadcast's length and
    // bytes) and its checkpoint at call 3; 2 iterations end the job at version 2.
    let kills = [
        "0,0,7,0", "0,0,1,1", "1,5,0,0", "2,1,1,0", "2,0,1,1", "4,0,0,0",
    ];
    let options = RobustOptions::default().with_mock(kills.iter().map(|k| kill(k)).collect());
    let ended =
        tracing::subscriber::with_default(subscriber, || job_with(3, 2, Vec::new(), options));
    let ended: Vec<_> = ended.into_iter().map(Result::unwrap).collect();
    assert_eq!(ended[2].1, 1, "rank 2's kill struck once");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for want in [
        "mock kill 0,0,7,0 never fired: version 0 had 3 calls and its checkpoint at call 3",
        "mock kill 0,0,1,1 never fired: rank 0 finished the job in its start 0, so start 1 never came",
        "mock kill 1,5,0,0 never fired: the job ended at version 2 (the last checkpoint), so version 5 never began",
        "mock kill 2,0,1,1 never fired: this start of rank 2 resumed from version 1, after it",
        "mock kill 4,0,0,0 never fired: the job has ranks 0..3 only",
    ] {
        assert_eq!(text.matches(want).count(), 1, "{want:?} once in:\n{text}");
    }
    assert!(!text.contains("mock kill 2,1,1,0"), "{text}");
    // On stderr too, for programs without a tracing subscriber: before, only logged.
    let printed = super::mock::PRINTED.lock().unwrap().clone();
    for want in [
        "switchyard mock: rank 0 (attempt 0): mock kill 0,0,7,0 never fired",
        "switchyard mock: rank 0 (attempt 0): mock kill 0,0,1,1 never fired",
        "switchyard mock: rank 1 (attempt 0): mock kill 1,5,0,0 never fired",
        "switchyard mock: rank 2 (attempt 1): mock kill 2,0,1,1 never fired",
        "switchyard mock: rank 0 (attempt 0): mock kill 4,0,0,0 never fired",
    ] {
        let found = printed.iter().filter(|l| l.starts_with(want)).count();
        assert_eq!(found, 1, "{want:?} once in {printed:#?}");
    }
}

#[test]
fn robust_options_read_from_a_lookup() {
    use super::{ENV_GLOBAL_REPLICA, ENV_LOCAL_REPLICA, ENV_MOCK, ENV_RESULT_BUDGET};
    let o = RobustOptions::from_lookup(&[
        (ENV_LOCAL_REPLICA, "3"),
        (ENV_GLOBAL_REPLICA, "0"),
        (ENV_RESULT_BUDGET, "4096"),
        ("DMLC_NUM_ATTEMPT", "2"),
        (ENV_MOCK, "0,0,1,0 1,1,1,0"),
    ])
    .unwrap();
    assert_eq!(
        (o.local_replica, o.global_replica, o.result_budget),
        (3, 1, 4096)
    );
    assert_eq!((o.attempt, o.mock.len()), (2, 2));
}

/// Each variable's malformed value: an error naming the variable and the value.
#[test]
fn robust_options_name_a_malformed_variable_and_its_value() {
    use super::{ENV_GLOBAL_REPLICA, ENV_LOCAL_REPLICA, ENV_MOCK, ENV_RESULT_BUDGET};
    for (var, bad) in [
        (ENV_LOCAL_REPLICA, "two"),
        (ENV_GLOBAL_REPLICA, "-1"),
        (ENV_RESULT_BUDGET, "1GiB"),
        ("DMLC_NUM_ATTEMPT", "first"),
        (ENV_MOCK, "0,0"),
    ] {
        let err = RobustOptions::from_lookup(&[(var, bad)]).unwrap_err();
        assert_eq!((err.var(), err.value()), (var, Some(bad)));
        assert!(
            err.to_string()
                .starts_with(&format!("{var}={bad:?}: expected ")),
            "{err}"
        );
    }
}

/// Rank 1's `prepare` fails and it goes on with the same communicator, as a
/// `try`/`except` loop does: robust mode's agreement brings it back into step with
/// the others, who wait in the failed call. When rank 1 makes the same allreduce
/// again (`retry`), every rank gets that call's sum and then the broadcast after it;
/// when it moves on to the broadcast instead, no rank gets data of another call: the
/// agreement refuses, and every rank's communicator is then unusable. Returns each
/// rank's results (its sum, then its broadcast value) or errors in words.
fn robust_after_a_failed_prepare(retry: bool) -> Vec<Vec<Result<u64, String>>> {
    let world = 3;
    let gens = Generations::new(world);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            std::thread::spawn(move || {
                let options = RobustOptions::default();
                let mut comm = robust(&gens, rank, 0, options);
                let mut seen = Vec::new();
                let mut sum = [0u64];
                let first = comm.try_allreduce_lazy(&mut sum, ReduceOp::Sum, |buf| {
                    if rank == 1 {
                        return Err("prepare raised");
                    }
                    buf[0] = rank as u64 + 1;
                    Ok(())
                });
                seen.push(first.map(|()| sum[0]).map_err(|e| e.to_string()));
                if rank == 1 {
                    assert!(!comm.is_poisoned(), "robust mode resynchronises");
                    if retry {
                        let again = comm.allreduce_lazy(&mut sum, ReduceOp::Sum, |buf| buf[0] = 2);
                        seen.push(again.map(|()| sum[0]).map_err(|e| e.to_string()));
                    }
                }
                let mut note = [if rank == 0 { 77u64 } else { 0 }];
                let broadcast = comm.broadcast(&mut note, 0);
                seen.push(broadcast.map(|()| note[0]).map_err(|e| e.to_string()));
                seen
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect()
}

#[test]
fn a_rank_whose_prepare_failed_rejoins_when_it_calls_again() {
    let seen = robust_after_a_failed_prepare(true);
    // The others' first call is the one rank 1 made again: 1 + 2 + 3.
    assert_eq!(seen[0], [Ok(6), Ok(77)]);
    assert_eq!(seen[2], [Ok(6), Ok(77)]);
    assert_eq!(seen[1][1..], [Ok(6), Ok(77)]);
    assert!(
        seen[1][0]
            .as_ref()
            .is_err_and(|e| e.contains("prepare failed on rank 1: prepare raised")),
        "{:?}",
        seen[1]
    );
}

#[test]
fn a_rank_whose_prepare_failed_and_moved_on_gets_no_other_calls_data() {
    let seen = robust_after_a_failed_prepare(false);
    // Rank 1's broadcast met the others' allreduce in the agreement: every rank
    // fails there, and the others' broadcast after it is refused.
    for (rank, calls) in seen.iter().enumerate() {
        assert_eq!(calls.len(), 2, "rank {rank}: {calls:?}");
        let at = usize::from(rank == 1);
        assert!(
            calls[at]
                .as_ref()
                .is_err_and(|e| e.contains("ranks disagree")),
            "rank {rank}: {calls:?}"
        );
        if rank != 1 {
            assert!(
                calls[1]
                    .as_ref()
                    .is_err_and(|e| e.contains("unusable after an earlier call failed")),
                "rank {rank}: {calls:?}"
            );
        }
    }
}

/// Two-byte floats in robust mode, whose allreduces on the host board read each
/// rank's input where the caller put it and write the result into the buffer robust
/// mode keeps: the f32 sum rounded once (2048 + 1 + 1 is 2050 in f16), in one board
/// call and in many pieces, the same bits on every rank.
#[test]
fn halves_reduce_on_the_host_board_in_robust_mode() {
    use half::{bf16, f16};
    let n = 3;
    let gens = Generations::new(n);
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            std::thread::spawn(move || {
                let mut comm = robust(&gens, rank, 0, RobustOptions::default());
                let first = if rank == 0 { 2048.0 } else { 1.0 };
                let mut small = [f16::from_f32(first); 5];
                comm.allreduce(&mut small, ReduceOp::Sum).unwrap();
                let input = |i: usize| bf16::from_f32(((i * 7 + rank * 13) % 50) as f32 / 8.0);
                let mut large: Vec<bf16> = (0..100_000).map(input).collect();
                comm.allreduce(&mut large, ReduceOp::Sum).unwrap();
                comm.finalize().unwrap();
                (small, large)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (rank, (small, large)) in results.iter().enumerate() {
        assert_eq!(*small, [f16::from_f32(2050.0); 5], "rank {rank}");
        for (i, x) in large.iter().enumerate() {
            let exact: usize = (0..n).map(|r| (i * 7 + r * 13) % 50).sum();
            assert_eq!(x.to_f32(), exact as f32 / 8.0, "rank {rank} element {i}");
        }
        assert_eq!(large, &results[0].1, "rank {rank}");
    }
}
