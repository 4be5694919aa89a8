//! A communicator used after a failed call: rank 1's `prepare` fails in a lazy
//! allreduce, every rank catches the error and goes on with a fixed sequence of
//! broadcasts and allreduces (a notebook, a try/except loop). No later call on any
//! rank may return another call's data: each either returns this call's result or
//! fails. Three ranks as threads, over the host board (shared memory), the TCP data
//! path without shared memory, ZeroMQ, `local://`, the in-memory link, and robust
//! mode over the in-memory link.
//!
//! The calls interleave the same way on every run (a rank returns by its timeout at
//! the latest, so nothing can hang): the ranks other than rank 0 start a call once
//! rank 0 has returned from the one before (the order that let a rank one board call
//! behind read rank 0's previous call as its current one), and for a byte string
//! rank 0 starts only once the others have returned from it (the order that let them
//! fail the first half of the broadcast, the length, which rank 0 then finished, and
//! take rank 0's next halves for their own).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::testing::{self, MemoryLink, MemorySchedule};
use switchyard::collective::{
    CollectiveError, CommOptions, Communicator, DataPath, ReduceOp, RobustOptions,
};

const SIZE: usize = 3;
/// The rank whose `prepare` fails.
const FAILING: usize = 1;
/// The silence timeout of every call.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The longest a rank waits for rank 0 to return from a call.
const FOLLOW: Duration = Duration::from_secs(60);

static JOB: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, Debug)]
enum Path {
    /// `tcp://` endpoints, every rank on this host: small calls on the host board.
    Board,
    /// The TCP data path with shared memory off.
    Tcp,
    /// Everything through ZeroMQ.
    Zmq,
    /// `local://` in-process queues.
    Local,
    /// The deterministic in-memory link.
    Memory,
    /// Robust mode over the in-memory link.
    Robust,
}

/// One later call and what every rank must get from it, unless it fails.
#[derive(Clone, Copy, Debug)]
enum Later {
    /// A broadcast of one `u64` from rank 0.
    Broadcast(u64),
    /// An allreduce (sum) of `[value + rank]`.
    Allreduce(u64),
    /// A byte string from rank 0 (two engine calls: the length, then the bytes), as
    /// the Python package broadcasts an object.
    Bytes(u64),
}

/// The calls after the failed one: runs of one kind, so that a rank a call behind
/// would meet a call of the same signature.
const LATER: [Later; 9] = [
    Later::Broadcast(11),
    Later::Broadcast(12),
    Later::Broadcast(13),
    Later::Allreduce(100),
    Later::Allreduce(200),
    Later::Allreduce(300),
    Later::Bytes(21),
    Later::Bytes(22),
    Later::Bytes(23),
];

impl Later {
    /// Whether rank 0 starts this call only once every other rank has returned from
    /// it. The others always start a call once rank 0 has returned from the one
    /// before.
    fn others_first(self) -> bool {
        matches!(self, Later::Bytes(_))
    }
}

/// How many later calls each rank has returned from.
type Progress = Arc<(Mutex<[usize; SIZE]>, Condvar)>;

fn returned(progress: &Progress, rank: usize, calls: usize) {
    let (counts, changed) = &**progress;
    counts.lock().unwrap()[rank] = calls;
    changed.notify_all();
}

/// Waits until every rank of `ranks` has returned from `calls` later calls.
fn wait_for(progress: &Progress, ranks: &[usize], calls: usize) {
    let (counts, changed) = &**progress;
    let (counts, timeout) = changed
        .wait_timeout_while(counts.lock().unwrap(), FOLLOW, |c| {
            ranks.iter().any(|&r| c[r] < calls)
        })
        .unwrap();
    assert!(
        !timeout.timed_out(),
        "ranks {ranks:?} did not return from call {calls} in {FOLLOW:?} (at {:?})",
        *counts
    );
}

/// What rank `rank` got from one later call: `Ok(what it should get)` is checked
/// by the caller.
fn later_call(comm: &mut Communicator, call: Later) -> Result<(u64, u64), CollectiveError> {
    let rank = comm.rank() as u64;
    match call {
        Later::Broadcast(value) => {
            let mut buf = [if rank == 0 { value } else { 0 }];
            comm.broadcast(&mut buf, 0)?;
            Ok((buf[0], value))
        }
        Later::Allreduce(value) => {
            let mut buf = [value + rank];
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            let expected = (0..SIZE as u64).map(|r| value + r).sum();
            Ok((buf[0], expected))
        }
        Later::Bytes(value) => {
            let object = format!("object number {value:04}").into_bytes();
            let mut buf = if rank == 0 {
                object.clone()
            } else {
                Vec::new()
            };
            comm.broadcast_bytes(&mut buf, 0)?;
            let got = if buf == object { value } else { u64::MAX };
            Ok((got, value))
        }
    }
}

/// One rank's story: the failed call's outcome, then each later call's.
struct Story {
    failed: Result<(), CollectiveError>,
    later: Vec<Result<(u64, u64), CollectiveError>>,
}

fn communicator(
    path: Path,
    rank: usize,
    exchange: MemoryExchange,
    memory: &Mutex<Vec<Option<MemoryLink>>>,
    job: usize,
) -> Communicator {
    // No spin: a rank whose data is not there yet looks at its abort notices at once.
    let options = CommOptions::default()
        .with_timeout(TIMEOUT)
        .with_direct_max_ranks(0)
        .with_spin(Duration::ZERO);
    let from_exchange = |options: CommOptions| {
        Communicator::join(&Bootstrap::from_exchange(rank, SIZE, exchange), options)
    };
    match path {
        Path::Board => from_exchange(options.with_data_path(DataPath::Tcp)).unwrap(),
        Path::Tcp => from_exchange(
            options
                .with_data_path(DataPath::Tcp)
                .with_shared_memory(false),
        )
        .unwrap(),
        Path::Zmq => from_exchange(options.with_data_path(DataPath::Zmq)).unwrap(),
        Path::Local => {
            let endpoints: Vec<String> = (0..SIZE)
                .map(|r| format!("local://failed-call-{}-{job}-{r}", std::process::id()))
                .collect();
            Communicator::join(&Bootstrap::endpoints(rank, &endpoints), options).unwrap()
        }
        Path::Memory | Path::Robust => {
            let link = memory.lock().unwrap()[rank].take().expect("link");
            if let Path::Robust = path {
                testing::robust_over_link(Box::new(link), options, RobustOptions::default())
            } else {
                testing::over_link(Box::new(link), options)
            }
        }
    }
}

/// Runs the story on every rank over `path`.
fn stories(path: Path) -> Vec<Story> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    let exchange = MemoryExchange::new(SIZE);
    let memory = Arc::new(Mutex::new(
        MemoryLink::world_with(SIZE, MemorySchedule::RoundRobin)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>(),
    ));
    let progress: Progress = Arc::default();
    let ranks: Vec<_> = (0..SIZE)
        .map(|rank| {
            let (exchange, memory, progress) = (exchange.clone(), memory.clone(), progress.clone());
            std::thread::spawn(move || {
                let mut comm = communicator(path, rank, exchange, &memory, job);
                let mut grad = [0.0f32; 4];
                let failed = comm.try_allreduce_lazy(&mut grad, ReduceOp::Sum, |buf| {
                    if rank == FAILING {
                        return Err("ValueError: prepare_fun raised");
                    }
                    buf.fill(1.0);
                    Ok(())
                });
                let mut later = Vec::new();
                let others: Vec<usize> = (1..SIZE).collect();
                for (i, &call) in LATER.iter().enumerate() {
                    if rank != 0 {
                        wait_for(&progress, &[0], i);
                    } else if call.others_first() {
                        wait_for(&progress, &others, i + 1);
                    }
                    later.push(later_call(&mut comm, call));
                    returned(&progress, rank, i + 1);
                }
                Story { failed, later }
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().expect("rank")).collect()
}

/// Every rank's failed call failed, rank `FAILING`'s with its own `PrepareFailed`,
/// the others' naming it, and no later call on any rank returned another call's
/// data: outside robust mode every one was refused.
fn no_later_call_returns_another_calls_data(path: Path) {
    let started = Instant::now();
    let stories = stories(path);
    let mut wrong = Vec::new();
    for (rank, story) in stories.iter().enumerate() {
        match (&story.failed, rank) {
            (Err(CollectiveError::PrepareFailed { rank: r, .. }), FAILING) => {
                assert_eq!(*r, FAILING);
            }
            // The others are told why, not misled by the failing rank's next call
            // (not checked on the in-memory link, where a peer may report the
            // silence instead, nor in robust mode, which recovers).
            (Err(e), r) if r != FAILING => assert!(
                matches!(path, Path::Memory | Path::Robust)
                    || e.to_string().contains("prepare failed on rank 1"),
                "{path:?}: rank {rank}: {e}"
            ),
            (other, _) => panic!("{path:?}: rank {rank}'s failed call returned {other:?}"),
        }
        if !matches!(path, Path::Robust) {
            // Every rank's call failed: every later call is refused, touching nothing.
            for (call, result) in LATER.iter().zip(&story.later) {
                assert!(
                    matches!(result, Err(CollectiveError::Poisoned { .. })),
                    "{path:?}: rank {rank}, {call:?}: {result:?}"
                );
            }
        }
        for (call, result) in LATER.iter().zip(&story.later) {
            if let Ok((got, expected)) = result {
                if got != expected {
                    wrong.push(format!(
                        "rank {rank}, {call:?}: got {got}, expected {expected}"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{path:?}: later calls returned another call's data:\n{}",
        wrong.join("\n")
    );
    eprintln!("{path:?}: {:?}", started.elapsed());
}

#[test]
fn after_a_failed_prepare_no_call_on_the_host_board_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Board);
}

#[test]
fn after_a_failed_prepare_no_call_over_tcp_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Tcp);
}

#[test]
fn after_a_failed_prepare_no_call_over_zeromq_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Zmq);
}

#[test]
fn after_a_failed_prepare_no_call_over_local_queues_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Local);
}

#[test]
fn after_a_failed_prepare_no_call_over_the_memory_link_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Memory);
}

#[test]
fn after_a_failed_prepare_no_robust_call_returns_another_calls_data() {
    no_later_call_returns_another_calls_data(Path::Robust);
}
