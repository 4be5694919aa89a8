//! What a collective can reduce: the element types and the built-in operations.

use super::error::{Call, CollectiveError};
use switchyard_msg::payload::Element;

/// Runs `$body` with `$t` naming the Rust type of `$dtype`: the one place a
/// [`DType`] becomes a type parameter.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;

/// A built-in reduction, applied element by element.
///
/// Every built-in operation is associative and commutative, so the mesh engine may
/// combine contributions in any order; with floating point that order changes the
/// rounding, but every rank always ends with bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum; integers wrap on overflow.
    Sum,
    /// Product; integers wrap on overflow.
    Prod,
    /// Maximum (for floats, a NaN operand gives an unspecified one of the two).
    Max,
    /// Minimum (for floats, a NaN operand gives an unspecified one of the two).
    Min,
    /// Bitwise or; integer types only.
    BitOr,
}

impl ReduceOp {
    /// The operation's wire code, part of the signature every message carries so that
    /// ranks calling different operations are told so.
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Max => 3,
            ReduceOp::Min => 4,
            ReduceOp::BitOr => 5,
        }
    }

    /// The operation with wire code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<ReduceOp> {
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::BitOr,
        ]
        .into_iter()
        .find(|o| o.code() == code)
    }
}

/// An element type's identity on the wire and in MPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// `u8`
    U8,
    /// [`half::f16`]: IEEE 754 binary16 (numpy's `float16`). Reductions sum in `f32`
    /// and round once per result element (see [`DType::is_half`]).
    F16,
    /// [`half::bf16`]: bfloat16, the top half of an `f32`. Reductions sum in `f32` and
    /// round once per result element (see [`DType::is_half`]).
    BF16,
}

impl DType {
    pub(crate) fn code(self) -> u8 {
        match self {
            DType::F32 => 1,
            DType::F64 => 2,
            DType::I32 => 3,
            DType::I64 => 4,
            DType::U32 => 5,
            DType::U64 => 6,
            DType::U8 => 7,
            DType::F16 => 8,
            DType::BF16 => 9,
        }
    }

    /// The type with wire code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Every element type.
    pub(crate) const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::U8,
        DType::F16,
        DType::BF16,
    ];

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Whether this is a two-byte float ([`DType::F16`], [`DType::BF16`]), which the
    /// built-in reductions of every engine compute in `f32`: each rank's elements are
    /// widened to `f32` (exactly) and combined with `f32` arithmetic (on the host
    /// board and in the direct exchange, each block in one place, from parts that
    /// travel in the element type; elsewhere as an [`DType::F32`] call of that
    /// length runs, partial results travelling between ranks as `f32`), and each
    /// element of the result is rounded to the element type once, to nearest, ties
    /// to even. So a
    /// sum of `n` values is the `f32` sum rounded once: within half a unit in the
    /// last place of the element type of the `f32` sum, and exactly the correctly
    /// rounded sum whenever the `f32` sum is exact (at up to 4 ranks, whenever the
    /// largest input's exponent exceeds the smallest nonzero one's by at most 11 for
    /// `f16`, 14 for `bf16`). Results are bit-identical on every rank. `Max` and `Min`
    /// are exact. The bound and its tests: the collectives page of the guide.
    ///
    /// ```
    /// use switchyard::collective::DType;
    /// assert!(DType::BF16.is_half() && DType::F16.is_float());
    /// assert_eq!(DType::F16.size(), 2);
    /// assert!(!DType::F32.is_half());
    /// ```
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Bytes per element (also its alignment).
    ///
    /// ```
    /// use switchyard::collective::DType;
    /// assert_eq!(DType::F64.size(), 8);
    /// assert_eq!(DType::U8.size(), 1);
    /// ```
    pub fn size(self) -> usize {
        with_dtype!(self, T => size_of::<T>())
    }

    /// Whether `op` is defined for this type (`BitOr` is not for floats), as
    /// [`Reducible::supports`] says for the type itself.
    ///
    /// ```
    /// use switchyard::collective::{DType, ReduceOp};
    /// assert!(DType::I32.supports(ReduceOp::BitOr));
    /// assert!(!DType::F32.supports(ReduceOp::BitOr));
    /// ```
    pub fn supports(self, op: ReduceOp) -> bool {
        with_dtype!(self, T => <T as Reducible>::supports(op))
    }
}

/// A number type the built-in operations reduce: `f32`, `f64`, `i32`, `i64`, `u32`,
/// `u64`, `u8`, and the `half` crate's [`half::f16`] and [`half::bf16`] (whose
/// collectives compute in `f32` and round once, see [`DType::is_half`]).
///
/// # Examples
///
/// ```
/// use switchyard::collective::{Reducible, ReduceOp};
/// let mut acc = [1i32, 5, -2];
/// i32::reduce_into(ReduceOp::Max, &mut acc, &[3, 4, -1]);
/// assert_eq!(acc, [3, 5, -1]);
/// assert!(!f32::supports(ReduceOp::BitOr));
/// ```
pub trait Reducible: Element + PartialOrd {
    /// This type's [`DType`].
    const DTYPE: DType;

    /// Whether `op` is defined for this type (`BitOr` is not for floats).
    fn supports(op: ReduceOp) -> bool;

    /// `acc[i] = acc[i] op other[i]` for every `i`.
    ///
    /// # Panics
    ///
    /// If the slices differ in length, or `op` is not [supported](Reducible::supports)
    /// (the collectives check both before calling it).
    fn reduce_into(op: ReduceOp, acc: &mut [Self], other: &[Self]);
}

/// The loop is written once per operation with the match outside, so that the
/// compiler vectorises each.
fn zip_with<T: Copy>(acc: &mut [T], other: &[T], f: impl Fn(T, T) -> T) {
    assert_eq!(
        acc.len(),
        other.len(),
        "reduce_into: slices differ in length"
    );
    for (a, b) in acc.iter_mut().zip(other) {
        *a = f(*a, *b);
    }
}

macro_rules! integers {
    ($($t:ty => $d:ident),*) => {$(
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            fn supports(_: ReduceOp) -> bool {
                true
            }
            fn reduce_into(op: ReduceOp, acc: &mut [Self], other: &[Self]) {
                match op {
                    ReduceOp::Sum => zip_with(acc, other, <$t>::wrapping_add),
                    ReduceOp::Prod => zip_with(acc, other, <$t>::wrapping_mul),
                    ReduceOp::Max => zip_with(acc, other, Ord::max),
                    ReduceOp::Min => zip_with(acc, other, Ord::min),
                    ReduceOp::BitOr => zip_with(acc, other, |a, b| a | b),
                }
            }
        }
    )*};
}
integers!(i32 => I32, i64 => I64, u32 => U32, u64 => U64, u8 => U8);

macro_rules! floats {
    ($($t:ty => $d:ident),*) => {$(
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            fn supports(op: ReduceOp) -> bool {
                op != ReduceOp::BitOr
            }
            fn reduce_into(op: ReduceOp, acc: &mut [Self], other: &[Self]) {
                match op {
                    ReduceOp::Sum => zip_with(acc, other, |a, b| a + b),
                    ReduceOp::Prod => zip_with(acc, other, |a, b| a * b),
                    ReduceOp::Max => zip_with(acc, other, |a, b| if b > a { b } else { a }),
                    ReduceOp::Min => zip_with(acc, other, |a, b| if b < a { b } else { a }),
                    ReduceOp::BitOr => panic!("BitOr is not defined for {}", stringify!($t)),
                }
            }
        }
    )*};
}
floats!(f32 => F32, f64 => F64);

/// The two-byte floats, through `f32`.
macro_rules! halves {
    ($($t:ty => $d:ident),*) => {$(
        /// `reduce_into` computes each pair in `f32` and rounds the result to the
        /// element type, one rounding per call. The collectives do not reduce pair by
        /// pair: they sum every rank's value in `f32` and round once
        /// ([`DType::is_half`]).
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            fn supports(op: ReduceOp) -> bool {
                op != ReduceOp::BitOr
            }
            fn reduce_into(op: ReduceOp, acc: &mut [Self], other: &[Self]) {
                let via = |f: fn(f32, f32) -> f32| {
                    move |a: $t, b: $t| <$t>::from_f32(f(a.to_f32(), b.to_f32()))
                };
                match op {
                    ReduceOp::Sum => zip_with(acc, other, via(|a, b| a + b)),
                    ReduceOp::Prod => zip_with(acc, other, via(|a, b| a * b)),
                    ReduceOp::Max => zip_with(acc, other, |a, b| if b > a { b } else { a }),
                    ReduceOp::Min => zip_with(acc, other, |a, b| if b < a { b } else { a }),
                    ReduceOp::BitOr => panic!("BitOr is not defined for {}", stringify!($t)),
                }
            }
        }
    )*};
}
halves!(half::f16 => F16, half::bf16 => BF16);

/// A reduction of two-byte floats ([`DType::is_half`]) run in `f32`: `buf` (bytes of
/// `dtype` elements, aligned for them: the communicator hands over nothing else)
/// widened into `scratch`, `reduce` run on that, and its result rounded back into
/// `buf` once per element, to nearest, ties to even. Refuses any other type.
/// `scratch` grows to fit and keeps its memory for the next call (a fresh buffer of
/// many megabytes costs a page fault per page on every call).
pub(crate) fn in_f32_with(
    call: Call,
    buf: &mut [u8],
    dtype: DType,
    scratch: &mut Vec<f32>,
    reduce: impl FnOnce(&mut [f32]) -> Result<(), CollectiveError>,
) -> Result<(), CollectiveError> {
    use half::slice::HalfFloatSliceExt;
    let refused = |reason: String| CollectiveError::InvalidArgument { call, reason };
    let halves = bytemuck::try_cast_slice_mut::<u8, u16>(buf)
        .map_err(|e| refused(format!("a buffer of {dtype:?} elements: {e:?}")))?;
    if scratch.len() < halves.len() {
        scratch.resize(halves.len(), 0.0);
    }
    let wide = &mut scratch[..halves.len()];
    match dtype {
        DType::F16 => bytemuck::cast_slice::<u16, half::f16>(halves).convert_to_f32_slice(wide),
        DType::BF16 => bytemuck::cast_slice::<u16, half::bf16>(halves).convert_to_f32_slice(wide),
        other => return Err(refused(format!("{other:?} is not a two-byte float"))),
    }
    reduce(wide)?;
    if dtype == DType::F16 {
        bytemuck::cast_slice_mut::<u16, half::f16>(halves).convert_from_f32_slice(wide);
    } else {
        bytemuck::cast_slice_mut::<u16, half::bf16>(halves).convert_from_f32_slice(wide);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Each pair in f32, rounded once per call: 2048 + 1 is a tie, which goes to
    /// the even 2048; maxima and minima are exact.
    #[test]
    fn halves_reduce_pair_by_pair_through_f32() {
        let mut acc = [f16::from_f32(2048.0), f16::from_f32(-0.5)];
        f16::reduce_into(ReduceOp::Sum, &mut acc, &[f16::ONE, f16::from_f32(0.25)]);
        assert_eq!(acc, [f16::from_f32(2048.0), f16::from_f32(-0.25)]);
        let mut acc = [bf16::from_f32(3.0)];
        bf16::reduce_into(ReduceOp::Prod, &mut acc, &[bf16::from_f32(-0.5)]);
        assert_eq!(acc, [bf16::from_f32(-1.5)]);
        bf16::reduce_into(ReduceOp::Max, &mut acc, &[bf16::NEG_INFINITY]);
        assert_eq!(acc, [bf16::from_f32(-1.5)]);
        assert!(!f16::supports(ReduceOp::BitOr) && !DType::BF16.supports(ReduceOp::BitOr));
        assert_eq!((DType::F16.size(), DType::BF16.size()), (2, 2));
        assert_eq!(DType::from_code(DType::BF16.code()), Some(DType::BF16));
    }

    /// `in_f32_with` hands the reduction the values widened, and rounds its result once:
    /// 2048 + 1 + 1 in f32 is 2050, which f16 holds.
    #[test]
    fn in_f32_widens_then_rounds_once_and_refuses_other_types() {
        let mut halves = [f16::from_f32(2048.0), f16::from_f32(0.1)];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut halves);
        let mut scratch = Vec::new();
        in_f32_with(Call::Allreduce, bytes, DType::F16, &mut scratch, |wide| {
            assert_eq!(wide[0], 2048.0);
            assert_eq!(wide[1], f16::from_f32(0.1).to_f32());
            wide[0] += 1.0;
            wide[0] += 1.0;
            wide[1] *= 3.0;
            Ok(())
        })
        .unwrap();
        assert_eq!(halves[0].to_f32(), 2050.0);
        assert_eq!(halves[1], f16::from_f32(f16::from_f32(0.1).to_f32() * 3.0));
        let mut words = [0u32; 2];
        let e = in_f32_with(
            Call::Allreduce,
            bytemuck::cast_slice_mut(&mut words),
            DType::U32,
            &mut scratch,
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("U32 is not a two-byte float"), "{e}");
    }
}
