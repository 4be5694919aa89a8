//! A hasher for the tables a router consults on every message (peer identities,
//! rank and tag pairs), whose keys come from this process or from the ranks of its
//! own job: SipHash's defence against chosen keys costs about 200 instructions per
//! lookup there and buys nothing. Tables keyed by what strangers send keep SipHash.

use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-and-rotate hasher over 8-byte words (the scheme of rustc's FxHash).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

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

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FastHasher>>;

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
}
