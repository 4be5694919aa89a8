//! Allreduce and broadcast across hosts, in phases over the same link (most training
//! jobs run several ranks on each of a few hosts, where the ranks of a host share
//! memory and the hosts share a network). An allreduce runs in three:
//!
//! 1. within each host: an allreduce among the host's ranks, on its host board (or
//!    its shared-memory pipes when it has none), so every rank of a host holds the
//!    host's sum;
//! 2. among one leader per host (each host's lowest rank): an allreduce of the hosts'
//!    sums over TCP, by the algorithm [`choose`] picks for that many ranks;
//! 3. within each host: the leader's result broadcast to the host's ranks.
//!
//! Each phase runs the mesh's algorithms unchanged on a [`GroupLink`] (the group's
//! ranks as a world of their own) under the call's signature, on steps of its own,
//! so that the phases' messages never share a tag. The network between hosts carries
//! one buffer per host instead of one per rank.
//!
//! The result is bit-identical on every rank (phase 3 copies one rank's result), and
//! its reduction order is: within each host as that host's algorithm combines (rank
//! order on the host board), then the hosts' sums as phase 2's algorithm combines
//! them. It differs in floating point from a world on one host, as any change of
//! grouping does; integer results, and sums of values exactly representable, are the
//! same.
//!
//! A broadcast runs in two: among one rank per host (the root on its own host, the
//! lowest rank on every other), from the root, over TCP; then on each host from that
//! rank to the others, on the host board. The network carries the buffer once per
//! host instead of once per rank; every rank gets the root's bytes.

use super::algo::Round;
use super::algo::choice::{Kind, choose};
use super::algo::run::{broadcast_as, reduce_as};
use super::element::{ReduceOp, Reducible};
use super::error::CollectiveError;
use super::link::GroupLink;
use super::options::Tuning;

/// Where the step numbers of each phase begin: above any step the algorithms use,
/// below checked mode's agreement (`AGREE_STEPS`, `1 << 30`).
const HOST_STEPS: u32 = 1 << 24;
/// Step numbers of the phase among leaders.
const LEADER_STEPS: u32 = 2 << 24;
/// Step numbers of the broadcast within each host.
const SPREAD_STEPS: u32 = 3 << 24;

/// The phases as errors name them.
const WITHIN: &str = "within the host";
/// The phase among leaders (a broadcast's root leads its host).
const AMONG: &str = "among the hosts' leaders";
/// The broadcast within each host.
const SPREAD: &str = "from the leader to its host";

/// Allreduces `buf` in place across the hosts of `round`'s link
/// ([`Link::host_groups`](super::link::Link::host_groups)).
pub(super) fn allreduce<T: Reducible>(
    round: &mut Round<'_>,
    buf: &mut [T],
    op: ReduceOp,
    tuning: &Tuning,
) -> Result<(), CollectiveError> {
    round.algo = "hierarchy of hosts";
    let hosts = round.link.host_groups().to_vec();
    let me = round.rank();
    let call = round.sig.call;
    let Some(host) = hosts.iter().find(|g| g.contains(&me)).cloned() else {
        return Err(CollectiveError::InvalidArgument {
            call,
            reason: format!("rank {me} is on none of the link's hosts {hosts:?}"),
        });
    };
    let leaders: Vec<usize> = hosts.iter().filter_map(|g| g.first().copied()).collect();
    let bytes = std::mem::size_of_val(buf);
    if host.len() > 1 {
        in_group(round, &host, true, (HOST_STEPS, WITHIN), |sub| {
            let on = choose(
                Kind::Allreduce,
                bytes,
                buf.len(),
                host.len(),
                tuning,
                sub.link.board_bytes(),
            );
            reduce_as(sub, buf, op, on, tuning)
        })?;
    }
    if host.first() == Some(&me) {
        in_group(round, &leaders, false, (LEADER_STEPS, AMONG), |sub| {
            let on = choose(Kind::Allreduce, bytes, buf.len(), leaders.len(), tuning, 0);
            reduce_as(sub, buf, op, on, tuning)
        })?;
    }
    if host.len() > 1 {
        in_group(round, &host, true, (SPREAD_STEPS, SPREAD), |sub| {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
            let on = choose(
                Kind::Broadcast,
                bytes.len(),
                bytes.len(),
                host.len(),
                tuning,
                sub.link.board_bytes(),
            );
            broadcast_as(sub, 0, bytes, on, tuning.piece_bytes)
        })?;
    }
    round.algo = "hierarchy of hosts";
    Ok(())
}

/// Broadcasts `buf` from `root` across the hosts of `round`'s link
/// ([`Link::host_groups`](super::link::Link::host_groups)).
pub(super) fn broadcast(
    round: &mut Round<'_>,
    root: usize,
    buf: &mut [u8],
    tuning: &Tuning,
) -> Result<(), CollectiveError> {
    round.algo = "hierarchy of hosts";
    let hosts = round.link.host_groups().to_vec();
    let (me, call) = (round.rank(), round.sig.call);
    let host_of = |rank: usize| {
        hosts
            .iter()
            .find(|g| g.contains(&rank))
            .cloned()
            .ok_or_else(|| CollectiveError::InvalidArgument {
                call,
                reason: format!("rank {rank} is on none of the link's hosts {hosts:?}"),
            })
    };
    let host = host_of(me)?;
    // A root on none of the hosts would leave every rank waiting for it.
    host_of(root)?;
    // Each host's part in the broadcast among hosts: the root on its host, the
    // lowest rank elsewhere (which then passes it on within its host).
    let sender_of = |group: &[usize]| {
        if group.contains(&root) {
            root
        } else {
            group[0]
        }
    };
    let senders: Vec<usize> = hosts.iter().map(|g| sender_of(g)).collect();
    let mine = sender_of(&host);
    let len = buf.len();
    if me == mine {
        let from = senders.iter().position(|&r| r == root).unwrap_or(0);
        in_group(round, &senders, false, (LEADER_STEPS, AMONG), |sub| {
            let on = choose(Kind::Broadcast, len, len, senders.len(), tuning, 0);
            broadcast_as(sub, from, buf, on, tuning.piece_bytes)
        })?;
    }
    if host.len() > 1 {
        let from = host.iter().position(|&r| r == mine).unwrap_or(0);
        in_group(round, &host, true, (SPREAD_STEPS, SPREAD), |sub| {
            let on = choose(
                Kind::Broadcast,
                len,
                len,
                host.len(),
                tuning,
                sub.link.board_bytes(),
            );
            broadcast_as(sub, from, buf, on, tuning.piece_bytes)
        })?;
    }
    round.algo = "hierarchy of hosts";
    Ok(())
}

/// Runs `body` on a round over the group `ranks` of `round`'s link (this rank among
/// them), on the steps from `steps` up; `on_host_board`: the group is this rank's
/// host, whose board it may use. A timeout's error names the phase and its algorithm.
fn in_group<R>(
    round: &mut Round<'_>,
    ranks: &[usize],
    on_host_board: bool,
    (steps, phase): (u32, &str),
    body: impl FnOnce(&mut Round<'_>) -> Result<R, CollectiveError>,
) -> Result<R, CollectiveError> {
    let me = round.rank();
    let Some(mut link) = GroupLink::new(&mut *round.link, ranks, on_host_board) else {
        return Err(CollectiveError::InvalidArgument {
            call: round.sig.call,
            reason: format!("rank {me} is not in the group {ranks:?}"),
        });
    };
    let mut sub = Round {
        link: &mut link,
        sig: round.sig,
        seq: round.seq,
        total: round.total,
        clock: round.clock,
        started: round.started,
        algo: "",
        step_base: round.step_base + steps,
    };
    let result = body(&mut sub);
    round.algo = sub.algo;
    result.map_err(|e| in_phase(e, phase))
}

/// `e` with the phase it happened in added to where it waited (`during`, as
/// " (recursive doubling step 0)").
fn in_phase(e: CollectiveError, phase: &str) -> CollectiveError {
    let named = |during: String| {
        let inner = during.trim().trim_start_matches('(').trim_end_matches(')');
        format!(" (hierarchy of hosts, {phase}: {inner})")
    };
    match e {
        CollectiveError::PeerTimeout {
            call,
            rank,
            waited,
            during,
        } => CollectiveError::PeerTimeout {
            call,
            rank,
            waited,
            during: named(during),
        },
        CollectiveError::DeadlineExceeded {
            call,
            limit,
            rank,
            during,
        } => CollectiveError::DeadlineExceeded {
            call,
            limit,
            rank,
            during: named(during),
        },
        other => other,
    }
}
