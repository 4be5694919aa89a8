//! The numbers a parameter server stores: [`Value`].

use switchyard_msg::payload::Element;

/// A number type a key's values can have: travels as a payload frame and adds.
///
/// Implemented for `f32`, `f64`, `i32` and `i64`. Integers add with wrap-around, so
/// that a sum never panics; SGD on integers rounds toward zero.
pub trait Value: Element + Copy + Default + PartialEq + std::fmt::Debug {
    /// `self + other`.
    fn add(self, other: Self) -> Self;
    /// `self - rate * gradient` (SGD's step).
    fn step(self, rate: f64, gradient: Self) -> Self;
}

macro_rules! float_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn add(self, other: Self) -> Self {
                self + other
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
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn step(self, rate: f64, gradient: Self) -> Self {
                self.wrapping_sub((rate * gradient as f64) as $t)
            }
        }
    )*};
}

float_value!(f32, f64);
int_value!(i32, i64);
