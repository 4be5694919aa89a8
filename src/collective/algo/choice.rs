//! Which algorithm the mesh engine runs for a call: one pure function of the call, its
//! size, the world size and the options, so that ranks that agree on those pick the
//! same one. Ranks that do not (another length, other options) are caught before it
//! matters: the algorithm rides in every message's signature, and every message of
//! a call is checked on arrival whatever its step (see `algo/mod.rs`), so the first
//! message between two such ranks fails the call instead of waiting on a step the
//! other never sends.

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
    /// One slot per rank in memory every rank maps, when all share one host:
    /// allreduce, broadcast and allgather (in pieces when larger than a slot) and the
    /// barrier.
    Board,
    /// Across hosts: allreduce within each host, among one leader per host, then
    /// the leader's result to its host (`collective/hierarchy.rs`).
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, in code order.
    const ALL: [Algorithm; 7] = [
        Algorithm::Doubling,
        Algorithm::Direct,
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::Chain,
        Algorithm::Board,
        Algorithm::Hierarchical,
    ];

    /// The algorithm's code in a [`Signature`](crate::collective::signature::Signature)
    /// (1 to 7; 0 means none).
    pub(crate) fn code(self) -> u8 {
        match self {
            Algorithm::Doubling => 1,
            Algorithm::Direct => 2,
            Algorithm::Ring => 3,
            Algorithm::Tree => 4,
            Algorithm::Chain => 5,
            Algorithm::Board => 6,
            Algorithm::Hierarchical => 7,
        }
    }

    /// The algorithm with code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.code() == code)
    }

    /// The algorithm's name in an error message.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Algorithm::Doubling => "recursive doubling",
            Algorithm::Direct => "direct exchange",
            Algorithm::Ring => "ring",
            Algorithm::Tree => "binomial tree",
            Algorithm::Chain => "chain",
            Algorithm::Board => "host board",
            Algorithm::Hierarchical => "hierarchy of hosts",
        }
    }
}

/// Whether a call of `kind` run by `algorithm` already shows every rank's signature
/// to every rank before any rank can finish: each rank's result depends on a message
/// from every other rank, directly or through ranks that checked it on the way (each
/// rank forwards only what it checked). For those, checked mode needs no separate
/// agreement: a rank that finishes has seen, by this chain of checks, that every
/// rank made the same call. Allreduce qualifies on each of its algorithms (the
/// bandwidth ones only run with at least one element per rank) and so does the
/// barrier; a broadcast's root receives nothing, and allgather, reduce-scatter and
/// ordered reduce may give a rank nothing to receive from some peer, except
/// allgather on the host board, where every rank reads every rank's slot and its
/// signature, and reduce-scatter there, where every rank reads its piece of every
/// rank's slot (a broadcast's root reads nothing there either). A
/// hierarchical allreduce qualifies too: a leader's result depends on its host's
/// ranks (phase 1) and on the other leaders (phase 2), each of which checked its own
/// host first, and every other rank takes its leader's result.
pub(crate) fn checks_everyone(kind: Kind, algorithm: Algorithm) -> bool {
    matches!(
        (kind, algorithm),
        (
            Kind::Allreduce,
            Algorithm::Doubling | Algorithm::Direct | Algorithm::Ring | Algorithm::Hierarchical
        ) | (Kind::Barrier, Algorithm::Doubling)
            | (
                Kind::Allreduce | Kind::Allgather | Kind::ReduceScatter | Kind::Barrier,
                Algorithm::Board
            )
    )
}

/// The algorithm for a call of `kind` in a world of `world` ranks on `hosts` hosts
/// ([`Link::host_groups`](crate::collective::link::Link::host_groups); 0 when they are
/// on one host or nobody knows), when it runs across hosts rather than by
/// [`choose`]: an allreduce or a broadcast in a world on several hosts with more ranks
/// than hosts (some host has several) runs hierarchically unless the tuning turns
/// that off. Every size does: each phase picks its own algorithm by [`choose`], and
/// the phase between hosts carries one buffer per host instead of one per rank.
pub(crate) fn choose_across_hosts(
    kind: Kind,
    hosts: usize,
    world: usize,
    tuning: &Tuning,
) -> Option<Algorithm> {
    let by_hosts = matches!(kind, Kind::Allreduce | Kind::Broadcast);
    (by_hosts && tuning.hierarchical && hosts > 1 && world > hosts)
        .then_some(Algorithm::Hierarchical)
}

/// The algorithm for a call of `kind` over `bytes` bytes in `count` elements on
/// `world` ranks, where the link's host board takes up to `board` bytes a rank (0:
/// no board, see [`Link::board_bytes`](crate::collective::link::Link::board_bytes)).
///
/// - allreduce, broadcast and allgather: the host board, when there is one, up to
///   `board_max_bytes` (`bytes`: the whole buffer, or the whole output of an
///   allgather); otherwise, for allreduce, recursive doubling below `large_threshold` bytes or with fewer
///   elements than ranks (the bandwidth algorithms give every rank a block); above,
///   the direct exchange up to `direct_max_ranks` ranks, the ring beyond;
/// - broadcast: the binomial tree below `large_threshold` bytes; above, scatter and
///   direct allgather up to `direct_max_ranks` ranks, the chain beyond;
/// - allgather: direct below `gather_threshold` bytes, the ring from there;
/// - reduce-scatter: the host board as above, else the ring; barrier: the host board
///   if there is one, else recursive doubling on nothing;
///   ordered reduce: the binomial tree (its order is the point).
pub(crate) fn choose(
    kind: Kind,
    bytes: usize,
    count: usize,
    world: usize,
    tuning: &Tuning,
    board: usize,
) -> Algorithm {
    let large = bytes >= tuning.large_threshold;
    let few_ranks = world <= tuning.direct_max_ranks;
    match kind {
        Kind::Allreduce | Kind::Broadcast | Kind::Allgather | Kind::ReduceScatter
            if board > 0 && bytes <= tuning.board_max_bytes =>
        {
            Algorithm::Board
        }
        Kind::Barrier if board > 0 => Algorithm::Board,
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
                        choose(Kind::Allreduce, bytes, count, world, &t, 0),
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
                    choose(Kind::Broadcast, bytes, count, world, &t, 0),
                    broadcast,
                    "{case}"
                );
                let gather = if bytes < 5000 {
                    Algorithm::Direct
                } else {
                    Algorithm::Ring
                };
                assert_eq!(
                    choose(Kind::Allgather, bytes, count, world, &t, 0),
                    gather,
                    "{case}"
                );
                let fixed = [
                    (Kind::ReduceScatter, Algorithm::Ring),
                    (Kind::Barrier, Algorithm::Doubling),
                    (Kind::OrderedReduce, Algorithm::Tree),
                ];
                for (kind, algorithm) in fixed {
                    assert_eq!(
                        choose(kind, bytes, count, world, &t, 0),
                        algorithm,
                        "{case}"
                    );
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
                choose(Kind::Allreduce, 4096, 1024, world, &t, 0),
                Algorithm::Ring
            );
            assert_eq!(
                choose(Kind::Broadcast, 4096, 1024, world, &t, 0),
                Algorithm::Chain
            );
        }
    }

    #[test]
    fn a_zero_threshold_still_keeps_short_buffers_on_doubling() {
        let t = CommOptions::default().with_large_threshold(0).tuning();
        assert_eq!(choose(Kind::Allreduce, 0, 0, 3, &t, 0), Algorithm::Doubling);
        assert_eq!(choose(Kind::Allreduce, 8, 2, 3, &t, 0), Algorithm::Doubling);
        assert_eq!(choose(Kind::Allreduce, 12, 3, 3, &t, 0), Algorithm::Direct);
        // A broadcast has no blocks to hand out per rank; even nothing goes direct.
        assert_eq!(choose(Kind::Broadcast, 0, 0, 3, &t, 0), Algorithm::Direct);
    }

    #[test]
    fn algorithm_codes_round_trip_and_only_all_reaching_calls_skip_the_agreement() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
            assert_ne!(a.code(), 0);
            assert!(a.code() & crate::collective::signature::CHECKED == 0);
        }
        assert_eq!(Algorithm::from_code(0), None);
        assert!(checks_everyone(Kind::Allreduce, Algorithm::Ring));
        assert!(checks_everyone(Kind::Barrier, Algorithm::Doubling));
        for a in Algorithm::ALL
            .into_iter()
            .filter(|&a| a != Algorithm::Board)
        {
            assert!(!checks_everyone(Kind::Allgather, a));
        }
        for a in Algorithm::ALL {
            assert!(!checks_everyone(Kind::Broadcast, a));
            assert!(!checks_everyone(Kind::OrderedReduce, a));
        }
        for a in Algorithm::ALL
            .into_iter()
            .filter(|&a| a != Algorithm::Board)
        {
            assert!(!checks_everyone(Kind::ReduceScatter, a));
        }
        assert!(checks_everyone(Kind::Allgather, Algorithm::Board));
        assert!(checks_everyone(Kind::ReduceScatter, Algorithm::Board));
    }

    /// With a host board, the allreduces, broadcasts and allgathers of at most
    /// `board_max_bytes` (any size, by default, and whatever their element count) and
    /// every barrier go to it; nothing else does.
    #[test]
    fn the_board_takes_calls_up_to_its_limit_where_every_rank_reads_every_slot() {
        for limit in [usize::MAX, 0, 4096] {
            let t = CommOptions::default()
                .with_large_threshold(1000)
                .with_gather_threshold(5000)
                .with_direct_max_ranks(4)
                .with_board_max_bytes(limit)
                .tuning();
            for world in 1usize..=8 {
                for board in [0, 64, 4096] {
                    for bytes in [0, 1, 64, 65, 999, 1000, 4096, 4097, 5000, 1 << 30] {
                        let case = format!("{bytes} B on {world} ranks, board {board}");
                        let on_board = board > 0 && bytes <= limit;
                        for count in [0, 1, bytes] {
                            let kinds = [
                                Kind::Allreduce,
                                Kind::Broadcast,
                                Kind::Allgather,
                                Kind::ReduceScatter,
                            ];
                            for kind in kinds {
                                let got = choose(kind, bytes, count, world, &t, board);
                                assert_eq!(
                                    got == Algorithm::Board,
                                    on_board,
                                    "{case}: {kind:?} {got:?}"
                                );
                                if !on_board {
                                    assert_eq!(
                                        got,
                                        choose(kind, bytes, count, world, &t, 0),
                                        "{case}: {kind:?}"
                                    );
                                }
                            }
                        }
                        let barrier = choose(Kind::Barrier, 0, 0, world, &t, board);
                        assert_eq!(barrier == Algorithm::Board, board > 0, "{case}");
                        assert_ne!(
                            choose(Kind::OrderedReduce, bytes, bytes, world, &t, board),
                            Algorithm::Board,
                            "{case}"
                        );
                    }
                }
            }
        }
    }

    /// Only allreduces go hierarchical, only when some host has several ranks of a
    /// world on several hosts, and only while the tuning allows it.
    #[test]
    fn hierarchical_allreduces_need_several_hosts_with_a_shared_one() {
        let on = CommOptions::default().tuning();
        let off = CommOptions::default().with_hierarchical(false).tuning();
        let kinds = [
            Kind::Allreduce,
            Kind::Broadcast,
            Kind::Allgather,
            Kind::ReduceScatter,
            Kind::Barrier,
            Kind::OrderedReduce,
        ];
        for kind in kinds {
            for world in 1..=6 {
                for hosts in 0..=world {
                    let expected = matches!(kind, Kind::Allreduce | Kind::Broadcast)
                        && hosts > 1
                        && world > hosts;
                    let got = choose_across_hosts(kind, hosts, world, &on);
                    assert_eq!(
                        got.is_some(),
                        expected,
                        "{kind:?}, {world} ranks, {hosts} hosts"
                    );
                    assert_eq!(choose_across_hosts(kind, hosts, world, &off), None);
                }
            }
        }
        assert!(checks_everyone(Kind::Allreduce, Algorithm::Hierarchical));
    }

    /// The defaults are the measured ones (BENCHMARKS.md): 512 KiB, 8 ranks, 64 MiB.
    #[test]
    fn the_default_thresholds() {
        let t = CommOptions::default().tuning();
        let kib = 1 << 10;
        let f32s = |bytes: usize| bytes / 4;
        let at = |bytes, world| choose(Kind::Allreduce, bytes, f32s(bytes), world, &t, 0);
        assert_eq!(at(512 * kib - 1, 4), Algorithm::Doubling);
        assert_eq!(at(512 * kib, 4), Algorithm::Direct);
        assert_eq!(at(512 * kib, 8), Algorithm::Direct);
        assert_eq!(at(512 * kib, 9), Algorithm::Ring);
        let gather = |bytes| choose(Kind::Allgather, bytes, bytes, 4, &t, 0);
        assert_eq!(gather((64 << 20) - 1), Algorithm::Direct);
        assert_eq!(gather(64 << 20), Algorithm::Ring);
    }
}
