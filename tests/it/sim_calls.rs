//! A seeded campaign over the deterministic in-memory link: no collective call ever
//! returns another call's data, after errors too.
//!
//! Each seed draws a world of 2-4 ranks, a schedule of the in-memory link (which rank
//! runs, and where a running rank is preempted), and a program of 4-12 calls:
//! broadcasts and byte-string broadcasts from any root, allreduces, allgathers, and
//! lazy allreduces whose `prepare` may fail on one rank. It may also draw one rank
//! that skips one call, as a program with a bug on one rank does. Every rank runs the
//! whole program and catches every error, as a notebook or a `try`/`except` loop does.
//!
//! Calls are matched by their place in each rank's sequence, as in MPI: the `i`th
//! call a rank makes goes with the `i`th call of every other rank (a rank that skipped
//! one is a call behind from there on). Invariants, checked on every rank:
//! - where every rank made the same `i`th call, a rank whose call returns `Ok` got
//!   that call's data (the value its root sent, the sum of every rank's contribution,
//!   every rank's part in rank order), whatever failed before;
//! - a lazy allreduce whose `prepare` failed on some rank returns `Ok` on no rank;
//! - every rank ends (the in-memory link ends a wait nobody can satisfy at once).
//!
//! Where the ranks' `i`th calls differ (after a skip), what a rank gets is the
//! mismatch tests' subject (`collective_mismatch.rs`): not checked here.
//!
//! `SEED=n cargo test -p switchyard --test it sim_calls -- --nocapture` replays seed
//! `n` with its trace; `SIM_SEEDS=n` runs a longer campaign. With the communicator's
//! refusal after a failed call taken out (`Communicator::usable` always `Ok`), seed
//! 74 fails: a rank's allgather returns `Ok` with another call's parts
//! (docs/testing.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::time::Duration;
use switchyard::collective::testing::{self, MemoryLink, MemorySchedule};
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
use switchyard_sim::{Campaign, Outcome, Rng, Trace};

/// Seeds in a plain `cargo test`.
const BUDGET: u64 = 1000;
/// The longest a rank may take over its whole program: the in-memory link ends every
/// wait that cannot be satisfied at once, so this is only a guard.
const RANK_LIMIT: Duration = Duration::from_secs(60);

/// One call of the program; the value makes each call's data its own.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// `root` broadcasts `[value, value + 1]`.
    Broadcast { root: usize, value: u64 },
    /// A byte string of a length of its own from `root`.
    Bytes { root: usize, value: u64 },
    /// Every rank adds `value + rank`.
    Allreduce { value: u64 },
    /// Every rank contributes `[value, rank]`.
    Allgather { value: u64 },
    /// A lazy allreduce of `value + rank`, whose `prepare` fails on `failing`.
    Lazy { value: u64, failing: Option<usize> },
}

impl Call {
    fn draw(rng: &mut Rng, size: usize, index: usize) -> Call {
        let value = 1000 * (index as u64 + 1) + rng.below(1000);
        let root = rng.index(size);
        match rng.below(5) {
            0 => Call::Broadcast { root, value },
            1 => Call::Bytes { root, value },
            2 => Call::Allreduce { value },
            3 => Call::Allgather { value },
            _ => Call::Lazy {
                value,
                failing: rng.chance(50).then(|| rng.index(size)),
            },
        }
    }

    /// The byte string of a `Bytes` call: its length differs from call to call.
    fn object(value: u64) -> Vec<u8> {
        let len = 1 + (value % 97) as usize;
        (0..len).map(|i| (value as usize + i) as u8).collect()
    }
}

/// What a rank got from one call: `Ok(matches)`, whether the data was this call's.
type Got = Result<bool, CollectiveError>;

/// Runs `call` on `comm`, and says whether what came back is the call's data.
fn run(comm: &mut Communicator, call: Call) -> Got {
    let (rank, size) = (comm.rank() as u64, comm.world_size() as u64);
    match call {
        Call::Broadcast { root, value } => {
            let mut buf = if rank == root as u64 {
                [value, value + 1]
            } else {
                [0, 0]
            };
            comm.broadcast(&mut buf, root)?;
            Ok(buf == [value, value + 1])
        }
        Call::Bytes { root, value } => {
            let object = Call::object(value);
            let mut buf = if rank == root as u64 {
                object.clone()
            } else {
                Vec::new()
            };
            comm.broadcast_bytes(&mut buf, root)?;
            Ok(buf == object)
        }
        Call::Allreduce { value } => {
            let mut buf = [value + rank];
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            Ok(buf[0] == (0..size).map(|r| value + r).sum::<u64>())
        }
        Call::Allgather { value } => {
            let mut all = vec![0u64; 2 * size as usize];
            comm.allgather(&[value, rank], &mut all)?;
            let want: Vec<u64> = (0..size).flat_map(|r| [value, r]).collect();
            Ok(all == want)
        }
        Call::Lazy { value, failing } => {
            let mut buf = [0u64];
            comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |b| {
                if failing == Some(rank as usize) {
                    return Err("prepare raised");
                }
                b[0] = value + rank;
                Ok(())
            })?;
            // A call whose prepare failed anywhere must not return at all.
            Ok(failing.is_none() && buf[0] == (0..size).map(|r| value + r).sum::<u64>())
        }
    }
}

/// One seed's world: its calls, and the rank and call skipped, if any.
struct Program {
    size: usize,
    schedule: u64,
    calls: Vec<Call>,
    skip: Option<(usize, usize)>,
}

impl Program {
    fn draw(seed: u64) -> Program {
        let mut rng = Rng::new(seed);
        let size = 2 + rng.index(3);
        let count = 4 + rng.index(9);
        let calls = (0..count).map(|i| Call::draw(&mut rng, size, i)).collect();
        let skip = rng.chance(25).then(|| (rng.index(size), rng.index(count)));
        Program {
            size,
            schedule: rng.next_u64(),
            calls,
            skip,
        }
    }
}

/// Runs seed `seed` and checks the invariants.
fn world(seed: u64) -> Outcome {
    let program = Program::draw(seed);
    let mut trace = Trace::default();
    trace.note(
        Duration::ZERO,
        format!(
            "{} ranks, schedule {}, rank {:?} skips call {:?}",
            program.size,
            program.schedule,
            program.skip.map(|s| s.0),
            program.skip.map(|s| s.1)
        ),
    );
    for (i, call) in program.calls.iter().enumerate() {
        trace.note(Duration::ZERO, format!("call {i}: {call:?}"));
    }
    let options = CommOptions::default().with_timeout(Duration::from_secs(30));
    let (done, results) = mpsc::channel();
    let links = MemoryLink::world_with(program.size, MemorySchedule::Seeded(program.schedule));
    for link in links {
        let (calls, skip, done, options) = (
            program.calls.clone(),
            program.skip,
            done.clone(),
            options.clone(),
        );
        std::thread::spawn(move || {
            let mut comm = testing::over_link(Box::new(link), options);
            let rank = comm.rank();
            let got: Vec<Option<Got>> = calls
                .iter()
                .enumerate()
                .map(|(i, &call)| (skip != Some((rank, i))).then(|| run(&mut comm, call)))
                .collect();
            let _ = done.send((rank, got));
        });
    }
    drop(done);
    // Each rank's calls in the order it made them: (the program's call, what it got).
    let mut made: Vec<Vec<(usize, Got)>> = (0..program.size).map(|_| Vec::new()).collect();
    for _ in 0..program.size {
        let Ok((rank, got)) = results.recv_timeout(RANK_LIMIT) else {
            let broken = Err(format!("a rank did not end within {RANK_LIMIT:?}"));
            return Outcome::new(broken, trace);
        };
        for (i, got) in got.into_iter().enumerate() {
            match got {
                Some(got) => {
                    trace.note(Duration::ZERO, format!("rank {rank} call {i}: {got:?}"));
                    made[rank].push((i, got));
                }
                None => trace.note(Duration::ZERO, format!("rank {rank} call {i}: skipped")),
            }
        }
    }
    let mut broken = Ok(());
    for place in 0..program.calls.len() {
        let calls: Vec<Option<usize>> = made.iter().map(|m| m.get(place).map(|c| c.0)).collect();
        let same = calls.iter().all(|c| c.is_some() && *c == calls[0]);
        for (rank, m) in made.iter().enumerate() {
            if let (true, Some((i, Ok(false)))) = (same, m.get(place)) {
                broken = broken.and(Err(format!(
                    "rank {rank}'s call {i} ({:?}), which every rank made, returned Ok with \
                     data that is not the call's",
                    program.calls[*i]
                )));
            }
        }
    }
    Outcome::new(broken, trace)
}

#[test]
fn sim_calls_never_return_another_calls_data() {
    Campaign::new(
        "switchyard",
        "sim_calls_never_return_another_calls_data",
        BUDGET,
    )
    .in_test("it")
    .check(world);
}
