//! A small deterministic mutator: the same seed gives the same inputs on every machine,
//! so a failure found by the driver in CI is reproduced by rerunning with its seed.
//!
//! It knows nothing of the formats beyond what every one of them shares: little-endian
//! `u32`/`u64` fields (lengths, counts, tags), so besides flipping and splicing bytes it
//! writes boundary numbers over whole words, which reach limit checks that random
//! bytes rarely do.

/// The workspace's seeded generator (SplitMix64), shared with the simulations: tiny,
/// fast and good enough to pick mutations.
pub use switchyard_sim::Rng;

/// Byte values at the edges of what the formats test: small tags, signs, all ones.
const BYTES: [u8; 10] = [0, 1, 2, 3, 11, 12, 0x7f, 0x80, 0xfe, 0xff];

/// Word values at the edges of counts, tags and limits.
const WORDS: [u64; 18] = [
    0,
    1,
    2,
    3,
    4,
    11,
    12,
    16,
    17,
    255,
    256,
    1024,
    1025,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 62,
    u64::MAX,
];

/// Mutates `input` in place with one to four stacked changes, keeping it at most
/// `max_len` bytes; `other` is another corpus entry to splice from.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], max_len: usize) {
    for _ in 0..1 + rng.index(4) {
        mutate_once(rng, input, other);
    }
    input.truncate(max_len);
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    let len = input.len();
    match rng.index(10) {
        0 if len > 0 => {
            let at = rng.index(len);
            input[at] ^= 1 << rng.index(8);
        }
        1 if len > 0 => {
            let at = rng.index(len);
            input[at] = rng.next_u64() as u8;
        }
        2 if len > 0 => {
            let at = rng.index(len);
            input[at] = rng.pick(&BYTES);
        }
        3 | 4 => {
            let width = if rng.index(2) == 0 { 4 } else { 8 };
            if len >= width {
                let at = rng.index(len - width + 1);
                let word = rng.pick(&WORDS).to_le_bytes();
                input[at..at + width].copy_from_slice(&word[..width]);
            }
        }
        5 => {
            let at = rng.index(len + 1);
            let count = 1 + rng.index(8);
            let bytes: Vec<u8> = (0..count).map(|_| rng.next_u64() as u8).collect();
            input.splice(at..at, bytes);
        }
        6 if len > 0 => {
            let at = rng.index(len);
            let end = (at + 1 + rng.index(8)).min(len);
            input.drain(at..end);
        }
        7 if len > 0 => {
            let at = rng.index(len);
            let end = (at + 1 + rng.index(16)).min(len);
            let chunk = input[at..end].to_vec();
            let to = rng.index(len + 1);
            input.splice(to..to, chunk);
        }
        8 if len > 0 => input.truncate(rng.index(len)),
        9 if !other.is_empty() => {
            // Splice: this input's head, the other's tail.
            let keep = rng.index(len + 1);
            let from = rng.index(other.len());
            input.truncate(keep);
            input.extend_from_slice(&other[from..]);
        }
        _ => input.push(rng.pick(&BYTES)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_inputs() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = b"SY\x02\x00 some bytes to change".to_vec();
            let mut seen = Vec::new();
            for _ in 0..200 {
                mutate(&mut rng, &mut input, b"other", 64);
                seen.push(input.clone());
            }
            seen
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert!(run(7).iter().all(|input| input.len() <= 64));
    }
}
