//! cargo-fuzz entry point: `cargo +nightly fuzz run mpi_wire --features libfuzzer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    switchyard_fuzz::targets::mpi_wire(data);
});
