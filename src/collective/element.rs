//! What a collective can reduce: the element types and the built-in operations.

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
        }
    }

    /// The type with wire code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Every element type.
    pub(crate) const ALL: [DType; 7] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::U8,
    ];

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
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
/// `u64` and `u8`.
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
