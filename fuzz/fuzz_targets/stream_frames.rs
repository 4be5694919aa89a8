//! cargo-fuzz entry point: `cargo +nightly fuzz run stream_frames --features libfuzzer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_fuzz::targets::stream_frames(data);
});
