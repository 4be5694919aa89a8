//! Fuzz targets for switchyard's decoders, and a driver that runs them on stable.
//!
//! Each [`Target`] is a function of the raw input bytes that panics when it finds a
//! bug: the decoder panicked, refused an input without a typed error, accepted one
//! that does not re-encode to the same bytes, or allocated more than its limits allow
//! (the [`alloc`] module counts). Three ways run the same functions:
//!
//! - `cargo run --manifest-path fuzz/Cargo.toml --bin fuzz -- --seconds 30`: the stable
//!   driver ([`driver`]), a deterministic mutator over the seed corpus;
//! - `cargo +nightly fuzz run decode_header --features libfuzzer`: libFuzzer, coverage
//!   guided, for those with nightly and cargo-fuzz (`fuzz_targets/`);
//! - `cargo test --manifest-path fuzz/Cargo.toml`: replays `fuzz/corpus/*` (the seeds
//!   and any finds copied there) as a normal test.
//!
//! The seed corpus is written by `cargo run --manifest-path fuzz/Cargo.toml --bin fuzz
//! -- seed` from [`Target::seeds`].

pub mod alloc;
pub mod corpus;
pub mod driver;
pub mod mutate;
pub mod targets;

pub use targets::{Target, TARGETS};
