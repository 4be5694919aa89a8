//! Plumbing that several switchyard crates share below the facade.
//!
//! [`env`](mod@env) reads environment variables through one injectable lookup and reports a
//! malformed value with one error type, the same way in every crate.

pub mod env;
