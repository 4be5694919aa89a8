//! A lazy allreduce whose `prepare` fails on one rank: the call
//! runs on no rank. That rank gets `PrepareFailed`; the others' calls fail at once
//! with `Aborted` naming it and "prepare failed", long before the silence timeout,
//! and none of them returns a result computed without its input. Three ranks as
//! threads over `tcp://127.0.0.1`, on both data paths, small (recursive doubling)
//! and large (ring) buffers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::thread;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::{CollectiveError, CommOptions, Communicator, DataPath, ReduceOp};

const SIZE: usize = 3;
/// The silence timeout: a peer that was not told would wait this long.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The rank whose `prepare` fails.
const FAILING: usize = 1;

/// Runs one lazy allreduce of `len` f32 on every rank over `path`; rank `FAILING`'s
/// prepare fails. Returns each rank's result and how long its call took.
fn lazy_call(path: DataPath, len: usize) -> Vec<(Result<Vec<f32>, CollectiveError>, Duration)> {
    let board = MemoryExchange::new(SIZE);
    let ranks: Vec<_> = (0..SIZE)
        .map(|rank| {
            let options = CommOptions::default()
                .with_timeout(TIMEOUT)
                .with_data_path(path)
                .with_direct_max_ranks(0);
            let board = board.clone();
            thread::spawn(move || {
                let boot = Bootstrap::from_exchange(rank, SIZE, board);
                let mut comm = Communicator::join(&boot, options).unwrap();
                let mut buf = vec![0.0f32; len];
                let started = Instant::now();
                let result = comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |buf| {
                    if rank == FAILING {
                        // Half-written, as a Python prepare_fun that raised midway.
                        buf[0] = 99.0;
                        return Err("ValueError: no input today");
                    }
                    buf.fill(1.0);
                    Ok(())
                });
                (result.map(|()| buf), started.elapsed())
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}

fn every_rank_fails_naming_the_failed_prepare(path: DataPath, len: usize) {
    let results = lazy_call(path, len);
    for (rank, (result, took)) in results.into_iter().enumerate() {
        let text = match &result {
            Ok(buf) => panic!(
                "rank {rank} got a result without rank {FAILING}'s input: {:?}",
                &buf[..1]
            ),
            Err(e) => e.to_string(),
        };
        if rank == FAILING {
            assert!(
                matches!(
                    result,
                    Err(CollectiveError::PrepareFailed { rank: FAILING, .. })
                ),
                "{result:?}"
            );
            assert!(text.contains("no input today"), "{text}");
        } else {
            assert!(
                matches!(result, Err(CollectiveError::Aborted { rank: FAILING, .. })),
                "rank {rank}: {result:?}"
            );
        }
        assert!(
            text.contains(&format!("prepare failed on rank {FAILING}")),
            "rank {rank}: {text}"
        );
        assert!(took < Duration::from_secs(5), "rank {rank} took {took:?}");
    }
}

#[test]
fn a_failed_prepare_aborts_a_small_call_on_every_rank() {
    every_rank_fails_naming_the_failed_prepare(DataPath::Tcp, 4);
}

#[test]
fn a_failed_prepare_aborts_a_ring_call_on_every_rank() {
    every_rank_fails_naming_the_failed_prepare(DataPath::Tcp, 1 << 20);
}

#[test]
fn a_failed_prepare_aborts_the_call_over_zeromq_too() {
    every_rank_fails_naming_the_failed_prepare(DataPath::Zmq, 1 << 18);
}
