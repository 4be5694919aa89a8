//! The seam between the [`Communicator`](super::Communicator) API and whatever moves
//! the data: an [`Engine`] runs one type-erased [`Collective`] at a time.
//!
//! Calls reach an engine as bytes plus what the bytes mean (element type or width,
//! operation, root, blocks), never as generic types, so that an engine that wraps
//! another (recovery, which keeps every result and replays it to a restarted rank)
//! can see, copy and replay any call without knowing the caller's types. The
//! communicator checks arguments before calling; engines may assume the checks
//! passed (a reduction's buffer is a whole number of aligned elements of its type, a
//! root is inside the world, blocks lie inside the buffer) but refuse, rather than
//! misbehave, where they notice otherwise.

use super::element::{DType, ReduceOp};
use super::error::{Call, CollectiveError};
use super::signature::Signature;
use std::ops::Range;

/// What the elements of a byte buffer are, where no [`DType`] says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    /// A byte string (`broadcast_bytes`) or serde-encoded values.
    Bytes,
    /// Plain elements of this many bytes each.
    Sized(usize),
}

impl Elem {
    /// The element-type byte of a [`Signature`](super::signature::Signature): 0 for
    /// bytes, the width otherwise.
    pub(crate) fn code(self) -> u8 {
        match self {
            Elem::Bytes => 0,
            Elem::Sized(width) => width as u8,
        }
    }

    /// Bytes per element (1 for byte strings).
    pub(crate) fn width(self) -> usize {
        match self {
            Elem::Bytes => 1,
            Elem::Sized(width) => width.max(1),
        }
    }
}

/// A rank-ordered user reducer over encoded values: `combine(acc, next, from)` sets
/// `acc` to `acc ∘ next`, where `next` came from rank `from` (and every rank before
/// it up to `acc`'s last contributor).
pub(crate) type Combine<'a> =
    dyn Fn(&mut Vec<u8>, &[u8], usize) -> Result<(), CollectiveError> + 'a;

/// Sends a [`Collective::Fold`]'s result from rank 0 to every rank, through the
/// engine's own `broadcast(buf, sig, count)` from root 0. A result of sized elements
/// has the length every rank passed; an encoded one (`Elem::Bytes`) has a length only
/// rank 0 knows, so that goes first.
pub(crate) fn share_fold_result(
    buf: &mut Vec<u8>,
    elem: Elem,
    sig: Signature,
    count: u64,
    mut broadcast: impl FnMut(&mut [u8], Signature, u64) -> Result<(), CollectiveError>,
) -> Result<(), CollectiveError> {
    match elem {
        Elem::Sized(_) => broadcast(buf, sig, count),
        Elem::Bytes => {
            let sig = Signature::broadcast(Elem::Bytes, 0);
            let mut len = (buf.len() as u64).to_ne_bytes();
            broadcast(&mut len, sig, 8)?;
            let len = u64::from_ne_bytes(len);
            let len = usize::try_from(len).map_err(|_| CollectiveError::Malformed {
                call: Call::Allreduce,
                rank: 0,
                reason: format!("a result of {len} bytes"),
            })?;
            buf.resize(len, 0);
            broadcast(buf, sig, len as u64)
        }
    }
}

/// A lazy call's closure that writes the call's input into its buffer; `Err` says,
/// in words, why it could not (the call must then not run anywhere).
pub(crate) type Prepare<'a> = dyn FnMut(&mut [u8]) -> Result<(), String> + 'a;

/// One collective call on this rank, its data as bytes.
pub(crate) enum Collective<'a> {
    /// Every element of `buf` (elements of `dtype`) replaced by `op` over all ranks.
    Allreduce {
        buf: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
    /// `buf` reduced over all ranks; this rank's block (`split(len, n, rank)` of the
    /// elements) ends in place, the rest is unspecified.
    ReduceScatter {
        buf: &'a mut [u8],
        dtype: DType,
        op: ReduceOp,
    },
    /// Rank `root`'s `buf` copied into every rank's (all of one length).
    Broadcast {
        buf: &'a mut [u8],
        elem: Elem,
        root: usize,
    },
    /// Allgather in place: block `r` of `out` (`blocks[r]`, in elements of `width`
    /// bytes) is complete on rank `r` and ends on every rank.
    Allgather {
        out: &'a mut [u8],
        width: usize,
        blocks: &'a [Range<usize>],
    },
    /// Returns once every rank has entered.
    Barrier,
    /// A rank-ordered reduction with a user function, whose result ends in `buf` on
    /// every rank. `count` values on every rank; for [`Elem::Sized`] `buf` holds them
    /// as elements and keeps its length; for [`Elem::Bytes`] it holds them encoded,
    /// of any length, and takes the result's.
    Fold {
        buf: &'a mut Vec<u8>,
        count: u64,
        elem: Elem,
        combine: &'a Combine<'a>,
    },
}

impl Collective<'_> {
    /// The buffer the call leaves its result in (empty for a barrier).
    pub(crate) fn result_buffer(&mut self) -> &mut [u8] {
        match self {
            Collective::Allreduce { buf, .. }
            | Collective::ReduceScatter { buf, .. }
            | Collective::Broadcast { buf, .. } => buf,
            Collective::Allgather { out, .. } => out,
            Collective::Fold { buf, .. } => buf.as_mut_slice(),
            Collective::Barrier => &mut [],
        }
    }

    /// The public call this is part of, for errors.
    pub(crate) fn call(&self) -> Call {
        match self {
            Collective::Allreduce { .. } | Collective::Fold { .. } => Call::Allreduce,
            Collective::ReduceScatter { .. } => Call::ReduceScatter,
            Collective::Broadcast { .. } => Call::Broadcast,
            Collective::Allgather { .. } => Call::Allgather,
            Collective::Barrier => Call::Barrier,
        }
    }

    /// The element count every rank must pass alike.
    pub(crate) fn count(&self) -> u64 {
        let count = match self {
            Collective::Allreduce { buf, dtype, .. }
            | Collective::ReduceScatter { buf, dtype, .. } => buf.len() / dtype.size(),
            Collective::Broadcast { buf, elem, .. } => buf.len() / elem.width(),
            Collective::Allgather { out, width, .. } => out.len() / (*width).max(1),
            Collective::Barrier => 0,
            Collective::Fold { count, .. } => return *count,
        };
        count as u64
    }
}

/// What runs a communicator's collectives: the mesh over a [`Link`](super::Link),
/// MPI, or nothing at all for a world of one. An engine that wraps another
/// implements this trait and calls the inner engine's [`Engine::run`].
pub(crate) trait Engine: Send {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// A short name for `Debug` output (`solo`, `mesh`, `mpi`).
    fn name(&self) -> &'static str;

    /// Whether calls involve other processes.
    fn is_distributed(&self) -> bool {
        true
    }

    /// Runs one call on this rank, in place in the request's buffers. Every rank must
    /// run the same calls in the same order.
    fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError>;

    /// Runs one call whose input `prepare` writes into the request's buffer (rabit's
    /// lazy allreduce). An engine that can produce the result without running the
    /// call (recovery, replaying a result kept by a survivor) does not call
    /// `prepare`; every other engine calls it once, first. When `prepare` fails the
    /// call does not run: [`Engine::prepare_failed`] ends it on every rank.
    fn run_prepared(
        &mut self,
        request: &mut Collective<'_>,
        prepare: &mut Prepare<'_>,
    ) -> Result<(), CollectiveError> {
        if let Err(reason) = prepare(request.result_buffer()) {
            return Err(self.prepare_failed(request.call(), reason));
        }
        self.run(request)
    }

    /// Fails the `call` this rank was about to make, whose `prepare` failed with
    /// `reason`, and returns the error for this rank. An engine with peers tells
    /// them, so that their calls fail at once (naming this rank) instead of waiting
    /// for an input that will never come, and never compute a result without it.
    fn prepare_failed(&mut self, call: Call, reason: String) -> CollectiveError {
        CollectiveError::PrepareFailed {
            call,
            rank: self.rank(),
            reason,
        }
    }

    /// An allreduce of `input` into `out` (of the same length) that leaves `input` as
    /// it was, for the recovery engine, which must still hold a call's input when the
    /// call fails half-way. This default copies `input` into `out` and runs the call
    /// there in place; the mesh on the host board reads `input` where it is, which
    /// saves that copy.
    fn allreduce_into(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        copy_then_allreduce(self, input, out, dtype, op)
    }

    /// Whether a communicator on this engine may still run calls after one failed
    /// here with `e`: only where the engine itself brings every rank back into the
    /// same call before the next one runs. No engine but recovery does (after a
    /// failed `prepare`), so the default is `false`: the communicator refuses every
    /// later call ([`CollectiveError::Poisoned`]).
    fn usable_after(&self, e: &CollectiveError) -> bool {
        let _ = e;
        false
    }

    /// The recovery engine, for checkpoints; `None` on every other engine.
    fn robust(&mut self) -> Option<&mut super::robust::RobustEngine> {
        None
    }

    /// Called once when the communicator is finalized, before it closes. The
    /// recovery engine holds a last agreement here, so that a rank that has
    /// finished cannot leave a restarted one without the results it needs.
    fn finish(&mut self) -> Result<(), CollectiveError> {
        Ok(())
    }
}

/// [`Engine::allreduce_into`] by a copy and the in-place call (the default, and what
/// an engine that overrides it does where it has no better way).
pub(crate) fn copy_then_allreduce<E: Engine + ?Sized>(
    engine: &mut E,
    input: &[u8],
    out: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CollectiveError> {
    if input.len() != out.len() {
        return Err(CollectiveError::InvalidArgument {
            call: Call::Allreduce,
            reason: format!(
                "an allreduce of {} bytes into a buffer of {}",
                input.len(),
                out.len()
            ),
        });
    }
    switchyard_msg::copy::copy_bytes(out, input);
    engine.run(&mut Collective::Allreduce {
        buf: out,
        dtype,
        op,
    })
}

/// A world of one: every call's result is this rank's input.
#[derive(Debug)]
pub(crate) struct Solo;

impl Engine for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn name(&self) -> &'static str {
        "solo"
    }

    fn is_distributed(&self) -> bool {
        false
    }

    fn run(&mut self, _request: &mut Collective<'_>) -> Result<(), CollectiveError> {
        Ok(())
    }
}

/// An engine around another one, the shape of recovery's: it sees every call's
/// result as bytes, keeps it, and can hand kept results back without running the
/// inner engine at all.
#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::{Collective, Elem, Engine, Solo};
    use crate::collective::error::{Call, CollectiveError};
    use crate::collective::signature::Signature;
    use crate::collective::{CommOptions, Communicator, DType, ReduceOp};
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// What the wrapper saw of one call: its signature, element count, and the bytes
    /// of its result on this rank.
    type Seen = (Signature, u64, Vec<u8>);

    /// Delegates every call (or replays a kept result instead) and records it.
    struct Recording {
        inner: Box<dyn Engine>,
        seen: Log,
        replay: VecDeque<Vec<u8>>,
    }

    type Log = Arc<Mutex<Vec<Seen>>>;

    impl Engine for Recording {
        fn rank(&self) -> usize {
            self.inner.rank()
        }

        fn world_size(&self) -> usize {
            self.inner.world_size()
        }

        fn name(&self) -> &'static str {
            "recording"
        }

        fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
            match self.replay.pop_front() {
                None => self.inner.run(request)?,
                // A byte-string fold's result has a length of its own.
                Some(kept) => match &mut *request {
                    Collective::Fold {
                        buf,
                        elem: Elem::Bytes,
                        ..
                    } => **buf = kept,
                    other => other.result_buffer().copy_from_slice(&kept),
                },
            }
            let entry = (
                Signature::of(request),
                request.count(),
                request.result_buffer().to_vec(),
            );
            self.seen.lock().expect("log").push(entry);
            Ok(())
        }
    }

    /// A rank whose network is gone: any call that reaches it fails.
    struct Gone {
        rank: usize,
        size: usize,
    }

    impl Engine for Gone {
        fn rank(&self) -> usize {
            self.rank
        }

        fn world_size(&self) -> usize {
            self.size
        }

        fn name(&self) -> &'static str {
            "gone"
        }

        fn run(&mut self, request: &mut Collective<'_>) -> Result<(), CollectiveError> {
            Err(CollectiveError::Transport {
                call: request.call(),
                rank: self.rank,
                reason: "no network".into(),
            })
        }
    }

    /// Puts a [`Recording`] around `comm`'s engine; returns its log.
    fn wrap(comm: &mut Communicator, replay: Vec<Vec<u8>>) -> Log {
        let inner = std::mem::replace(&mut comm.engine, Box::new(Solo));
        let seen = Log::default();
        comm.engine = Box::new(Recording {
            inner,
            seen: seen.clone(),
            replay: replay.into(),
        });
        seen
    }

    fn taken(log: &Log) -> Vec<Seen> {
        std::mem::take(&mut *log.lock().expect("log"))
    }

    #[derive(Debug, PartialEq)]
    struct Results {
        sum: Vec<f32>,
        max_unaligned: Vec<u8>,
        text: Vec<u8>,
        gathered: Vec<u16>,
        block: Vec<u64>,
        ordered: Vec<u64>,
        words: Vec<String>,
    }

    /// One call of every kind, each through the typed API.
    fn script(comm: &mut Communicator) -> Result<Results, CollectiveError> {
        let r = comm.rank();
        let mut sum = vec![r as f32 + 1.0; 5];
        comm.allreduce(&mut sum, ReduceOp::Sum)?;
        // Three i32s one byte into an 8-aligned buffer, so surely misaligned: reduced
        // through an aligned copy.
        let mut backing = [0u64; 2];
        let raw = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut backing)[..13];
        assert_ne!(raw[1..].as_ptr().align_offset(4), 0);
        for (i, chunk) in raw[1..].chunks_mut(4).enumerate() {
            chunk.copy_from_slice(&((r * 10 + i) as i32).to_ne_bytes());
        }
        comm.allreduce_raw(&mut raw[1..], DType::I32, ReduceOp::Max)?;
        let mut text = if r == 1 {
            b"from one".to_vec()
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(&mut text, 1)?;
        let mut gathered = vec![0u16; 2 * comm.world_size()];
        comm.allgather(&[r as u16, 7], &mut gathered)?;
        let mut scattered = vec![r as u64 + 1; 7];
        let mine = comm.reduce_scatter(&mut scattered, ReduceOp::Prod)?;
        let mut ordered = vec![r as u64 + 1; 2];
        comm.allreduce_with(&mut ordered, |acc, next| *acc = *acc * 10 + *next)?;
        let mut words = vec![format!("{r}")];
        comm.allreduce_serde(&mut words, |acc, next| acc.push_str(next))?;
        comm.barrier()?;
        Ok(Results {
            sum,
            max_unaligned: raw[1..].to_vec(),
            text,
            gathered,
            block: scattered[mine].to_vec(),
            ordered,
            words,
        })
    }

    /// A wrapper around the mesh engine changes no result and sees every call, with
    /// its result, as bytes; the same wrapper around an engine with no network
    /// replays those results through the typed API, bit for bit.
    #[test]
    fn a_wrapper_engine_sees_every_call_and_can_replay_it() {
        let n = 3;
        let endpoints: Vec<String> = (0..n)
            .map(|r| format!("local://engine-wrapper-{}-{r}", std::process::id()))
            .collect();
        let threads: Vec<_> = (0..n)
            .map(|rank| {
                let boot = crate::bootstrap::Bootstrap::endpoints(rank, &endpoints);
                std::thread::spawn(move || {
                    let options = CommOptions::default().with_timeout(Duration::from_secs(20));
                    let mut comm = Communicator::join(&boot, options)?;
                    let log = wrap(&mut comm, Vec::new());
                    let results = script(&mut comm)?;
                    Ok::<_, CollectiveError>((results, taken(&log)))
                })
            })
            .collect();
        let ranks: Vec<(Results, Vec<Seen>)> = threads
            .into_iter()
            .map(|t| t.join().expect("rank thread").expect("rank"))
            .collect();
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        for (rank, (results, seen)) in ranks.iter().enumerate() {
            assert_eq!(results.sum, [6.0; 5]);
            assert_eq!(results.max_unaligned, i32s(&[20, 21, 22]));
            assert_eq!(results.text, b"from one");
            assert_eq!(results.gathered, [0, 7, 1, 7, 2, 7]);
            // 7 elements over 3 ranks: blocks of 3, 2, 2; every product is 1*2*3.
            assert_eq!(results.block, vec![6; if rank == 0 { 3 } else { 2 }]);
            assert_eq!(results.ordered, [123, 123]);
            assert_eq!(results.words, ["012"]);
            let calls: Vec<Call> = seen.iter().map(|(sig, _, _)| sig.call).collect();
            use Call::*;
            // broadcast_bytes is two calls: the length, then the bytes.
            let expected = [
                Allreduce,
                Allreduce,
                Broadcast,
                Broadcast,
                Allgather,
                ReduceScatter,
                Allreduce,
                Allreduce,
                Barrier,
            ];
            assert_eq!(calls, expected, "rank {rank}");
            assert_eq!(seen[0].1, 5);
            assert_eq!(seen[0].2, bytemuck::cast_slice::<f32, u8>(&[6.0; 5]));
            assert_eq!(seen[3].2, b"from one");
        }

        // Rank 1 again, with no network: every result comes from what was kept.
        let (live, seen) = &ranks[1];
        let mut gone = Gone { rank: 1, size: n };
        assert!(
            gone.run(&mut Collective::Barrier).is_err(),
            "the inner engine must refuse"
        );
        let mut comm =
            Communicator::with_engine(Box::new(gone), CommOptions::default(), "replay".into());
        let kept = seen.iter().map(|(_, _, bytes)| bytes.clone()).collect();
        let log = wrap(&mut comm, kept);
        let replayed = script(&mut comm).expect("replay");
        assert_eq!(&replayed, live);
        assert_eq!(taken(&log), *seen);
    }
}
