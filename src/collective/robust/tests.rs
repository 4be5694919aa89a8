//! The recovery engine with ranks as threads: a rank "dies" by dropping its
//! communicator (its TCP connections close, as a killed process's do) and a new
//! thread takes its place with a fresh engine, as a restarted process would. Meshes
//! are formed by an in-process rendezvous standing in for the tracker's `recover`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::engine::RobustEngine;
use super::{Checkpoint, RobustOptions};
use crate::collective::engine::Engine;
use crate::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
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
    let engine = RobustEngine::new(first, rejoin, options, attempt);
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
/// (allreduce, broadcast, checkpoint).
#[derive(Clone, Copy)]
struct Death {
    iter: u64,
    after: usize,
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Rabit's test program: per iteration an allreduce (lazy), a broadcast, a
/// checkpoint with a local model. Returns `None` where the rank dies.
fn program(
    comm: &mut Communicator,
    iters: u64,
    death: Option<Death>,
) -> Result<Option<Outcome>, CollectiveError> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let (mut model, mut local, start) = match comm.load_checkpoint()? {
        None => (vec![0.0f64; 4], vec![rank as f64], 0),
        Some(Checkpoint {
            version,
            global,
            local,
        }) => (f64s(&global), f64s(&local.expect("a local model")), version),
    };
    assert_eq!(comm.version_number(), start);
    let mut prepares = 0;
    for iter in start..iters {
        let dies = |after: usize| death.is_some_and(|d| d.iter == iter && d.after == after);
        if dies(0) {
            return Ok(None);
        }
        let mut grad = vec![0.0f64; 4];
        comm.allreduce_lazy(&mut grad, ReduceOp::Sum, |g| {
            prepares += 1;
            for (i, x) in g.iter_mut().enumerate() {
                *x = (rank * 10 + i) as f64 + iter as f64;
            }
        })?;
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
        local[0] += (rank + 1) as f64 * grad[0];
        comm.checkpoint(
            bytemuck::cast_slice(&model),
            Some(bytemuck::cast_slice(&local)),
        )?;
    }
    Ok(Some(Outcome {
        model,
        local,
        prepares,
    }))
}

/// Runs `world` ranks; `deaths[r]` lists rank r's deaths in order (one per start).
fn job(world: usize, iters: u64, deaths: Vec<Vec<Death>>) -> Vec<(Outcome, u64)> {
    let gens = Generations::new(world);
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let gens = Arc::clone(&gens);
            let deaths = deaths.get(rank).cloned().unwrap_or_default();
            std::thread::spawn(move || {
                let mut attempt = 0u64;
                loop {
                    let death = deaths.get(attempt as usize).copied();
                    let mut comm = robust(&gens, rank, attempt, RobustOptions::default());
                    let outcome = program(&mut comm, iters, death)
                        .unwrap_or_else(|e| panic!("rank {rank} attempt {attempt}: {e}"));
                    match outcome {
                        Some(outcome) => {
                            let engine = comm.engine.as_mut();
                            engine.finish().expect("finish");
                            return (outcome, attempt);
                        }
                        // Dies: its links close with the communicator; a new "process"
                        // takes the rank.
                        None => {
                            drop(comm);
                            attempt += 1;
                        }
                    }
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
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
