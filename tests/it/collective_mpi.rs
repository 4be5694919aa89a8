//! The MPI engine of the collectives under `mpirun`: the shared suite's cases
//! (`collective_suite/`), every result against its sequential reference, on the MPI
//! engine and on the mesh engine over the MPI transport, and the two bit for bit.
//! Each `in_mpi_job` test runs in every rank of an `mpirun` job that a plain test
//! below starts, so `cargo test --features mpi` covers them with no setup.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::mpirun::expect_ranks_pass;
use std::time::Duration;

/// Tests run inside every rank.
mod in_mpi_job {
    use crate::collective_suite::rank;
    use std::time::Duration;
    use switchyard::bootstrap::Bootstrap;
    use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};

    /// Lengths: empty, tiny, odd, and above the mesh's ring threshold for every type
    /// but `u8` (so that the mesh runs both of its algorithms).
    const LENGTHS: [usize; 4] = [0, 1, 13, 20_000];

    fn options() -> CommOptions {
        CommOptions::default().with_timeout(Duration::from_secs(60))
    }

    /// Everything but the typed allreduces (each call checked against the suite's
    /// reference on this rank), whose results are returned so that the two engines
    /// can be compared; `large` adds buffers above the mesh's thresholds.
    fn other_calls(comm: &mut Communicator, large: bool) -> Vec<Vec<u8>> {
        let root = comm.world_size() - 1;
        let mut results = Vec::new();
        // Broadcast from the last rank, small and above the chain threshold.
        for len in [0, 5, if large { 100_000 } else { 37 }] {
            results.extend(rank::broadcast_from(comm, root, len).unwrap());
        }
        // Allgather of equal blocks, and of blocks whose length depends on the rank.
        results.extend(rank::allgathers(comm, 5).unwrap());
        // Reduce-scatter: lengths that do not divide evenly, and shorter than the world.
        for len in [1, 10, if large { 30_001 } else { 31 }] {
            results.extend(rank::reduce_scatters(comm, len).unwrap());
        }
        comm.barrier().unwrap();
        // Reducers that are associative but not commutative, on numbers and serde values.
        results.extend(rank::user_reducers(comm).unwrap());
        results
    }

    /// Every built-in operation and type, and every other call, on MPI's collectives
    /// and on the mesh over the MPI transport: both equal the sequential reference and
    /// each other.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn engines_agree() {
        let mut mpi = Communicator::join(&Bootstrap::mpi().unwrap(), options()).unwrap();
        let (rank, n) = (mpi.rank(), mpi.world_size());
        assert!(n >= 2, "run under mpirun -np 2 or more");
        assert!(mpi.is_distributed());
        assert!(!mpi.processor_name().is_empty());
        let endpoints: Vec<String> = (0..n).map(|r| format!("mpi://{r}")).collect();
        let mut mesh =
            Communicator::join(&Bootstrap::endpoints(rank, &endpoints), options()).unwrap();
        assert_eq!((mesh.rank(), mesh.world_size()), (rank, n));

        for len in LENGTHS {
            let by_mpi = rank::allreduce_every_op_and_dtype(&mut mpi, len).unwrap();
            let by_mesh = rank::allreduce_every_op_and_dtype(&mut mesh, len).unwrap();
            assert!(
                by_mpi == by_mesh,
                "len {len} on {n} ranks: mesh and mpi differ"
            );
        }

        let by_mpi = other_calls(&mut mpi, true);
        let by_mesh = other_calls(&mut mesh, true);
        assert!(by_mpi == by_mesh, "mesh and mpi differ");
        mpi.barrier().unwrap();
    }

    /// A smaller suite against the reference, for the engine's other paths.
    fn suite(comm: &mut Communicator) {
        for len in [0, 4, 5, 23] {
            rank::allreduce_every_op_and_dtype(comm, len).unwrap();
        }
        other_calls(comm, false);
    }

    /// With at most 5 elements per MPI call every large call is split (allreduce and
    /// broadcast in pieces, allgather block by block, reduce-scatter and the gather in
    /// rounds), and without `MPI_IN_PLACE` the inputs go through scratch copies.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn split_and_copied_calls() {
        for (max_count, in_place) in [("5", "1"), ("2147483647", "0"), ("1", "0")] {
            // SAFETY: each in_mpi_job test runs alone in its process (one test per mpirun rank).
            unsafe { std::env::set_var("SWITCHYARD_MPI_MAX_COUNT", max_count) };
            // SAFETY: each in_mpi_job test runs alone in its process (one test per mpirun rank).
            unsafe { std::env::set_var("SWITCHYARD_MPI_IN_PLACE", in_place) };
            let mut comm = Communicator::join(&Bootstrap::mpi().unwrap(), options()).unwrap();
            suite(&mut comm);
        }
        // SAFETY: each in_mpi_job test runs alone in its process (one test per mpirun rank).
        unsafe { std::env::remove_var("SWITCHYARD_MPI_MAX_COUNT") };
        // SAFETY: each in_mpi_job test runs alone in its process (one test per mpirun rank).
        unsafe { std::env::remove_var("SWITCHYARD_MPI_IN_PLACE") };
    }

    /// A lazy allreduce whose `prepare` fails on one rank runs on no rank: that rank
    /// gets `PrepareFailed`, every other `Aborted` naming it, nobody waits in MPI,
    /// and the next call works.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn a_failed_prepare_is_named_on_every_rank() {
        let mut comm = Communicator::join(&Bootstrap::mpi().unwrap(), options()).unwrap();
        let (rank, n) = (comm.rank(), comm.world_size());
        let mut buf = [7u32; 3];
        let result = comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |b| {
            if rank == 1 {
                return Err("no data on rank 1");
            }
            b.fill(1);
            Ok(())
        });
        match result {
            Err(CollectiveError::PrepareFailed {
                rank: r, reason, ..
            }) if rank == 1 => {
                assert_eq!((r, reason.as_str()), (1, "no data on rank 1"));
            }
            Err(CollectiveError::Aborted {
                rank: r, reason, ..
            }) if rank != 1 => {
                assert_eq!(r, 1);
                assert!(reason.contains("prepare failed"), "{reason}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        let mut buf = [1u32; 3];
        comm.try_allreduce_lazy(&mut buf, ReduceOp::Sum, |b| {
            b.fill(2);
            Ok::<(), String>(())
        })
        .unwrap();
        assert_eq!(buf, [2 * n as u32; 3]);
    }

    /// Ranks that disagree all fail with an error naming a rank, instead of hanging.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn disagreements_are_named() {
        let mut comm = Communicator::join(&Bootstrap::mpi().unwrap(), options()).unwrap();
        let (rank, n) = (comm.rank(), comm.world_size());
        // The last rank passes one element more.
        let len = if rank == n - 1 { 4 } else { 3 };
        let mut buf = vec![1u32; len];
        match comm.allreduce(&mut buf, ReduceOp::Sum) {
            Err(CollectiveError::SizeMismatch {
                rank: other,
                me,
                ours,
                theirs,
                ..
            }) => {
                assert_eq!(me, rank);
                assert_eq!(ours, len as u64);
                assert_ne!(theirs, ours);
                assert_eq!(other, if rank == n - 1 { 0 } else { n - 1 });
            }
            other => panic!("rank {rank}: expected a size mismatch, got {other:?}"),
        }
        // Rank 0 broadcasts while the others reduce.
        let mut buf = vec![2u8; 3];
        let result = if rank == 0 {
            comm.broadcast(&mut buf, 0)
        } else {
            comm.allreduce(&mut buf, ReduceOp::Max)
        };
        match result {
            Err(CollectiveError::CallMismatch {
                rank: other,
                ours,
                theirs,
                ..
            }) => {
                assert_eq!(other, if rank == 0 { 1 } else { 0 });
                assert_ne!(ours, theirs);
                assert!(
                    ours.contains("broadcast") || theirs.contains("broadcast"),
                    "{ours} {theirs}"
                );
            }
            other => panic!("rank {rank}: expected a call mismatch, got {other:?}"),
        }
        // The last rank reduces bfloat16, the others f16 (the same width).
        let result = if rank == n - 1 {
            comm.allreduce(&mut [switchyard::half::bf16::ONE; 5], ReduceOp::Sum)
        } else {
            comm.allreduce(&mut [switchyard::half::f16::ONE; 5], ReduceOp::Sum)
        };
        match result {
            Err(CollectiveError::CallMismatch { ours, theirs, .. }) => {
                let (f16, bf16) = ("allreduce(Sum, f16 x 5)", "allreduce(Sum, bf16 x 5)");
                let want = if rank == n - 1 {
                    (bf16, f16)
                } else {
                    (f16, bf16)
                };
                assert_eq!((ours.as_str(), theirs.as_str()), want);
            }
            other => panic!("rank {rank}: expected a type mismatch, got {other:?}"),
        }
        // Nobody entered the mismatched collective, so the communicator still works.
        let mut buf = vec![rank as u64; 2];
        comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, vec![(n * (n - 1) / 2) as u64; 2]);

        // Checked mode turns the check on even with `mpi_arg_checks` off: ranks that
        // name different broadcast roots all fail, naming both roots in words.
        let options = options().with_mpi_arg_checks(false).with_check(true);
        let mut checked = Communicator::join(&Bootstrap::mpi().unwrap(), options).unwrap();
        let root = usize::from(rank != 0);
        let mut buf = vec![rank as f32; 1000];
        match checked.broadcast(&mut buf, root) {
            Err(CollectiveError::CallMismatch { ours, theirs, .. }) => {
                assert_eq!(ours, format!("broadcast(4-byte x 1000, root {root})"));
                assert_eq!(
                    theirs,
                    format!("broadcast(4-byte x 1000, root {})", 1 - root)
                );
            }
            other => panic!("rank {rank}: expected a root mismatch, got {other:?}"),
        }
    }
}

const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn engines_agree_on_2_ranks() {
    expect_ranks_pass(2, "collective_mpi::in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn engines_agree_on_3_ranks() {
    expect_ranks_pass(3, "collective_mpi::in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn engines_agree_on_4_ranks() {
    expect_ranks_pass(4, "collective_mpi::in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn split_and_copied_calls_on_3_ranks() {
    expect_ranks_pass(
        3,
        "collective_mpi::in_mpi_job::split_and_copied_calls",
        LIMIT,
    );
}

#[test]
fn a_failed_prepare_is_named_on_every_rank_of_3() {
    expect_ranks_pass(
        3,
        "collective_mpi::in_mpi_job::a_failed_prepare_is_named_on_every_rank",
        LIMIT,
    );
}

#[test]
fn disagreements_are_named_on_3_ranks() {
    expect_ranks_pass(
        3,
        "collective_mpi::in_mpi_job::disagreements_are_named",
        LIMIT,
    );
}
