//! The algorithms on their own, over the deterministic in-memory link: world sizes
//! 1..=8 (odd ones and non-powers of two included), element counts 0, 1, n-1, n+1
//! and large, every root, and several schedules (round-robin and seeded
//! interleavings), each result against a sequential reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::accumulate::Pairwise;
use super::{Round, Signature, direct, doubling, ring, split, tree};
use crate::collective::error::{Call, CollectiveError};
use crate::collective::link::{Clock, Link, MemoryLink, MemorySchedule};
use bytes::Bytes;
use std::ops::Range;
use std::time::{Duration, Instant};

const WORLDS: std::ops::RangeInclusive<usize> = 1..=8;
/// Long enough for several pieces per block in every world above.
const LARGE: usize = 4099;
const SCHEDULES: [MemorySchedule; 3] = [
    MemorySchedule::RoundRobin,
    MemorySchedule::Seeded(1),
    MemorySchedule::Seeded(0x5eed),
];

/// The element counts every algorithm is tried with in a world of `n`.
fn lengths(n: usize) -> Vec<usize> {
    let mut lens = vec![0, 1, n.saturating_sub(1), n + 1, LARGE];
    lens.dedup();
    lens
}

/// Pieces small enough that a large buffer takes several per block.
fn piece_bytes(len: usize) -> usize {
    if len >= LARGE { 256 } else { 16 }
}

/// The one call of every test, as the engine would describe it.
fn round(link: &mut dyn Link, total: usize) -> Round<'_> {
    Round {
        link,
        sig: Signature {
            call: Call::Allreduce,
            op: 0,
            dtype: 0,
            root: 0,
            how: 0,
        },
        seq: 1,
        total: total as u64,
        clock: Clock::silence(Duration::from_secs(30)),
        started: Instant::now(),
        algo: "",
        step_base: 0,
    }
}

/// Runs `body` on every rank of an in-memory world of `n` under `schedule`, each on
/// its own thread; returns the results in rank order, failing on any rank's error.
fn on_world<R: Send + 'static>(
    n: usize,
    schedule: MemorySchedule,
    body: impl Fn(&mut dyn Link) -> Result<R, CollectiveError> + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let handles: Vec<_> = MemoryLink::world_with(n, schedule)
        .into_iter()
        .map(|mut link| {
            let body = body.clone();
            std::thread::spawn(move || body(&mut link))
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(rank, h)| match h.join() {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => panic!("n={n} {schedule:?}: rank {rank}: {e}"),
            Err(_) => panic!("n={n} {schedule:?}: rank {rank} panicked"),
        })
        .collect()
}

/// Rank `rank`'s input: small integers, negative ones too.
fn input(rank: usize, len: usize) -> Vec<i64> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 50) as i64 - 20)
        .collect()
}

fn sum(acc: &mut [i64], other: &[i64]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a = a.wrapping_add(*b);
    }
}

fn reference_sum(n: usize, len: usize) -> Vec<i64> {
    let mut acc = input(0, len);
    (1..n).for_each(|r| sum(&mut acc, &input(r, len)));
    acc
}

/// Every world, length and schedule; `check(n, len, schedule)` runs one world.
fn sweep(check: impl Fn(usize, usize, MemorySchedule)) {
    for n in WORLDS {
        for len in lengths(n) {
            for schedule in SCHEDULES {
                check(n, len, schedule);
            }
        }
    }
}

#[test]
fn recursive_doubling_allreduces() {
    sweep(|n, len, schedule| {
        let results = on_world(n, schedule, move |link| {
            let mut buf = input(link.rank(), len);
            doubling::allreduce(&mut round(link, len), &mut buf, &sum)?;
            Ok(buf)
        });
        let want = reference_sum(n, len);
        for (rank, got) in results.iter().enumerate() {
            assert!(got == &want, "n={n} len={len} {schedule:?}: rank {rank}");
        }
    });
}

#[test]
fn recursive_doubling_gives_every_rank_the_same_bits_in_floating_point() {
    for n in WORLDS {
        let results = on_world(n, MemorySchedule::Seeded(3), move |link| {
            let r = link.rank() as f64;
            let mut buf: Vec<f64> = (0..9).map(|i| 0.1 * r + 1.0 / (i as f64 + 3.0)).collect();
            doubling::allreduce(&mut round(link, 9), &mut buf, &|acc, other| {
                acc.iter_mut().zip(other).for_each(|(a, b)| *a += b)
            })?;
            Ok(buf.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        });
        assert!(results.iter().all(|r| r == &results[0]), "n={n}");
    }
}

#[test]
fn direct_exchange_allreduces() {
    sweep(|n, len, schedule| {
        let results = on_world(n, schedule, move |link| {
            let mut buf = input(link.rank(), len);
            direct::allreduce(
                &mut round(link, len),
                &mut buf,
                &mut Pairwise(&sum),
                piece_bytes(len),
            )?;
            Ok(buf)
        });
        let want = reference_sum(n, len);
        for (rank, got) in results.iter().enumerate() {
            assert!(got == &want, "n={n} len={len} {schedule:?}: rank {rank}");
        }
    });
}

#[test]
fn the_ring_allreduces_with_every_window() {
    sweep(|n, len, schedule| {
        for window in [1, 3] {
            let results = on_world(n, schedule, move |link| {
                let mut buf = input(link.rank(), len);
                let plan = ring::RingPlan::even::<i64>(len, n, piece_bytes(len), window);
                ring::run(
                    &mut round(link, len),
                    &mut buf,
                    &plan,
                    ring::Phase::Both,
                    &sum,
                )?;
                Ok(buf)
            });
            let want = reference_sum(n, len);
            for (rank, got) in results.iter().enumerate() {
                assert!(
                    got == &want,
                    "n={n} len={len} window={window} {schedule:?}: rank {rank}"
                );
            }
        }
    });
}

#[test]
fn the_ring_reduce_scatters_each_rank_its_block() {
    sweep(|n, len, schedule| {
        let results = on_world(n, schedule, move |link| {
            let r = link.rank();
            let mut buf = input(r, len);
            let plan = ring::RingPlan::even::<i64>(len, n, piece_bytes(len), 2);
            let phase = ring::Phase::ReduceScatter;
            ring::run(&mut round(link, len), &mut buf, &plan, phase, &sum)?;
            Ok(buf[split(len, n, r)].to_vec())
        });
        let want = reference_sum(n, len);
        for (rank, got) in results.iter().enumerate() {
            assert_eq!(
                got,
                &want[split(len, n, rank)],
                "n={n} len={len} {schedule:?}"
            );
        }
    });
}

/// Blocks of unequal lengths (rank `r` owns `r % 3 * len / n` elements, some none),
/// laid end to end.
fn varied_blocks(n: usize, len: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    (0..n)
        .map(|r| {
            let block = start..start + (r % 3) * len / n.max(1);
            start = block.end;
            block
        })
        .collect()
}

fn gathered(blocks: &[Range<usize>]) -> Vec<i64> {
    let total = blocks.last().map_or(0, |b| b.end);
    (0..total).map(|i| i as i64 * 3 - 7).collect()
}

#[test]
fn the_ring_and_the_direct_exchange_allgather_blocks_of_any_length() {
    sweep(|n, len, schedule| {
        for (blocks, ring_path) in [
            ((0..n).map(|r| split(len, n, r)).collect::<Vec<_>>(), true),
            ((0..n).map(|r| split(len, n, r)).collect(), false),
            (varied_blocks(n, len), true),
            (varied_blocks(n, len), false),
        ] {
            let want = gathered(&blocks);
            let (sent, total) = (want.clone(), want.len());
            let results = on_world(n, schedule, move |link| {
                let r = link.rank();
                let mut out = vec![0i64; total];
                out[blocks[r].clone()].copy_from_slice(&sent[blocks[r].clone()]);
                let mut round = round(link, total);
                if ring_path {
                    let plan = ring::RingPlan::with_blocks::<i64>(blocks.clone(), 64, 2);
                    ring::run(
                        &mut round,
                        &mut out,
                        &plan,
                        ring::Phase::Allgather,
                        &|_, _| {},
                    )?;
                } else {
                    direct::allgather(&mut round, &mut out, &blocks)?;
                }
                Ok(out)
            });
            for (rank, got) in results.iter().enumerate() {
                assert!(
                    got == &want,
                    "n={n} len={len} ring={ring_path} {schedule:?}: rank {rank}"
                );
            }
        }
    });
}

#[test]
fn every_broadcast_delivers_the_roots_buffer_from_every_root() {
    sweep(|n, len, schedule| {
        for root in 0..n {
            let want = input(root, len);
            let results = on_world(n, schedule, move |link| {
                let r = link.rank();
                let mine = if r == root {
                    input(r, len)
                } else {
                    vec![0; len]
                };
                let mut round = round(link, len);
                let mut by_chain = mine.clone();
                tree::broadcast_chain(&mut round, root, &mut by_chain, piece_bytes(len))?;
                round.seq += 1;
                let mut by_scatter = mine.clone();
                direct::broadcast(&mut round, root, &mut by_scatter, piece_bytes(len))?;
                round.seq += 1;
                let frame = (r == root).then(|| Bytes::from(bytemuck::cast_slice(&mine).to_vec()));
                let by_tree = tree::broadcast_frame(&mut round, root, frame)?;
                Ok((by_chain, by_scatter, by_tree))
            });
            let want_bytes: &[u8] = bytemuck::cast_slice(&want);
            for (rank, (chain, scatter, tree)) in results.iter().enumerate() {
                let what = format!("n={n} len={len} root={root} {schedule:?}: rank {rank}");
                assert!(chain == &want, "chain {what}");
                assert!(scatter == &want, "scatter + allgather {what}");
                assert!(&tree[..] == want_bytes, "tree {what}");
            }
        }
    });
}

#[test]
fn the_ordered_reduce_combines_in_rank_order_onto_rank_0() {
    for n in WORLDS {
        for schedule in SCHEDULES {
            let results = on_world(n, schedule, move |link| {
                let mut acc = format!("<{}>", link.rank()).into_bytes();
                let holds =
                    tree::ordered_reduce(&mut round(link, 1), &mut acc, &|acc, next, _| {
                        acc.extend_from_slice(next);
                        Ok(())
                    })?;
                Ok(holds.then_some(acc))
            });
            let want: String = (0..n).map(|r| format!("<{r}>")).collect();
            assert_eq!(results[0].as_deref(), Some(want.as_bytes()), "n={n}");
            assert!(results[1..].iter().all(Option::is_none), "n={n}");
        }
    }
}

#[test]
fn ranks_that_pass_different_lengths_get_an_error_not_a_hang() {
    let started = Instant::now();
    let handles: Vec<_> = MemoryLink::world(3)
        .into_iter()
        .map(|mut link| {
            std::thread::spawn(move || {
                let len = if link.rank() == 1 { 5 } else { 4 };
                let mut buf = input(link.rank(), len);
                doubling::allreduce(&mut round(&mut link, len), &mut buf, &sum)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        results.iter().any(|r| matches!(
            r,
            Err(CollectiveError::SizeMismatch { rank: 1, .. })
                | Err(CollectiveError::SizeMismatch { me: 1, .. })
        )),
        "{results:?}"
    );
}

/// Runs `body` on a world of `n` where a rank may queue at most `capacity` messages
/// for another; `Err` names the first rank that failed.
fn on_bounded_world<R: Send + 'static>(
    n: usize,
    schedule: MemorySchedule,
    capacity: usize,
    body: impl Fn(&mut dyn Link) -> Result<R, CollectiveError> + Send + Sync + Clone + 'static,
) -> Result<Vec<R>, String> {
    let handles: Vec<_> = MemoryLink::world_bounded(n, schedule, Some(capacity))
        .into_iter()
        .map(|mut link| {
            let body = body.clone();
            std::thread::spawn(move || body(&mut link))
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(rank, h)| match h.join() {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => Err(format!("rank {rank}: {e}")),
            Err(_) => Err(format!("rank {rank} panicked")),
        })
        .collect()
}

/// The ring keeps at most `window` pieces in flight to its successor, as its module
/// documentation says: with room for exactly `window` messages per pair, and sends
/// that wait without receiving (as into a full ZeroMQ queue), it completes.
#[test]
fn the_ring_needs_room_for_its_window_and_no_more() {
    for n in [2, 3, 4, 5, 8] {
        for len in [n + 1, LARGE] {
            for window in [1, 2, 3] {
                for schedule in SCHEDULES {
                    let result = on_bounded_world(n, schedule, window, move |link| {
                        let mut buf = input(link.rank(), len);
                        let plan = ring::RingPlan::even::<i64>(len, n, piece_bytes(len), window);
                        let phase = ring::Phase::Both;
                        ring::run(&mut round(link, len), &mut buf, &plan, phase, &sum)?;
                        Ok(buf)
                    });
                    let what = format!("n={n} len={len} window={window} {schedule:?}");
                    let results = result.unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(
                        results.iter().all(|r| r == &reference_sum(n, len)),
                        "{what}"
                    );
                }
            }
        }
    }
    // The bound is real: with room for fewer messages than the window, some
    // interleaving runs out of room (and ends at once, in a timeout).
    let starved = SCHEDULES.iter().any(|&schedule| {
        on_bounded_world(3, schedule, 1, |link| {
            let mut buf = input(link.rank(), LARGE);
            let plan = ring::RingPlan::even::<i64>(LARGE, 3, 256, 3);
            ring::run(
                &mut round(link, LARGE),
                &mut buf,
                &plan,
                ring::Phase::Both,
                &sum,
            )
        })
        .is_err()
    });
    assert!(starved);
}

/// Every other algorithm completes with room for a single message per pair.
#[test]
fn the_other_algorithms_need_room_for_one_message_per_pair() {
    for n in [2, 3, 4, 5, 8] {
        for schedule in SCHEDULES {
            let root = n / 2;
            let result = on_bounded_world(n, schedule, 1, move |link| {
                let r = link.rank();
                let mut round = round(link, LARGE);
                let mut buf = input(r, LARGE);
                direct::allreduce(&mut round, &mut buf, &mut Pairwise(&sum), 256)?;
                let reduced = buf.clone();
                round.seq += 1;
                let mut chained = input(r, LARGE);
                tree::broadcast_chain(&mut round, root, &mut chained, 256)?;
                round.seq += 1;
                let mut scattered = input(r, LARGE);
                direct::broadcast(&mut round, root, &mut scattered, 256)?;
                round.seq += 1;
                let blocks: Vec<_> = (0..n).map(|p| split(LARGE, n, p)).collect();
                let mut gathered = vec![0; LARGE];
                gathered[blocks[r].clone()].copy_from_slice(&input(0, LARGE)[blocks[r].clone()]);
                direct::allgather(&mut round, &mut gathered, &blocks)?;
                round.seq += 1;
                round.total = 33;
                let mut small = input(r, 33);
                doubling::allreduce(&mut round, &mut small, &sum)?;
                Ok((reduced, chained, scattered, gathered, small))
            });
            let what = format!("n={n} {schedule:?}");
            for (reduced, chained, scattered, gathered, small) in
                result.unwrap_or_else(|e| panic!("{what}: {e}"))
            {
                assert!(
                    reduced == reference_sum(n, LARGE),
                    "direct allreduce {what}"
                );
                assert!(chained == input(root, LARGE), "chain {what}");
                assert!(scattered == input(root, LARGE), "scatter {what}");
                assert!(gathered == input(0, LARGE), "allgather {what}");
                assert!(small == reference_sum(n, 33), "doubling {what}");
            }
        }
    }
}
