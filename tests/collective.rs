//! The mesh engine's collectives against sequential references, with every rank a
//! thread of this process (over in-process queues unless a test says otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp, Reducible};

static JOB: AtomicUsize = AtomicUsize::new(0);

/// Endpoints for a fresh job of `n` ranks over `scheme` (`local` or `inproc`).
fn endpoints(scheme: &str, n: usize) -> Vec<String> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|r| {
            format!(
                "{scheme}://collective-test-{}-{job}-{r}",
                std::process::id()
            )
        })
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
    let outcomes: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    let failures: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(rank, outcome)| match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("rank {rank}: {e}")),
            Err(_) => Some(format!("rank {rank} panicked")),
        })
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    outcomes
        .into_iter()
        .filter_map(|outcome| outcome.ok().and_then(Result::ok))
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

fn check_allreduce<T: Reducible + FromSmall + std::fmt::Debug>(
    n: usize,
    len: usize,
    options: CommOptions,
) {
    for op in [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::BitOr,
    ] {
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
    let ring = options()
        .with_large_threshold(0)
        .with_direct_max_ranks(0)
        .with_piece_bytes(16)
        .with_window(3);
    for n in [2, 3, 4, 5, 7] {
        for len in [1, 4, 7, 100, 1001] {
            check_every_dtype(n, len, ring.clone());
        }
    }
}

#[test]
fn allreduce_every_op_and_dtype_large_buffers_take_the_direct_exchange() {
    let direct = options()
        .with_large_threshold(0)
        .with_direct_max_ranks(64)
        .with_piece_bytes(16);
    for n in [2, 3, 4, 5, 7] {
        for len in [1, 4, 7, 100, 1001] {
            check_every_dtype(n, len, direct.clone());
        }
    }
}

#[test]
fn allreduce_over_zeromq_inproc_and_tcp() {
    let ring = options().with_large_threshold(1024);
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

#[test]
fn broadcast_slices_bytes_and_values_from_every_root() {
    for n in [1, 2, 3, 5] {
        for root in 0..n {
            // Tree; chain (direct_max_ranks 0); scatter + allgather (direct).
            for (len, threshold, direct) in [
                (0usize, 64 << 10, 8),
                (1, 64 << 10, 8),
                (37, 64 << 10, 8),
                (1000, 0, 0),
                (1000, 0, 8),
                (3, 0, 8),
            ] {
                let results = on_ranks(
                    n,
                    options()
                        .with_large_threshold(threshold)
                        .with_direct_max_ranks(direct)
                        .with_piece_bytes(64),
                    move |comm| {
                        let r = comm.rank();
                        let mut slice: Vec<i64> =
                            (0..len as i64).map(|i| i * 3 + r as i64 * 1000).collect();
                        comm.broadcast(&mut slice, root)?;
                        let mut bytes = vec![r as u8; r * len];
                        comm.broadcast_bytes(&mut bytes, root)?;
                        let mut value = (format!("from {r}"), vec![r; r]);
                        comm.broadcast_value(&mut value, root)?;
                        Ok((slice, bytes, value))
                    },
                );
                for (slice, bytes, value) in results {
                    let want: Vec<i64> = (0..len as i64)
                        .map(|i| i * 3 + root as i64 * 1000)
                        .collect();
                    assert_eq!(slice, want, "n={n} root={root} len={len}");
                    assert_eq!(bytes, vec![root as u8; root * len]);
                    assert_eq!(value, (format!("from {root}"), vec![root; root]));
                }
            }
        }
    }
}

#[test]
fn allgather_equal_and_varied_sizes() {
    for n in [1, 2, 3, 4, 7] {
        for (m, piece, gather) in [
            (0usize, 256 << 10, 1 << 20),
            (1, 256 << 10, 1 << 20),
            (9, 8, 1 << 20),
            (9, 8, 0),
        ] {
            let mut opts = options().with_piece_bytes(piece);
            opts.gather_threshold = gather;
            let results = on_ranks(n, opts, move |comm| {
                let r = comm.rank();
                let mine: Vec<u32> = (0..m as u32).map(|i| i + 100 * r as u32).collect();
                let mut out = vec![0u32; n * m];
                comm.allgather(&mine, &mut out)?;
                let varied: Vec<f64> = (0..r * m + r % 2).map(|i| (i + r) as f64).collect();
                let all = comm.allgather_varied(&varied)?;
                Ok((out, all))
            });
            let want_equal: Vec<u32> = (0..n)
                .flat_map(|r| (0..m as u32).map(move |i| i + 100 * r as u32))
                .collect();
            let want_varied: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..r * m + r % 2).map(|i| (i + r) as f64).collect())
                .collect();
            for (out, all) in results {
                assert_eq!(out, want_equal, "n={n} m={m}");
                assert_eq!(all, want_varied, "n={n} m={m}");
            }
        }
    }
}

#[test]
fn reduce_scatter_leaves_each_rank_its_reduced_block() {
    for n in [1, 2, 3, 4, 5, 7] {
        for len in [0, 1, 6, 50, 999] {
            let results = on_ranks(n, options().with_piece_bytes(24), move |comm| {
                let mut buf = input::<i32>(comm.rank(), len, ReduceOp::Sum);
                let range = comm.reduce_scatter(&mut buf, ReduceOp::Sum)?;
                Ok((range.clone(), buf[range].to_vec()))
            });
            let full = reference::<i32>(n, len, ReduceOp::Sum);
            let mut covered = 0;
            for (rank, (range, block)) in results.into_iter().enumerate() {
                assert_eq!(range.start, covered, "rank {rank} n={n} len={len}");
                assert_eq!(block, full[range.clone()], "rank {rank} n={n} len={len}");
                covered = range.end;
            }
            assert_eq!(covered, len);
        }
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    for n in [1, 2, 3, 5] {
        let arrived = Arc::new(AtomicUsize::new(0));
        let seen = arrived.clone();
        let counts = on_ranks(n, options(), move |comm| {
            if comm.rank() == n - 1 {
                std::thread::sleep(Duration::from_millis(100));
            }
            seen.fetch_add(1, Ordering::SeqCst);
            comm.barrier()?;
            Ok(seen.load(Ordering::SeqCst))
        });
        assert!(counts.iter().all(|&c| c == n), "n={n}: {counts:?}");
    }
}

/// Digit strings packed as `value * 16 + length`, combined by concatenation:
/// associative, not commutative, so any order but rank order gives another number.
fn concat(acc: &mut u64, next: &u64) {
    let (a, la) = (*acc / 16, *acc % 16);
    let (b, lb) = (*next / 16, *next % 16);
    *acc = (a * 10u64.pow(lb as u32) + b) * 16 + la + lb;
}

#[test]
fn user_reducers_combine_in_rank_order() {
    for n in [1, 2, 3, 4, 5, 7] {
        let results = on_ranks(n, options(), move |comm| {
            let r = comm.rank() as u64;
            let mut digits = [(r + 1) * 16 + 1, (9 - r) * 16 + 1];
            comm.allreduce_with(&mut digits, concat)?;
            let mut words = vec![format!("r{r}"), "x".repeat(r as usize)];
            comm.allreduce_serde(&mut words, |acc, next| acc.push_str(next))?;
            Ok((digits, words))
        });
        let forward: u64 = (0..n as u64).fold(0, |acc, r| acc * 10 + r + 1);
        let backward: u64 = (0..n as u64).fold(0, |acc, r| acc * 10 + 9 - r);
        let joined: String = (0..n).map(|r| format!("r{r}")).collect();
        let xs: String = (0..n).map(|r| "x".repeat(r)).collect();
        for (digits, words) in results {
            assert_eq!(digits, [forward * 16 + n as u64, backward * 16 + n as u64]);
            assert_eq!(words, [joined.clone(), xs.clone()]);
        }
    }
}

#[test]
fn lazy_prepare_runs_before_the_reduction() {
    let results = on_ranks(3, options(), |comm| {
        let r = comm.rank();
        let mut calls = 0;
        let mut buf = vec![0.0f64; 4];
        comm.allreduce_lazy(&mut buf, ReduceOp::Max, |b| {
            calls += 1;
            b.fill(r as f64);
        })?;
        Ok((calls, buf))
    });
    for (calls, buf) in results {
        assert_eq!(calls, 1);
        assert_eq!(buf, [2.0; 4]);
    }
}

#[test]
fn a_buffer_larger_than_64_mib() {
    // 17 Mi f32 = 68 MiB per rank, through the ring with default pieces.
    let len = 17 << 20;
    let results = on_ranks(
        3,
        options().with_timeout(Duration::from_secs(120)),
        move |comm| {
            let r = comm.rank() as f32;
            let mut buf: Vec<f32> = (0..len).map(|i| (i % 1000) as f32 + r).collect();
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            let wrong = (0..len)
                .filter(|&i| buf[i] != 3.0 * (i % 1000) as f32 + 3.0)
                .count();
            Ok(wrong)
        },
    );
    assert_eq!(results, [0, 0, 0]);
}

/// Runs `body` on `n` ranks and returns each rank's result, errors included.
fn outcomes<R: Send + 'static>(
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<Result<R, CollectiveError>> {
    on_ranks(n, options, move |comm| Ok(body(comm)))
}

#[test]
fn mismatched_lengths_are_an_error_naming_the_rank_not_a_hang() {
    let started = std::time::Instant::now();
    let results = outcomes(4, options(), |comm| {
        let len = if comm.rank() == 2 { 9 } else { 8 };
        let mut buf = vec![1.0f32; len];
        comm.allreduce(&mut buf, ReduceOp::Sum)
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let text: Vec<String> = results.iter().map(|r| format!("{r:?}")).collect();
    assert!(results.iter().all(Result::is_err), "{text:#?}");
    // Someone must have seen rank 2's 9 elements (or rank 2 someone's 8) and said so.
    assert!(
        results.iter().any(|r| matches!(
            r,
            Err(CollectiveError::SizeMismatch {
                rank: 2,
                ours: 8,
                theirs: 9,
                ..
            }) | Err(CollectiveError::SizeMismatch {
                me: 2,
                ours: 9,
                theirs: 8,
                ..
            })
        )),
        "{text:#?}"
    );
    for r in &results {
        assert!(
            r.as_ref()
                .unwrap_err()
                .to_string()
                .starts_with("allreduce: "),
            "{text:#?}"
        );
    }
}

#[test]
fn different_operations_or_roots_are_an_error() {
    let results = outcomes(2, options(), |comm| {
        let op = if comm.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Max
        };
        let mut buf = [1u32; 3];
        comm.allreduce(&mut buf, op)
    });
    assert!(
        results.iter().all(|r| matches!(
            r,
            Err(CollectiveError::CallMismatch { .. }) | Err(CollectiveError::Aborted { .. })
        )),
        "{results:?}"
    );
    // A rank that receives from a rank with another root notices; one that only
    // sends cannot (documented on Communicator::broadcast).
    // Here rank 2 waits for rank 1, which never sends: the deadline ends it.
    let started = std::time::Instant::now();
    let results = outcomes(3, options().with_timeout(Duration::from_secs(1)), |comm| {
        let mut buf = [0u8; 4];
        let root = if comm.rank() == 2 { 1 } else { 0 };
        comm.broadcast(&mut buf, root)
    });
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            results[2],
            Err(CollectiveError::PeerTimeout { rank: 1, .. })
        ),
        "{results:?}"
    );
}

#[test]
fn a_silent_peer_is_a_timeout_naming_it() {
    let timeout = Duration::from_millis(500);
    let results = outcomes(3, options().with_timeout(timeout), move |comm| {
        let mut buf = [1i64; 4];
        if comm.rank() == 1 {
            // Rank 1 is alive but never calls (a hung peer).
            std::thread::sleep(timeout * 3);
            return Ok(());
        }
        comm.allreduce(&mut buf, ReduceOp::Sum)
    });
    for rank in [0, 2] {
        match &results[rank] {
            Err(CollectiveError::PeerTimeout {
                rank: 1, waited, ..
            }) => {
                assert!(
                    *waited >= timeout && *waited < timeout * 2 + Duration::from_secs(1),
                    "{waited:?}"
                )
            }
            Err(CollectiveError::Aborted { .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CollectiveError::PeerTimeout { rank: 1, .. }))),
        "{results:?}"
    );
}

#[test]
fn arguments_no_rank_could_use_are_refused_before_any_traffic() {
    let mut comm = Communicator::solo();
    assert_eq!(comm.world_size(), 1);
    assert!(!comm.is_distributed());
    assert!(!comm.processor_name().is_empty());
    let mut floats = [1.0f32];
    let err = comm.allreduce(&mut floats, ReduceOp::BitOr).unwrap_err();
    assert!(
        matches!(err, CollectiveError::InvalidArgument { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("BitOr"), "{err}");
    let err = comm.broadcast(&mut floats, 1).unwrap_err();
    assert!(
        err.to_string().contains("root 1 is outside a world of 1"),
        "{err}"
    );
    let mut out = [0.0f32; 3];
    let err = comm.allgather(&floats, &mut out).unwrap_err();
    assert!(err.to_string().contains("out holds 3 elements"), "{err}");
}

#[test]
fn over_tcp_a_peer_that_leaves_is_lost_at_once_not_at_the_deadline() {
    let timeout = Duration::from_secs(30);
    let started = std::time::Instant::now();
    let results = on_ranks_over("tcp", 3, options().with_timeout(timeout), |comm| {
        if comm.rank() == 2 {
            // Closes its connections, as a process that dies does.
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut buf = [1u32; 8];
        Ok(Some(comm.allreduce(&mut buf, ReduceOp::Sum)))
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Whoever notices first names rank 2; the other may instead see that rank leave
    // after its error, or its abort notice.
    for rank in [0, 1] {
        match &results[rank] {
            Some(Err(CollectiveError::PeerLost { endpoint, .. })) => {
                assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}")
            }
            Some(Err(CollectiveError::Aborted { .. })) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Some(Err(CollectiveError::PeerLost { rank: 2, .. })))),
        "{results:?}"
    );
}

#[test]
fn over_tcp_every_collective_matches_the_reference() {
    for n in [2, 3, 4] {
        let results = on_ranks_over(
            "tcp",
            n,
            options().with_large_threshold(4096),
            move |comm| {
                let r = comm.rank();
                let mut small = input::<i64>(r, 17, ReduceOp::Max);
                comm.allreduce(&mut small, ReduceOp::Max)?;
                let mut large = input::<f64>(r, 300_000, ReduceOp::Sum);
                comm.allreduce(&mut large, ReduceOp::Sum)?;
                let mut model = if r == n - 1 {
                    vec![7u8; 100_000]
                } else {
                    Vec::new()
                };
                comm.broadcast_bytes(&mut model, n - 1)?;
                let mut gathered = vec![0u32; n * 3];
                comm.allgather(&[r as u32; 3], &mut gathered)?;
                comm.barrier()?;
                Ok((small, large, model, gathered))
            },
        );
        for (small, large, model, gathered) in results {
            assert_eq!(small, reference::<i64>(n, 17, ReduceOp::Max));
            assert!(large == reference::<f64>(n, 300_000, ReduceOp::Sum));
            assert_eq!(model, vec![7u8; 100_000]);
            assert_eq!(
                gathered,
                (0..n as u32).flat_map(|r| [r; 3]).collect::<Vec<_>>()
            );
        }
    }
}
