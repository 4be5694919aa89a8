//! The hash of the server's and the worker's tables, which are keyed by keys, worker
//! ranks and request ids: a multiply-rotate hash of the words (FxHash's), not std's
//! SipHash, which took 13% of the instructions of a round of 32 small keys.
//!
//! It does not resist chosen keys (HashDoS): the keys come from the job's own
//! workers, which registered with the scheduler (and, with a job secret, proved it).

use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`KeyHasher`].
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<KeyHasher>>;
/// A `HashSet` with [`KeyHasher`].
pub(crate) type HashSet<K> = std::collections::HashSet<K, BuildHasherDefault<KeyHasher>>;

/// FxHash's word hash: rotate, xor in the word, multiply.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_keys_spread_over_the_buckets_and_the_tags() {
        // hashbrown finds the bucket by the low bits and filters by a tag of the top
        // 7: consecutive keys take distinct buckets, and their tags vary.
        let hashes: Vec<u64> = (0..128u64)
            .map(|k| {
                let mut h = KeyHasher::default();
                h.write_u64(k);
                h.finish()
            })
            .collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 127).collect();
        let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!(low.len(), 128);
        assert!(tags.len() > 32, "{} distinct tags", tags.len());
        let mut map: HashMap<(u32, u64), u64> = HashMap::default();
        map.insert((1, 2), 3);
        assert_eq!(map.get(&(1, 2)), Some(&3));
    }
}
