//! Ranks that call a collective differently fail, every one of them, within a second,
//! with an error naming the difference: lengths across every algorithm boundary,
//! operations, element types, call kinds, roots and tunings, at n = 5 and n = 3, on
//! the TCP data path, the ZeroMQ socket path, `local://` and the in-memory link; with
//! and without checked
//! mode ([`CommOptions::check`]), where no rank may ever return `Ok`.
//!
//! Every rank is a thread with its own communicator. The ranks start their call
//! together and keep their communicators open until every rank has returned: what is
//! tested is how fast a mismatch is seen, not how a rank that leaves is noticed.
//! The timeout is 5 s, so that a regression fails as a timeout rather than a hang.
//! The bound is 1 s per rank (the project machines have 2 cores shared with other
//! work; the calls here take milliseconds when they succeed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::testing::{self, MemoryLink, MemorySchedule};
use switchyard::collective::{CollectiveError, CommOptions, Communicator, DataPath, ReduceOp};

/// The most any rank may take to fail.
const BOUND: Duration = Duration::from_secs(1);

/// The world sizes tested: the 5 and another odd one.
const SIZES: [usize; 2] = [5, 3];

/// How the ranks reach each other.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "zmq"), allow(dead_code))]
enum Path {
    /// `tcp://` endpoints with the TCP data path (`StreamLink`).
    Stream,
    /// `tcp://` endpoints with everything through ZeroMQ (`SocketLink`).
    Socket,
    /// `local://` in-process queues (`SocketLink` on the local backend).
    Local,
    /// The deterministic in-memory link (`MemoryLink`, round-robin turns), whose
    /// ranks find out at once when nothing can come (so a regression there shows as
    /// a `PeerTimeout` that names no mismatch).
    Memory,
}

#[cfg(feature = "zmq")]
const PATHS: [Path; 4] = [Path::Stream, Path::Socket, Path::Local, Path::Memory];
#[cfg(not(feature = "zmq"))]
const PATHS: [Path; 2] = [Path::Local, Path::Memory];

static JOB: AtomicUsize = AtomicUsize::new(0);

fn options() -> CommOptions {
    CommOptions::default().with_timeout(Duration::from_secs(5))
}

/// One rank's outcome: its result and how long its call took.
type Outcome<R> = (Result<R, CollectiveError>, Duration);

/// Runs `call` once on `n` ranks over `path`, rank `r` with `options(r)`; returns
/// each rank's outcome in rank order.
fn run<R: Send + 'static>(
    path: Path,
    n: usize,
    options: impl Fn(usize) -> CommOptions,
    call: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<Outcome<R>> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    let call = Arc::new(call);
    let board = MemoryExchange::new(n);
    let memory = Arc::new(Mutex::new(
        MemoryLink::world_with(n, MemorySchedule::RoundRobin)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>(),
    ));
    let (bound, start, done) = (
        Arc::new(Barrier::new(n)),
        Arc::new(Barrier::new(n)),
        Arc::new(Barrier::new(n)),
    );
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let mut options = options(rank);
            let (call, board, memory) = (call.clone(), board.clone(), memory.clone());
            let (bound, start, done) = (bound.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                let comm = match path {
                    Path::Memory => {
                        let link = memory.lock().unwrap()[rank].take().expect("link");
                        bound.wait();
                        Ok(testing::over_link(Box::new(link), options))
                    }
                    Path::Local => {
                        let endpoints: Vec<String> = (0..n)
                            .map(|r| format!("local://mismatch-{}-{job}-{r}", std::process::id()))
                            .collect();
                        bound.wait();
                        Communicator::join(&Bootstrap::endpoints(rank, &endpoints), options)
                    }
                    Path::Stream | Path::Socket => {
                        options.data_path = match path {
                            Path::Stream => DataPath::Tcp,
                            _ => DataPath::Zmq,
                        };
                        // Port 0 on loopback, the real endpoints swapped on the board.
                        Communicator::join(&Bootstrap::from_exchange(rank, n, board), options)
                    }
                };
                // A rank whose setup failed still takes part in the barriers, so that
                // the others are not held up; its outcome is the setup's error.
                start.wait();
                let (result, took) = match comm {
                    Ok(mut comm) => {
                        let started = Instant::now();
                        let result = call(&mut comm);
                        let took = started.elapsed();
                        if let Path::Memory = path {
                            // An in-memory rank keeps the turn until it calls its link
                            // again or drops it; a closed one is no news to the others.
                            drop(comm);
                        }
                        done.wait();
                        (result, took)
                    }
                    Err(e) => {
                        done.wait();
                        (Err(e), Duration::ZERO)
                    }
                };
                (result, took)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a rank panicked"))
        .collect()
}

/// Asserts that every rank failed within [`BOUND`] with an error whose text holds
/// every one of `names` (the detecting rank's own error, or the abort notice that
/// carries it).
fn all_fail_naming<R: std::fmt::Debug>(case: &str, outcomes: &[Outcome<R>], names: &[&str]) {
    fail_naming(case, outcomes, names, &|_| false);
}

/// [`all_fail_naming`], except that the ranks for which `may_pass(rank)` holds
/// (ranks that receive nothing from a rank that called differently, which without
/// checked mode nothing tells of the mismatch) may return `Ok`, though also only
/// within [`BOUND`].
fn fail_naming<R: std::fmt::Debug>(
    case: &str,
    outcomes: &[Outcome<R>],
    names: &[&str],
    may_pass: &dyn Fn(usize) -> bool,
) {
    for (rank, (result, took)) in outcomes.iter().enumerate() {
        let error = match result {
            Err(e) => e.to_string(),
            Ok(_) if may_pass(rank) => {
                assert!(*took < BOUND, "{case}: rank {rank} took {took:?}");
                continue;
            }
            Ok(value) => panic!("{case}: rank {rank} returned Ok({value:?}) from a mismatch"),
        };
        for name in names {
            assert!(
                error.contains(name),
                "{case}: rank {rank}: {error:?} does not name {name:?}"
            );
        }
        assert!(*took < BOUND, "{case}: rank {rank} took {took:?}: {error}");
    }
}

/// Runs `case` in default and checked mode on every path and world size; in both,
/// every rank must fail naming `names(n)`.
fn every_rank_fails(
    case: &str,
    tune: impl Fn(usize, usize, CommOptions) -> CommOptions + Copy + Send + Sync + 'static,
    call: impl Fn(&mut Communicator) -> Result<(), CollectiveError> + Copy + Send + Sync + 'static,
    names: impl Fn(usize) -> Vec<String>,
) {
    every_rank_fails_in_checked_mode(case, |_| false, tune, call, names);
}

/// [`every_rank_fails`], except that without checked mode the ranks for which
/// `may_pass(rank)` holds may return `Ok` (see [`fail_naming`]); in checked mode
/// every rank must fail.
fn every_rank_fails_in_checked_mode(
    case: &str,
    may_pass: impl Fn(usize) -> bool,
    tune: impl Fn(usize, usize, CommOptions) -> CommOptions + Copy + Send + Sync + 'static,
    call: impl Fn(&mut Communicator) -> Result<(), CollectiveError> + Copy + Send + Sync + 'static,
    names: impl Fn(usize) -> Vec<String>,
) {
    for n in SIZES {
        for path in PATHS {
            for check in [false, true] {
                let label = format!("{case}, n = {n}, {path:?}, check {check}");
                let outcomes = run(path, n, |r| tune(n, r, options().with_check(check)), call);
                let names = names(n);
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let pass = |rank| !check && may_pass(rank);
                fail_naming(&label, &outcomes, &names, &pass);
            }
        }
    }
}

/// An allreduce of `len(n, rank)` f32 on each rank.
fn allreduce_of(
    len: impl Fn(usize, usize) -> usize + Copy + Send + Sync + 'static,
) -> impl Fn(&mut Communicator) -> Result<(), CollectiveError> + Copy + Send + Sync + 'static {
    move |comm| {
        let mut buf = vec![1.0f32; len(comm.world_size(), comm.rank())];
        comm.allreduce(&mut buf, ReduceOp::Sum)
    }
}

fn keep(_: usize, _: usize, o: CommOptions) -> CommOptions {
    o
}

/// 131072 f32 is 512 KiB, the default large threshold: rank 1 takes the direct
/// exchange (or the ring), the others recursive doubling. Their step tags never meet.
#[test]
fn a_length_across_the_large_threshold() {
    every_rank_fails(
        "large threshold",
        keep,
        allreduce_of(|_, r| if r == 1 { 131072 } else { 131071 }),
        |_| vec!["f32 x 131072".into(), "f32 x 131071".into()],
    );
}

/// With the large threshold at 0, a buffer of fewer elements than ranks still takes
/// recursive doubling: rank 1 with `n` elements takes the direct exchange.
#[test]
fn a_length_across_the_fewer_elements_than_ranks_fallback() {
    every_rank_fails(
        "len < n",
        |_, _, o| o.with_large_threshold(0),
        allreduce_of(|n, r| if r == 1 { n } else { n - 1 }),
        |n| vec![format!("f32 x {n})"), format!("f32 x {})", n - 1)],
    );
}

/// With `direct_max_ranks` just below the world, large allreduces take the ring: a
/// length across the threshold puts rank 0 on the ring, the others on doubling.
#[test]
fn a_length_across_the_threshold_onto_the_ring() {
    every_rank_fails(
        "ring",
        |n, _, o| o.with_large_threshold(4096).with_direct_max_ranks(n - 1),
        allreduce_of(|_, r| if r == 0 { 1024 } else { 1023 }),
        |_| vec!["f32 x 1024".into(), "f32 x 1023".into()],
    );
}

/// The direct/ring switch of allgather: one rank's block makes its total cross the
/// gather threshold.
#[test]
fn an_allgather_length_across_the_direct_ring_switch() {
    every_rank_fails(
        "allgather switch",
        |_, _, o| o.with_gather_threshold(4096),
        |comm: &mut Communicator| {
            let n = comm.world_size();
            let m = if comm.rank() == 2 { 1024 } else { 1 };
            let mine = vec![7u32; m];
            let mut out = vec![0u32; n * m];
            comm.allgather(&mine, &mut out)
        },
        |n| vec![format!("4-byte x {}", n * 1024), format!("4-byte x {n})")],
    );
}

/// A broadcast across the large threshold: tree on some ranks, direct on rank 1.
/// Only rank 1 receives from a rank that called differently (the root): without
/// checked mode the others get the root's data and cannot tell.
#[test]
fn a_broadcast_length_across_the_large_threshold() {
    every_rank_fails_in_checked_mode(
        "broadcast threshold",
        |rank| rank != 1,
        |_, _, o| o.with_large_threshold(4096),
        |comm: &mut Communicator| {
            let len = if comm.rank() == 1 { 1024 } else { 1023 };
            let mut buf = vec![comm.rank() as u32; len];
            comm.broadcast(&mut buf, 0)
        },
        |_| vec!["4-byte x 1024".into(), "4-byte x 1023".into()],
    );
}

/// The same call on ranks whose tunings differ: rank 0 takes the ring where the
/// others take the direct exchange (off the host board, which would take both).
#[test]
fn tunings_that_pick_different_algorithms() {
    every_rank_fails(
        "tuning",
        |_, r, o| {
            let o = o.with_large_threshold(4096).with_board_max_bytes(0);
            if r == 0 {
                o.with_direct_max_ranks(0)
            } else {
                o
            }
        },
        allreduce_of(|_, _| 2048),
        |_| vec!["by ring".into(), "by direct exchange".into()],
    );
}

/// On one host through shared memory, rank 0 keeps off the host board while the
/// others run the call on it: rank 0 waits for messages that never come, the others
/// for a slot rank 0 never writes. Each side sees the other's call where it looks
/// (the board's slot, the pipes' first message). Only the TCP data path has a board.
#[cfg(feature = "zmq")]
#[test]
fn a_rank_off_the_host_board() {
    for n in SIZES {
        for check in [false, true] {
            let label = format!("board, n = {n}, check {check}");
            let tune = move |r| {
                let o = options().with_check(check).with_large_threshold(4096);
                if r == 0 { o.with_board_max_bytes(0) } else { o }
            };
            let outcomes = run(Path::Stream, n, tune, allreduce_of(|_, _| 2048));
            all_fail_naming(&label, &outcomes, &["by host board", "by direct exchange"]);
        }
    }
}

#[test]
fn operations() {
    every_rank_fails(
        "op",
        keep,
        |comm: &mut Communicator| {
            let op = if comm.rank() == 3 % comm.world_size() {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let mut buf = vec![1.0f32; 1000];
            comm.allreduce(&mut buf, op)
        },
        |_| vec!["(Max, f32 x 1000)".into(), "(Sum, f32 x 1000)".into()],
    );
}

/// f32 and i32 have the same width: only the type tells them apart.
#[test]
fn element_types() {
    every_rank_fails(
        "dtype",
        keep,
        |comm: &mut Communicator| {
            if comm.rank() == 1 {
                comm.allreduce(&mut [1i32; 1000], ReduceOp::Sum)
            } else {
                comm.allreduce(&mut [1.0f32; 1000], ReduceOp::Sum)
            }
        },
        |_| vec!["(Sum, i32 x 1000)".into(), "(Sum, f32 x 1000)".into()],
    );
}

/// The two-byte floats are told apart from each other and from a user reduction of
/// `u16` (all three are two bytes wide).
#[test]
fn half_element_types() {
    use switchyard::half::{bf16, f16};
    every_rank_fails(
        "f16 against bf16",
        keep,
        |comm: &mut Communicator| {
            if comm.rank() == 1 {
                comm.allreduce(&mut [bf16::ONE; 1000], ReduceOp::Sum)
            } else {
                comm.allreduce(&mut [f16::ONE; 1000], ReduceOp::Sum)
            }
        },
        |_| vec!["(Sum, bf16 x 1000)".into(), "(Sum, f16 x 1000)".into()],
    );
    every_rank_fails(
        "f16 against u16",
        keep,
        |comm: &mut Communicator| {
            if comm.rank() == 1 {
                comm.allreduce_with(&mut [1u16; 1000], |a, b| *a = a.wrapping_add(*b))
            } else {
                comm.allreduce(&mut [f16::ONE; 1000], ReduceOp::Sum)
            }
        },
        |_| {
            vec![
                "(user fn, 2-byte x 1000)".into(),
                "(Sum, f16 x 1000)".into(),
            ]
        },
    );
}

/// Rank 0 broadcasts (it only sends, so only checked mode tells it) while the others
/// allreduce; and a barrier against an allreduce.
#[test]
fn call_kinds() {
    every_rank_fails_in_checked_mode(
        "broadcast vs allreduce",
        |rank| rank == 0,
        keep,
        |comm: &mut Communicator| {
            let mut buf = vec![1.0f32; 1000];
            if comm.rank() == 0 {
                comm.broadcast(&mut buf, 0)
            } else {
                comm.allreduce(&mut buf, ReduceOp::Sum)
            }
        },
        |_| {
            vec![
                "broadcast(4-byte x 1000, root 0)".into(),
                "allreduce(Sum, f32 x 1000)".into(),
            ]
        },
    );
    every_rank_fails(
        "barrier vs allreduce",
        keep,
        |comm: &mut Communicator| {
            if comm.rank() == 2 {
                comm.barrier()
            } else {
                comm.allreduce(&mut [1u64; 4], ReduceOp::Sum)
            }
        },
        |_| vec!["barrier()".into(), "allreduce(Sum, u64 x 4)".into()],
    );
}

/// One rank in checked mode, the others not: their first messages to each other
/// disagree, which is already the barrier that ends the communicator's setup. Every
/// rank fails, in the setup or the call; a rank that saw the difference names it
/// (the others may see only that rank leave).
#[test]
fn checked_mode_on_one_rank_only() {
    for n in SIZES {
        for path in PATHS {
            let label = format!("one checked, n = {n}, {path:?}");
            let outcomes = run(
                path,
                n,
                |r| options().with_check(r == 1),
                |comm: &mut Communicator| comm.allreduce(&mut [1.0f32; 100], ReduceOp::Sum),
            );
            let errors: Vec<String> = outcomes
                .iter()
                .map(|(result, _)| match result {
                    Err(e) => e.to_string(),
                    Ok(()) => panic!("{label}: a rank returned Ok: {outcomes:?}"),
                })
                .collect();
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains(", checked") && e.contains(", unchecked")),
                "{label}: {errors:#?}"
            );
        }
    }
}

/// The case: rank 0 broadcasts from root 0, the others from root 1. Rank 0
/// and rank 1 only send, so without checked mode they cannot notice; in checked mode
/// every rank fails.
#[test]
fn different_roots_fail_everywhere_in_checked_mode() {
    for n in SIZES {
        for path in PATHS {
            let label = format!("roots, n = {n}, {path:?}");
            let outcomes = run(
                path,
                n,
                |_| options().with_check(true),
                |comm: &mut Communicator| {
                    let root = usize::from(comm.rank() != 0);
                    let mut buf = vec![comm.rank() as f32; 1000];
                    comm.broadcast(&mut buf, root)
                },
            );
            all_fail_naming(&label, &outcomes, &["root 0)", "root 1)"]);
        }
    }
}

/// Without checked mode a receiver still checks the root: the last rank names root
/// 1 where everyone else names root 0. In the tree from root 0 its parent is rank 0;
/// in the tree from root 1 it waits for a rank that never sends to it. It must fail
/// at rank 0's message, and no rank may return `Ok` with data other than rank 0's.
#[test]
fn a_receiver_with_another_root_fails_without_checked_mode() {
    for n in SIZES {
        for path in PATHS {
            let label = format!("receiver root, n = {n}, {path:?}");
            let outcomes = run(
                path,
                n,
                |_| options(),
                move |comm: &mut Communicator| {
                    let root = usize::from(comm.rank() == n - 1);
                    let mut buf = vec![comm.rank() as f32 + 1.0; 1000];
                    comm.broadcast(&mut buf, root)?;
                    Ok(buf[0])
                },
            );
            let (last, took) = &outcomes[n - 1];
            match last {
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("root 0)") && text.contains("root 1)"),
                        "{label}: {text}"
                    );
                }
                Ok(v) => panic!("{label}: the last rank returned Ok({v})"),
            }
            assert!(*took < BOUND, "{label}: {took:?}");
            for (rank, (result, took)) in outcomes.iter().enumerate() {
                assert!(*took < BOUND, "{label}: rank {rank} took {took:?}");
                if let Ok(v) = result {
                    assert_eq!(*v, 1.0, "{label}: rank {rank} got another root's data");
                }
            }
        }
    }
}

/// The same calls with the same arguments succeed in checked mode, on every call
/// kind, and give the same results as without it.
#[test]
fn checked_mode_passes_matching_calls() {
    for n in SIZES {
        for path in PATHS {
            let outcomes = run(
                path,
                n,
                |_| options().with_check(true).with_large_threshold(4096),
                |comm: &mut Communicator| {
                    let (n, r) = (comm.world_size(), comm.rank());
                    let mut small = [r as f32; 3];
                    comm.allreduce(&mut small, ReduceOp::Sum)?;
                    let mut large = vec![1u32; 4096];
                    comm.allreduce(&mut large, ReduceOp::Sum)?;
                    let mut b = vec![r as u8; 10_000];
                    comm.broadcast(&mut b, n - 1)?;
                    let mut out = vec![0u16; 2 * n];
                    comm.allgather(&[r as u16; 2], &mut out)?;
                    let mut rs = vec![1i64; 2 * n + 1];
                    let mine = comm.reduce_scatter(&mut rs, ReduceOp::Sum)?;
                    comm.barrier()?;
                    let mut folded = [r as u64];
                    comm.allreduce_with(&mut folded, |acc, next| *acc += *next)?;
                    Ok((small[0], large[0], b[0], out, rs[mine.start], folded[0]))
                },
            );
            let expected_fold = (0..n as u64).sum::<u64>();
            for (rank, (result, _)) in outcomes.into_iter().enumerate() {
                let (small, large, b, out, rs, folded) =
                    result.unwrap_or_else(|e| panic!("n = {n}, {path:?}, rank {rank}: {e}"));
                assert_eq!(small, (n * (n - 1) / 2) as f32);
                assert_eq!(large, n as u32);
                assert_eq!(b, (n - 1) as u8);
                let gathered: Vec<u16> = (0..n).flat_map(|r| [r as u16; 2]).collect();
                assert_eq!(out, gathered);
                assert_eq!(rs, n as i64);
                assert_eq!(folded, expected_fold);
            }
        }
    }
}
