//! The tree and ring link maps of the classic protocol, exactly as XGBoost 1.7's
//! tracker builds them.
//!
//! A heap-shaped tree over provisional ids is walked depth first into a ring (the last
//! child's walk reversed, children visited in the order a small Python set of ints
//! iterates: by value mod 8), and every id is relabelled by its position in that ring.
//! After relabelling the ring is simply `r-1 → r → r+1`, which XGBoost's ring
//! algorithms require, and the tree still has root 0.

/// Rank `r`'s place in the tree and ring of a world of `n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Links {
    /// The tree parent, `-1` for the root.
    pub parent: i32,
    /// Tree neighbours (parent and children), ascending.
    pub tree: Vec<u32>,
    /// The ring predecessor, `-1` when it would be `r` itself (a world of one).
    pub prev: i32,
    /// The ring successor, `-1` when it would be `r` itself.
    pub next: i32,
}

impl Links {
    /// Every rank this one links to: tree neighbours and ring neighbours, ascending,
    /// without repeats.
    pub fn link_set(&self) -> Vec<u32> {
        let mut all = self.tree.clone();
        all.extend(
            [self.prev, self.next]
                .iter()
                .filter(|&&r| r >= 0)
                .map(|&r| r as u32),
        );
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// The provisional heap tree's children of `p`, in the reference's visiting order.
fn children(p: usize, n: usize) -> Vec<usize> {
    let mut kids: Vec<usize> = [2 * p + 1, 2 * p + 2]
        .into_iter()
        .filter(|&c| c < n)
        .collect();
    // A Python set of small ints iterates by value mod 8: 2p+1 ≡ 7 puts 2p+2 (≡ 0) first.
    kids.sort_by_key(|&c| c % 8);
    kids
}

/// The ring walk from `root`: W(p) = [p] ++ W(first child) ++ reverse(W(last child)).
fn ring_walk(root: usize, n: usize) -> Vec<usize> {
    fn walk(p: usize, n: usize) -> Vec<usize> {
        let mut out = vec![p];
        let kids = children(p, n);
        let last = kids.len().saturating_sub(1);
        for (i, c) in kids.into_iter().enumerate() {
            let mut sub = walk(c, n);
            if i == last {
                sub.reverse();
            }
            out.extend(sub);
        }
        out
    }
    // Depth is log2(n): recursion is safe for any n a tracker will see.
    walk(root, n)
}

/// The maps for a world of `n`: `maps(n)[r]` is rank `r`'s links. Empty for `n = 0`.
pub fn link_maps(n: usize) -> Vec<Links> {
    if n == 0 {
        return Vec::new();
    }
    let ring = ring_walk(0, n);
    let mut rank_of = vec![0usize; n];
    for (pos, &p) in ring.iter().enumerate() {
        rank_of[p] = pos;
    }
    let mut out = vec![
        Links {
            parent: -1,
            tree: Vec::new(),
            prev: -1,
            next: -1,
        };
        n
    ];
    for p in 0..n {
        let r = rank_of[p];
        let parent = if p == 0 {
            None
        } else {
            Some(rank_of[(p - 1) / 2])
        };
        let mut tree: Vec<u32> = children(p, n)
            .into_iter()
            .map(|c| rank_of[c] as u32)
            .collect();
        if let Some(q) = parent {
            tree.push(q as u32);
        }
        tree.sort_unstable();
        let other = |q: usize| if q == r { -1 } else { q as i32 };
        out[r] = Links {
            parent: parent.map_or(-1, |q| q as i32),
            tree,
            prev: other((r + n - 1) % n),
            next: other((r + 1) % n),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_matches_the_reference_vector() {
        let ring = ring_walk(0, 16);
        assert_eq!(ring, [0, 1, 3, 8, 15, 7, 10, 9, 4, 6, 13, 14, 12, 11, 5, 2]);
        let parents: Vec<i32> = link_maps(16).iter().map(|l| l.parent).collect();
        assert_eq!(
            parents,
            [-1, 0, 1, 2, 5, 2, 8, 8, 1, 15, 9, 9, 14, 14, 15, 0]
        );
    }

    #[test]
    fn small_worlds_match_the_reference_table() {
        // rabit's link maps, n = 1..8: (parent, tree neighbours) by rank.
        let table: [&[(i32, &[u32])]; 8] = [
            &[(-1, &[])],
            &[(-1, &[1]), (0, &[0])],
            &[(-1, &[1, 2]), (0, &[0]), (0, &[0])],
            &[(-1, &[1, 3]), (0, &[0, 2]), (1, &[1]), (0, &[0])],
            &[
                (-1, &[1, 4]),
                (0, &[0, 2, 3]),
                (1, &[1]),
                (1, &[1]),
                (0, &[0]),
            ],
            &[
                (-1, &[1, 5]),
                (0, &[0, 2, 3]),
                (1, &[1]),
                (1, &[1]),
                (5, &[5]),
                (0, &[0, 4]),
            ],
            &[
                (-1, &[1, 6]),
                (0, &[0, 2, 3]),
                (1, &[1]),
                (1, &[1]),
                (6, &[6]),
                (6, &[6]),
                (0, &[0, 4, 5]),
            ],
            &[
                (-1, &[1, 7]),
                (0, &[0, 2, 4]),
                (1, &[1, 3]),
                (2, &[2]),
                (1, &[1]),
                (7, &[7]),
                (7, &[7]),
                (0, &[0, 5, 6]),
            ],
        ];
        for (i, want) in table.iter().enumerate() {
            let n = i + 1;
            let got = link_maps(n);
            for (r, (parent, tree)) in want.iter().enumerate() {
                assert_eq!(got[r].parent, *parent, "n={n} rank {r} parent");
                assert_eq!(got[r].tree, *tree, "n={n} rank {r} tree");
            }
        }
        assert_eq!(link_maps(1)[0].prev, -1);
        assert_eq!(link_maps(2)[0].link_set(), [1]);
    }

    #[test]
    fn every_world_up_to_300_is_a_symmetric_spanning_tree_with_a_rank_ring() {
        for n in 1..=300 {
            let maps = link_maps(n);
            for (r, l) in maps.iter().enumerate() {
                if n > 1 {
                    assert_eq!(l.prev, ((r + n - 1) % n) as i32);
                    assert_eq!(l.next, ((r + 1) % n) as i32);
                }
                if l.parent >= 0 {
                    assert!(l.tree.contains(&(l.parent as u32)), "n={n} r={r}");
                }
                for &q in &l.link_set() {
                    assert!(maps[q as usize].link_set().contains(&(r as u32)), "n={n}");
                }
            }
            // n-1 tree edges, all reachable from 0 by parents.
            let edges: usize = maps.iter().map(|l| l.tree.len()).sum();
            assert_eq!(edges, 2 * (n - 1), "n={n}");
            for r in 0..n {
                let (mut at, mut hops) = (r as i32, 0);
                while at != 0 {
                    at = maps[at as usize].parent;
                    hops += 1;
                    assert!(hops <= n, "n={n} r={r} has no path to the root");
                }
            }
        }
    }
}
