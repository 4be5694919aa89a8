//! The wire format's integration tests in one binary: each file is a module (run one
//! with `cargo test -p switchyard-msg --test it -- decode_props::`).

mod support;

mod decode_alloc_bound;
mod decode_props;
