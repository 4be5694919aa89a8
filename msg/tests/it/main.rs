//! The wire format's integration tests in one binary: each file is a module (run one
//! with `cargo test -p switchyard-msg --test it -- decode_props::`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod decode_alloc_bound;
mod decode_props;
