//! The collectives test suite, written once.
//!
//! - [`reference`]: every input and expected result.
//! - [`rank`]: what one rank does in each case, checked on the rank; used as it is
//!   by the MPI tests, where every rank is a process.
//! - Below: the sweeps over world sizes, lengths, roots and options, for worlds whose
//!   ranks are threads of this process ([`World`]), and [`instantiate!`], which makes
//!   one `#[test]` per sweep for a given world (a link, a transport).
#![allow(
    dead_code,
    unused_macros,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used
)]

pub(crate) mod rank;
pub(crate) mod reference;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use switchyard::collective::{CollectiveError, CommOptions, Communicator};

/// A way to run `n` ranks as threads of this process, each with its own communicator.
pub(crate) trait World {
    /// Runs `body` on every rank of a fresh world of `n`; returns the results in
    /// rank order, failing the test if any rank failed.
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R>;
}

/// The options every case starts from.
pub(crate) fn options() -> CommOptions {
    CommOptions::default().with_timeout(Duration::from_secs(20))
}

/// Small buffers, which take recursive doubling, or the host board where every rank
/// shares one host (over shared memory).
pub(crate) fn allreduce_small_buffers(world: &impl World) {
    for n in [1, 2, 3, 4, 5, 7] {
        for len in [0, 1, 5, 33] {
            world.run(n, options(), move |comm| {
                rank::allreduce_every_op_and_dtype(comm, len)
            });
        }
    }
}

/// A tiny threshold and piece size send these lengths through the ring with many
/// pieces, blocks of unequal length, and (len < n) empty blocks.
pub(crate) fn allreduce_ring(world: &impl World) {
    for n in [2, 3, 4, 5, 7] {
        for len in [1, 4, 7, 100, 1001] {
            let ring = options()
                .with_large_threshold(0)
                .with_direct_max_ranks(0)
                .with_board_max_bytes(0)
                .with_piece_bytes(piece_bytes(len))
                .with_window(3);
            world.run(n, ring, move |comm| {
                rank::allreduce_every_op_and_dtype(comm, len)
            });
        }
    }
}

/// The piece size for a sweep of `len` elements: 16 bytes, so that even 100 elements
/// make dozens of pieces per block with a ragged last one; 64 for 1001 elements, which
/// still makes 16 to 125 pieces per block, ragged too (1001 elements of 4 or 8 bytes
/// are not a multiple of 64), at a quarter of the messages (the 16-byte pieces made
/// that one length most of the suite's time on the step-by-step memory schedules).
fn piece_bytes(len: usize) -> usize {
    if len > 100 { 64 } else { 16 }
}

/// The same lengths through the direct exchange.
pub(crate) fn allreduce_direct(world: &impl World) {
    for n in [2, 3, 4, 5, 7] {
        for len in [1, 4, 7, 100, 1001] {
            let direct = options()
                .with_large_threshold(0)
                .with_direct_max_ranks(64)
                .with_board_max_bytes(0)
                .with_piece_bytes(piece_bytes(len));
            world.run(n, direct, move |comm| {
                rank::allreduce_every_op_and_dtype(comm, len)
            });
        }
    }
}

/// Pieces of 16 and 64 bytes: on the host board (where every rank shares one host)
/// these lengths run as many board calls with ragged last pieces and, beyond 3 ranks,
/// empty blocks; elsewhere they take recursive doubling.
pub(crate) fn allreduce_board_pieces(world: &impl World) {
    for n in [2, 3, 5] {
        for len in [100, 1001] {
            let pieces = options().with_piece_bytes(piece_bytes(len));
            world.run(n, pieces, move |comm| {
                rank::allreduce_every_op_and_dtype(comm, len)
            });
        }
    }
}

/// A small and a large sum on one communicator, with the default algorithms.
pub(crate) fn allreduce_small_then_large(world: &impl World) {
    let opts = options().with_large_threshold(1024);
    world.run(3, opts, |comm| rank::small_then_large_sum(comm, 100_000));
}

/// Every root; the tree, the chain (direct_max_ranks 0), and scatter + allgather (the
/// host board, where there is one, takes the small ones).
pub(crate) fn broadcast_from_every_root(world: &impl World) {
    for n in [1, 2, 3, 5] {
        for root in 0..n {
            for (len, threshold, direct) in [
                (0usize, 64 << 10, 8),
                (1, 64 << 10, 8),
                (37, 64 << 10, 8),
                (1000, 64 << 10, 8),
                (1000, 0, 0),
                (1000, 0, 8),
                (3, 0, 8),
            ] {
                let opts = options()
                    .with_large_threshold(threshold)
                    .with_direct_max_ranks(direct)
                    .with_board_max_bytes(if threshold == 0 { 0 } else { usize::MAX })
                    .with_piece_bytes(64);
                world.run(n, opts, move |comm| rank::broadcast_from(comm, root, len));
            }
        }
    }
}

/// Equal and varied blocks, by the direct exchange and (gather_threshold 0) the ring;
/// the host board, where there is one, takes the others.
pub(crate) fn allgather_equal_and_varied(world: &impl World) {
    for n in [1, 2, 3, 4, 7] {
        for (m, piece, gather) in [
            (0usize, 256 << 10, 1 << 20),
            (1, 256 << 10, 1 << 20),
            (9, 8, 1 << 20),
            (9, 8, 0),
        ] {
            let mut opts = options()
                .with_piece_bytes(piece)
                .with_board_max_bytes(if gather == 0 { 0 } else { usize::MAX });
            opts.gather_threshold = gather;
            world.run(n, opts, move |comm| rank::allgathers(comm, m));
        }
    }
}

/// Lengths that do not divide evenly, and shorter than the world.
pub(crate) fn reduce_scatter_blocks(world: &impl World) {
    for n in [1, 2, 3, 4, 5, 7] {
        for len in [0, 1, 6, 50, 999] {
            world.run(n, options().with_piece_bytes(24), move |comm| {
                rank::reduce_scatters(comm, len)
            });
        }
    }
}

/// No rank leaves the barrier before the last one (which comes late) arrives.
pub(crate) fn barrier_waits_for_every_rank(world: &impl World) {
    for n in [1, 2, 3, 5] {
        let arrived = Arc::new(AtomicUsize::new(0));
        let seen = arrived.clone();
        let counts = world.run(n, options(), move |comm| {
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

/// Non-commutative user reducers combine in rank order.
pub(crate) fn user_reducers_in_rank_order(world: &impl World) {
    for n in [1, 2, 3, 4, 5, 7] {
        world.run(n, options(), rank::user_reducers);
    }
}

/// The lazy allreduce's preparation runs once, first.
pub(crate) fn lazy_prepare(world: &impl World) {
    world.run(3, options(), rank::lazy_prepare);
}

/// One of every collective in a row, with buffers above the threshold.
pub(crate) fn one_of_each(world: &impl World) {
    for n in [2, 3, 4] {
        world.run(n, options().with_large_threshold(4096), rank::one_of_each);
    }
}

/// One `#[test]` per sweep above, in a module `$name`, for the world `$world`.
macro_rules! instantiate {
    ($name:ident, $world:expr) => {
        mod $name {
            use crate::collective_suite as suite;

            #[test]
            fn allreduce_every_op_and_dtype_small_buffers() {
                suite::allreduce_small_buffers(&$world);
            }

            #[test]
            fn allreduce_every_op_and_dtype_large_buffers_take_the_ring() {
                suite::allreduce_ring(&$world);
            }

            #[test]
            fn allreduce_every_op_and_dtype_large_buffers_take_the_direct_exchange() {
                suite::allreduce_direct(&$world);
            }

            #[test]
            fn allreduce_every_op_and_dtype_in_board_pieces() {
                suite::allreduce_board_pieces(&$world);
            }

            #[test]
            fn allreduce_small_then_large() {
                suite::allreduce_small_then_large(&$world);
            }

            #[test]
            fn broadcast_slices_bytes_and_values_from_every_root() {
                suite::broadcast_from_every_root(&$world);
            }

            #[test]
            fn allgather_equal_and_varied_sizes() {
                suite::allgather_equal_and_varied(&$world);
            }

            #[test]
            fn reduce_scatter_leaves_each_rank_its_reduced_block() {
                suite::reduce_scatter_blocks(&$world);
            }

            #[test]
            fn barrier_waits_for_every_rank() {
                suite::barrier_waits_for_every_rank(&$world);
            }

            #[test]
            fn user_reducers_combine_in_rank_order() {
                suite::user_reducers_in_rank_order(&$world);
            }

            #[test]
            fn lazy_prepare_runs_before_the_reduction() {
                suite::lazy_prepare(&$world);
            }

            #[test]
            fn every_collective_in_one_job() {
                suite::one_of_each(&$world);
            }
        }
    };
}
pub(crate) use instantiate;
