//! Random tags: 64 bits that tell one job's or one mesh's connections and datagrams
//! from a stray's or an older generation's.

use std::hash::{BuildHasher, Hasher};

/// 64 random bits: std's per-process random hash keys, mixed with the time and the
/// pid. Not a secret (anyone on the path sees a tag); two processes started at the same
/// instant still draw different keys, which is all a tag needs.
///
/// # Examples
///
/// ```
/// assert_ne!(switchyard_net::tag::random_tag(), switchyard_net::tag::random_tag());
/// ```
pub fn random_tag() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
