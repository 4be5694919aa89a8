//! How the algorithms that combine a block in one place (the host board, the direct
//! exchange) add up every rank's part of it: [`Accumulate`], with the element type's
//! own operation ([`Pairwise`]) or, for the two-byte floats, in `f32` with one
//! rounding per block ([`HalfInF32`]).

use crate::collective::element::{ReduceOp, Reducible};
use half::slice::HalfFloatSliceExt;
use switchyard_msg::copy::copy_elements;
use switchyard_msg::payload::Element;

/// Combines every rank's part of a block into `acc`, in an order the algorithm
/// fixes: either [`Accumulate::add`] with `from == 0` first (that part replaces what
/// `acc` held), or [`Accumulate::start_in_place`] (the first part is what `acc`
/// holds already); then `add` for each later part, `last` set on the last one. Every
/// rank that combines a block makes the same calls in the same order, so the result
/// is the same wherever it is computed.
pub(crate) trait Accumulate<T> {
    /// Combines the part `theirs`, number `from` in the order, into `acc`.
    fn add(&mut self, acc: &mut [T], from: usize, last: bool, theirs: &[T]);

    /// Starts a block from what `acc` holds, as `add` with `from == 0` would from a
    /// copy of it; a block with no later part is left as it is.
    fn start_in_place(&mut self, acc: &[T]);
}

/// The element type's own operation, part after part: `((x0 + x1) + x2) + ...`.
pub(crate) struct Pairwise<'a, T>(pub(crate) &'a dyn Fn(&mut [T], &[T]));

impl<T: Element> Accumulate<T> for Pairwise<'_, T> {
    fn add(&mut self, acc: &mut [T], from: usize, _last: bool, theirs: &[T]) {
        if from == 0 {
            copy_elements(acc, theirs);
        } else {
            (self.0)(acc, theirs);
        }
    }

    fn start_in_place(&mut self, _acc: &[T]) {}
}

/// The two-byte floats ([`DType::is_half`](crate::collective::DType::is_half)):
/// every part widened to `f32` and combined there, part after part, with `f32`'s
/// operation, and the block rounded to the element type once, after the last part.
/// The parts travel in their own type (half the bytes of `f32`); only the block being
/// combined is widened: into a buffer kept for the call, and each later part a chunk
/// at a time.
pub(crate) struct HalfInF32 {
    op: ReduceOp,
    acc: Vec<f32>,
}

/// Elements a later part is widened in at a time before it is combined: a buffer
/// that stays in the first-level cache between the two passes.
const WIDEN_CHUNK: usize = 1024;

impl HalfInF32 {
    /// The accumulation of `op`.
    pub(crate) fn new(op: ReduceOp) -> HalfInF32 {
        HalfInF32 {
            op,
            acc: Vec::new(),
        }
    }

    /// `first`, widened, as the block's running result.
    fn widen_first<T>(&mut self, first: &[T])
    where
        [T]: HalfFloatSliceExt,
    {
        self.acc.clear();
        self.acc.resize(first.len(), 0.0);
        first.convert_to_f32_slice(&mut self.acc);
    }
}

impl<T> Accumulate<T> for HalfInF32
where
    [T]: HalfFloatSliceExt,
{
    fn add(&mut self, acc: &mut [T], from: usize, last: bool, theirs: &[T]) {
        if from == 0 {
            self.widen_first(theirs);
        } else {
            let mut wide = [0f32; WIDEN_CHUNK];
            let chunks = self
                .acc
                .chunks_mut(WIDEN_CHUNK)
                .zip(theirs.chunks(WIDEN_CHUNK));
            for (acc, theirs) in chunks {
                let wide = &mut wide[..theirs.len()];
                theirs.convert_to_f32_slice(wide);
                f32::reduce_into(self.op, acc, wide);
            }
        }
        if last {
            acc.convert_from_f32_slice(&self.acc);
        }
    }

    fn start_in_place(&mut self, acc: &[T]) {
        self.widen_first(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// Started in place or from a first part, the same sum, rounded once at the last
    /// part: 2048 + 1 + 1 = 2050 in f16 (2048 one part at a time).
    #[test]
    fn halves_accumulate_in_f32_and_round_at_the_last_part() {
        let one = [f16::ONE; 3];
        let mut by_parts = [f16::ZERO; 3];
        let mut sum = HalfInF32::new(ReduceOp::Sum);
        sum.add(&mut by_parts, 0, false, &[f16::from_f32(2048.0); 3]);
        sum.add(&mut by_parts, 1, false, &one);
        assert_eq!(
            by_parts,
            [f16::ZERO; 3],
            "nothing written before the last part"
        );
        sum.add(&mut by_parts, 2, true, &one);
        assert_eq!(by_parts, [f16::from_f32(2050.0); 3]);
        let mut in_place = [f16::from_f32(2048.0); 3];
        sum.start_in_place(&in_place);
        sum.add(&mut in_place, 1, false, &one);
        sum.add(&mut in_place, 2, true, &one);
        assert_eq!(in_place, by_parts);
        let mut pairwise = [f16::from_f32(2048.0); 3];
        let reduce = |a: &mut [f16], b: &[f16]| f16::reduce_into(ReduceOp::Sum, a, b);
        let mut each = Pairwise(&reduce);
        each.start_in_place(&pairwise);
        each.add(&mut pairwise, 1, false, &one);
        each.add(&mut pairwise, 2, true, &one);
        assert_eq!(pairwise, [f16::from_f32(2048.0); 3]);
    }
}
