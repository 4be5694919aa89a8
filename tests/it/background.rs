//! Calls that return at once (`Communicator::into_background`): the same results as
//! the blocking calls, in issue order whatever the waits, errors and poisoning as
//! the blocking API, a panic on the communication thread as an error, and the
//! overlap itself: a rank's call progresses while the rank's own thread is busy
//! elsewhere. Ranks are threads of this process over `local://` queues.
//!
//! No test sleeps: every wait is bounded by a timeout that only a broken build
//! reaches, and where a test shows that something has *not* happened (a call held
//! back by a peer that has not called yet), the peer is held by a channel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};
use switchyard::bootstrap::Bootstrap;
use switchyard::collective::{
    BackgroundCommunicator, Call, CollectiveError, CommOptions, Communicator, ReduceOp,
};
use switchyard::half::{bf16, f16};

static JOB: AtomicUsize = AtomicUsize::new(0);

/// The longest any rank waits for a peer or a handle: reached only by a broken build.
const BOUND: Duration = Duration::from_secs(30);

/// Bootstraps for a fresh job of `n` ranks over `local://`.
fn boots(n: usize) -> Vec<Bootstrap> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    let endpoints: Vec<String> = (0..n)
        .map(|r| format!("local://background-{}-{job}-{r}", std::process::id()))
        .collect();
    (0..n)
        .map(|r| Bootstrap::endpoints(r, &endpoints))
        .collect()
}

fn join(boot: &Bootstrap) -> Communicator {
    Communicator::join(boot, CommOptions::default().with_timeout(BOUND)).unwrap()
}

/// Runs `body` on `n` ranks, each a thread with its own communicator; returns their
/// results in rank order.
fn on_ranks<R: Send + 'static>(
    n: usize,
    body: impl Fn(Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let body = Arc::new(body);
    let ranks: Vec<_> = boots(n)
        .into_iter()
        .map(|boot| {
            let body = body.clone();
            thread::spawn(move || body(join(&boot)))
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Rank `r`'s inputs: values that differ per rank and element, with fractions that
/// make the two-byte floats round.
fn inputs(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| r as f32 * 1.37 + i as f32 * 0.11).collect()
}

/// One of every call, blocking: each call's result as bytes (reduce-scatter: this
/// rank's block only, the rest is unspecified).
fn blocking_calls(mut comm: Communicator) -> Vec<Vec<u8>> {
    let r = comm.rank();
    let mut out = Vec::new();
    let mut a = inputs(r, 5);
    comm.allreduce(&mut a, ReduceOp::Sum).unwrap();
    out.push(bytes(&a));
    let mut b: Vec<f64> = inputs(r, 3).iter().map(|&x| -f64::from(x)).collect();
    comm.allreduce(&mut b, ReduceOp::Max).unwrap();
    out.push(bytes(&b));
    let mut c = vec![r as u64 + 3, 1 << r];
    comm.allreduce(&mut c, ReduceOp::BitOr).unwrap();
    out.push(bytes(&c));
    let mut h: Vec<f16> = inputs(r, 9).into_iter().map(f16::from_f32).collect();
    comm.allreduce(&mut h, ReduceOp::Sum).unwrap();
    out.push(bytes(&h));
    let mut g: Vec<bf16> = inputs(r, 9).into_iter().map(bf16::from_f32).collect();
    comm.allreduce(&mut g, ReduceOp::Sum).unwrap();
    out.push(bytes(&g));
    let mut d = vec![r as i32 * 10; 4];
    comm.broadcast(&mut d, 2).unwrap();
    out.push(bytes(&d));
    let mut e = if r == 1 {
        b"from one".to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(&mut e, 1).unwrap();
    out.push(e);
    let mut f = vec![0u32; 2 * comm.world_size()];
    comm.allgather(&[r as u32, 7], &mut f).unwrap();
    out.push(bytes(&f));
    let mut s = inputs(r, 7);
    let mine = comm.reduce_scatter(&mut s, ReduceOp::Sum).unwrap();
    out.push(bytes(&s[mine]));
    comm.barrier().unwrap();
    out
}

/// The calls of [`blocking_calls`], all issued before any is waited on, waited on
/// last to first.
fn background_calls(comm: Communicator) -> Vec<Vec<u8>> {
    let mut comm = comm.into_background().unwrap();
    let r = comm.rank();
    assert_eq!(comm.world_size(), 3);
    let a = comm.allreduce(inputs(r, 5), ReduceOp::Sum);
    let b: Vec<f64> = inputs(r, 3).iter().map(|&x| -f64::from(x)).collect();
    let b = comm.allreduce(b, ReduceOp::Max);
    let c = comm.allreduce(vec![r as u64 + 3, 1 << r], ReduceOp::BitOr);
    let h = comm.allreduce(
        inputs(r, 9).into_iter().map(f16::from_f32).collect(),
        ReduceOp::Sum,
    );
    let g = comm.allreduce(
        inputs(r, 9).into_iter().map(bf16::from_f32).collect(),
        ReduceOp::Sum,
    );
    let d = comm.broadcast(vec![r as i32 * 10; 4], 2);
    let e = comm.broadcast_bytes(
        if r == 1 {
            b"from one".to_vec()
        } else {
            Vec::new()
        },
        1,
    );
    let f = comm.allgather(vec![r as u32, 7]);
    let s = comm.reduce_scatter(inputs(r, 7), ReduceOp::Sum);
    let barrier = comm.barrier();
    barrier.wait().unwrap();
    let (s, mine) = s.wait().unwrap();
    let mut out = vec![
        bytes(&s[mine]),
        bytes(&f.wait().unwrap()),
        e.wait().unwrap(),
        bytes(&d.wait().unwrap()),
        bytes(&g.wait().unwrap()),
        bytes(&h.wait().unwrap()),
        bytes(&c.wait().unwrap()),
        bytes(&b.wait().unwrap()),
        bytes(&a.wait().unwrap()),
    ];
    out.reverse();
    out
}

#[test]
fn every_call_returns_what_the_blocking_call_returns() {
    let blocking = on_ranks(3, blocking_calls);
    let background = on_ranks(3, background_calls);
    assert_eq!(background, blocking);
    // The results are the collectives' and not, say, each rank's own input.
    assert_eq!(blocking[0][5], bytes(&[20i32; 4]));
    assert_eq!(blocking[2][6], b"from one");
    assert_eq!(blocking[1][7], bytes(&[0u32, 7, 1, 7, 2, 7]));
}

/// Twenty allreduces of different values, a third of the handles dropped unread,
/// the rest waited on last to first: each handle returns its own call's sum.
#[test]
fn calls_run_in_issue_order_whatever_is_waited_on() {
    let results = on_ranks(2, |comm| {
        let mut comm = comm.into_background().unwrap();
        let r = comm.rank() as u64;
        let mut kept = Vec::new();
        for k in 0..20u64 {
            let pending = comm.allreduce(vec![k * 10 + r, k], ReduceOp::Sum);
            if k % 3 == 1 {
                drop(pending);
            } else {
                kept.push((k, pending));
            }
        }
        kept.into_iter()
            .rev()
            .map(|(k, pending)| (k, pending.wait().unwrap()))
            .collect::<Vec<_>>()
    });
    for got in results {
        assert_eq!(got.len(), 13);
        for (k, sum) in got {
            assert_eq!(sum, [k * 20 + 1, 2 * k], "call {k}");
        }
    }
}

/// Rank 0 issues an allreduce and, before it waits on it, waits (bounded) to hear
/// that rank 1's blocking allreduce of the same call has returned. Rank 1's call
/// cannot return before rank 0's data has reached it, and rank 0's own thread is
/// busy here all along: the call must have run on rank 0's communication thread.
/// Small (recursive doubling) and large (ring) buffers.
#[test]
fn a_call_progresses_while_its_rank_is_busy() {
    for len in [4usize, 1 << 18] {
        let [boot0, boot1]: [Bootstrap; 2] = boots(2).try_into().unwrap();
        let (returned, heard) = mpsc::channel();
        let rank1 = thread::spawn(move || {
            let mut comm = join(&boot1);
            let mut buf = vec![2.0f32; len];
            comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            returned.send(buf).unwrap();
            comm
        });
        let mut comm = join(&boot0).into_background().unwrap();
        let pending = comm.allreduce(vec![1.0f32; len], ReduceOp::Sum);
        let theirs = heard.recv_timeout(BOUND).expect(
            "rank 1's allreduce did not return while rank 0 had not waited on its own: \
             the call did not progress in the background",
        );
        assert!(!theirs.is_empty() && theirs.iter().all(|&x| x == 3.0));
        assert!(pending.wait_timeout(BOUND));
        let ours = pending.wait().unwrap();
        assert!(!ours.is_empty() && ours.iter().all(|&x| x == 3.0));
        drop(rank1.join().unwrap());
    }
}

/// The premise of the test above: a rank whose thread is busy before its blocking
/// call holds its peer's call back, so the peer is not heard from within the wait.
#[test]
fn a_blocking_call_not_yet_made_holds_the_peer_back() {
    let [boot0, boot1]: [Bootstrap; 2] = boots(2).try_into().unwrap();
    let (returned, heard) = mpsc::channel();
    let rank1 = thread::spawn(move || {
        let mut comm = join(&boot1);
        let mut buf = [2.0f32; 4];
        comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
        returned.send(buf).unwrap();
    });
    let mut comm = join(&boot0);
    assert!(matches!(
        heard.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout)
    ));
    let mut buf = [1.0f32; 4];
    comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
    assert_eq!(heard.recv_timeout(BOUND).unwrap(), [3.0; 4]);
    rank1.join().unwrap();
}

/// A handle tells a call in flight from a finished one without blocking for
/// longer than asked: rank 1 is held back until rank 0 has looked.
#[test]
fn wait_timeout_and_is_done_tell_a_call_in_flight() {
    let [boot0, boot1]: [Bootstrap; 2] = boots(2).try_into().unwrap();
    let (go, told) = mpsc::channel::<()>();
    let rank1 = thread::spawn(move || {
        let mut comm = join(&boot1);
        told.recv_timeout(BOUND).unwrap();
        comm.barrier().unwrap();
    });
    let mut comm = join(&boot0).into_background().unwrap();
    let pending = comm.barrier();
    let started = Instant::now();
    assert!(!pending.wait_timeout(Duration::from_millis(50)));
    assert!(started.elapsed() < BOUND);
    assert!(!pending.wait_deadline(Instant::now()));
    assert!(!pending.is_done());
    assert!(
        format!("{pending:?}").contains("done: false"),
        "{pending:?}"
    );
    go.send(()).unwrap();
    assert!(pending.wait_timeout(BOUND));
    assert!(pending.is_done());
    pending.wait().unwrap();
    rank1.join().unwrap();
}

/// Rank 1's `prepare` fails: its handle returns `PrepareFailed`, rank 0's the abort
/// naming rank 1, and every call issued after it, on both ranks, is refused naming
/// the first failure; the communicator handed back is poisoned.
#[test]
fn a_failed_call_fails_its_handle_and_refuses_the_later_ones() {
    let results = on_ranks(2, |comm| {
        let mut comm = comm.into_background().unwrap();
        let rank = comm.rank();
        let first = comm.allreduce(vec![1u32], ReduceOp::Sum);
        let lazy = comm.submit(Call::Allreduce, move |comm| {
            let mut buf = [0u32; 3];
            comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |buf| {
                if rank == 1 {
                    return Err("no input today");
                }
                buf.fill(1);
                Ok(())
            })?;
            Ok(buf)
        });
        let later = [
            comm.allreduce(vec![1u32], ReduceOp::Sum).wait(),
            comm.broadcast(vec![1u32], 0).wait(),
            comm.allgather(vec![1u32]).wait(),
        ];
        let barrier = comm.barrier();
        let back = comm.into_inner();
        (
            first.wait(),
            lazy.wait(),
            later,
            barrier.wait(),
            back.wait(),
        )
    });
    for (rank, (first, lazy, later, barrier, back)) in results.into_iter().enumerate() {
        assert_eq!(first.unwrap(), [2]);
        let lazy = lazy.unwrap_err();
        if rank == 1 {
            assert!(
                matches!(lazy, CollectiveError::PrepareFailed { rank: 1, .. }),
                "{lazy}"
            );
        }
        assert!(
            lazy.to_string().contains("prepare failed on rank 1"),
            "{lazy}"
        );
        let refusals = later.into_iter().map(|r| r.map(|_| ())).chain([barrier]);
        for refused in refusals {
            match refused {
                Err(CollectiveError::Poisoned { first, .. }) => {
                    assert!(first.contains("prepare failed on rank 1"), "{first}");
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
        assert!(back.unwrap().is_poisoned());
    }
}

/// Arguments refused before any traffic leave the communicator usable, as with the
/// blocking calls.
#[test]
fn refused_arguments_leave_it_usable() {
    let mut comm = Communicator::solo().into_background().unwrap();
    let wrong_root = comm.broadcast(vec![1u8], 3);
    let no_bitor = comm.allreduce(vec![1.5f32], ReduceOp::BitOr);
    let fine = comm.allreduce(vec![1.5f32], ReduceOp::Max);
    assert!(matches!(
        wrong_root.wait(),
        Err(CollectiveError::InvalidArgument { .. })
    ));
    assert!(matches!(
        no_bitor.wait(),
        Err(CollectiveError::InvalidArgument { .. })
    ));
    assert_eq!(fine.wait().unwrap(), [1.5]);
    assert!(!comm.into_inner().wait().unwrap().is_poisoned());
}

/// A panic on the communication thread is its call's error and poisons the
/// communicator; the thread goes on serving, and hands the communicator back.
#[test]
fn a_panic_on_the_thread_is_an_error_never_a_hang() {
    let mut comm = Communicator::solo().into_background().unwrap();
    let boom = comm.submit::<(), _>(Call::Broadcast, |_| panic!("boom"));
    let owned = comm.submit::<(), _>(Call::Allgather, |_| panic!("{}", "boom, owned"));
    let after = comm.barrier();
    assert!(after.wait_timeout(BOUND));
    let e = boom.wait().unwrap_err();
    assert!(
        matches!(
            e,
            CollectiveError::Aborted {
                call: Call::Broadcast,
                rank: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains(
            "broadcast: rank 0 aborted the call: the communication thread panicked: boom"
        ),
        "{e}"
    );
    // Issued after the first panic: refused, not run.
    assert!(matches!(
        owned.wait(),
        Err(CollectiveError::Poisoned { .. })
    ));
    match after.wait() {
        Err(CollectiveError::Poisoned { first, .. }) => {
            assert!(first.contains("panicked: boom"), "{first}");
        }
        other => panic!("{other:?}"),
    }
    let back = comm.into_inner();
    assert!(back.wait_timeout(BOUND));
    assert!(back.wait().unwrap().is_poisoned());
}

/// Dropping the background communicator runs the calls already issued, handles
/// dropped or not, before it returns.
#[test]
fn dropping_it_finishes_the_issued_calls_then_joins() {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut comm = Communicator::solo().into_background().unwrap();
    for _ in 0..50 {
        let ran = ran.clone();
        drop(comm.submit(Call::Barrier, move |comm| {
            comm.barrier()?;
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
    }
    drop(comm);
    assert_eq!(ran.load(Ordering::SeqCst), 50);

    // Across ranks: rank 0's call, handle and communicator dropped at once, still
    // gives rank 1 its sum.
    let sums = on_ranks(2, |comm| {
        let rank = comm.rank();
        if rank == 0 {
            let mut comm: BackgroundCommunicator = comm.into_background().unwrap();
            drop(comm.allreduce(vec![5u64], ReduceOp::Sum));
            drop(comm);
            None
        } else {
            let mut comm = comm;
            let mut buf = [6u64];
            comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            Some(buf)
        }
    });
    assert_eq!(sums, [None, Some([11])]);
}
