//! The numbers a parameter server stores: [`Value`], and how a sync round sums them.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use switchyard_msg::payload::Element;

/// A number type a key's values can have: travels as a payload frame and adds.
///
/// Implemented for `f32`, `f64`, `i32`, `i64` and the `half` crate's [`half::f16`]
/// (IEEE binary16) and [`half::bf16`] (bfloat16). Integers add with wrap-around, so
/// that a sum never panics; SGD on integers rounds toward zero.
///
/// A sync round's pushes are summed in [`Value::Acc`] in worker rank order, whatever
/// order they arrived in, and the sum is converted to `Self` once, before the
/// [`super::Update`] sees it: halves sum in `f32` and round once (to nearest, ties to
/// even), the other types sum in their own type. So a round's result is bit-identical
/// whichever order the pushes arrive in, and on every server of a split key.
pub trait Value: Element + Copy + Default + PartialEq + std::fmt::Debug {
    /// The type a sync round's sum is accumulated in: `f32` for [`half::f16`] and
    /// [`half::bf16`], `Self` for the others.
    type Acc: Copy + Default + std::fmt::Debug + Send + Sync + 'static;

    /// `self` as an accumulator (exact).
    fn widen(self) -> Self::Acc;
    /// `acc + value`, in the accumulator's type.
    fn accumulate(acc: Self::Acc, value: Self) -> Self::Acc;
    /// An accumulator rounded to `Self` (to nearest, ties to even, for halves).
    fn narrow(acc: Self::Acc) -> Self;
    /// `self - rate * gradient` (SGD's step). Halves compute it in `f32` and round
    /// once.
    fn step(self, rate: f64, gradient: Self) -> Self;

    /// `self + other`: computed in [`Value::Acc`] and rounded once. For two halves
    /// the `f32` sum rounded to the half type is the correctly rounded half sum
    /// (`f32`'s 24 bits are at least twice a half's significand plus two).
    fn add(self, other: Self) -> Self {
        Self::narrow(Self::accumulate(self.widen(), other))
    }

    /// `values` widened into `out` (as long as `values`).
    fn widen_slice(values: &[Self], out: &mut [Self::Acc]) {
        out.iter_mut().zip(values).for_each(|(o, v)| *o = v.widen());
    }

    /// `acc` rounded into `out` (as long as `acc`).
    fn narrow_slice(acc: &[Self::Acc], out: &mut [Self]) {
        out.iter_mut()
            .zip(acc)
            .for_each(|(o, a)| *o = Self::narrow(*a));
    }
}

/// Elements summed per block: the accumulators of a block stay on the stack.
const BLOCK: usize = 512;

/// `sum += rest[0] + rest[1] + ...`, in that order, element by element, accumulated in
/// [`Value::Acc`] and rounded into `sum` once. `sum` holds the first worker's push and
/// `rest` the others' in rank order; a piece shorter than `sum` adds nothing past its
/// end.
pub(crate) fn sum_in_order<T: Value>(sum: &mut [T], rest: &[&[T]]) {
    let mut block = [T::Acc::default(); BLOCK];
    for (b, out) in sum.chunks_mut(BLOCK).enumerate() {
        let at = b * BLOCK;
        let acc = &mut block[..out.len()];
        T::widen_slice(out, acc);
        for piece in rest {
            let piece = piece.get(at..).unwrap_or_default();
            acc.iter_mut()
                .zip(piece)
                .for_each(|(a, v)| *a = T::accumulate(*a, *v));
        }
        T::narrow_slice(acc, out);
    }
}

macro_rules! float_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn accumulate(acc: $t, value: $t) -> $t {
                acc + value
            }
            fn narrow(acc: $t) -> $t {
                acc
            }
            fn step(self, rate: f64, gradient: Self) -> Self {
                self - (rate as $t) * gradient
            }
        }
    )*};
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type Acc = $t;
            fn widen(self) -> $t {
                self
            }
            fn accumulate(acc: $t, value: $t) -> $t {
                acc.wrapping_add(value)
            }
            fn narrow(acc: $t) -> $t {
                acc
            }
            fn step(self, rate: f64, gradient: Self) -> Self {
                self.wrapping_sub((rate * gradient as f64) as $t)
            }
        }
    )*};
}

macro_rules! half_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type Acc = f32;
            fn widen(self) -> f32 {
                self.to_f32()
            }
            fn accumulate(acc: f32, value: $t) -> f32 {
                acc + value.to_f32()
            }
            fn narrow(acc: f32) -> $t {
                <$t>::from_f32(acc)
            }
            fn step(self, rate: f64, gradient: Self) -> Self {
                <$t>::from_f32(self.to_f32() - (rate as f32) * gradient.to_f32())
            }
            fn widen_slice(values: &[$t], out: &mut [f32]) {
                values.convert_to_f32_slice(out);
            }
            fn narrow_slice(acc: &[f32], out: &mut [$t]) {
                out.convert_from_f32_slice(acc);
            }
        }
    )*};
}

float_value!(f32, f64);
int_value!(i32, i64);
half_value!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;

    /// 2048 + 1 + 1: each add rounded to f16 would stay at 2048 (2049 is a tie, to
    /// even); summed in f32 and rounded once it is 2050.
    #[test]
    fn halves_sum_in_f32_and_round_once() {
        let mut sum = [f16::from_f32(2048.0), f16::from_f32(0.1)];
        let one = [f16::ONE, f16::from_f32(0.1)];
        sum_in_order(&mut sum, &[&one, &one]);
        assert_eq!(sum[0], f16::from_f32(2050.0));
        assert_eq!(f16::from_f32(2048.0).add(f16::ONE), f16::from_f32(2048.0));
        assert_eq!(sum[1], f16::from_f32(f16::from_f32(0.1).to_f32() * 3.0));
        let mut long = vec![bf16::from_f32(256.0); BLOCK + 3];
        let ones = vec![bf16::ONE; BLOCK + 3];
        sum_in_order(&mut long, &[&ones, &ones]);
        assert!(
            long.iter().all(|v| *v == bf16::from_f32(258.0)),
            "past a block"
        );
    }

    /// The other types: the same sum as adding piece after piece in place.
    #[test]
    fn other_types_sum_as_before() {
        let a = [0.1f32, -0.0, 1e30];
        let (b, c) = ([0.2f32, -0.0, 1.0], [0.3f32, 0.0, -1e30]);
        let mut sum = a;
        sum_in_order(&mut sum, &[&b, &c]);
        let expected: Vec<f32> = (0..3).map(|i| (a[i] + b[i]) + c[i]).collect();
        assert_eq!(
            sum.map(f32::to_bits).to_vec(),
            expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let mut ints = [i32::MAX, 1];
        sum_in_order(&mut ints, &[&[1, 2][..]]);
        assert_eq!(ints, [i32::MIN, 3]);
    }

    #[test]
    fn half_sgd_steps_in_f32_and_rounds_once() {
        let s = bf16::from_f32(1.0);
        let g = bf16::from_f32(3.0);
        let want = bf16::from_f32(1.0 - 0.1f32 * 3.0);
        assert_eq!(s.step(0.1, g), want);
    }
}
