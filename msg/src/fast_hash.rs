//! A hasher for tables keyed by a job's own identifiers (peer identities, ranks,
//! tags, parameter keys, request ids), looked up on every message: a multiply-rotate
//! hash of 8-byte words (the scheme of rustc's FxHash) instead of std's SipHash, whose
//! defence against chosen keys costs about 200 instructions a lookup on a router and
//! 13% of the instructions of a parameter-server round of 32 small keys.
//!
//! It does not resist chosen keys (HashDoS): use it only where the keys come from
//! this process or from the job's own ranks (which, with a job secret, proved who they
//! are). Tables keyed by what strangers send keep SipHash.
//!
//! ```
//! use switchyard_msg::fast_hash::FastMap;
//! let mut ranks: FastMap<(u32, u64), &str> = FastMap::default();
//! ranks.insert((1, 7), "worker 1, request 7");
//! assert_eq!(ranks[&(1, 7)], "worker 1, request 7");
//! ```

use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-and-rotate hasher over 8-byte words.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = std::collections::HashSet<K, BuildHasherDefault<FastHasher>>;

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(word);
            self.add(u64::from_le_bytes(eight));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut eight = [0u8; 8];
            eight[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(eight));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn equal_keys_hash_equal_and_near_keys_apart() {
        let build = BuildHasherDefault::<FastHasher>::default();
        assert_eq!(build.hash_one(b"worker-1"), build.hash_one(b"worker-1"));
        assert_ne!(build.hash_one(b"worker-1"), build.hash_one(b"worker-2"));
        assert_ne!(build.hash_one((1i32, 2i32)), build.hash_one((2i32, 1i32)));
        let mut map: FastMap<Vec<u8>, u32> = FastMap::default();
        for i in 0..1000u32 {
            map.insert(i.to_le_bytes().to_vec(), i);
        }
        assert!((0..1000u32).all(|i| map[&i.to_le_bytes().to_vec()] == i));
    }

    #[test]
    fn dense_keys_spread_over_the_buckets_and_the_tags() {
        // hashbrown finds the bucket by the low bits and filters by a tag of the top
        // 7: consecutive keys take distinct buckets, and their tags vary.
        let hashes: Vec<u64> = (0..128u64)
            .map(|k| {
                let mut h = FastHasher::default();
                h.write_u64(k);
                h.finish()
            })
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 127).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(low.len(), 128);
        assert!(tags.len() > 32, "{} distinct tags", tags.len());
    }
}
