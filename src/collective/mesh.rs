//! The mesh engine: the algorithms of [`algo`](super::algo) over a [`Link`], each call
//! on the one picked by [`choose`].
//!
//! Reductions run on the element type their [`DType`] names (the bytes are
//! reinterpreted in place, never copied), but for the two-byte floats, which are
//! combined in `f32` and rounded once ([`DType::is_half`], `reduce_half_as`); copies
//! (broadcast, allgather) run on the bytes, because any cut of a buffer copies the
//! same.

use super::algo::accumulate::{HalfInF32, Pairwise};
use super::algo::choice::{Algorithm, Kind, checks_everyone, choose, choose_across_hosts};
use super::algo::run::{broadcast_as, not_for, reduce_as, reduce_half_as};
use super::algo::{AGREE_STEPS, Round, board, direct, doubling, ring, tree};
use super::element::{DType, ReduceOp, Reducible, in_f32_with, with_dtype};
use super::engine::{self, Collective, Combine, Elem, Engine, share_fold_result};
use super::error::{Call, CollectiveError};
use super::hierarchy;
use super::link::Clock;
use super::link::Link;
use super::link::blame::{self, Seen};
use super::options::Tuning;
use super::signature::{CHECKED, Signature};
use std::ops::Range;
use std::time::Instant;

/// Collectives over a [`Link`].
pub(crate) struct MeshEngine {
    link: Box<dyn Link>,
    tuning: Tuning,
    /// Number of calls so far, which tags every message of the next one.
    seq: u64,
    /// The `f32` copy that reductions of two-byte floats off the host board run on,
    /// kept for the next one up to [`SCRATCH_KEPT`] elements.
    scratch: Vec<f32>,
}

/// The largest `f32` copy (in elements: 64 MiB) the engine keeps between reductions
/// of two-byte floats: a larger one is freed after its call.
const SCRATCH_KEPT: usize = 16 << 20;

impl MeshEngine {
    /// The engine over `link`, whose calls all run with `tuning`.
    pub(crate) fn new(link: Box<dyn Link>, tuning: Tuning) -> MeshEngine {
        MeshEngine {
            link,
            tuning,
            seq: 0,
            scratch: Vec::new(),
        }
    }

    /// Runs `body` as one call of `total` elements named by `sig`, of `kind` by
    /// `algorithm`; on failure tells the other ranks, so that they fail at once
    /// instead of at their deadline.
    ///
    /// Every message of the call carries `sig` with the algorithm and checked mode in
    /// it, and the link refuses any message of the call that does not ([`Round::expect`]).
    /// In checked mode a call whose algorithm does not already show every rank's
    /// signature to every rank ([`checks_everyone`]) first runs an agreement: recursive
    /// doubling on nothing under the call's own stamp, so that no rank moves data, or
    /// returns, before it has seen that every rank made the same call.
    fn round<R>(
        &mut self,
        sig: Signature,
        total: u64,
        (kind, algorithm): (Kind, Algorithm),
        body: impl FnOnce(&mut Round<'_>) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.seq += 1;
        let seq = self.seq;
        let started = Instant::now();
        let clock = Clock {
            silence: self.tuning.timeout,
            deadline: self.tuning.deadline.and_then(|d| started.checked_add(d)),
        };
        let check = self.tuning.check;
        let how = algorithm.code() | if check { CHECKED } else { 0 };
        let mut round = Round {
            link: self.link.as_mut(),
            sig: sig.run_as(how),
            seq,
            total,
            clock,
            started,
            algo: "",
            step_base: 0,
        };
        round.expect();
        let result = if check && !checks_everyone(kind, algorithm) {
            agree(&mut round).and_then(|()| body(&mut round))
        } else {
            body(&mut round)
        }
        .and_then(|r| round.finish().map(|()| r));
        result.map_err(|e| self.failed(seq, sig, e))
    }

    /// Tells the other ranks that call `seq` failed here with `e`, and returns the
    /// error to report: `e`, unless `e` only blames a peer that went away or silent
    /// and the abort notices of the ranks it leads to explain why
    /// ([`blame::explain`]): then the abort of the notice that explains it, which
    /// says so when the blame comes back to this rank (its peers gave up waiting for
    /// it: it was stopped).
    ///
    /// Every failed rank sends one notice. One that blames a rank is sent only once
    /// that rank is known to be gone (its connection closed, or it did not answer
    /// [`Link::alive`]) or has sent its own notice, which continues the chain. A
    /// silent peer that answers is itself waiting for someone and will say for whom
    /// within one silence timeout, so this rank waits for its notice instead of
    /// blaming it.
    fn failed(&mut self, seq: u64, sig: Signature, e: CollectiveError) -> CollectiveError {
        let me = self.link.rank();
        let (blamed, seen) = match &e {
            CollectiveError::PeerTimeout { rank, .. } => (*rank, Seen::Silent),
            CollectiveError::PeerLost { rank, .. } => (*rank, Seen::Gone),
            CollectiveError::Aborted { rank, .. } => (*rank, Seen::Aborted),
            _ => {
                // The failure began here: say so, and report it as it is.
                self.link
                    .abort_blaming(seq, &format!("rank {me}: {e}"), None);
                return e;
            }
        };
        if seen == Seen::Aborted {
            // A link in the chain: ranks waiting for this one follow it to `rank`.
            if self.link.notices(Instant::now()).is_some() {
                let reason = format!("rank {me}: {e}");
                self.link.abort_blaming(seq, &reason, Some(blamed));
            }
        }
        let limit = Instant::now() + self.tuning.timeout + blame::PROBE_WAIT;
        let explained = blame::explain(self.link.as_mut(), blamed, seen, limit);
        if seen != Seen::Aborted {
            // Sent only now: `blamed` is gone, or its own notice continues the chain.
            self.link
                .abort_blaming(seq, &format!("rank {me}: {e}"), Some(blamed));
        }
        match explained.abort(me) {
            Some((rank, reason)) => CollectiveError::Aborted {
                call: sig.call,
                rank,
                reason,
            },
            None => e,
        }
    }

    /// [`choose`] for this world and tuning.
    fn choose(&self, kind: Kind, bytes: usize, count: u64) -> Algorithm {
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        let world = self.link.world_size();
        let hosts = self.link.host_groups().len();
        if let Some(across) = choose_across_hosts(kind, hosts, world, &self.tuning) {
            return across;
        }
        choose(
            kind,
            bytes,
            count,
            world,
            &self.tuning,
            self.link.board_bytes(),
        )
    }

    /// A built-in reduction of `buf` on its element type.
    fn reduce(
        &mut self,
        kind: Kind,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let call = if kind == Kind::ReduceScatter {
            Call::ReduceScatter
        } else {
            Call::Allreduce
        };
        let sig = Signature::reduction(call, dtype, op);
        let total = (buf.len() / dtype.size()) as u64;
        let tuning = self.tuning;
        let algorithm = self.choose(kind, buf.len(), total);
        if dtype.is_half() {
            // In f32, rounded once (`DType::is_half`).
            let mut scratch = std::mem::take(&mut self.scratch);
            let how = (algorithm, &tuning);
            let result = self.round(sig, total, (kind, algorithm), |round| match dtype {
                _ if algorithm == Algorithm::Hierarchical => {
                    in_f32_with(call, buf, dtype, &mut scratch, |wide| {
                        hierarchy::allreduce(round, wide, op, &tuning)
                    })
                }
                DType::F16 => {
                    let buf = elements::<half::f16>(call, buf)?;
                    reduce_half_as(round, (buf, dtype), op, how, &mut scratch)
                }
                _ => {
                    let buf = elements::<half::bf16>(call, buf)?;
                    reduce_half_as(round, (buf, dtype), op, how, &mut scratch)
                }
            });
            if scratch.len() <= SCRATCH_KEPT {
                self.scratch = scratch;
            }
            return result;
        }
        self.round(sig, total, (kind, algorithm), |round| {
            with_dtype!(dtype, T => {
                let buf = elements::<T>(call, buf)?;
                if algorithm == Algorithm::Hierarchical {
                    return hierarchy::allreduce(round, buf, op, &tuning);
                }
                reduce_as::<T>(round, buf, op, algorithm, &tuning)
            })
        })
    }

    /// A copy of `buf` from `root` on every rank.
    fn broadcast(
        &mut self,
        buf: &mut [u8],
        sig: Signature,
        total: u64,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let algorithm = self.choose(Kind::Broadcast, buf.len(), total);
        let tuning = self.tuning;
        self.round(sig, total, (Kind::Broadcast, algorithm), |round| {
            if algorithm == Algorithm::Hierarchical {
                return hierarchy::broadcast(round, root, buf, &tuning);
            }
            broadcast_as(round, root, buf, algorithm, tuning.piece_bytes)
        })
    }

    fn allgather(
        &mut self,
        out: &mut [u8],
        width: usize,
        blocks: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        let sig = Signature::plain(Call::Allgather, Elem::Sized(width));
        let total = (out.len() / width.max(1)) as u64;
        let byte_blocks: Vec<Range<usize>> = blocks
            .iter()
            .map(|b| b.start * width..b.end * width)
            .collect();
        let algorithm = self.choose(Kind::Allgather, out.len(), total);
        let tuning = self.tuning;
        self.round(
            sig,
            total,
            (Kind::Allgather, algorithm),
            |round| match algorithm {
                Algorithm::Board => board::allgather(round, out, &byte_blocks, tuning.piece_bytes),
                Algorithm::Direct => direct::allgather(round, out, &byte_blocks),
                Algorithm::Ring => {
                    let plan = ring::RingPlan::with_blocks::<u8>(
                        byte_blocks,
                        tuning.piece_bytes,
                        tuning.window,
                    );
                    ring::run(round, out, &plan, ring::Phase::Allgather, &|_, _| {})
                }
                other => Err(not_for(Call::Allgather, other)),
            },
        )
    }

    /// Rank-ordered reduction onto rank 0, then its result to every rank.
    fn fold(
        &mut self,
        buf: &mut Vec<u8>,
        count: u64,
        elem: Elem,
        combine: &Combine<'_>,
    ) -> Result<(), CollectiveError> {
        let sig = Signature::user(elem);
        match self.choose(Kind::OrderedReduce, buf.len(), count) {
            Algorithm::Tree => self.round(
                sig,
                count,
                (Kind::OrderedReduce, Algorithm::Tree),
                |round| tree::ordered_reduce(round, buf, combine),
            )?,
            other => return Err(not_for(Call::Allreduce, other)),
        };
        share_fold_result(buf, elem, sig, count, |buf, sig, count| {
            self.broadcast(buf, sig, count, 0)
        })
    }
}

impl Engine for MeshEngine {
    fn rank(&self) -> usize {
        self.link.rank()
    }

    fn world_size(&self) -> usize {
        self.link.world_size()
    }

    fn name(&self) -> &'static str {
        "mesh"
    }

    /// Takes the number of the call that will not run here, as the peers' calls
    /// take it, and sends them an abort notice for it that blames no one else: every
    /// peer waiting in that call, directly or through others, fails with `Aborted`
    /// naming this rank.
    fn prepare_failed(&mut self, call: Call, reason: String) -> CollectiveError {
        self.seq += 1;
        let me = self.link.rank();
        let e = CollectiveError::PrepareFailed {
            call,
            rank: me,
            reason,
        };
        self.link
            .abort_blaming(self.seq, &format!("rank {me}: {e}"), None);
        e
    }

    fn allreduce_into(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        let total = (out.len() / dtype.size()) as u64;
        let algorithm = self.choose(Kind::Allreduce, out.len(), total);
        if algorithm != Algorithm::Board {
            return engine::copy_then_allreduce(self, input, out, dtype, op);
        }
        let sig = Signature::reduction(call, dtype, op);
        let tuning = self.tuning;
        self.round(sig, total, (Kind::Allreduce, algorithm), |round| {
            let piece = tuning.piece_bytes;
            match dtype {
                DType::F16 => {
                    let (input, out) = (elements_of(call, input)?, elements(call, out)?);
                    let fold = &mut HalfInF32::new(op);
                    board::allreduce_into::<half::f16>(round, input, out, fold, piece)
                }
                DType::BF16 => {
                    let (input, out) = (elements_of(call, input)?, elements(call, out)?);
                    let fold = &mut HalfInF32::new(op);
                    board::allreduce_into::<half::bf16>(round, input, out, fold, piece)
                }
                _ => with_dtype!(dtype, T => {
                    let input = elements_of::<T>(call, input)?;
                    let out = elements::<T>(call, out)?;
                    let reduce = move |acc: &mut [T], other: &[T]| T::reduce_into(op, acc, other);
                    board::allreduce_into(round, input, out, &mut Pairwise(&reduce), piece)
                }),
            }
        })
    }

    fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        let (sig, total, call) = (Signature::of(request), request.count(), request.call());
        match request {
            Collective::Allreduce { buf, dtype, op } => {
                self.reduce(Kind::Allreduce, buf, *dtype, *op)
            }
            Collective::ReduceScatter { buf, dtype, op } => {
                self.reduce(Kind::ReduceScatter, buf, *dtype, *op)
            }
            Collective::Broadcast { buf, root, .. } => self.broadcast(buf, sig, total, *root),
            Collective::Allgather { out, width, blocks } => self.allgather(out, *width, blocks),
            Collective::Barrier => match self.choose(Kind::Barrier, 0, 0) {
                Algorithm::Doubling => {
                    self.round(sig, 0, (Kind::Barrier, Algorithm::Doubling), |round| {
                        doubling::allreduce::<u8>(round, &mut [], &|_, _| {})
                    })
                }
                Algorithm::Board => {
                    self.round(sig, 0, (Kind::Barrier, Algorithm::Board), board::barrier)
                }
                other => Err(not_for(call, other)),
            },
            Collective::Fold {
                buf,
                count,
                elem,
                combine,
            } => self.fold(buf, *count, *elem, *combine),
        }
    }
}

/// Checked mode's agreement: recursive doubling on nothing, on the agreement's own
/// steps, whose every message carries the call's stamp and is checked on arrival. A
/// rank finishes it only after messages from every rank, directly or through ranks
/// that checked them, have shown the same call.
fn agree(round: &mut Round<'_>) -> Result<(), CollectiveError> {
    round.step_base = AGREE_STEPS;
    let agreed = doubling::allreduce::<u8>(round, &mut [], &|_, _| {});
    round.step_base = 0;
    agreed
}

/// `buf` as elements of `T`; the communicator hands over whole, aligned elements, so
/// anything else is refused rather than misread.
fn elements<T: Reducible>(call: Call, buf: &mut [u8]) -> Result<&mut [T], CollectiveError> {
    bytemuck::try_cast_slice_mut(buf).map_err(|e| CollectiveError::InvalidArgument {
        call,
        reason: format!("a buffer of {:?} elements: {e:?}", T::DTYPE),
    })
}

/// [`elements`] of a buffer the call only reads.
fn elements_of<T: Reducible>(call: Call, buf: &[u8]) -> Result<&[T], CollectiveError> {
    bytemuck::try_cast_slice(buf).map_err(|e| CollectiveError::InvalidArgument {
        call,
        reason: format!("a buffer of {:?} elements: {e:?}", T::DTYPE),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::bootstrap::{Bootstrap, MemoryExchange};
    use crate::collective::{CommOptions, Communicator, DataPath, ReduceOp};
    use std::time::Duration;

    /// Rank 1 comes to an allreduce 5 s late (as a rank stopped for that long does,
    /// and then resumed): ranks 0 and 2 give up on it after their 2 s timeout and
    /// leave. Rank 1 then finds them gone, and must say that they gave up waiting for
    /// it, not blame rank 0 or 2 for leaving (as it did).
    #[test]
    fn a_rank_its_peers_gave_up_on_says_so() {
        let n = 3;
        let board = MemoryExchange::new(n);
        let threads: Vec<_> = (0..n)
            .map(|rank| {
                let boot = Bootstrap::from_exchange(rank, n, board.clone());
                std::thread::spawn(move || {
                    let options = CommOptions::default()
                        .with_timeout(Duration::from_secs(2))
                        .with_data_path(DataPath::Tcp)
                        .with_shared_memory(false);
                    let mut comm = Communicator::join(&boot, options).unwrap();
                    if rank == 1 {
                        std::thread::sleep(Duration::from_secs(5));
                    }
                    let mut x = [1u32];
                    comm.allreduce(&mut x, ReduceOp::Sum)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        let errors: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let late = &errors[1];
        assert!(
            late.contains("gave up waiting for this rank (rank 1)"),
            "rank 1: {late}\nothers: {errors:?}"
        );
        for survivor in [0, 2] {
            assert!(!late.contains(&format!("lost rank {survivor} ")), "{late}");
        }
    }
}
