//! Helpers shared by the wire format's integration tests.

/// The factor by which soaks and sweeps repeat or grow: `SWITCHYARD_TEST_SCALE`, 1
/// (what CI runs) when unset. A nightly-style run raises it; a value that is not a
/// positive integer fails the test rather than quietly running at scale 1.
pub(crate) fn scale() -> u64 {
    match std::env::var("SWITCHYARD_TEST_SCALE") {
        Err(_) => 1,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("SWITCHYARD_TEST_SCALE={text:?}: expected a positive integer"),
        },
    }
}
