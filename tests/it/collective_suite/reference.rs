//! Every input and expected result of the collectives suite, in one place: what each
//! rank passes, and what every rank must get back, computed sequentially here.

use switchyard::collective::{ReduceOp, Reducible};

/// Every built-in reduction.
pub(crate) const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::BitOr,
];

/// Conversion from a small integer, for every element type.
pub(crate) trait FromSmall: Reducible + std::fmt::Debug {
    /// Whether the type has negative values (inputs then include some).
    const SIGNED: bool;
    /// Added to every input of a sum (and a third of it to every factor of a
    /// product), so that `u8` results overflow and wrap on a few ranks: OpenMPI 4.1's
    /// `op/avx` saturates 8-bit sums instead (ompi issue #8045), which a suite whose
    /// sums stayed below 256 never saw.
    const OVERFLOW: i64 = 0;
    /// `v` as this type.
    fn from_small(v: i64) -> Self;
    /// For the two-byte floats, which the collectives reduce in `f32` and round once
    /// (`DType::is_half`): `op` over `inputs` computed in `f64` (exact for these
    /// small integers) and rounded once to the type. `None` for every other type,
    /// whose reference is the type's own `reduce_into`, one rank after the other.
    fn rounded_once(_inputs: &[Vec<Self>], _op: ReduceOp) -> Option<Vec<Self>> {
        None
    }
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
from_small!(f32 => true, f64 => true, i32 => true, i64 => true, u32 => false, u64 => false);

impl FromSmall for u8 {
    const SIGNED: bool = false;
    const OVERFLOW: i64 = 200;
    fn from_small(v: i64) -> Self {
        v as u8
    }
}

macro_rules! from_small_half {
    ($($t:ty),*) => {$(
        impl FromSmall for $t {
            const SIGNED: bool = true;
            fn from_small(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
            fn rounded_once(inputs: &[Vec<Self>], op: ReduceOp) -> Option<Vec<Self>> {
                let len = inputs.first().map_or(0, Vec::len);
                let exact = (0..len).map(|i| {
                    let mut values = inputs.iter().map(|v| v[i].to_f64());
                    let first = values.next().unwrap_or(0.0);
                    values.fold(first, |acc, x| match op {
                        ReduceOp::Sum => acc + x,
                        ReduceOp::Prod => acc * x,
                        ReduceOp::Max => acc.max(x),
                        _ => acc.min(x),
                    })
                });
                Some(exact.map(<$t>::from_f64).collect())
            }
        }
    )*};
}
from_small_half!(switchyard::half::f16, switchyard::half::bf16);

/// Rank `rank`'s element `i` for `op`: a small integer (negative too for signed
/// types), so that float sums and products are exact in any order. Integer products
/// wrap alike in the reference and the collectives.
pub(crate) fn value<T: FromSmall>(rank: usize, i: usize, op: ReduceOp) -> T {
    let v = match op {
        ReduceOp::Prod => (1 + (i + rank) % 3) as i64 + T::OVERFLOW / 60,
        ReduceOp::Sum => ((i * 7 + rank * 13) % 50) as i64 + T::OVERFLOW,
        _ => ((i * 7 + rank * 13) % 50) as i64,
    };
    let shift = if T::SIGNED && op != ReduceOp::Prod {
        20
    } else {
        0
    };
    T::from_small(v - shift)
}

/// Rank `rank`'s buffer of `len` elements for `op`.
pub(crate) fn input<T: FromSmall>(rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    (0..len).map(|i| value(rank, i, op)).collect()
}

/// `op` over the inputs of ranks `0..n`, one rank after the other.
pub(crate) fn reference<T: FromSmall>(n: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..n).map(|rank| input::<T>(rank, len, op)).collect();
    if let Some(rounded) = T::rounded_once(&inputs, op) {
        return rounded;
    }
    let mut acc = input::<T>(0, len, op);
    for rank in 1..n {
        T::reduce_into(op, &mut acc, &input::<T>(rank, len, op));
    }
    acc
}

/// The block of `len` elements that `reduce_scatter` leaves on rank `rank` of `n`:
/// blocks split the buffer evenly, the first `len % n` ranks getting one more.
pub(crate) fn block(len: usize, n: usize, rank: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Rank `rank`'s slice of `len` integers to broadcast (distinct on every rank).
pub(crate) fn broadcast_slice(rank: usize, len: usize) -> Vec<i64> {
    (0..len as i64)
        .map(|i| i * 3 + rank as i64 * 1000)
        .collect()
}

/// Rank `rank`'s floats to broadcast.
pub(crate) fn broadcast_floats(rank: usize, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (i * 3 + 1) as f64 + rank as f64 / 4.0)
        .collect()
}

/// Rank `rank`'s bytes to broadcast: `rank * len` of them, so lengths differ too.
pub(crate) fn broadcast_bytes(rank: usize, len: usize) -> Vec<u8> {
    vec![rank as u8; rank * len]
}

/// Rank `rank`'s serde value to broadcast.
pub(crate) fn broadcast_value(rank: usize) -> (String, Vec<usize>) {
    (format!("from {rank}"), vec![rank; rank])
}

/// Rank `rank`'s block of `m` values for `allgather`.
pub(crate) fn gather_block(rank: usize, m: usize) -> Vec<u32> {
    (0..m as u32).map(|i| i + 100 * rank as u32).collect()
}

/// Rank `rank`'s values for `allgather_varied`: their number depends on the rank
/// (odd ranks one more).
pub(crate) fn varied_block(rank: usize, m: usize) -> Vec<f64> {
    (0..rank * m + rank % 2)
        .map(|i| (i + rank) as f64)
        .collect()
}

/// Digit strings packed as `value * 16 + length`, combined by concatenation:
/// associative, not commutative, so any order but rank order gives another number.
pub(crate) fn concat(acc: &mut u64, next: &u64) {
    let (a, la) = (*acc / 16, *acc % 16);
    let (b, lb) = (*next / 16, *next % 16);
    *acc = (a * 10u64.pow(lb as u32) + b) * 16 + la + lb;
}

/// Rank `rank`'s one-digit strings for the user reducer: rank + 1, 9 - rank, then
/// digits that vary with the element.
pub(crate) fn digits(rank: usize) -> Vec<u64> {
    let r = rank as u64;
    let mut digits = vec![(r + 1) * 16 + 1, (9 - r) * 16 + 1];
    digits.extend((0..4).map(|i| ((r + 2 * i) % 10) * 16 + 1));
    digits
}

/// The rank-ordered concatenation of every rank's [`digits`].
pub(crate) fn digits_reference(n: usize) -> Vec<u64> {
    let mut acc = digits(0);
    for rank in 1..n {
        for (a, b) in acc.iter_mut().zip(digits(rank)) {
            concat(a, &b);
        }
    }
    acc
}

/// Rank `rank`'s strings for the serde reducer.
pub(crate) fn words(rank: usize) -> Vec<String> {
    vec![format!("r{rank}"), "x".repeat(rank), format!("<{rank}.2>")]
}
