//! Which server holds which key, and which part of a long value.
//!
//! Pure functions, no sockets: [`Placement`] maps a key and its length to pieces on
//! servers. Range sharding cuts the key space `0..key_space` into `servers` ranges whose
//! sizes differ by at most one, computed in 128-bit arithmetic so that no key is left
//! without a server when the space does not divide evenly (ps-lite's `Range` division
//! drops the remainder, so the last keys of `u64` belong to nobody). Hash sharding
//! spreads keys with a fixed 64-bit mixer, for key sets that crowd into one range.
//! A value of at least [`Placement::split_threshold`] elements is cut into one
//! contiguous piece per server, so that one big tensor loads every server's link.

use super::PsError;

/// How keys are spread over servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharding {
    /// Contiguous key ranges: keys `0..key_space` in `servers` ranges of near-equal
    /// size. `key_space: None` is all of `u64`. Dense keys `0..n` spread best with
    /// `key_space: Some(n)`.
    Range {
        /// Keys are `0..key_space`; `None`: every `u64`.
        key_space: Option<u64>,
    },
    /// `mix(key) % servers`, with splitmix64's finaliser as the mixer: for keys that
    /// crowd into part of the space.
    Hash,
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding::Range { key_space: None }
    }
}

/// One contiguous part of a key's value, held by one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The server's rank.
    pub server: usize,
    /// First element of the value this piece holds.
    pub offset: u64,
    /// Number of elements.
    pub len: u64,
}

/// Where keys go: the sharding, the number of servers, the split threshold.
///
/// # Examples
///
/// ```
/// use switchyard_ps::{Placement, Sharding};
/// # fn main() -> Result<(), switchyard_ps::PsError> {
/// let place = Placement::new(Sharding::Range { key_space: Some(10) }, 3, 1000);
/// // 10 keys over 3 servers: 0..4, 4..7, 7..10 — key 9 is not lost.
/// assert_eq!(place.owner(3)?, 0);
/// assert_eq!(place.owner(9)?, 2);
/// // A long value is split: one piece per server.
/// let pieces = place.pieces(5, 3000)?;
/// assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), 3000);
/// assert_eq!(pieces.len(), 3);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    sharding: Sharding,
    servers: usize,
    split_threshold: u64,
}

impl Placement {
    /// A placement over `servers` servers (at least 1); values of `split_threshold`
    /// elements or more are split over every server.
    pub fn new(sharding: Sharding, servers: usize, split_threshold: u64) -> Placement {
        Placement {
            sharding,
            servers: servers.max(1),
            split_threshold: split_threshold.max(1),
        }
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// Values at least this long are split over every server.
    pub fn split_threshold(&self) -> u64 {
        self.split_threshold
    }

    fn space(&self) -> u128 {
        match self.sharding {
            Sharding::Range { key_space: Some(n) } => u128::from(n),
            _ => 1u128 << 64,
        }
    }

    /// The server that holds `key` when its value is not split.
    pub fn owner(&self, key: u64) -> Result<usize, PsError> {
        match self.sharding {
            Sharding::Hash => Ok((mix(key) % self.servers as u64) as usize),
            Sharding::Range { key_space } => {
                let space = self.space();
                if u128::from(key) >= space {
                    return Err(PsError::KeyOutOfRange {
                        key,
                        key_space: key_space.unwrap_or(u64::MAX),
                    });
                }
                Ok((u128::from(key) * self.servers as u128 / space) as usize)
            }
        }
    }

    /// The keys server `server` holds under range sharding: `start..end` (end
    /// exclusive, as u128 so that the last range can end at 2^64). `None` for hash
    /// sharding or a server out of range.
    pub fn range_of(&self, server: usize) -> Option<(u128, u128)> {
        if !matches!(self.sharding, Sharding::Range { .. }) || server >= self.servers {
            return None;
        }
        let space = self.space();
        let bound = |s: usize| (s as u128 * space).div_ceil(self.servers as u128);
        Some((bound(server), bound(server + 1)))
    }

    /// Where the `len` values of `key` go: one piece on the key's owner, or, when
    /// `len >= split_threshold` and there are several servers, one non-empty
    /// contiguous piece per server in server order.
    pub fn pieces(&self, key: u64, len: u64) -> Result<Vec<Piece>, PsError> {
        let owner = self.owner(key)?;
        if len < self.split_threshold || self.servers == 1 {
            return Ok(vec![Piece {
                server: owner,
                offset: 0,
                len,
            }]);
        }
        let n = self.servers as u128;
        let cut = |s: usize| (s as u128 * u128::from(len) / n) as u64;
        Ok((0..self.servers)
            .map(|server| Piece {
                server,
                offset: cut(server),
                len: cut(server + 1) - cut(server),
            })
            .filter(|p| p.len > 0)
            .collect())
    }
}

/// splitmix64's finaliser: a bijection on u64 that scatters nearby keys.
fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_u64_space_loses_no_key() {
        for servers in 1..=7 {
            let place = Placement::new(Sharding::default(), servers, u64::MAX);
            assert_eq!(place.owner(0).unwrap(), 0);
            assert_eq!(place.owner(u64::MAX).unwrap(), servers - 1);
            assert_eq!(place.range_of(servers - 1).unwrap().1, 1u128 << 64);
        }
    }

    #[test]
    fn key_outside_space_is_an_error() {
        let place = Placement::new(Sharding::Range { key_space: Some(4) }, 2, 10);
        assert!(matches!(
            place.owner(4),
            Err(PsError::KeyOutOfRange {
                key: 4,
                key_space: 4
            })
        ));
    }

    #[test]
    fn hash_spreads_dense_keys() {
        let place = Placement::new(Sharding::Hash, 4, u64::MAX);
        let mut counts = [0usize; 4];
        for key in 0..4000 {
            counts[place.owner(key).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }

    proptest! {
        #[test]
        fn ranges_tile_the_space(space in 1u64..10_000, servers in 1usize..17) {
            let place = Placement::new(Sharding::Range { key_space: Some(space) }, servers, 10);
            let mut next = 0u128;
            let mut sizes = Vec::new();
            for s in 0..servers {
                let (start, end) = place.range_of(s).unwrap();
                prop_assert_eq!(start, next);
                sizes.push(end - start);
                next = end;
            }
            prop_assert_eq!(next, u128::from(space));
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(hi - lo <= 1);
        }

        #[test]
        fn owner_agrees_with_ranges(space in 1u64..u64::MAX, servers in 1usize..17, key in any::<u64>()) {
            let place = Placement::new(Sharding::Range { key_space: Some(space) }, servers, 10);
            let key = key % space;
            let owner = place.owner(key).unwrap();
            let (start, end) = place.range_of(owner).unwrap();
            prop_assert!(start <= u128::from(key) && u128::from(key) < end);
        }

        #[test]
        fn pieces_cover_the_value(len in 0u64..100_000, servers in 1usize..9, threshold in 1u64..5_000, key in any::<u64>()) {
            let place = Placement::new(Sharding::Hash, servers, threshold);
            let pieces = place.pieces(key, len).unwrap();
            let mut next = 0;
            for p in &pieces {
                prop_assert_eq!(p.offset, next);
                prop_assert!(p.server < servers);
                next += p.len;
            }
            prop_assert_eq!(next, len);
            if len >= threshold && servers > 1 {
                prop_assert_eq!(pieces.len() as u64, (servers as u64).min(len));
            } else {
                prop_assert_eq!(pieces.len(), 1);
            }
        }
    }
}
