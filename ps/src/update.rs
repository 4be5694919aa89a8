//! What a server does with a round's pushes ([`Update`]) and when ([`Mode`]).

use super::Value;
use std::sync::Arc;

/// The function a custom [`Update`] runs: key, stored values, aggregate of the pushes.
pub type UpdateFn<T> = dyn Fn(u64, &mut [T], &[T]) + Send + Sync;

/// What a server does with the aggregate of a round (the sum of the pushes).
///
/// In [`Mode::Sync`] the aggregate is summed in worker rank order and, for halves,
/// accumulated in `f32` and rounded once before the update sees it ([`Value`]). In
/// [`Mode::Async`] each push is the aggregate of its own: [`Update::Sum`] adds it to
/// the stored value in [`Value::Acc`] and rounds once ([`Value::add`]), so the stored
/// value depends on the order pushes arrive in.
///
/// A key never pushed or initialised starts as zeros. For a key split over servers,
/// each server runs the update on its own piece, so a custom function must work
/// element by element (or know the piece layout, [`super::Placement::pieces`]).
#[derive(Clone)]
#[non_exhaustive]
pub enum Update<T> {
    /// `stored += aggregate` (ps-lite's default handle).
    Sum,
    /// `stored -= rate * aggregate`: SGD, the pushes being gradients (for halves,
    /// computed in `f32` and rounded once, [`Value::step`]).
    Sgd {
        /// The learning rate.
        rate: f64,
    },
    /// A function of the key, the stored values (to change in place) and the
    /// aggregate.
    Custom(Arc<UpdateFn<T>>),
}

impl<T> std::fmt::Debug for Update<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Update::Sum => f.write_str("Sum"),
            Update::Sgd { rate } => write!(f, "Sgd {{ rate: {rate} }}"),
            Update::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl<T: Value> Update<T> {
    /// A custom update from a closure.
    pub fn custom(f: impl Fn(u64, &mut [T], &[T]) + Send + Sync + 'static) -> Update<T> {
        Update::Custom(Arc::new(f))
    }

    pub(crate) fn apply(&self, key: u64, stored: &mut [T], aggregate: &[T]) {
        match self {
            Update::Sum => stored
                .iter_mut()
                .zip(aggregate)
                .for_each(|(s, a)| *s = s.add(*a)),
            Update::Sgd { rate } => stored
                .iter_mut()
                .zip(aggregate)
                .for_each(|(s, a)| *s = s.step(*rate, *a)),
            Update::Custom(f) => f(key, stored, aggregate),
        }
    }
}

/// When pushes are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Wait for every worker's push of a key, then apply their sum once.
    #[default]
    Sync,
    /// Apply every push as it comes.
    Async,
}
