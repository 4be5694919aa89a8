//! The MPI engine of the collectives under `mpirun`: every result against a
//! sequential reference, and against the mesh engine over the MPI transport, bit for
//! bit. Each `in_mpi_job` test runs in every rank of an `mpirun` job that a plain
//! test below starts, so `cargo test --features mpi` covers them with no setup.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;
use support::mpirun::expect_ranks_pass;

/// Tests run inside every rank.
mod in_mpi_job {
    use std::fmt::Debug;
    use std::time::Duration;
    use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp, Reducible};

    const OPS: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::BitOr,
    ];

    /// Lengths: empty, tiny, odd, and above the mesh's ring threshold for every type
    /// but `u8` (so that the mesh runs both of its algorithms).
    const LENGTHS: [usize; 4] = [0, 1, 13, 20_000];

    fn options() -> CommOptions {
        CommOptions::default().with_timeout(Duration::from_secs(60))
    }

    /// Conversion from a small integer, for every element type.
    trait FromSmall: Reducible + Debug {
        const SIGNED: bool;
        fn from_small(v: i64) -> Self;
    }
    macro_rules! from_small {
        ($($t:ty => $signed:expr),*) => {$(
            impl FromSmall for $t {
                const SIGNED: bool = $signed;
                fn from_small(v: i64) -> Self {
                    v as $t
                }
            }
        )*};
    }
    from_small!(f32 => true, f64 => true, i32 => true, i64 => true, u32 => false, u64 => false, u8 => false);

    /// Rank `rank`'s element `i`: a small integer (negative too for signed types), so
    /// that float sums and products are exact in any order and products stay in
    /// range for the world sizes tested.
    fn value<T: FromSmall>(rank: usize, i: usize, op: ReduceOp) -> T {
        let v = match op {
            ReduceOp::Prod => 1 + (i + rank) % 3,
            _ => (i * 7 + rank * 13) % 50,
        } as i64;
        let shift = if T::SIGNED && op != ReduceOp::Prod {
            20
        } else {
            0
        };
        T::from_small(v - shift)
    }

    fn input<T: FromSmall>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
        (0..len).map(|i| value(rank, i, op)).collect()
    }

    /// The reduction computed here, one rank after the other.
    fn reference<T: FromSmall>(n: usize, len: usize, op: ReduceOp) -> Vec<T> {
        let mut acc = input::<T>(0, len, op);
        for rank in 1..n {
            T::reduce_into(op, &mut acc, &input::<T>(rank, len, op));
        }
        acc
    }

    fn bits<T: FromSmall>(values: &[T]) -> &[u8] {
        bytemuck::cast_slice(values)
    }

    /// Every operation on `T` at every length, on both engines.
    fn allreduce_agrees<T: FromSmall>(mpi: &mut Communicator, mesh: &mut Communicator) {
        let (rank, n) = (mpi.rank(), mpi.world_size());
        for op in OPS.into_iter().filter(|&op| T::supports(op)) {
            for len in LENGTHS {
                let what = format!("{:?} {op:?} len {len} on {n} ranks", T::DTYPE);
                let expected = reference::<T>(n, len, op);
                let mut by_mpi = input::<T>(rank, len, op);
                mpi.allreduce(&mut by_mpi, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut by_mesh = input::<T>(rank, len, op);
                mesh.allreduce(&mut by_mesh, op)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    by_mpi == expected,
                    "{what}: mpi {:?}..",
                    &by_mpi[..len.min(8)]
                );
                assert_eq!(bits(&by_mpi), bits(&by_mesh), "{what}: mesh and mpi differ");
            }
        }
        if !T::supports(ReduceOp::BitOr) {
            let err = mpi.allreduce(&mut input::<T>(rank, 3, ReduceOp::Sum), ReduceOp::BitOr);
            assert!(
                matches!(err, Err(CollectiveError::InvalidArgument { .. })),
                "{err:?}"
            );
        }
    }

    /// Everything but the typed allreduces, whose results are returned so that the
    /// two engines can be compared; `large` adds buffers above the mesh's thresholds.
    fn other_calls(comm: &mut Communicator, large: bool) -> Vec<Vec<u8>> {
        let (rank, n) = (comm.rank(), comm.world_size());
        let root = n - 1;
        let mut results = Vec::new();

        // Broadcast from the last rank, small and above the chain threshold.
        for len in [0, 5, if large { 100_000 } else { 37 }] {
            let pattern: Vec<f64> = (0..len).map(|i| (i * 3 + 1) as f64).collect();
            let mut buf = if rank == root {
                pattern.clone()
            } else {
                vec![0.0; len]
            };
            comm.broadcast(&mut buf, root).unwrap();
            assert_eq!(buf, pattern, "broadcast of {len} from {root}");
            results.push(bytemuck::cast_slice(&buf).to_vec());
        }
        let mut bytes = if rank == root {
            b"weights from the root".to_vec()
        } else {
            vec![7; 3]
        };
        comm.broadcast_bytes(&mut bytes, root).unwrap();
        assert_eq!(bytes, b"weights from the root");
        let mut value = if rank == root {
            (String::from("model"), 42u32)
        } else {
            Default::default()
        };
        comm.broadcast_value(&mut value, root).unwrap();
        assert_eq!(value, ("model".to_string(), 42));

        // Allgather of equal blocks, and of blocks whose length depends on the rank.
        let mine: Vec<u32> = (0..5).map(|i| (rank * 100 + i) as u32).collect();
        let mut out = vec![0u32; 5 * n];
        comm.allgather(&mine, &mut out).unwrap();
        let expected: Vec<u32> = (0..n)
            .flat_map(|r| (0..5).map(move |i| (r * 100 + i) as u32))
            .collect();
        assert_eq!(out, expected);
        results.push(bytemuck::cast_slice(&out).to_vec());
        let varied_of =
            |r: usize| -> Vec<i64> { (0..r * 3).map(|i| (r * 1000 + i) as i64).collect() };
        let varied = comm.allgather_varied(&varied_of(rank)).unwrap();
        assert_eq!(varied, (0..n).map(varied_of).collect::<Vec<_>>());
        results.push(bytemuck::cast_slice(&varied.concat()).to_vec());

        // Reduce-scatter: lengths that do not divide evenly, and shorter than the world.
        for len in [1, 10, if large { 30_001 } else { 31 }] {
            let mut buf = input::<i32>(rank, len, ReduceOp::Sum);
            let mine = comm.reduce_scatter(&mut buf, ReduceOp::Sum).unwrap();
            let expected = reference::<i32>(n, len, ReduceOp::Sum);
            assert_eq!(
                buf[mine.clone()],
                expected[mine.clone()],
                "reduce_scatter of {len}"
            );
            results.push(bytemuck::cast_slice(&buf[mine]).to_vec());
        }
        let mut floats = input::<f32>(rank, 17, ReduceOp::Max);
        let mine = comm.reduce_scatter(&mut floats, ReduceOp::Max).unwrap();
        assert_eq!(
            floats[mine.clone()],
            reference::<f32>(n, 17, ReduceOp::Max)[mine]
        );

        comm.barrier().unwrap();

        // An associative reducer that is not commutative: decimal strings of digits,
        // concatenated in rank order, each element a `u64` of (digit count << 56 | value).
        const DIGITS: u32 = 56;
        let digits_of = |r: usize, i: usize| (1u64 << DIGITS) | ((r + 2 * i) % 10) as u64;
        let concat = |acc: &mut u64, next: &u64| {
            let (count, value) = (*acc >> DIGITS, *acc & ((1 << DIGITS) - 1));
            let (more, tail) = (*next >> DIGITS, *next & ((1 << DIGITS) - 1));
            *acc = (count + more) << DIGITS | (value * 10u64.pow(more as u32) + tail);
        };
        let mut digits: Vec<u64> = (0..6).map(|i| digits_of(rank, i)).collect();
        comm.allreduce_with(&mut digits, concat).unwrap();
        let expected: Vec<u64> = (0..6)
            .map(|i| {
                let mut acc = digits_of(0, i);
                (1..n).for_each(|r| concat(&mut acc, &digits_of(r, i)));
                acc
            })
            .collect();
        assert_eq!(digits, expected);
        // 0 1 2 3 in rank order, not in tree order.
        assert_eq!(
            digits[0] & ((1 << DIGITS) - 1),
            (0..n as u64).fold(0, |a, r| a * 10 + r)
        );
        results.push(bytemuck::cast_slice(&digits).to_vec());

        // Serde values, concatenated in rank order.
        let mut words: Vec<String> = (0..3).map(|i| format!("<{rank}.{i}>")).collect();
        comm.allreduce_serde(&mut words, |acc, next| acc.push_str(next))
            .unwrap();
        let expected: Vec<String> = (0..3)
            .map(|i| (0..n).map(|r| format!("<{r}.{i}>")).collect())
            .collect();
        assert_eq!(words, expected);
        results.push(words.concat().into_bytes());
        results
    }

    /// Every built-in operation and type, and every other call, on MPI's collectives
    /// and on the mesh over the MPI transport: both equal the sequential reference and
    /// each other.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn engines_agree() {
        let mut mpi = Communicator::mpi(options()).unwrap();
        let (rank, n) = (mpi.rank(), mpi.world_size());
        assert!(n >= 2, "run under mpirun -np 2 or more");
        assert!(mpi.is_distributed());
        assert!(!mpi.processor_name().is_empty());
        let endpoints: Vec<String> = (0..n).map(|r| format!("mpi://{r}")).collect();
        let mut mesh = Communicator::mesh(rank, &endpoints, options()).unwrap();
        assert_eq!((mesh.rank(), mesh.world_size()), (rank, n));

        allreduce_agrees::<f32>(&mut mpi, &mut mesh);
        allreduce_agrees::<f64>(&mut mpi, &mut mesh);
        allreduce_agrees::<i32>(&mut mpi, &mut mesh);
        allreduce_agrees::<i64>(&mut mpi, &mut mesh);
        allreduce_agrees::<u32>(&mut mpi, &mut mesh);
        allreduce_agrees::<u64>(&mut mpi, &mut mesh);
        allreduce_agrees::<u8>(&mut mpi, &mut mesh);

        let by_mpi = other_calls(&mut mpi, true);
        let by_mesh = other_calls(&mut mesh, true);
        assert!(by_mpi == by_mesh, "mesh and mpi differ");
        mpi.barrier().unwrap();
    }

    /// A smaller suite against the reference, for the engine's other paths.
    fn suite(comm: &mut Communicator) {
        let (rank, n) = (comm.rank(), comm.world_size());
        for op in OPS {
            for len in [0, 4, 5, 23] {
                let mut buf = input::<i64>(rank, len, op);
                comm.allreduce(&mut buf, op).unwrap();
                assert_eq!(buf, reference::<i64>(n, len, op), "{op:?} len {len}");
            }
        }
        let mut floats = input::<f64>(rank, 23, ReduceOp::Sum);
        comm.allreduce(&mut floats, ReduceOp::Sum).unwrap();
        assert_eq!(floats, reference::<f64>(n, 23, ReduceOp::Sum));
        other_calls(comm, false);
    }

    /// With at most 5 elements per MPI call every large call is split (allreduce and
    /// broadcast in pieces, allgather block by block, reduce-scatter and the gather in
    /// rounds), and without `MPI_IN_PLACE` the inputs go through scratch copies.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn split_and_copied_calls() {
        for (max_count, in_place) in [("5", "1"), ("2147483647", "0"), ("1", "0")] {
            std::env::set_var("SWITCHYARD_MPI_MAX_COUNT", max_count);
            std::env::set_var("SWITCHYARD_MPI_IN_PLACE", in_place);
            let mut comm = Communicator::mpi(options()).unwrap();
            suite(&mut comm);
        }
        std::env::remove_var("SWITCHYARD_MPI_MAX_COUNT");
        std::env::remove_var("SWITCHYARD_MPI_IN_PLACE");
    }

    /// Ranks that disagree all fail with an error naming a rank, instead of hanging.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn disagreements_are_named() {
        let mut comm = Communicator::mpi(options()).unwrap();
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
        // Nobody entered the mismatched collective, so the communicator still works.
        let mut buf = vec![rank as u64; 2];
        comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
        assert_eq!(buf, vec![(n * (n - 1) / 2) as u64; 2]);
    }
}

const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn engines_agree_on_2_ranks() {
    expect_ranks_pass(2, "in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn engines_agree_on_3_ranks() {
    expect_ranks_pass(3, "in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn engines_agree_on_4_ranks() {
    expect_ranks_pass(4, "in_mpi_job::engines_agree", LIMIT);
}

#[test]
fn split_and_copied_calls_on_3_ranks() {
    expect_ranks_pass(3, "in_mpi_job::split_and_copied_calls", LIMIT);
}

#[test]
fn disagreements_are_named_on_3_ranks() {
    expect_ranks_pass(3, "in_mpi_job::disagreements_are_named", LIMIT);
}
