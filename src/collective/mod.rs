//! Collectives: allreduce, broadcast, allgather, reduce-scatter and barrier, one
//! [`Communicator`] API over two engines.
//!
//! - The **mesh** engine runs over the Dealer/Router transports (ZeroMQ tcp between
//!   processes, or any other backend): recursive doubling for small allreduces, a
//!   direct exchange or a pipelined ring (reduce-scatter, then allgather) for large
//!   ones, binomial trees, scatter + allgather or a pipelined chain for broadcast.
//!   The algorithms only see the link trait of the `switchyard-link` crate.
//! - The **MPI** engine (feature `mpi`, under `mpirun`) calls MPI's own collectives.
//! - A world of one process needs no network at all ([`Communicator::solo`]).
//!
//! Every communicator is formed by one door, [`Communicator::join`], from a
//! [`Bootstrap`](crate::bootstrap::Bootstrap) that says how the job is formed (the
//! environment of a launcher, a unique id, a tracker, MPI, endpoints known in
//! advance, a world of one) and [`CommOptions`] (robust mode among them).
//! [`Communicator::from_env`], [`Communicator::from_unique_id`] and
//! [`Communicator::solo`] are short ways to the same door, named as in the Python
//! package.
//!
//! As in rabit, every rank must make the same calls in the same order with the same
//! lengths; the mesh engine checks lengths, operations, types and roots on every
//! message and fails with an error naming the rank instead of computing garbage.
//!
//! # Examples
//!
//! Three ranks as threads of one process, over in-process queues:
//!
//! ```
//! use switchyard::collective::{CommOptions, Communicator, ReduceOp};
//! use switchyard::bootstrap::Bootstrap;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoints: Vec<String> = (0..3).map(|r| format!("local://doc-allreduce-{r}")).collect();
//! let handles: Vec<_> = (0..3)
//!     .map(|rank| {
//!         let boot = Bootstrap::endpoints(rank, &endpoints);
//!         std::thread::spawn(move || {
//!             let mut comm = Communicator::join(&boot, CommOptions::default())?;
//!             let mut grad = vec![rank as f32; 4];
//!             comm.allreduce(&mut grad, ReduceOp::Sum)?;
//!             let mut model = if rank == 0 { b"weights".to_vec() } else { Vec::new() };
//!             comm.broadcast_bytes(&mut model, 0)?;
//!             Ok::<_, switchyard::collective::CollectiveError>((grad, model))
//!         })
//!     })
//!     .collect();
//! for handle in handles {
//!     let (grad, model) = handle.join().expect("rank thread")?;
//!     assert_eq!(grad, [3.0; 4]);
//!     assert_eq!(model, b"weights");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How it is built
//!
//! A [`Communicator`] checks a call's arguments, turns the buffer into bytes plus
//! what they mean (element type, operation, root), and hands that to its engine: the
//! mesh engine (`mesh.rs`, which picks an algorithm in `algo/choice.rs` and runs it
//! from `algo/`), the MPI engine (`mpi_engine/`) or the solo engine of a world of
//! one. What every rank must agree on, and the checks of it, live in `signature.rs`
//! for both engines. Because engines see only bytes, an engine can wrap another
//! (recovery will); [`Communicator::allreduce_raw`] and
//! [`Communicator::broadcast_raw`] are the same calls for callers without Rust types
//! (replay, other languages).

mod algo;
mod background;
mod calls;
mod element;
mod engine;
mod error;
mod hierarchy;
/// The link layer under the mesh engine: the `switchyard-link` crate.
use switchyard_link as link;
mod mesh;
#[cfg(feature = "mpi")]
mod mpi_engine;
mod options;
mod robust;
mod setup;
mod signature;
#[cfg(feature = "testing")]
pub mod testing;
mod tracked;
mod user;

pub use background::{BackgroundCommunicator, Pending};
pub use element::{DType, ReduceOp, Reducible};
pub use error::{Call, CollectiveError};
pub use options::{
    CommOptions, DataPath, ENV_CHECK, ENV_DATA_PATH, ENV_DEADLINE, ENV_HEARTBEAT, ENV_HOST_ID,
    ENV_LARGE_THRESHOLD, ENV_SHM, ENV_TIMEOUT,
};
pub use robust::{
    Checkpoint, ENV_GLOBAL_REPLICA, ENV_LOCAL_REPLICA, ENV_MOCK, ENV_RESULT_BUDGET, KillPoint,
    MOCK_EXIT_STATUS, MockKill, RobustOptions,
};
/// Set with [`CommOptions::with_interrupt`]:
///
/// ```
/// use switchyard::collective::{CommOptions, Interrupt};
/// let stop = Interrupt::new();
/// let options = CommOptions::default().with_interrupt(stop.clone());
/// assert!(!stop.is_raised());
/// stop.raise();
/// assert!(options.interrupt.as_ref().is_some_and(Interrupt::is_raised));
/// ```
pub use switchyard_link::Interrupt;
pub use tracked::{ENV_TRACKER_PROTOCOL, TrackerJoin, TrackerProtocol};

use engine::{Collective, Elem, Engine};
use switchyard_msg::payload::Element;

/// A group of ranks that run collectives together.
///
/// Not `Sync`: one thread drives a communicator at a time, as with MPI
/// communicators and rabit. Every call blocks until this rank's part is done, and
/// waits at most [`CommOptions::timeout`] for any peer.
///
/// # After a failed call
///
/// A call that fails leaves the ranks where the failure found them: a peer may have
/// finished the call, or given up on it, or still wait in it, and a message or host
/// board part of it may still be on its way. So the first call that fails on a rank
/// makes that rank's communicator unusable: every later call on it, of any kind
/// (checkpoints and `load_checkpoint` included), fails at once with
/// [`CollectiveError::Poisoned`], which names the first failure, and touches no
/// peer. Every rank whose call failed must make a new communicator to go on (a
/// notebook or a `try`/`except` loop that catches the error and calls again gets
/// that error, never another call's data). A rank whose own call succeeded while a
/// peer's failed (a broadcast's root, which only sends) is not refused, but the
/// peer takes part in nothing more: a later call that waits for it fails, by the
/// peer's abort notice or at [`CommOptions::timeout`].
///
/// Two failures leave the communicator usable, because no rank has communicated
/// anything of the call: arguments refused by the call's own checks before any
/// traffic ([`CollectiveError::InvalidArgument`] from a root outside the world, a
/// buffer of the wrong length or alignment, an operation the type lacks), and
/// [`CollectiveError::NotRobust`]. In robust mode ([`CommOptions::robust`]) a lazy
/// call whose `prepare` failed here leaves it usable too: the recovery's agreement,
/// which compares every rank's call, number, signature and length, brings the ranks
/// back into step before the next call runs (see
/// [`try_allreduce_lazy`](Communicator::try_allreduce_lazy)); any other failure
/// that robust mode returns makes it unusable like any other. On the MPI engine the
/// failures every rank reaches together before any data moves leave it usable too:
/// the argument check's [`CollectiveError::CallMismatch`] and
/// [`CollectiveError::SizeMismatch`] (every rank compared every rank's call before
/// any ran it) and a failed `prepare` ([`CollectiveError::PrepareFailed`] on its
/// rank, [`CollectiveError::Aborted`] on the others: no rank ran the call).
pub struct Communicator {
    rank: usize,
    size: usize,
    engine: Box<dyn Engine>,
    options: CommOptions,
    processor_name: String,
    /// The first failure of a call on this communicator, in words, once one failed:
    /// every later call is refused with it (see "After a failed call").
    failed: Option<String>,
    /// The tracker session of a communicator formed through a tracker; last, so that
    /// the engine's links close before its `shutdown` goes out.
    tracker: Option<tracked::TrackerLink>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("engine", &self.engine.name())
            .field("tracker", &self.tracker.is_some())
            .field("failed", &self.failed)
            .finish()
    }
}

impl Communicator {
    /// A communicator on `engine`, which every call goes through.
    fn with_engine(
        engine: Box<dyn Engine>,
        options: CommOptions,
        processor_name: String,
    ) -> Communicator {
        Communicator {
            rank: engine.rank(),
            size: engine.world_size(),
            engine,
            options,
            processor_name,
            failed: None,
            tracker: None,
        }
    }

    /// Whether an earlier call failed on this communicator, which now refuses every
    /// call with [`CollectiveError::Poisoned`] (see "After a failed call" above).
    ///
    /// ```
    /// use switchyard::collective::{CollectiveError, Communicator, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut sums = [0.0f64; 2];
    /// let _ = comm.try_allreduce_lazy(&mut sums, ReduceOp::Sum, |_| Err("no data"));
    /// assert!(comm.is_poisoned());
    /// let e = comm.barrier().unwrap_err();
    /// assert!(matches!(e, CollectiveError::Poisoned { .. }));
    /// assert!(e.to_string().contains("prepare failed on rank 0: no data"), "{e}");
    /// ```
    pub fn is_poisoned(&self) -> bool {
        self.failed.is_some()
    }

    /// Refuses any call once an earlier one failed.
    fn usable(&self, call: Call) -> Result<(), CollectiveError> {
        match &self.failed {
            Some(first) => Err(CollectiveError::Poisoned {
                call,
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Marks this communicator unusable after `e`, unless an earlier failure did.
    fn poison(&mut self, e: &CollectiveError) {
        if self.failed.is_none() {
            tracing::warn!(rank = self.rank, error = %e, "communicator unusable after a failed call");
            self.failed = Some(e.to_string());
        }
    }

    /// Runs `work`, the engine's part of a `call`, unless an earlier call failed; a
    /// failure of its own makes this communicator unusable, unless the engine brings
    /// the ranks back into step after it ([`Engine::usable_after`]).
    fn guarded<R>(
        &mut self,
        call: Call,
        work: impl FnOnce(&mut dyn Engine) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        self.usable(call)?;
        let result = work(self.engine.as_mut());
        if let Err(e) = &result {
            if !self.engine.usable_after(e) {
                self.poison(e);
            }
        }
        result
    }

    /// This process's rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// Whether collectives involve other processes (false for a world of one).
    pub fn is_distributed(&self) -> bool {
        self.engine.is_distributed()
    }

    /// The engine that runs the calls: `"mesh"` (the transports), `"mpi"` (MPI's own
    /// collectives), `"robust"` (robust mode around a mesh) or `"solo"` (a world of
    /// one).
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// The host this rank runs on (MPI's processor name under MPI).
    pub fn processor_name(&self) -> &str {
        &self.processor_name
    }

    /// The options in force.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    /// Runs one call on the engine (refused once an earlier call failed).
    fn run(&mut self, mut request: Collective<'_>) -> Result<(), CollectiveError> {
        self.guarded(request.call(), |engine| engine.run(&mut request))
    }

    fn check_root(&self, call: Call, root: usize) -> Result<(), CollectiveError> {
        if root >= self.size {
            return Err(CollectiveError::InvalidArgument {
                call,
                reason: format!("root {root} is outside a world of {}", self.size),
            });
        }
        Ok(())
    }

    /// Replaces every element of `buf` with `op` over all ranks' `buf`s.
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::{Communicator, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut counts = [3u64, 4];
    /// comm.allreduce(&mut counts, ReduceOp::Sum)?;
    /// assert_eq!(counts, [3, 4]);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allreduce<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.allreduce_raw(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// [`allreduce`](Communicator::allreduce) of a buffer whose element type is known
    /// only at run time: `buf` holds elements of `dtype` in native byte order, and
    /// ranks that call `allreduce::<f32>` and `allreduce_raw(.., DType::F32, ..)` are
    /// in the same call. This is the entry point for callers without Rust types (a
    /// numpy array's bytes, a result being replayed).
    ///
    /// The bytes are reduced in place, with no copy, when `buf` is aligned for
    /// `dtype` (as any buffer of that type is); an unaligned `buf` is reduced through
    /// one aligned copy, with the same result.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::InvalidArgument`], before any traffic, if `op` is not
    /// defined for `dtype` or `buf` is not a whole number of elements; otherwise as
    /// [`allreduce`](Communicator::allreduce).
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::{Communicator, DType, ReduceOp};
    /// let mut comm = Communicator::solo();
    /// let mut bytes: Vec<u8> = [1.5f64, -2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
    /// comm.allreduce_raw(&mut bytes, DType::F64, ReduceOp::Max)?;
    /// assert_eq!(bytes[..8], 1.5f64.to_ne_bytes());
    /// // Not a whole number of f64s: refused on every engine.
    /// assert!(comm.allreduce_raw(&mut bytes[..12], DType::F64, ReduceOp::Max).is_err());
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allreduce_raw(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        if !dtype.supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call,
                reason: format!("{op:?} is not defined for {dtype:?}"),
            });
        }
        whole_elements(call, buf.len(), dtype)?;
        if buf.as_ptr().align_offset(dtype.size()) == 0 {
            return self.run(Collective::Allreduce { buf, dtype, op });
        }
        // Every DType's alignment divides 8.
        let mut scratch = vec![0u64; buf.len().div_ceil(8)];
        let aligned = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch)[..buf.len()];
        aligned.copy_from_slice(buf);
        self.run(Collective::Allreduce {
            buf: aligned,
            dtype,
            op,
        })?;
        buf.copy_from_slice(aligned);
        Ok(())
    }

    /// Copies `buf` from rank `root` into every rank's `buf` (all of the same length).
    ///
    /// Every message carries the root and the length, so a rank that receives from a
    /// rank that named another root, or passed another length, fails with
    /// [`CollectiveError::CallMismatch`] or [`CollectiveError::SizeMismatch`]. A rank
    /// that only sends (the root) cannot notice unless checked mode
    /// ([`CommOptions::check`]) is on, which makes every rank fail instead.
    pub fn broadcast<T: Element>(
        &mut self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        self.run(Collective::Broadcast {
            buf: bytemuck::cast_slice_mut(buf),
            elem: Elem::Sized(size_of::<T>()),
            root,
        })
    }

    /// [`broadcast`](Communicator::broadcast) of a buffer whose element type is known
    /// only at run time: `buf` holds elements of `dtype`, and ranks that call
    /// `broadcast::<f32>` and `broadcast_raw(.., DType::F32, ..)` are in the same
    /// call. Bytes are copied as they are, so `buf` need not be aligned.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::InvalidArgument`], before any traffic, if `root` is outside
    /// the world or `buf` is not a whole number of elements; otherwise as
    /// [`broadcast`](Communicator::broadcast).
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::{Communicator, DType};
    /// let mut comm = Communicator::solo();
    /// let mut bytes = 7i32.to_ne_bytes().to_vec();
    /// comm.broadcast_raw(&mut bytes, DType::I32, 0)?;
    /// assert_eq!(bytes, 7i32.to_ne_bytes());
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn broadcast_raw(
        &mut self,
        buf: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        whole_elements(Call::Broadcast, buf.len(), dtype)?;
        self.run(Collective::Broadcast {
            buf,
            elem: Elem::Sized(dtype.size()),
            root,
        })
    }
}

/// Refuses a byte length that is not a whole number of `dtype` elements.
/// Refuses a byte buffer that does not start on a `dtype` boundary, for the calls
/// that reduce in place (they read the bytes as elements). An empty buffer holds no
/// element to misread, whatever its pointer (numpy's empty arrays have any).
fn aligned(call: Call, buf: &[u8], dtype: DType) -> Result<(), CollectiveError> {
    if buf.is_empty() || buf.as_ptr().align_offset(dtype.size()) == 0 {
        return Ok(());
    }
    Err(CollectiveError::InvalidArgument {
        call,
        reason: format!(
            "the buffer does not start on a {dtype:?} boundary ({} bytes)",
            dtype.size()
        ),
    })
}

fn whole_elements(call: Call, len: usize, dtype: DType) -> Result<(), CollectiveError> {
    if len % dtype.size() == 0 {
        return Ok(());
    }
    Err(CollectiveError::InvalidArgument {
        call,
        reason: format!(
            "{len} bytes are not a whole number of {dtype:?} elements ({} bytes each)",
            dtype.size()
        ),
    })
}
