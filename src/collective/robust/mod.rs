//! Robust mode: rabit's checkpoints and recovery, so that an iterative job survives
//! a worker's death.
//!
//! A robust [`Communicator`] is formed through a tracker by
//! [`Communicator::join`] with [`CommOptions::robust`](crate::collective::CommOptions::robust)
//! set (under `switchyard launch`, with the bootstrap of
//! [`Bootstrap::from_env`](crate::bootstrap::Bootstrap::from_env)). The program is
//! written as for rabit:
//!
//! 1. [`Communicator::load_checkpoint`] first: `None` on a fresh start, or the last
//!    checkpoint when this process is a restarted worker;
//! 2. collectives as usual (each is recoverable; [`Communicator::allreduce_lazy`]'s
//!    `prepare` runs only when the result is not recovered);
//! 3. [`Communicator::checkpoint`] (or [`lazy_checkpoint`](Communicator::lazy_checkpoint))
//!    after each iteration: the global model, the same on every rank, and an
//!    optional local model of this rank, kept on this rank and its
//!    [`RobustOptions::local_replica`] ring successors. In memory, not on disk.
//!
//! When a worker dies, the others notice at once (its connections close) and wait
//! inside their pending call; the launcher (`--max-restarts`) starts it again; it
//! rejoins through the tracker, gets the last checkpoint and then, for every call it
//! makes again, the result a survivor kept, without computing anything, until it
//! catches up. The final model is the one of a run without the failure.
//!
//! Rabit's `mock=rank,version,seq,ndeath` kills ([`MockKill`], [`ENV_MOCK`]) make a
//! chosen rank exit at a chosen call, for tests.
//!
//! What it costs: a copy of each call's input, and a copy of its result on
//! [`RobustOptions::global_replica`] of the ranks until the next checkpoint (bounded by
//! [`RobustOptions::result_budget`]); an agreement (one small allreduce) before a call
//! only after a failure, until every rank is in step again, and at checkpoints.
//! Reduce-scatter runs as an allreduce, so that any keeper can replay any rank's block.

mod engine;
mod join;
mod mock;
mod retry;
mod state;
mod store;

#[cfg(feature = "testing")]
pub(crate) use engine::Rejoin;
pub(crate) use engine::RobustEngine;
pub use mock::{ENV_MOCK, KillPoint, MOCK_EXIT_STATUS, MockKill};

use super::Communicator;
use super::element::{DType, ReduceOp, Reducible};
use super::engine::Collective;
use super::error::{Call, CollectiveError};
use serde::{Serialize, de::DeserializeOwned};
use std::sync::Arc;
use store::Global;
use switchyard_msg::payload;
use switchyard_net::env::{self, EnvError, Lookup};

/// Environment variable: [`RobustOptions::local_replica`].
pub const ENV_LOCAL_REPLICA: &str = "SWITCHYARD_LOCAL_REPLICA";
/// Environment variable: [`RobustOptions::global_replica`].
pub const ENV_GLOBAL_REPLICA: &str = "SWITCHYARD_GLOBAL_REPLICA";
/// Environment variable: [`RobustOptions::result_budget`], in bytes.
pub const ENV_RESULT_BUDGET: &str = "SWITCHYARD_RESULT_BUDGET";

/// How robust mode keeps what recovery needs.
///
/// | field | default | environment |
/// |---|---|---|
/// | `local_replica` | 2 | `SWITCHYARD_LOCAL_REPLICA` |
/// | `global_replica` | 5 | `SWITCHYARD_GLOBAL_REPLICA` |
/// | `result_budget` | 1 GiB | `SWITCHYARD_RESULT_BUDGET` |
/// | `mock` | none | `SWITCHYARD_MOCK`, or `mock=` arguments ([`RobustOptions::with_args`]) |
/// | `attempt` | 0 | `DMLC_NUM_ATTEMPT` |
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RobustOptions {
    /// Ring successors that hold a copy of each rank's local model.
    pub local_replica: usize,
    /// Ranks that keep each call's result until the next checkpoint (rabit's
    /// `num_global_replica`): every `world / global_replica`-th rank.
    pub global_replica: usize,
    /// Most bytes of results one rank keeps between checkpoints; a call that would
    /// pass it fails with [`CollectiveError::ResultBudget`].
    pub result_budget: usize,
    /// Planned deaths, for tests.
    pub mock: Vec<MockKill>,
    /// This process's start number (`DMLC_NUM_ATTEMPT`: 0 first, then one more per
    /// restart), which mock kills match.
    pub attempt: u64,
}

impl Default for RobustOptions {
    fn default() -> Self {
        RobustOptions {
            local_replica: 2,
            global_replica: 5,
            result_budget: 1 << 30,
            mock: Vec::new(),
            attempt: 0,
        }
    }
}

impl RobustOptions {
    /// The defaults, overridden by the environment variables of the table above.
    ///
    /// # Errors
    ///
    /// A variable that is set but malformed, named with its value and what was
    /// expected.
    pub fn from_env() -> Result<RobustOptions, EnvError> {
        RobustOptions::from_lookup(&env::ProcessEnv)
    }

    /// As [`RobustOptions::from_env`], with variables from `lookup` (a map or a
    /// closure in a test).
    ///
    /// # Errors
    ///
    /// As [`RobustOptions::from_env`].
    pub fn from_lookup(lookup: &(impl Lookup + ?Sized)) -> Result<RobustOptions, EnvError> {
        let mut options = RobustOptions::default();
        if let Some(n) = env::usize(lookup, ENV_LOCAL_REPLICA)? {
            options.local_replica = n;
        }
        if let Some(n) = env::usize(lookup, ENV_GLOBAL_REPLICA)? {
            options.global_replica = n.max(1);
        }
        if let Some(n) = env::usize(lookup, ENV_RESULT_BUDGET)? {
            options.result_budget = n;
        }
        if let Some(n) = env::u64(lookup, crate::bootstrap::ENV_NUM_ATTEMPT)? {
            options.attempt = n;
        }
        if let Some(text) = env::text(lookup, ENV_MOCK) {
            options.mock = MockKill::parse_list(&text).map_err(|e| {
                EnvError::malformed(
                    ENV_MOCK,
                    text.clone(),
                    format!("kills `rank,version,seq,ndeath[,point]` separated by spaces ({e})"),
                )
            })?;
        }
        Ok(options)
    }

    /// Adds the kills of rabit-style `mock=rank,version,seq,ndeath` arguments (other
    /// arguments are ignored), as rabit's test programs take them.
    ///
    /// ```
    /// use switchyard::collective::RobustOptions;
    /// let args = ["--iters", "3", "mock=0,0,1,0", "mock=1,1,1,0"].map(String::from);
    /// let options = RobustOptions::default().with_args(args)?;
    /// assert_eq!(options.mock.len(), 2);
    /// # Ok::<(), String>(())
    /// ```
    pub fn with_args(mut self, args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        for arg in args {
            if let Some(spec) = arg.strip_prefix("mock=") {
                self.mock.push(MockKill::parse(spec)?);
            }
        }
        Ok(self)
    }

    /// Replaces the planned kills.
    pub fn with_mock(mut self, mock: Vec<MockKill>) -> Self {
        self.mock = mock;
        self
    }

    /// Sets [`RobustOptions::local_replica`].
    pub fn with_local_replica(mut self, n: usize) -> Self {
        self.local_replica = n;
        self
    }

    /// Sets [`RobustOptions::global_replica`] (at least 1).
    pub fn with_global_replica(mut self, n: usize) -> Self {
        self.global_replica = n.max(1);
        self
    }

    /// Sets [`RobustOptions::result_budget`].
    pub fn with_result_budget(mut self, bytes: usize) -> Self {
        self.result_budget = bytes;
        self
    }
}

/// A checkpoint as [`Communicator::load_checkpoint`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Checkpoints committed so far (1 after the first).
    pub version: u64,
    /// The global model.
    pub global: Vec<u8>,
    /// This rank's local model, if it checkpointed one.
    pub local: Option<Vec<u8>>,
}

impl Communicator {
    /// Runs `work` on the recovery engine as [`Communicator::guarded`] does: refused
    /// on a communicator that is not in robust mode (before anything else, leaving
    /// it usable) or after a failed call.
    fn robust_call<R>(
        &mut self,
        call: Call,
        work: impl FnOnce(&mut RobustEngine) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let engine = self.engine.name();
        if self.engine.robust().is_none() {
            return Err(CollectiveError::NotRobust { call, engine });
        }
        self.guarded(call, |inner| match inner.robust() {
            Some(robust) => work(robust),
            None => Err(CollectiveError::NotRobust { call, engine }),
        })
    }

    /// The last checkpoint: `None` when there is none (a fresh start: begin at
    /// version 0), else the version to resume from with the global model and this
    /// rank's local model. A restarted worker gets them from the survivors. Call it
    /// first, before any collective, on every rank.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::NotRobust`] outside robust mode;
    /// [`CollectiveError::LocalModelLost`] when this rank's local model and every copy
    /// of it are gone.
    pub fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, CollectiveError> {
        self.robust_call(Call::LoadCheckpoint, RobustEngine::load)
    }

    /// Commits a checkpoint: `global`, the model every rank holds alike, and this
    /// rank's optional `local` model, copied to its
    /// [`local_replica`](RobustOptions::local_replica) ring successors. Every rank
    /// calls it at the same point; [`version_number`](Communicator::version_number)
    /// then grows by one and the results kept since the last one are dropped.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::NotRobust`] outside robust mode; otherwise as a collective.
    pub fn checkpoint(
        &mut self,
        global: &[u8],
        local: Option<&[u8]>,
    ) -> Result<(), CollectiveError> {
        let global = Global::Bytes(Arc::new(global.to_vec()));
        let local = local.map(<[u8]>::to_vec);
        self.robust_call(Call::Checkpoint, |robust| robust.checkpoint(global, local))
    }

    /// [`checkpoint`](Communicator::checkpoint) of a global model without copying it
    /// (rabit's `LazyCheckPoint`): `global` encodes the model only when a restarted
    /// rank needs it, so it must give the model as it is at this call until the next
    /// checkpoint (keep the model unchanged, or capture a snapshot). No local model.
    ///
    /// # Errors
    ///
    /// As [`checkpoint`](Communicator::checkpoint).
    pub fn lazy_checkpoint(
        &mut self,
        global: impl Fn() -> Vec<u8> + Send + Sync + 'static,
    ) -> Result<(), CollectiveError> {
        self.robust_call(Call::Checkpoint, |robust| {
            robust.checkpoint(Global::Lazy(Arc::new(global)), None)
        })
    }

    /// [`checkpoint`](Communicator::checkpoint) of serde values (bincode, as
    /// [`broadcast_value`](Communicator::broadcast_value) encodes them).
    ///
    /// # Errors
    ///
    /// A value that cannot be encoded; otherwise as [`checkpoint`](Communicator::checkpoint).
    pub fn checkpoint_value<G: Serialize, L: Serialize>(
        &mut self,
        global: &G,
        local: Option<&L>,
    ) -> Result<(), CollectiveError> {
        let encode =
            |what: &str, e: switchyard_msg::PayloadError| CollectiveError::InvalidArgument {
                call: Call::Checkpoint,
                reason: format!("cannot encode the {what} model: {e}"),
            };
        let global = payload::frame_from_value(global).map_err(|e| encode("global", e))?;
        let local = match local {
            Some(l) => Some(payload::frame_from_value(l).map_err(|e| encode("local", e))?),
            None => None,
        };
        self.checkpoint(&global, local.as_deref())
    }

    /// [`load_checkpoint`](Communicator::load_checkpoint) of values that
    /// [`checkpoint_value`](Communicator::checkpoint_value) stored: `None` on a fresh
    /// start, else the version, the global model and this rank's local model.
    ///
    /// # Errors
    ///
    /// Bytes that do not decode as `G` (or `L`) are [`CollectiveError::Malformed`];
    /// otherwise as [`load_checkpoint`](Communicator::load_checkpoint).
    pub fn load_checkpoint_value<G: DeserializeOwned, L: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(u64, G, Option<L>)>, CollectiveError> {
        let Some(c) = self.load_checkpoint()? else {
            return Ok(None);
        };
        let (rank, limit) = (self.rank, usize::MAX);
        let decode = |what: &str, e: switchyard_msg::PayloadError| CollectiveError::Malformed {
            call: Call::LoadCheckpoint,
            rank,
            reason: format!("the checkpoint's {what} model does not decode: {e}"),
        };
        let global = payload::frame_to_value(&c.global, limit).map_err(|e| decode("global", e))?;
        let local = match c.local {
            Some(l) => Some(payload::frame_to_value(&l, limit).map_err(|e| decode("local", e))?),
            None => None,
        };
        Ok(Some((c.version, global, local)))
    }

    /// Checkpoints committed so far (0 outside robust mode).
    pub fn version_number(&mut self) -> u64 {
        self.engine.robust().map_or(0, |e| e.version())
    }

    /// How many times this rank formed a new mesh after a failure (0 outside robust
    /// mode).
    pub fn recoveries(&mut self) -> u64 {
        self.engine.robust().map_or(0, |e| e.rejoins())
    }

    /// [`allreduce`](Communicator::allreduce) with rabit's lazy preparation: `prepare`
    /// fills `buf` right before the reduction runs, and is not called at all when
    /// robust mode recovers the result from a survivor (a restarted rank catching
    /// up), which saves computing an input whose result is known.
    ///
    /// ```
    /// use switchyard::collective::{Communicator, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut sums = [0.0f64; 2];
    /// comm.allreduce_lazy(&mut sums, ReduceOp::Sum, |buf| buf.copy_from_slice(&[1.0, 2.0]))?;
    /// assert_eq!(sums, [1.0, 2.0]);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allreduce_lazy<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        prepare: impl FnOnce(&mut [T]),
    ) -> Result<(), CollectiveError> {
        self.try_allreduce_lazy(buf, op, |buf| {
            prepare(buf);
            Ok::<(), std::convert::Infallible>(())
        })
    }

    /// [`allreduce_lazy`](Communicator::allreduce_lazy) with a `prepare` that can
    /// fail. When it returns an error the call runs on no rank: this rank gets
    /// [`CollectiveError::PrepareFailed`] with the error in words, and the other
    /// ranks' calls fail with [`CollectiveError::Aborted`] naming this rank and
    /// "prepare failed" (in robust mode they recover instead, as after any aborted
    /// call, and keep no result of it). No rank ever gets a result computed from an
    /// input that was not prepared.
    ///
    /// Like any failed call, it leaves every rank's communicator unusable: later
    /// calls fail with [`CollectiveError::Poisoned`] until the program makes a new
    /// one. In robust mode the failing rank's communicator stays usable: its next
    /// call goes through the recovery's agreement, where the other ranks still wait
    /// in this call, so that the next call must be the same allreduce again (its
    /// `prepare` run anew), or the agreement fails with
    /// [`CollectiveError::Disagree`]. Under MPI, whose collectives cannot be aborted
    /// halfway, every rank first tells the others whether its `prepare` succeeded
    /// (one small allgather per lazy call) and the call runs only if all did.
    ///
    /// ```
    /// use switchyard::collective::{CollectiveError, Communicator, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut sums = [0.0f64; 2];
    /// let e = comm
    ///     .try_allreduce_lazy(&mut sums, ReduceOp::Sum, |_| Err("no data"))
    ///     .unwrap_err();
    /// assert!(matches!(e, CollectiveError::PrepareFailed { rank: 0, .. }));
    /// assert!(e.to_string().contains("prepare failed on rank 0: no data"));
    /// ```
    pub fn try_allreduce_lazy<T: Reducible, E: std::fmt::Display>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        prepare: impl FnOnce(&mut [T]) -> Result<(), E>,
    ) -> Result<(), CollectiveError> {
        self.try_allreduce_lazy_raw(bytemuck::cast_slice_mut(buf), T::DTYPE, op, |bytes| {
            prepare(bytemuck::cast_slice_mut(bytes))
        })
    }

    /// [`try_allreduce_lazy`](Communicator::try_allreduce_lazy) for callers without
    /// Rust types (the Python package): `buf` is bytes of `dtype` elements, aligned for
    /// them, and `prepare` gets them as bytes.
    ///
    /// ```
    /// use switchyard::collective::{Communicator, DType, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut sums = [0.0f32; 2];
    /// let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut sums);
    /// comm.try_allreduce_lazy_raw(bytes, DType::F32, ReduceOp::Sum, |b| {
    ///     b.copy_from_slice(bytemuck::cast_slice(&[1.5f32, 2.5]));
    ///     Ok::<(), String>(())
    /// })?;
    /// assert_eq!(sums, [1.5, 2.5]);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn try_allreduce_lazy_raw<E: std::fmt::Display>(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        prepare: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        if !dtype.supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call,
                reason: format!("{op:?} is not defined for {dtype:?}"),
            });
        }
        super::whole_elements(call, buf.len(), dtype)?;
        // Not copied to an aligned scratch as `allreduce_raw` does: `prepare` may
        // write the caller's memory behind the slice (Python writes its array).
        super::aligned(call, buf, dtype)?;
        let mut prepare = Some(prepare);
        let mut on_bytes = |bytes: &mut [u8]| match prepare.take() {
            Some(prepare) => prepare(bytes).map_err(|e| e.to_string()),
            None => Ok(()),
        };
        let mut request = Collective::Allreduce { buf, dtype, op };
        self.guarded(call, |engine| {
            engine.run_prepared(&mut request, &mut on_bytes)
        })
    }
}

#[cfg(test)]
mod tests;
