//! One rank of a run: its processes, one after the other on one thread, each running
//! the program from `load_checkpoint` on.

use super::RUN_LIMIT;
use super::program::{Model, Program, Reference, bytes_of, call};
use super::world::{Death, Life, Run, next_link};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Instant;
use switchyard::collective::testing::{self, NextLink};
use switchyard::collective::{CollectiveError, RobustOptions};

/// Most processes one rank may start: deaths are 1-2, so more is a loop.
const MOST_STARTS: u64 = 4;

/// How one process ended.
pub(crate) enum End {
    /// Killed by the plan.
    Died,
    /// Failed because every copy of a result or local model it needed is gone: the
    /// error in words, and the ranks that held the copies.
    Lost(String, Vec<usize>),
    /// Could not form a mesh because another rank's last process had ended: after a
    /// loss, a replacement that starts later is left alone (its job is over).
    Orphaned(String),
    /// Finished the program with these models, after this many new meshes.
    Done(Model, u64),
    /// Broke an invariant, or failed: the run's verdict.
    Broken(String),
}

/// A failed call's end: a death if the process is dead, a loss or the job's end if
/// the error says so, else a broken run.
pub(crate) fn failed(run: &Run, life: &Life, what: &str, e: &CollectiveError) -> End {
    let why = || {
        format!(
            "rank {} (process {}): {what} failed: {e}",
            life.rank, life.attempt
        )
    };
    if life.dead() {
        End::Died
    } else if run.someone_ended() && matches!(e, CollectiveError::Setup { .. }) {
        End::Orphaned(why())
    } else if let CollectiveError::ResultLost { keepers: held, .. }
    | CollectiveError::LocalModelLost {
        replicas_tried: held,
        ..
    } = e
    {
        End::Lost(e.to_string(), held.clone())
    } else {
        End::Broken(why())
    }
}

/// One process of a rank: the whole program, from `load_checkpoint` on.
pub(crate) fn process(run: &Arc<Run>, life: &Arc<Life>) -> End {
    let (rank, program) = (life.rank, &run.program);
    let reference = Arc::clone(&run.reference);
    run.note(
        rank,
        format!("rank {rank} (process {}) starts", life.attempt),
    );
    let first = match next_link(run, life) {
        Ok(link) => link,
        Err(e) => return failed(run, life, "forming the first mesh", &e),
    };
    let mut robust = RobustOptions::default();
    robust.attempt = life.attempt;
    if let Some((global, local)) = program.replicas {
        robust = robust.with_global_replica(global).with_local_replica(local);
    }
    let (again, me) = (Arc::clone(run), Arc::clone(life));
    let next: NextLink = Box::new(move || next_link(&again, &me));
    let mut comm = testing::robust_over_links(first, program.options(), robust, next);
    let (mut model, start) = match comm.load_checkpoint() {
        Err(e) => return failed(run, life, "load_checkpoint", &e),
        Ok(_) if life.dead() => return End::Died,
        Ok(None) => (Model::initial(program, rank), 0),
        Ok(Some(c)) => {
            let loaded = Model::decode(program, rank, &c.global, c.local.as_deref());
            let want = reference
                .checkpoints
                .get(c.version as usize)
                .map(|m| &m[rank]);
            if c.version == 0 || loaded.as_ref() != want {
                return End::Broken(format!(
                    "rank {rank} (process {}) loaded checkpoint {} that is not the \
                     failure-free run's: {loaded:?}, not {want:?}",
                    life.attempt, c.version
                ));
            }
            (
                loaded.unwrap_or_else(|| Model::initial(program, rank)),
                c.version,
            )
        }
    };
    run.note(
        rank,
        format!(
            "rank {rank} (process {}) loaded version {start}",
            life.attempt
        ),
    );
    for iter in start..program.iters {
        for (c, &op) in program.calls.iter().enumerate() {
            if run.at_point(life, iter, c) {
                return End::Died;
            }
            let input = model.input(program, rank, iter, c);
            let result = match call(&mut comm, op, &input, rank) {
                Err(e) => return failed(run, life, &format!("iteration {iter} call {c}"), &e),
                Ok(_) if life.dead() => return End::Died,
                Ok(result) => result,
            };
            if result != reference.results[iter as usize][c] {
                return End::Broken(format!(
                    "rank {rank} (process {}) iteration {iter} call {c} ({op:?}) returned Ok \
                     with data that is not the call's: {:?}",
                    life.attempt,
                    &result[..result.len().min(32)]
                ));
            }
            model.fold(program, (rank, iter, c), &result);
        }
        let calls = program.calls.len();
        if run.at_point(life, iter, calls) {
            return End::Died;
        }
        let (global, local) = (bytes_of(&model.global), bytes_of(&model.local));
        let checkpointed = if program.lazy {
            comm.lazy_checkpoint(move || global.clone())
        } else {
            comm.checkpoint(&global, Some(&local))
        };
        if let Err(e) = checkpointed {
            return failed(run, life, &format!("iteration {iter}'s checkpoint"), &e);
        }
        if life.dead() {
            return End::Died;
        }
        let version = comm.version_number();
        if version != iter + 1 {
            return End::Broken(format!(
                "rank {rank} (process {}) is at version {version} after iteration {iter}'s \
                 checkpoint",
                life.attempt
            ));
        }
        if run.at_point(life, iter, calls + 1) {
            return End::Died;
        }
    }
    life.finishing.store(true, Ordering::SeqCst);
    {
        let mut clock = run.clock.lock().unwrap();
        clock.before_finish[rank] = clock.per_rank[rank];
    }
    let recoveries = comm.recoveries();
    if let Err(e) = comm.finalize() {
        return failed(run, life, "finalize", &e);
    }
    End::Done(model, recoveries)
}

/// How a rank's job went: its last process's end, and how many it started.
pub(crate) type RankEnd = (End, u64);

/// What a run of `program` with `deaths` left: each rank's end, the deaths as they
/// struck, each rank's link operations before `finalize`, the worlds formed, and the
/// trace's events.
pub(crate) struct Ran {
    /// Each rank's end (`None`: it did not end within [`RUN_LIMIT`]).
    pub(crate) ends: Vec<Option<RankEnd>>,
    /// The invariants broken, the first first.
    pub(crate) broken: Vec<(u64, usize, String)>,
    pub(crate) deaths: Vec<Death>,
    /// Each rank's sends and receives before its last process began `finalize`.
    pub(crate) ops: Vec<u64>,
    /// Worlds formed.
    pub(crate) generations: u64,
    /// The trace's lines, in the order of the run's clock.
    pub(crate) events: Vec<(u64, usize, String)>,
}

/// Runs `program` with `deaths`, every rank on a thread of its own, its processes one
/// after the other.
pub(crate) fn run_job(program: &Program, reference: &Arc<Reference>, deaths: Vec<Death>) -> Ran {
    let run = Run::new(program, Arc::clone(reference), deaths);
    let (done, ends) = mpsc::channel();
    for rank in 0..program.size {
        let (run, done) = (Arc::clone(&run), done.clone());
        std::thread::spawn(move || {
            let mut attempt = 0;
            let end = loop {
                let life = Arc::new(Life {
                    rank,
                    attempt,
                    dead: AtomicBool::new(false),
                    finishing: AtomicBool::new(false),
                });
                match process(&run, &life) {
                    End::Died if attempt + 1 < MOST_STARTS => {
                        run.note(rank, format!("rank {rank} (process {attempt}) is gone"));
                        attempt += 1;
                    }
                    End::Died => {
                        break End::Broken(format!("rank {rank} died {MOST_STARTS} times"));
                    }
                    end => break end,
                }
            };
            match &end {
                End::Done(_, recoveries) => run.note(
                    rank,
                    format!(
                        "rank {rank} (process {attempt}) finished after {recoveries} new meshes"
                    ),
                ),
                End::Broken(why) => {
                    run.note(rank, format!("broken: {why}"));
                    let at = run.stamp(rank);
                    run.broken.lock().unwrap().push((at, rank, why.clone()));
                }
                End::Lost(why, _) => run.note(rank, format!("lost: {why}")),
                End::Orphaned(why) => run.note(rank, format!("left alone: {why}")),
                End::Died => {}
            }
            run.finished(rank);
            let _ = done.send((rank, end, attempt));
        });
    }
    drop(done);
    let mut ended: Vec<Option<RankEnd>> = (0..program.size).map(|_| None).collect();
    let until = Instant::now() + RUN_LIMIT;
    for _ in 0..program.size {
        let left = until.saturating_duration_since(Instant::now());
        match ends.recv_timeout(left) {
            Ok((rank, end, attempt)) => ended[rank] = Some((end, attempt)),
            Err(_) => {
                run.close();
                break;
            }
        }
    }
    let mut events = std::mem::take(&mut *run.events.lock().unwrap());
    events.sort_by_key(|&(at, rank, _)| (at, rank));
    let mut broken = std::mem::take(&mut *run.broken.lock().unwrap());
    broken.sort_by_key(|&(at, rank, _)| (at, rank));
    let ops = run.clock.lock().unwrap().before_finish.clone();
    Ran {
        ends: ended,
        broken,
        deaths: run.deaths.lock().unwrap().clone(),
        ops,
        generations: run.generation(),
        events,
    }
}
