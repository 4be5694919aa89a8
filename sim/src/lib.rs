//! The pieces every deterministic simulation of switchyard shares.
//!
//! A simulation drives a crate's real sans-IO state machines over a simulated network
//! and clock. One seed decides everything that could differ between two runs (every
//! delay, every order of delivery, every fault, every jump of the clock), so a seed
//! that breaks an invariant breaks it again on every replay. `docs/testing.md` lists
//! the simulations and what each checks.
//!
//! - [`Rng`]: the seeded generator every choice is drawn from;
//! - [`Campaign`]: runs a budget of seeds (`SIM_SEEDS` for a longer one), replays one
//!   (`SEED`), and reports a failing seed as the one line that replays it followed by
//!   its [`Trace`];
//! - [`Faults`]: the world's misbehaviour (delay, reordering, loss, duplication,
//!   crashes, pauses), each a decision drawn from the seed;
//! - [`Network`]: messages in flight, delivered in order per channel, any due channel
//!   first.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use switchyard_sim::{Campaign, Outcome, Rng, Trace};
//!
//! // A "system" whose invariant is that a counter never passes 10.
//! let campaign = Campaign::new("my-crate", "sim_counter_stays_small", 50);
//! let passed = campaign.run(|seed| {
//!     let mut rng = Rng::new(seed);
//!     let mut trace = Trace::default();
//!     let steps = rng.below(10);
//!     trace.note(Duration::ZERO, format!("{steps} steps"));
//!     Outcome::new(if steps < 10 { Ok(()) } else { Err("too many".into()) }, trace)
//! });
//! assert!(passed.is_ok());
//! ```
#![doc(test(attr(deny(warnings))))]

mod campaign;
mod faults;
mod network;
mod rng;

pub use campaign::{Campaign, Failure, Outcome, Seeds, Trace};
pub use faults::Faults;
pub use network::{Network, Step};
pub use rng::Rng;
