//! Collectives: allreduce, broadcast, allgather, reduce-scatter and barrier, one
//! [`Communicator`] API over two engines.
//!
//! - The **mesh** engine runs over the Dealer/Router transports (ZeroMQ tcp between
//!   processes, or any other backend): recursive doubling for small allreduces, a
//!   pipelined ring (reduce-scatter, then allgather) for large ones, binomial trees
//!   and a pipelined chain for broadcast. The algorithms only see the [`Link`] trait.
//! - The **MPI** engine (feature `mpi`, under `mpirun`) calls MPI's own collectives.
//! - A world of one process needs no network at all ([`Communicator::solo`]).
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
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoints: Vec<String> = (0..3).map(|r| format!("local://doc-allreduce-{r}")).collect();
//! let handles: Vec<_> = (0..3)
//!     .map(|rank| {
//!         let endpoints = endpoints.clone();
//!         std::thread::spawn(move || {
//!             let mut comm = Communicator::mesh(rank, &endpoints, CommOptions::default())?;
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

mod algo;
mod element;
mod error;
pub(crate) mod link;
#[cfg(feature = "mpi")]
mod mpi_engine;
mod options;

pub use element::{DType, ReduceOp, Reducible};
pub use error::{Call, CollectiveError, LinkError};
pub use link::{BoundLink, Link, MemoryLink, MemorySchedule, SocketLink, StreamLink, Tag};
pub use options::{CommOptions, DataPath, ENV_DATA_PATH, ENV_LARGE_THRESHOLD, ENV_TIMEOUT};

use crate::launch::{Bootstrap, Rendezvous};
use algo::{direct, doubling, ring, split, tree, Round, Signature};
use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use std::ops::Range;
use std::time::Instant;
use switchyard_msg::payload::{self, Element};

/// Which engine a communicator runs on.
enum Engine {
    Solo,
    Mesh(Box<dyn Link>),
    #[cfg(feature = "mpi")]
    Mpi(mpi_engine::MpiEngine),
}

/// Operation code of the user reducers in a [`Signature`].
const USER_OP: u8 = 0xff;

/// A group of ranks that run collectives together.
///
/// Not `Sync`: one thread drives a communicator at a time, as with MPI
/// communicators and rabit. Every call blocks until this rank's part is done, and
/// waits at most [`CommOptions::timeout`] for any peer.
pub struct Communicator {
    rank: usize,
    size: usize,
    engine: Engine,
    seq: u64,
    options: CommOptions,
    processor_name: String,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let engine = match &self.engine {
            Engine::Solo => "solo",
            Engine::Mesh(_) => "mesh",
            #[cfg(feature = "mpi")]
            Engine::Mpi(_) => "mpi",
        };
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("engine", &engine)
            .finish()
    }
}

/// A mesh communicator whose endpoint is bound but whose peers are not connected:
/// hand [`MeshBuilder::endpoint`] to the other ranks, then [`MeshBuilder::connect`].
#[derive(Debug)]
pub struct MeshBuilder {
    link: BoundLink,
    options: CommOptions,
}

impl MeshBuilder {
    /// Where the other ranks reach this one (the real port when bound to port 0).
    pub fn endpoint(&self) -> &str {
        self.link.endpoint()
    }

    /// Connects to every rank's endpoint (`endpoints[r]` is rank `r`'s), waiting at
    /// most [`CommOptions::timeout`] for all of them.
    pub fn connect(self, endpoints: &[String]) -> Result<Communicator, CollectiveError> {
        let tcp_host = tcp_host(self.link.endpoint());
        let link = self
            .link
            .connect(endpoints, self.options.timeout)
            .map_err(|e| e.during(Call::Setup))?;
        let link: Box<dyn Link> = match tcp_host {
            Some(host) if self.options.data_path == DataPath::Tcp => Box::new(
                StreamLink::connect(
                    link,
                    &host,
                    self.options.timeout,
                    self.options.socket.limits.max_frame_bytes,
                    self.options.spin,
                )
                .map_err(|e| e.during(Call::Setup))?,
            ),
            _ => Box::new(link),
        };
        let mut comm = Communicator::over_link(link, self.options);
        // Until every rank is connected both ways, none may start (and possibly finish
        // and leave) its first call: a router counts only live peers.
        comm.barrier().map_err(|e| match e {
            CollectiveError::PeerTimeout { rank, waited, .. } => CollectiveError::PeerTimeout {
                call: Call::Setup,
                rank,
                waited,
            },
            other => other,
        })?;
        Ok(comm)
    }
}

/// The host of a `tcp://host:port` endpoint, where the TCP data path listens too.
fn tcp_host(endpoint: &str) -> Option<String> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, _port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(if host == "*" {
        "0.0.0.0".into()
    } else {
        host.to_string()
    })
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Communicator {
    /// A world of one rank: every collective returns at once, nothing touches the
    /// network.
    pub fn solo() -> Communicator {
        Communicator {
            rank: 0,
            size: 1,
            engine: Engine::Solo,
            seq: 0,
            options: CommOptions::default(),
            processor_name: this_host(),
        }
    }

    /// A mesh communicator over any [`Link`].
    pub fn over_link(link: Box<dyn Link>, options: CommOptions) -> Communicator {
        Communicator {
            rank: link.rank(),
            size: link.world_size(),
            engine: Engine::Mesh(link),
            seq: 0,
            options,
            processor_name: this_host(),
        }
    }

    /// Binds rank `rank` of `size` at `endpoint` (`tcp://127.0.0.1:0` picks a port),
    /// for peers to be connected later.
    pub fn bind_mesh(
        rank: usize,
        size: usize,
        endpoint: &str,
        options: CommOptions,
    ) -> Result<MeshBuilder, CollectiveError> {
        if size == 0 || rank >= size {
            return Err(CollectiveError::InvalidArgument {
                call: Call::Setup,
                reason: format!("rank {rank} is outside a world of {size}"),
            });
        }
        let link = BoundLink::bind(rank, size, endpoint, options.socket.clone())
            .map_err(|e| e.during(Call::Setup))?;
        Ok(MeshBuilder { link, options })
    }

    /// Rank `rank` of a mesh whose endpoints are all known in advance: binds
    /// `endpoints[rank]` and connects to the others. A world of one is
    /// [`solo`](Communicator::solo).
    pub fn mesh(
        rank: usize,
        endpoints: &[String],
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        if endpoints.len() == 1 && rank == 0 {
            return Ok(Communicator {
                options,
                ..Communicator::solo()
            });
        }
        let endpoint = endpoints
            .get(rank)
            .ok_or_else(|| CollectiveError::InvalidArgument {
                call: Call::Setup,
                reason: format!("rank {rank} has no endpoint among {}", endpoints.len()),
            })?;
        Communicator::bind_mesh(rank, endpoints.len(), endpoint, options)?.connect(endpoints)
    }

    /// The communicator of a process started by `switchyard launch` (a mesh on
    /// loopback, endpoints exchanged through the launcher's rendezvous) or by
    /// `mpirun` (the MPI engine; needs the `mpi` feature).
    pub fn from_bootstrap(
        boot: &Bootstrap,
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        let setup = |reason: String| CollectiveError::InvalidArgument {
            call: Call::Setup,
            reason,
        };
        match &boot.rendezvous {
            Rendezvous::Mpi => {
                #[cfg(feature = "mpi")]
                return Communicator::mpi(options);
                #[cfg(not(feature = "mpi"))]
                return Err(setup(
                    "started by mpirun, but this build has no MPI engine: \
                                  rebuild with `--features mpi`"
                        .into(),
                ));
            }
            Rendezvous::Launcher(_) => {
                let (rank, size) = (boot.rank as usize, boot.world_size as usize);
                if size == 1 {
                    return Ok(Communicator {
                        options,
                        ..Communicator::solo()
                    });
                }
                let builder = Communicator::bind_mesh(rank, size, "tcp://127.0.0.1:0", options)?;
                let endpoints = boot
                    .exchange(builder.endpoint(), builder.options.timeout)
                    .map_err(|e| setup(format!("endpoint exchange: {e}")))?;
                builder.connect(&endpoints)
            }
        }
    }

    /// The communicator for however this process was started: see
    /// [`from_bootstrap`](Communicator::from_bootstrap); a process started by hand is
    /// a world of one. Options come from [`CommOptions::from_env`].
    pub fn from_env() -> Result<Communicator, CollectiveError> {
        Communicator::from_env_with(CommOptions::from_env())
    }

    /// [`from_env`](Communicator::from_env) with the given options.
    pub fn from_env_with(options: CommOptions) -> Result<Communicator, CollectiveError> {
        match Bootstrap::from_env() {
            Ok(Some(boot)) => Communicator::from_bootstrap(&boot, options),
            Ok(None) => Ok(Communicator {
                options,
                ..Communicator::solo()
            }),
            Err(e) => Err(CollectiveError::InvalidArgument {
                call: Call::Setup,
                reason: e.to_string(),
            }),
        }
    }

    /// The MPI engine on `MPI_COMM_WORLD` (the process must run under `mpirun`).
    #[cfg(feature = "mpi")]
    pub fn mpi(options: CommOptions) -> Result<Communicator, CollectiveError> {
        let mut engine = mpi_engine::MpiEngine::new(options.timeout)?;
        engine.set_check_args(options.mpi_arg_checks);
        Ok(Communicator {
            rank: engine.rank(),
            size: engine.size(),
            processor_name: engine.processor_name().to_string(),
            engine: Engine::Mpi(engine),
            seq: 0,
            options,
        })
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
        !matches!(self.engine, Engine::Solo)
    }

    /// The host this rank runs on (MPI's processor name under MPI).
    pub fn processor_name(&self) -> &str {
        &self.processor_name
    }

    /// The options in force.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Runs `body` as one mesh call; on failure tells the other ranks, so that they
    /// fail at once instead of at their deadline.
    fn on_mesh<R>(
        &mut self,
        sig: Signature,
        total: u64,
        body: impl FnOnce(&mut Round<'_>) -> Result<R, CollectiveError>,
    ) -> Result<R, CollectiveError> {
        let seq = self.next_seq();
        let deadline = Instant::now() + self.options.timeout;
        let Engine::Mesh(link) = &mut self.engine else {
            unreachable!("on_mesh is only called for the mesh engine");
        };
        let mut round = Round {
            link: link.as_mut(),
            sig,
            seq,
            total,
            deadline,
        };
        let result = body(&mut round);
        if let Err(e) = &result {
            if !matches!(e, CollectiveError::Aborted { .. }) {
                link.abort(seq, &format!("rank {}: {e}", self.rank));
            }
        }
        result
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
        if !T::supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call: Call::Allreduce,
                reason: format!("{op:?} is not defined for {:?}", T::DTYPE),
            });
        }
        let sig = Signature {
            call: Call::Allreduce,
            op: op.code(),
            dtype: T::DTYPE.code(),
            root: 0,
        };
        let reduce = move |acc: &mut [T], other: &[T]| T::reduce_into(op, acc, other);
        match &mut self.engine {
            Engine::Solo => Ok(()),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => mpi.allreduce(buf, op),
            Engine::Mesh(_) => {
                let bytes = std::mem::size_of_val(buf);
                let n = self.size;
                let options = self.options.clone();
                self.on_mesh(sig, buf.len() as u64, |round| {
                    if bytes < options.large_threshold || buf.len() < n {
                        doubling::allreduce(round, buf, &reduce)
                    } else if n <= options.direct_max_ranks {
                        direct::allreduce(round, buf, &reduce, options.piece_bytes)
                    } else {
                        let plan = ring::RingPlan::even::<T>(
                            buf.len(),
                            n,
                            options.piece_bytes,
                            options.effective_window(),
                        );
                        ring::run(round, buf, &plan, ring::Phase::Both, &reduce)
                    }
                })
            }
        }
    }

    /// [`allreduce`](Communicator::allreduce) with rabit's lazy preparation: `prepare`
    /// fills `buf` before the reduction and is meant to run only when the result
    /// cannot be recovered from a checkpoint. Recovery does not exist yet, so today
    /// `prepare` always runs, once, right before the reduction.
    pub fn allreduce_lazy<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
        prepare: impl FnOnce(&mut [T]),
    ) -> Result<(), CollectiveError> {
        prepare(buf);
        self.allreduce(buf, op)
    }

    /// Allreduce with a user function: afterwards every `buf[i]` is
    /// `x0[i] ∘ x1[i] ∘ ... ∘ x(n-1)[i]` in rank order, where `reducer(acc, next)`
    /// computes `acc = acc ∘ next`. The operation must be associative; it need not
    /// be commutative (ranks are combined in order, on a binomial tree to rank 0,
    /// whose result is then broadcast).
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::Communicator;
    /// let mut comm = Communicator::solo();
    /// let mut buf = [2.0f64];
    /// comm.allreduce_with(&mut buf, |acc, next| *acc = *acc * 10.0 + *next)?;
    /// assert_eq!(buf, [2.0]);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allreduce_with<T: Element>(
        &mut self,
        buf: &mut [T],
        reducer: impl Fn(&mut T, &T),
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        let combine = |acc: &mut Vec<T>, next: Vec<T>| {
            for (a, b) in acc.iter_mut().zip(&next) {
                reducer(a, b);
            }
        };
        let len = buf.len();
        let encode = |v: &Vec<T>| Ok(payload::frame_from_slice(v));
        let decode = |frame: Bytes, from: usize| -> Result<Vec<T>, CollectiveError> {
            let values =
                payload::frame_to_vec::<T>(&frame).map_err(|e| CollectiveError::Malformed {
                    call,
                    rank: from,
                    reason: e.to_string(),
                })?;
            if values.len() != len {
                return Err(CollectiveError::SizeMismatch {
                    call,
                    rank: from,
                    me: 0,
                    ours: len as u64,
                    theirs: values.len() as u64,
                });
            }
            Ok(values)
        };
        let reduced = self.ordered_reduce(
            buf.to_vec(),
            len as u64,
            size_of::<T>() as u8,
            &encode,
            &decode,
            &combine,
        )?;
        if let Some(result) = reduced {
            buf.copy_from_slice(&result);
        }
        self.broadcast_elements(
            buf,
            0,
            Signature {
                call,
                op: USER_OP,
                dtype: size_of::<T>() as u8,
                root: 0,
            },
        )
    }

    /// Allreduce of structured values with a user function, like rabit's
    /// `SerializeReducer`: every rank passes the same number of values; afterwards
    /// `values[i]` is the rank-ordered combination `reducer(acc, next)` of every
    /// rank's `values[i]`. Values travel serde + bincode encoded.
    pub fn allreduce_serde<T: Serialize + DeserializeOwned>(
        &mut self,
        values: &mut [T],
        reducer: impl Fn(&mut T, &T),
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        let limit = self.options.socket.limits.max_frame_bytes;
        let len = values.len();
        let encode = |v: &Vec<Bytes>| -> Result<Bytes, CollectiveError> { Ok(v[0].clone()) };
        let decode =
            |frame: Bytes, _from: usize| -> Result<Vec<Bytes>, CollectiveError> { Ok(vec![frame]) };
        // Values are combined decoded; the tree moves them encoded.
        let mine =
            payload::frame_from_value(&*values).map_err(|e| CollectiveError::InvalidArgument {
                call,
                reason: format!("cannot encode the values: {e}"),
            })?;
        let failure = std::cell::RefCell::new(None);
        let combine = |acc: &mut Vec<Bytes>, next: Vec<Bytes>| {
            let decoded: Result<(Vec<T>, Vec<T>), String> = (|| {
                let a =
                    payload::frame_to_value::<Vec<T>>(&acc[0], limit).map_err(|e| e.to_string())?;
                let b = payload::frame_to_value::<Vec<T>>(&next[0], limit)
                    .map_err(|e| e.to_string())?;
                Ok((a, b))
            })();
            match decoded {
                Ok((mut a, b)) if a.len() == b.len() => {
                    for (x, y) in a.iter_mut().zip(&b) {
                        reducer(x, y);
                    }
                    match payload::frame_from_value(&a) {
                        Ok(frame) => acc[0] = frame,
                        Err(e) => *failure.borrow_mut() = Some(e.to_string()),
                    }
                }
                Ok((a, b)) => {
                    *failure.borrow_mut() = Some(format!("{} values against {}", a.len(), b.len()))
                }
                Err(e) => *failure.borrow_mut() = Some(e),
            }
        };
        let reduced = self.ordered_reduce(vec![mine], len as u64, 0, &encode, &decode, &combine)?;
        if let Some(reason) = failure.into_inner() {
            return Err(CollectiveError::Malformed {
                call,
                rank: self.rank,
                reason,
            });
        }
        let mut bytes = reduced.map(|v| v[0].to_vec()).unwrap_or_default();
        self.broadcast_bytes(&mut bytes, 0)?;
        let result: Vec<T> =
            payload::frame_to_value(&bytes, limit).map_err(|e| CollectiveError::Malformed {
                call,
                rank: 0,
                reason: e.to_string(),
            })?;
        if result.len() != len {
            return Err(CollectiveError::SizeMismatch {
                call,
                rank: 0,
                me: self.rank,
                ours: len as u64,
                theirs: result.len() as u64,
            });
        }
        for (slot, value) in values.iter_mut().zip(result) {
            *slot = value;
        }
        Ok(())
    }

    /// Rank-ordered reduction onto rank 0 (`Some` there, `None` elsewhere).
    fn ordered_reduce<V>(
        &mut self,
        mine: V,
        total: u64,
        dtype: u8,
        encode: &dyn Fn(&V) -> Result<Bytes, CollectiveError>,
        decode: &dyn Fn(Bytes, usize) -> Result<V, CollectiveError>,
        combine: &dyn Fn(&mut V, V),
    ) -> Result<Option<V>, CollectiveError> {
        let sig = Signature {
            call: Call::Allreduce,
            op: USER_OP,
            dtype,
            root: 0,
        };
        match &mut self.engine {
            Engine::Solo => Ok(Some(mine)),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => {
                let frame = encode(&mine)?;
                let Some(frames) = mpi.gather_to_zero(&frame)? else {
                    return Ok(None);
                };
                let mut acc = mine;
                for (rank, frame) in frames.into_iter().enumerate().skip(1) {
                    combine(&mut acc, decode(Bytes::from(frame), rank)?);
                }
                Ok(Some(acc))
            }
            Engine::Mesh(_) => self.on_mesh(sig, total, |round| {
                tree::ordered_reduce(round, mine, encode, decode, combine)
            }),
        }
    }

    /// Copies `buf` from rank `root` into every rank's `buf` (all of the same length).
    ///
    /// Every message carries the root and the length, so a rank that receives from a
    /// rank that named another root, or passed another length, fails with
    /// [`CollectiveError::CallMismatch`] or [`CollectiveError::SizeMismatch`]. A rank
    /// that only sends in the tree (a root, or a leaf's sender) cannot notice; as in
    /// MPI, passing different roots is the program's error.
    pub fn broadcast<T: Element>(
        &mut self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        let sig = Signature {
            call: Call::Broadcast,
            op: 0,
            dtype: size_of::<T>() as u8,
            root: root as u32,
        };
        self.broadcast_elements(buf, root, sig)
    }

    fn broadcast_elements<T: Element>(
        &mut self,
        buf: &mut [T],
        root: usize,
        sig: Signature,
    ) -> Result<(), CollectiveError> {
        match &mut self.engine {
            Engine::Solo => Ok(()),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => mpi.broadcast(bytemuck_bytes_mut(buf), root),
            Engine::Mesh(_) => {
                let options = self.options.clone();
                let me = self.rank;
                self.on_mesh(sig, buf.len() as u64, |round| {
                    if std::mem::size_of_val(buf) >= options.large_threshold {
                        if round.size() <= options.direct_max_ranks {
                            return direct::broadcast(round, root, buf, options.piece_bytes);
                        }
                        return tree::broadcast_chain(round, root, buf, options.piece_bytes);
                    }
                    let frame = (me == root).then(|| payload::frame_from_slice(buf));
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
                })
            }
        }
    }

    /// Copies rank `root`'s byte buffer to every rank, resizing the others' to fit
    /// (like rabit's `Broadcast(std::string*, root)`).
    pub fn broadcast_bytes(
        &mut self,
        buf: &mut Vec<u8>,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        let mut len = [buf.len() as u64];
        let sig = Signature {
            call: Call::Broadcast,
            op: 0,
            dtype: 0,
            root: root as u32,
        };
        self.broadcast_elements(&mut len, root, sig)?;
        let len = usize::try_from(len[0]).map_err(|_| CollectiveError::Malformed {
            call: Call::Broadcast,
            rank: root,
            reason: format!("a length of {} bytes", len[0]),
        })?;
        buf.resize(len, 0);
        self.broadcast_elements(buf.as_mut_slice(), root, sig)
    }

    /// Replaces `value` on every rank with rank `root`'s (serde + bincode encoded).
    pub fn broadcast_value<T: Serialize + DeserializeOwned>(
        &mut self,
        value: &mut T,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        let mut bytes = if self.rank == root {
            payload::frame_from_value(&*value)
                .map_err(|e| CollectiveError::InvalidArgument {
                    call: Call::Broadcast,
                    reason: format!("cannot encode the value: {e}"),
                })?
                .to_vec()
        } else {
            Vec::new()
        };
        self.broadcast_bytes(&mut bytes, root)?;
        if self.rank != root {
            *value = payload::frame_to_value(&bytes, self.options.socket.limits.max_frame_bytes)
                .map_err(|e| CollectiveError::Malformed {
                    call: Call::Broadcast,
                    rank: root,
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Gathers every rank's `mine` (all of one length) into `out`, in rank order:
    /// `out` must hold `world_size() * mine.len()` elements.
    pub fn allgather<T: Element>(
        &mut self,
        mine: &[T],
        out: &mut [T],
    ) -> Result<(), CollectiveError> {
        let (n, r, m) = (self.size, self.rank, mine.len());
        if out.len() != n * m {
            return Err(CollectiveError::InvalidArgument {
                call: Call::Allgather,
                reason: format!(
                    "out holds {} elements, {n} ranks x {m} need {}",
                    out.len(),
                    n * m
                ),
            });
        }
        out[r * m..(r + 1) * m].copy_from_slice(mine);
        let blocks = (0..n).map(|i| i * m..(i + 1) * m).collect();
        self.gather_blocks(out, blocks, out_len_signature::<T>(Call::Allgather))
    }

    /// Gathers every rank's `mine`, whatever its length; returns them in rank order.
    pub fn allgather_varied<T: Element>(
        &mut self,
        mine: &[T],
    ) -> Result<Vec<Vec<T>>, CollectiveError> {
        let n = self.size;
        let mut lens = vec![0u64; n];
        self.allgather(&[mine.len() as u64], &mut lens)?;
        let mut starts = Vec::with_capacity(n + 1);
        let mut total = 0usize;
        for len in &lens {
            starts.push(total);
            total = total.saturating_add(usize::try_from(*len).unwrap_or(usize::MAX));
        }
        starts.push(total);
        let mut out = vec![<T as bytemuck::Zeroable>::zeroed(); total];
        out[starts[self.rank]..starts[self.rank + 1]].copy_from_slice(mine);
        let blocks: Vec<Range<usize>> = (0..n).map(|i| starts[i]..starts[i + 1]).collect();
        self.gather_blocks(
            &mut out,
            blocks.clone(),
            out_len_signature::<T>(Call::Allgather),
        )?;
        Ok(blocks.into_iter().map(|b| out[b].to_vec()).collect())
    }

    /// Allgather of `out` where block `r` (complete on rank `r`) is `blocks[r]`.
    fn gather_blocks<T: Element>(
        &mut self,
        out: &mut [T],
        blocks: Vec<Range<usize>>,
        sig: Signature,
    ) -> Result<(), CollectiveError> {
        match &mut self.engine {
            Engine::Solo => Ok(()),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => {
                let size = size_of::<T>();
                let byte_blocks = blocks
                    .iter()
                    .map(|b| b.start * size..b.end * size)
                    .collect();
                mpi.allgather(bytemuck_bytes_mut(out), byte_blocks)
            }
            Engine::Mesh(_) => {
                let options = self.options.clone();
                let plan = ring::RingPlan::with_blocks::<T>(
                    blocks,
                    options.piece_bytes,
                    options.effective_window(),
                );
                let direct = std::mem::size_of_val(out) < options.gather_threshold;
                self.on_mesh(sig, out.len() as u64, |round| {
                    if direct {
                        direct::allgather(round, out, &plan.blocks)
                    } else {
                        ring::run(round, out, &plan, ring::Phase::Allgather, &|_, _| {})
                    }
                })
            }
        }
    }

    /// Reduces `buf` over all ranks and leaves block `rank()` of the result on this
    /// rank: returns that block's range, `buf[range]` holds it, the rest of `buf` is
    /// unspecified. Blocks split `buf` evenly, the first `len % world_size()` ranks
    /// getting one element more.
    pub fn reduce_scatter<T: Reducible>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<Range<usize>, CollectiveError> {
        if !T::supports(op) {
            return Err(CollectiveError::InvalidArgument {
                call: Call::ReduceScatter,
                reason: format!("{op:?} is not defined for {:?}", T::DTYPE),
            });
        }
        let (n, r) = (self.size, self.rank);
        let mine = split(buf.len(), n, r);
        let sig = Signature {
            call: Call::ReduceScatter,
            op: op.code(),
            dtype: T::DTYPE.code(),
            root: 0,
        };
        match &mut self.engine {
            Engine::Solo => Ok(mine),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => {
                let counts = (0..n)
                    .map(|i| split(buf.len(), n, i).len())
                    .collect::<Vec<_>>();
                mpi.reduce_scatter(buf, op, &counts)?;
                Ok(mine)
            }
            Engine::Mesh(_) => {
                let options = self.options.clone();
                let plan = ring::RingPlan::even::<T>(
                    buf.len(),
                    n,
                    options.piece_bytes,
                    options.effective_window(),
                );
                let reduce = move |acc: &mut [T], other: &[T]| T::reduce_into(op, acc, other);
                self.on_mesh(sig, buf.len() as u64, |round| {
                    ring::run(round, buf, &plan, ring::Phase::ReduceScatter, &reduce)
                })?;
                Ok(mine)
            }
        }
    }

    /// Returns once every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        let sig = Signature {
            call: Call::Barrier,
            op: 0,
            dtype: 0,
            root: 0,
        };
        match &mut self.engine {
            Engine::Solo => Ok(()),
            #[cfg(feature = "mpi")]
            Engine::Mpi(mpi) => mpi.barrier(),
            Engine::Mesh(_) => self.on_mesh(sig, 0, |round| {
                let mut nothing: [u8; 0] = [];
                doubling::allreduce(round, &mut nothing, &|_, _| {})
            }),
        }
    }
}

fn out_len_signature<T>(call: Call) -> Signature {
    Signature {
        call,
        op: 0,
        dtype: size_of::<T>() as u8,
        root: 0,
    }
}

#[cfg(feature = "mpi")]
fn bytemuck_bytes_mut<T: Element>(buf: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(buf)
}
