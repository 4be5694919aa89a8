//! cargo-fuzz entry point: `cargo +nightly fuzz run decode_header --features libfuzzer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_fuzz::targets::decode_header(data);
});
