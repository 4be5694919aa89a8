//! The mesh engine's collectives against sequential references, with every rank a
//! thread of this process (over in-process queues unless a test says otherwise).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp, Reducible};

static JOB: AtomicUsize = AtomicUsize::new(0);

/// Endpoints for a fresh job of `n` ranks over `scheme` (`local` or `inproc`).
fn endpoints(scheme: &str, n: usize) -> Vec<String> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|r| format!("{scheme}://collective-test-{}-{job}-{r}", std::process::id()))
        .collect()
}

/// Every rank binds port 0, then all swap their real endpoints through `board`.
fn tcp_mesh(
    rank: usize,
    n: usize,
    board: &(Mutex<Vec<String>>, Barrier),
    options: CommOptions,
) -> Result<Communicator, CollectiveError> {
    let builder = Communicator::bind_mesh(rank, n, "tcp://127.0.0.1:0", options)?;
    board.0.lock().expect("board")[rank] = builder.endpoint().to_string();
    board.1.wait();
    let endpoints = board.0.lock().expect("board").clone();
    builder.connect(&endpoints)
}

fn options() -> CommOptions {
    CommOptions::default().with_timeout(Duration::from_secs(20))
}

/// Runs `body` on `n` ranks, each a thread with its own communicator, and returns
/// their results in rank order.
fn on_ranks<R: Send + 'static>(
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    on_ranks_over("local", n, options, body)
}

fn on_ranks_over<R: Send + 'static>(
    scheme: &str,
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    let endpoints = endpoints(scheme, n);
    let body = Arc::new(body);
    let board = Arc::new((Mutex::new(vec![String::new(); n]), Barrier::new(n)));
    let tcp = scheme == "tcp";
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (endpoints, body, options) = (endpoints.clone(), body.clone(), options.clone());
            let board = board.clone();
            std::thread::spawn(move || {
                let mut comm = if tcp {
                    tcp_mesh(rank, n, &board, options)?
                } else {
                    Communicator::mesh(rank, &endpoints, options)?
                };
                assert_eq!(comm.rank(), rank);
                assert_eq!(comm.world_size(), n);
                assert_eq!(comm.is_distributed(), n > 1);
                body(&mut comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(rank, h)| match h.join() {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => panic!("rank {rank}: {e}"),
            Err(_) => panic!("rank {rank} panicked"),
        })
        .collect()
}

/// Rank `rank`'s input: small integers, so that float sums and products are exact in
/// any order and integer products stay in range for the world sizes tested.
fn input<T: Reducible + FromSmall>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len)
        .map(|i| {
            let v = match op {
                ReduceOp::Prod => 1 + (i + rank) % 2,
                _ => (i * 7 + rank * 13) % 50,
            };
            T::from_small(v as u8)
        })
        .collect()
}

/// Conversion from a small integer, for every element type.
trait FromSmall {
    fn from_small(v: u8) -> Self;
}
macro_rules! from_small {
    ($($t:ty),*) => {$(impl FromSmall for $t { fn from_small(v: u8) -> Self { v as $t } })*};
}
from_small!(f32, f64, i32, i64, u32, u64, u8);

fn reference<T: Reducible + FromSmall>(n: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut acc = input::<T>(0, len, op);
    for rank in 1..n {
        T::reduce_into(op, &mut acc, &input::<T>(rank, len, op));
    }
    acc
}

fn check_allreduce<T: Reducible + FromSmall + std::fmt::Debug>(n: usize, len: usize, options: CommOptions) {
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::BitOr] {
        if !T::supports(op) {
            continue;
        }
        let results = on_ranks(n, options.clone(), move |comm| {
            let mut buf = input::<T>(comm.rank(), len, op);
            comm.allreduce(&mut buf, op)?;
            Ok(buf)
        });
        let expected = reference::<T>(n, len, op);
        for (rank, got) in results.iter().enumerate() {
            assert!(
                got == &expected,
                "{:?} {op:?} n={n} len={len}: rank {rank} got {:?}.., expected {:?}..",
                T::DTYPE,
                &got[..got.len().min(8)],
                &expected[..expected.len().min(8)]
            );
        }
    }
}

fn check_every_dtype(n: usize, len: usize, options: CommOptions) {
    check_allreduce::<f32>(n, len, options.clone());
    check_allreduce::<f64>(n, len, options.clone());
    check_allreduce::<i32>(n, len, options.clone());
    check_allreduce::<i64>(n, len, options.clone());
    check_allreduce::<u32>(n, len, options.clone());
    check_allreduce::<u64>(n, len, options.clone());
    check_allreduce::<u8>(n, len, options);
}

#[test]
fn allreduce_every_op_and_dtype_small_buffers_take_recursive_doubling() {
    for n in [1, 2, 3, 4, 5, 7] {
        for len in [0, 1, 5, 33] {
            check_every_dtype(n, len, options());
        }
    }
}

#[test]
fn allreduce_every_op_and_dtype_large_buffers_take_the_ring() {
    // A tiny threshold and piece size send these lengths through the ring with many
    // pieces, blocks of unequal length, and (len < n) empty blocks.
    let ring = options().with_ring_threshold(0).with_piece_bytes(16).with_window(3);
    for n in [2, 3, 4, 5, 7] {
        for len in [1, 4, 7, 100, 1001] {
            check_every_dtype(n, len, ring.clone());
        }
    }
}

#[test]
fn allreduce_over_zeromq_inproc_and_tcp() {
    let ring = options().with_ring_threshold(1024);
    for scheme in ["inproc", "tcp"] {
        let n = 3;
        let len = 100_000;
        let results = on_ranks_over(scheme, n, ring.clone(), move |comm| {
            let mut small = input::<f32>(comm.rank(), 10, ReduceOp::Sum);
            comm.allreduce(&mut small, ReduceOp::Sum)?;
            let mut large = input::<f32>(comm.rank(), len, ReduceOp::Sum);
            comm.allreduce(&mut large, ReduceOp::Sum)?;
            Ok((small, large))
        });
        for (small, large) in results {
            assert_eq!(small, reference::<f32>(n, 10, ReduceOp::Sum));
            assert_eq!(large, reference::<f32>(n, len, ReduceOp::Sum));
        }
    }
}
