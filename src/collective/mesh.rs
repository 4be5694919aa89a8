//! The mesh engine: the algorithms of [`algo`](super::algo) over a [`Link`], each call
//! on the one picked by [`choose`].
//!
//! Reductions run on the element type their [`DType`] names (the bytes are
//! reinterpreted in place, never copied); copies (broadcast, allgather) run on the
//! bytes, because any cut of a buffer copies the same.

use super::algo::choice::{checks_everyone, choose, Algorithm, Kind};
use super::algo::{direct, doubling, ring, tree, Round, AGREE_STEPS};
use super::element::{with_dtype, DType, ReduceOp, Reducible};
use super::engine::{Collective, Combine, Elem, Engine};
use super::error::{Call, CollectiveError};
use super::options::Tuning;
use super::signature::{Signature, CHECKED};
use super::Link;
use std::ops::Range;
use std::time::Instant;
use switchyard_msg::payload;

/// Collectives over a [`Link`].
pub(crate) struct MeshEngine {
    link: Box<dyn Link>,
    tuning: Tuning,
    /// Number of calls so far, which tags every message of the next one.
    seq: u64,
}

impl MeshEngine {
    /// The engine over `link`, whose calls all run with `tuning`.
    pub(crate) fn new(link: Box<dyn Link>, tuning: Tuning) -> MeshEngine {
        MeshEngine {
            link,
            tuning,
            seq: 0,
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
        let rank = self.link.rank();
        let check = self.tuning.check;
        let how = algorithm.code() | if check { CHECKED } else { 0 };
        let mut round = Round {
            link: self.link.as_mut(),
            sig: sig.run_as(how),
            seq,
            total,
            deadline: Instant::now() + self.tuning.timeout,
            step_base: 0,
        };
        round.expect();
        let result = if check && !checks_everyone(kind, algorithm) {
            agree(&mut round).and_then(|()| body(&mut round))
        } else {
            body(&mut round)
        };
        if let Err(e) = &result {
            if !matches!(e, CollectiveError::Aborted { .. }) {
                self.link.abort(seq, &format!("rank {rank}: {e}"));
            }
        }
        result
    }

    /// [`choose`] for this world and tuning.
    fn choose(&self, kind: Kind, bytes: usize, count: u64) -> Algorithm {
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        choose(kind, bytes, count, self.link.world_size(), &self.tuning)
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
        let algorithm = self.choose(kind, buf.len(), total);
        let tuning = self.tuning;
        self.round(sig, total, (kind, algorithm), |round| {
            with_dtype!(dtype, T => {
                let buf = elements::<T>(call, buf)?;
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
        let piece_bytes = self.tuning.piece_bytes;
        self.round(
            sig,
            total,
            (Kind::Broadcast, algorithm),
            |round| match algorithm {
                Algorithm::Direct => direct::broadcast(round, root, buf, piece_bytes),
                Algorithm::Chain => tree::broadcast_chain(round, root, buf, piece_bytes),
                Algorithm::Tree => {
                    let me = round.rank();
                    let frame = (me == root).then(|| round.frame_of::<u8>(buf));
                    let data = tree::broadcast_frame(round, root, frame)?;
                    if me != root {
                        payload::frame_copy_into(&data, buf).map_err(|e| {
                            CollectiveError::Malformed {
                                call: sig.call,
                                rank: root,
                                reason: e.to_string(),
                            }
                        })?;
                    }
                    Ok(())
                }
                other => Err(not_for(sig.call, other)),
            },
        )
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
        match elem {
            Elem::Sized(_) => self.broadcast(buf, sig, count, 0),
            Elem::Bytes => {
                // Only rank 0 knows the length of the encoded result.
                let sig = Signature::broadcast(Elem::Bytes, 0);
                let mut len = (buf.len() as u64).to_ne_bytes();
                self.broadcast(&mut len, sig, 8, 0)?;
                let len = u64::from_ne_bytes(len);
                let len = usize::try_from(len).map_err(|_| CollectiveError::Malformed {
                    call: Call::Allreduce,
                    rank: 0,
                    reason: format!("a result of {len} bytes"),
                })?;
                buf.resize(len, 0);
                self.broadcast(buf, sig, len as u64, 0)
            }
        }
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

/// Runs `algorithm` for a built-in reduction of `buf`: all of it (`Phase::Both`),
/// or each rank's block ([`ring::Phase::ReduceScatter`]).
fn reduce_as<T: Reducible>(
    round: &mut Round<'_>,
    buf: &mut [T],
    op: ReduceOp,
    algorithm: Algorithm,
    tuning: &Tuning,
) -> Result<(), CollectiveError> {
    let reduce = move |acc: &mut [T], other: &[T]| T::reduce_into(op, acc, other);
    let phase = match round.sig.call {
        Call::ReduceScatter => ring::Phase::ReduceScatter,
        _ => ring::Phase::Both,
    };
    match algorithm {
        Algorithm::Doubling => doubling::allreduce(round, buf, &reduce),
        Algorithm::Direct => direct::allreduce(round, buf, &reduce, tuning.piece_bytes),
        Algorithm::Ring => {
            let plan = ring::RingPlan::even::<T>(
                buf.len(),
                round.size(),
                tuning.piece_bytes,
                tuning.window,
            );
            ring::run(round, buf, &plan, phase, &reduce)
        }
        other => Err(not_for(round.sig.call, other)),
    }
}

/// The error for an algorithm [`choose`] should never pick for `call`.
fn not_for(call: Call, algorithm: Algorithm) -> CollectiveError {
    CollectiveError::InvalidArgument {
        call,
        reason: format!("the mesh has no {algorithm:?} algorithm for {call}"),
    }
}
