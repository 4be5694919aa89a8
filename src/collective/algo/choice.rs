//! Which algorithm the mesh engine runs for a call: one pure function of what every
//! rank knows alike (the call, its size, the world size and the options), so that
//! every rank picks the same one.

use crate::collective::options::Tuning;

/// The shape of a mesh call, as far as the choice of algorithm goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A built-in, commutative reduction whose result every rank gets.
    Allreduce,
    /// One rank's buffer to every rank.
    Broadcast,
    /// Every rank's block to every rank.
    Allgather,
    /// A built-in reduction leaving each rank one block.
    ReduceScatter,
    /// No data.
    Barrier,
    /// A rank-ordered reduction with a user function onto rank 0.
    OrderedReduce,
}

/// A mesh algorithm (see the modules of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algorithm {
    /// Recursive doubling: `log2 n` whole-buffer exchanges.
    Doubling,
    /// Direct exchange: allreduce by reduce-scatter and allgather straight to every
    /// rank, allgather straight to every rank, broadcast by scatter then allgather.
    Direct,
    /// The pipelined ring (reduce-scatter and/or allgather).
    Ring,
    /// A binomial tree: one frame down it for broadcast, in rank order up it for
    /// [`Kind::OrderedReduce`].
    Tree,
    /// The pipelined chain broadcast.
    Chain,
}

/// The algorithm for a call of `kind` over `bytes` bytes in `count` elements on
/// `world` ranks.
///
/// - allreduce: recursive doubling below `large_threshold` bytes or with fewer
///   elements than ranks (the bandwidth algorithms give every rank a block); above,
///   the direct exchange up to `direct_max_ranks` ranks, the ring beyond;
/// - broadcast: the binomial tree below `large_threshold` bytes; above, scatter and
///   direct allgather up to `direct_max_ranks` ranks, the chain beyond;
/// - allgather: direct below `gather_threshold` bytes, the ring from there;
/// - reduce-scatter: always the ring; barrier: recursive doubling on nothing;
///   ordered reduce: the binomial tree (its order is the point).
pub(crate) fn choose(
    kind: Kind,
    bytes: usize,
    count: usize,
    world: usize,
    tuning: &Tuning,
) -> Algorithm {
    let large = bytes >= tuning.large_threshold;
    let few_ranks = world <= tuning.direct_max_ranks;
    match kind {
        Kind::Allreduce if !large || count < world => Algorithm::Doubling,
        Kind::Allreduce if few_ranks => Algorithm::Direct,
        Kind::Allreduce => Algorithm::Ring,
        Kind::Broadcast if !large => Algorithm::Tree,
        Kind::Broadcast if few_ranks => Algorithm::Direct,
        Kind::Broadcast => Algorithm::Chain,
        Kind::Allgather if bytes < tuning.gather_threshold => Algorithm::Direct,
        Kind::Allgather | Kind::ReduceScatter => Algorithm::Ring,
        Kind::Barrier => Algorithm::Doubling,
        Kind::OrderedReduce => Algorithm::Tree,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::CommOptions;

    fn tuning() -> Tuning {
        CommOptions::default()
            .with_large_threshold(1000)
            .with_gather_threshold(5000)
            .with_direct_max_ranks(4)
            .tuning()
    }

    /// Every size around each threshold, on every world size around
    /// `direct_max_ranks`, against the rule spelt out case by case.
    #[test]
    fn allreduce_at_every_threshold() {
        let t = tuning();
        for world in 1usize..=8 {
            for bytes in [0, 1, 999, 1000, 1001, 4999, 5000, 5001, usize::MAX] {
                for count in [0, 1, world.saturating_sub(1), world, world + 1, bytes / 4] {
                    let expected = if bytes < 1000 || count < world {
                        Algorithm::Doubling
                    } else if world <= 4 {
                        Algorithm::Direct
                    } else {
                        Algorithm::Ring
                    };
                    assert_eq!(
                        choose(Kind::Allreduce, bytes, count, world, &t),
                        expected,
                        "{bytes} B, {count} elements, {world} ranks"
                    );
                }
            }
        }
    }

    #[test]
    fn broadcast_allgather_and_the_fixed_ones_at_every_threshold() {
        let t = tuning();
        for world in 1usize..=8 {
            for bytes in [0, 1, 999, 1000, 1001, 4999, 5000, 5001, usize::MAX] {
                let count = bytes;
                let broadcast = match (bytes >= 1000, world <= 4) {
                    (false, _) => Algorithm::Tree,
                    (true, true) => Algorithm::Direct,
                    (true, false) => Algorithm::Chain,
                };
                let case = format!("{bytes} B on {world} ranks");
                assert_eq!(
                    choose(Kind::Broadcast, bytes, count, world, &t),
                    broadcast,
                    "{case}"
                );
                let gather = if bytes < 5000 {
                    Algorithm::Direct
                } else {
                    Algorithm::Ring
                };
                assert_eq!(
                    choose(Kind::Allgather, bytes, count, world, &t),
                    gather,
                    "{case}"
                );
                let fixed = [
                    (Kind::ReduceScatter, Algorithm::Ring),
                    (Kind::Barrier, Algorithm::Doubling),
                    (Kind::OrderedReduce, Algorithm::Tree),
                ];
                for (kind, algorithm) in fixed {
                    assert_eq!(choose(kind, bytes, count, world, &t), algorithm, "{case}");
                }
            }
        }
    }

    #[test]
    fn direct_max_ranks_zero_always_takes_the_ring_or_chain() {
        let t = CommOptions::default()
            .with_direct_max_ranks(0)
            .with_large_threshold(0)
            .tuning();
        for world in 1usize..=8 {
            assert_eq!(
                choose(Kind::Allreduce, 4096, 1024, world, &t),
                Algorithm::Ring
            );
            assert_eq!(
                choose(Kind::Broadcast, 4096, 1024, world, &t),
                Algorithm::Chain
            );
        }
    }

    #[test]
    fn a_zero_threshold_still_keeps_short_buffers_on_doubling() {
        let t = CommOptions::default().with_large_threshold(0).tuning();
        assert_eq!(choose(Kind::Allreduce, 0, 0, 3, &t), Algorithm::Doubling);
        assert_eq!(choose(Kind::Allreduce, 8, 2, 3, &t), Algorithm::Doubling);
        assert_eq!(choose(Kind::Allreduce, 12, 3, 3, &t), Algorithm::Direct);
        // A broadcast has no blocks to hand out per rank; even nothing goes direct.
        assert_eq!(choose(Kind::Broadcast, 0, 0, 3, &t), Algorithm::Direct);
    }

    /// The defaults are the measured ones (BENCHMARKS.md): 512 KiB, 8 ranks, 64 MiB.
    #[test]
    fn the_default_thresholds() {
        let t = CommOptions::default().tuning();
        let kib = 1 << 10;
        let f32s = |bytes: usize| bytes / 4;
        let at = |bytes, world| choose(Kind::Allreduce, bytes, f32s(bytes), world, &t);
        assert_eq!(at(512 * kib - 1, 4), Algorithm::Doubling);
        assert_eq!(at(512 * kib, 4), Algorithm::Direct);
        assert_eq!(at(512 * kib, 8), Algorithm::Direct);
        assert_eq!(at(512 * kib, 9), Algorithm::Ring);
        let gather = |bytes| choose(Kind::Allgather, bytes, bytes, 4, &t);
        assert_eq!(gather((64 << 20) - 1), Algorithm::Direct);
        assert_eq!(gather(64 << 20), Algorithm::Ring);
    }
}
