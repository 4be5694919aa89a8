//! What one rank does in each case of the suite, checked against
//! [`reference`](super::reference) on the rank itself (as rabit's tests do), so that
//! the same bodies serve ranks that are threads of this process and ranks that are
//! processes under `mpirun`. Each returns its results as bytes, for comparing engines.

use super::reference::*;
use switchyard::collective::{CollectiveError, Communicator, ReduceOp};
use switchyard::half::{bf16, f16};

fn bits<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// Every operation `T` supports on rank inputs of `len` elements, each equal to the
/// reference; an operation it lacks is refused before any traffic.
fn allreduce_every_op<T: FromSmall>(
    comm: &mut Communicator,
    len: usize,
    results: &mut Vec<Vec<u8>>,
) -> Result<(), CollectiveError> {
    let (rank, n) = (comm.rank(), comm.world_size());
    for op in OPS.into_iter().filter(|&op| T::supports(op)) {
        let mut buf = input::<T>(rank, len, op);
        comm.allreduce(&mut buf, op)?;
        let expected = reference::<T>(n, len, op);
        assert!(
            buf == expected,
            "{:?} {op:?} n={n} len={len}: rank {rank} got {:?}.., expected {:?}..",
            T::DTYPE,
            &buf[..buf.len().min(8)],
            &expected[..expected.len().min(8)]
        );
        results.push(bits(&buf));
    }
    if !T::supports(ReduceOp::BitOr) {
        let err = comm.allreduce(&mut input::<T>(rank, 3, ReduceOp::Sum), ReduceOp::BitOr);
        assert!(
            matches!(err, Err(CollectiveError::InvalidArgument { .. })),
            "{err:?}"
        );
    }
    Ok(())
}

/// Allreduce of every element type with every operation it supports.
pub(crate) fn allreduce_every_op_and_dtype(
    comm: &mut Communicator,
    len: usize,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let mut results = Vec::new();
    allreduce_every_op::<f32>(comm, len, &mut results)?;
    allreduce_every_op::<f64>(comm, len, &mut results)?;
    allreduce_every_op::<i32>(comm, len, &mut results)?;
    allreduce_every_op::<i64>(comm, len, &mut results)?;
    allreduce_every_op::<u32>(comm, len, &mut results)?;
    allreduce_every_op::<u64>(comm, len, &mut results)?;
    allreduce_every_op::<u8>(comm, len, &mut results)?;
    allreduce_every_op::<f16>(comm, len, &mut results)?;
    allreduce_every_op::<bf16>(comm, len, &mut results)?;
    Ok(results)
}

/// A small and a large `f32` sum, one after the other on one communicator.
pub(crate) fn small_then_large_sum(
    comm: &mut Communicator,
    large: usize,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut small = input::<f32>(rank, 10, ReduceOp::Sum);
    comm.allreduce(&mut small, ReduceOp::Sum)?;
    let mut big = input::<f32>(rank, large, ReduceOp::Sum);
    comm.allreduce(&mut big, ReduceOp::Sum)?;
    assert_eq!(small, reference::<f32>(n, 10, ReduceOp::Sum));
    assert!(big == reference::<f32>(n, large, ReduceOp::Sum), "n={n}");
    Ok(vec![bits(&small), bits(&big)])
}

/// Broadcasts of a slice, floats, bytes of a rank-dependent length, and a serde
/// value, all from `root`.
pub(crate) fn broadcast_from(
    comm: &mut Communicator,
    root: usize,
    len: usize,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
    let what = format!("n={n} root={root} len={len} rank {r}");
    let mut slice = broadcast_slice(r, len);
    comm.broadcast(&mut slice, root)?;
    assert_eq!(slice, broadcast_slice(root, len), "{what}");
    let mut floats = broadcast_floats(r, len);
    comm.broadcast(&mut floats, root)?;
    assert_eq!(floats, broadcast_floats(root, len), "{what}");
    let mut bytes = broadcast_bytes(r, len);
    comm.broadcast_bytes(&mut bytes, root)?;
    assert_eq!(bytes, broadcast_bytes(root, len), "{what}");
    let mut value = broadcast_value(r);
    comm.broadcast_value(&mut value, root)?;
    assert_eq!(value, broadcast_value(root), "{what}");
    Ok(vec![bits(&slice), bits(&floats), bytes])
}

/// Allgather of equal blocks of `m`, then of blocks whose length depends on the rank.
pub(crate) fn allgathers(
    comm: &mut Communicator,
    m: usize,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
    let mut out = vec![0u32; n * m];
    comm.allgather(&gather_block(r, m), &mut out)?;
    let all = comm.allgather_varied(&varied_block(r, m))?;
    let want_equal: Vec<u32> = (0..n).flat_map(|p| gather_block(p, m)).collect();
    let want_varied: Vec<Vec<f64>> = (0..n).map(|p| varied_block(p, m)).collect();
    assert_eq!(out, want_equal, "n={n} m={m}");
    assert_eq!(all, want_varied, "n={n} m={m}");
    Ok(vec![bits(&out), bits(&all.concat())])
}

/// Reduce-scatter of `len` `i32` sums, of 17 `f32` maxima and of `len` `f16` sums:
/// each rank gets its block of the reduced buffer.
pub(crate) fn reduce_scatters(
    comm: &mut Communicator,
    len: usize,
) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
    let mut buf = input::<i32>(r, len, ReduceOp::Sum);
    let range = comm.reduce_scatter(&mut buf, ReduceOp::Sum)?;
    assert_eq!(range, block(len, n, r), "rank {r} n={n} len={len}");
    let full = reference::<i32>(n, len, ReduceOp::Sum);
    assert_eq!(
        buf[range.clone()],
        full[range.clone()],
        "rank {r} n={n} len={len}"
    );
    let mut floats = input::<f32>(r, 17, ReduceOp::Max);
    let mine = comm.reduce_scatter(&mut floats, ReduceOp::Max)?;
    assert_eq!(
        floats[mine.clone()],
        reference::<f32>(n, 17, ReduceOp::Max)[mine.clone()]
    );
    let mut halves = input::<f16>(r, len, ReduceOp::Sum);
    let ours = comm.reduce_scatter(&mut halves, ReduceOp::Sum)?;
    let expected = reference::<f16>(n, len, ReduceOp::Sum);
    assert_eq!(
        halves[ours.clone()],
        expected[ours.clone()],
        "f16 n={n} len={len}"
    );
    Ok(vec![
        bits(&buf[range]),
        bits(&floats[mine]),
        bits(&halves[ours]),
    ])
}

/// User reducers that are associative but not commutative: digits concatenated in
/// rank order, and serde strings appended in rank order.
pub(crate) fn user_reducers(comm: &mut Communicator) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
    let mut packed = digits(r);
    comm.allreduce_with(&mut packed, concat)?;
    assert_eq!(packed, digits_reference(n), "n={n}");
    let forward: u64 = (0..n as u64).fold(0, |acc, r| acc * 10 + r + 1);
    let backward: u64 = (0..n as u64).fold(0, |acc, r| acc * 10 + 9 - r);
    assert_eq!(
        packed[..2],
        [forward * 16 + n as u64, backward * 16 + n as u64]
    );
    // 0 1 2 3 in rank order, not in tree order.
    assert_eq!(packed[2] / 16, (0..n as u64).fold(0, |a, r| a * 10 + r));

    let mut strings = words(r);
    comm.allreduce_serde(&mut strings, |acc, next| acc.push_str(next))?;
    let expected: Vec<String> = (0..3)
        .map(|i| (0..n).map(|p| words(p)[i].clone()).collect())
        .collect();
    assert_eq!(strings, expected);
    Ok(vec![bits(&packed), strings.concat().into_bytes()])
}

/// `allreduce_lazy` runs its preparation once, before the reduction.
pub(crate) fn lazy_prepare(comm: &mut Communicator) -> Result<(), CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
    let mut calls = 0;
    let mut buf = vec![0.0f64; 4];
    comm.allreduce_lazy(&mut buf, ReduceOp::Max, |b| {
        calls += 1;
        b.fill(r as f64);
    })?;
    assert_eq!(calls, 1);
    assert_eq!(buf, [(n - 1) as f64; 4]);
    Ok(())
}

/// One of every collective in a row: a small maximum, a large sum, a broadcast of
/// 100,000 bytes from the last rank, an allgather and a barrier.
pub(crate) fn one_of_each(comm: &mut Communicator) -> Result<(), CollectiveError> {
    let (r, n) = (comm.rank(), comm.world_size());
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
    assert_eq!(small, reference::<i64>(n, 17, ReduceOp::Max));
    assert!(large == reference::<f64>(n, 300_000, ReduceOp::Sum));
    assert_eq!(model, vec![7u8; 100_000]);
    assert_eq!(
        gathered,
        (0..n as u32).flat_map(|r| [r; 3]).collect::<Vec<_>>()
    );
    Ok(())
}
