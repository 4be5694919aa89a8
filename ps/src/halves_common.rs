//! The half-precision tests' own view of `half::f16` and `half::bf16`, shared by the
//! store's unit tests (`halves_tests.rs`) and the whole-job tests
//! (`tests/ps_halves.rs`, which include this file by path).

use super::Value;
use half::{bf16, f16};

/// To and from f32, as the `half` crate converts, and the two values the tests
/// build their ties from.
pub(crate) trait Half: Value {
    /// A value whose spacing is 2 (so `BIG + 1` is a tie, which goes to even: `BIG`).
    #[allow(dead_code)]
    const BIG: f32;
    /// Half the spacing at 1: `1 + TIE` is a tie, which goes to even: 1.
    const TIE: f32;
    /// The value as an f32 (exact).
    fn to(self) -> f32;
    /// `v` rounded to the nearest half, ties to even.
    fn from(v: f32) -> Self;
}

impl Half for f16 {
    const BIG: f32 = 2048.0;
    const TIE: f32 = 1.0 / 2048.0;
    fn to(self) -> f32 {
        self.to_f32()
    }
    fn from(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Half for bf16 {
    const BIG: f32 = 256.0;
    const TIE: f32 = 1.0 / 256.0;
    fn to(self) -> f32 {
        self.to_f32()
    }
    fn from(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
