//! Forming a [`Communicator`]: the one door, [`Communicator::join`], and what it
//! goes through for each [`Rendezvous`]: a world of one, a mesh over the transports
//! whose endpoints are known, a mesh whose endpoints go through an
//! [`EndpointExchange`] (the launcher's rendezvous, a unique id's root, the program's
//! own; one path for all of them, [`Communicator::exchanged_mesh`]), a tracker
//! (`tracked.rs`, robust mode in `robust/join.rs`), or MPI.

use super::engine::{Engine, Solo};
use super::error::{Call, CollectiveError, During};
use super::link::{BoundLink, Link, StreamLink};
use super::mesh::MeshEngine;
use super::options::{CommOptions, DataPath};
use super::{Communicator, TrackerJoin, TrackerProtocol};
use crate::bootstrap::{
    Bootstrap, EndpointExchange, LauncherExchange, Rendezvous, UniqueId, UniqueIdExchange,
};
use std::time::Duration;

/// A mesh communicator whose endpoint is bound but whose peers are not connected:
/// its endpoint goes through an exchange ([`MeshBuilder::connect_through`]), or the
/// endpoints were known in advance ([`MeshBuilder::connect`]).
#[derive(Debug)]
pub(crate) struct MeshBuilder {
    link: BoundLink,
    rank: u32,
    world: u32,
    options: CommOptions,
    /// Every endpoint was bound before the rendezvous handed it out, so one that
    /// refuses a connection belongs to a rank that left.
    exchanged: bool,
}

impl MeshBuilder {
    /// Where the other ranks reach this one (the real port when bound to port 0).
    pub(crate) fn endpoint(&self) -> &str {
        self.link.endpoint()
    }

    /// Hands this rank's endpoint to `exchange` and returns every rank's, waiting at
    /// most `timeout`; a failure is the setup error of `stage`.
    pub(crate) fn exchange(
        &self,
        exchange: &mut dyn EndpointExchange,
        stage: impl FnOnce() -> String,
        timeout: Duration,
    ) -> Result<Vec<String>, CollectiveError> {
        exchange
            .exchange(self.rank, self.world, self.endpoint(), timeout)
            .map_err(|e| CollectiveError::setup(stage(), e))
    }

    /// Hands this rank's endpoint to `exchange` (waiting at most `timeout` for the
    /// others'; a failure is the setup error of `stage`), then connects to every
    /// rank's. A world of one is solo once the exchange is done.
    pub(crate) fn connect_through(
        self,
        exchange: &mut dyn EndpointExchange,
        stage: impl FnOnce() -> String,
        timeout: Duration,
    ) -> Result<Communicator, CollectiveError> {
        let endpoints = self.exchange(exchange, stage, timeout)?;
        if self.world == 1 {
            return Ok(Communicator::solo_with(self.options));
        }
        self.connect(&endpoints)
    }

    /// Connects to every rank's endpoint (`endpoints[r]` is rank `r`'s), waiting at
    /// most [`CommOptions::timeout`] for all of them.
    pub(crate) fn connect(self, endpoints: &[String]) -> Result<Communicator, CollectiveError> {
        let tcp_host = tcp_host(self.link.endpoint());
        let mut bound = self.link;
        if self.exchanged || self.options.setup_limit.is_some() {
            // Robust mode's attempts, and meshes whose endpoints were exchanged after
            // binding: a refused connection means that rank is gone.
            bound.gone_if_refused();
        }
        let link = bound
            .connect(endpoints, self.options.setup_timeout())
            .map_err(|e| e.during(Call::Setup))?;
        let link: Box<dyn Link> = match tcp_host {
            Some(host) if self.options.data_path == DataPath::Tcp => {
                let mut stream = StreamLink::open(
                    link,
                    &host,
                    self.options.setup_timeout(),
                    self.options.socket.limits.max_frame_bytes,
                    self.options.spin,
                    self.options.heartbeat,
                    self.options.announced_host().as_deref(),
                )
                .map_err(|e| e.during(Call::Setup))?;
                stream.watch_interrupt(self.options.interrupt.clone());
                Box::new(stream)
            }
            _ => Box::new(link),
        };
        let mut comm = Communicator::over_link(link, self.options);
        // Until every rank is connected both ways, none may start (and possibly finish
        // and leave) its first call: a router counts only live peers.
        comm.barrier().map_err(|e| match e {
            CollectiveError::PeerTimeout {
                rank,
                waited,
                during,
                ..
            } => CollectiveError::PeerTimeout {
                call: Call::Setup,
                rank,
                waited,
                during,
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

pub(super) fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

impl Communicator {
    /// Forms this process's communicator as `bootstrap` says, with `options`: the one
    /// door for every way a job is formed.
    ///
    /// | bootstrap | how the communicator forms |
    /// |---|---|
    /// | [`Bootstrap::from_env`] under `switchyard launch` | a mesh on the address [`Bootstrap::bind_endpoint`] chooses, endpoints exchanged through the launcher's rendezvous |
    /// | [`Bootstrap::unique_id`] (or torchrun's, a scheduler's variables) | a mesh, endpoints exchanged through rank 0's root, as [`unique_id`](crate::bootstrap::unique_id) describes |
    /// | [`Bootstrap::tracker`] (or `DMLC_TRACKER_URI`) | joins the rabit/XGBoost tracker, which assigns the rank; a mesh, endpoints passed round the tracker's ring |
    /// | `Bootstrap::mpi` (or `mpirun`'s variables; feature `mpi`) | the MPI engine on `MPI_COMM_WORLD` |
    /// | [`Bootstrap::endpoints`] | a mesh on endpoints known in advance: this rank binds its own and connects to the others |
    /// | [`Bootstrap::from_exchange`] | a mesh, endpoints exchanged through the program's own [`EndpointExchange`] (for threads of one process: [`MemoryExchange`](crate::bootstrap::MemoryExchange)) |
    /// | [`Bootstrap::solo`], or any bootstrap of a world of one | no network at all |
    ///
    /// Every wait is bounded by [`CommOptions::timeout`], including the wait for the
    /// whole job to arrive.
    ///
    /// With [`CommOptions::robust`] set the communicator is in robust mode:
    /// collectives survive the death of a rank that the launcher restarts (see the
    /// guide's `docs/guide/robust-mode.md` for the program's shape). Robust mode joins
    /// a tracker of the classic protocol with a task id: the first mesh forms as
    /// above; after a failure every survivor forms a new one with the tracker's
    /// `recover` (same rank) while the restarted process joins with `start` and its
    /// task id, which the tracker maps back to its rank, so the task id must stay the
    /// same across restarts (`switchyard launch` sets `DMLC_TASK_ID`). Heartbeats
    /// ([`CommOptions::ROBUST_HEARTBEAT`]) are on unless set otherwise.
    ///
    /// A communicator formed through a tracker keeps its session:
    /// [`tracker_print`](Communicator::tracker_print) goes to the tracker's log, and
    /// `shutdown` is sent once, by [`finalize`](Communicator::finalize) or on drop
    /// (in robust mode by `finalize` only).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Setup`], naming the stage and keeping the cause, when the
    /// tracker, the rendezvous or a peer cannot be reached or the exchange breaks
    /// off; [`CollectiveError::InvalidArgument`] for a rank outside the world, and for
    /// robust mode without a classic tracker or a task id (refused before joining).
    ///
    /// # Examples
    ///
    /// Three ranks as threads of one process, on endpoints known in advance:
    ///
    /// ```
    /// use switchyard::collective::{CommOptions, Communicator, ReduceOp};
    /// use switchyard::bootstrap::Bootstrap;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let endpoints: Vec<String> = (0..3).map(|r| format!("local://doc-join-{r}")).collect();
    /// let ranks: Vec<_> = (0..3)
    ///     .map(|rank| {
    ///         let boot = Bootstrap::endpoints(rank, &endpoints);
    ///         std::thread::spawn(move || {
    ///             let mut comm = Communicator::join(&boot, CommOptions::default())?;
    ///             let mut x = [rank as u32 + 1];
    ///             comm.allreduce(&mut x, ReduceOp::Sum)?;
    ///             Ok::<_, switchyard::collective::CollectiveError>(x[0])
    ///         })
    ///     })
    ///     .collect();
    /// for r in ranks {
    ///     assert_eq!(r.join().expect("rank")?, 6);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// Two ranks as threads of one process, binding port 0 on loopback and swapping
    /// their endpoints through an in-memory board:
    ///
    /// ```
    /// use switchyard::bootstrap::{Bootstrap, MemoryExchange};
    /// use switchyard::collective::{CommOptions, Communicator, ReduceOp};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let board = MemoryExchange::new(2);
    /// let ranks: Vec<_> = (0..2)
    ///     .map(|rank| {
    ///         let boot = Bootstrap::from_exchange(rank, 2, board.clone());
    ///         std::thread::spawn(move || {
    ///             let mut comm = Communicator::join(&boot, CommOptions::default())?;
    ///             let mut x = [rank as u32 + 1];
    ///             comm.allreduce(&mut x, ReduceOp::Sum)?;
    ///             Ok::<_, switchyard::collective::CollectiveError>(x[0])
    ///         })
    ///     })
    ///     .collect();
    /// for r in ranks {
    ///     assert_eq!(r.join().expect("rank")?, 3);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A worker of a tracker, and a robust one:
    ///
    /// ```no_run
    /// use switchyard::collective::{CommOptions, Communicator, ReduceOp, RobustOptions, TrackerJoin};
    /// use switchyard::bootstrap::Bootstrap;
    /// # fn main() -> Result<(), switchyard::collective::CollectiveError> {
    /// let boot = Bootstrap::tracker(TrackerJoin::new("127.0.0.1", 9091).with_task_id("worker-0"));
    /// let mut comm = Communicator::join(&boot, CommOptions::default())?;
    /// let mut total = [1u32];
    /// comm.allreduce(&mut total, ReduceOp::Sum)?;
    /// comm.tracker_print(&format!("rank {} sees {} workers", comm.rank(), total[0]))?;
    /// comm.finalize()?;
    ///
    /// let robust = CommOptions::default().with_robust(RobustOptions::default());
    /// let comm = Communicator::join(&boot, robust)?;
    /// assert_eq!(comm.engine_name(), "robust");
    /// # Ok(())
    /// # }
    /// ```
    pub fn join(
        bootstrap: &Bootstrap,
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        if let Some(robust) = options.robust.clone() {
            return Communicator::join_robust(bootstrap, options, robust);
        }
        let (rank, world) = (bootstrap.rank as usize, bootstrap.world_size as usize);
        match &bootstrap.rendezvous {
            Rendezvous::Mpi => {
                #[cfg(feature = "mpi")]
                return Communicator::mpi(options);
                #[cfg(not(feature = "mpi"))]
                return Err(CollectiveError::setup(
                    "forming the communicator under mpirun",
                    "this build has no MPI engine: rebuild with `--features mpi`",
                ));
            }
            Rendezvous::Tracker {
                host,
                port,
                task_id,
                protocol,
            } => {
                let spec = tracker_join(host, *port, task_id, *protocol);
                Communicator::join_tracker(&spec, options)
            }
            Rendezvous::Solo => Ok(Communicator::solo_with(options)),
            Rendezvous::Endpoints(endpoints) => Communicator::mesh(rank, endpoints, options),
            Rendezvous::Launcher(addr) => {
                check_rank(rank, world)?;
                if world == 1 {
                    return Ok(Communicator::solo_with(options));
                }
                crate::bootstrap::split_host_port(addr)
                    .map_err(|e| CollectiveError::setup("choosing the mesh address", e))?;
                let mut launcher = LauncherExchange::new(addr.clone());
                // The error names the rendezvous's address.
                Communicator::exchanged_mesh(rank, world, &mut launcher, options, || {
                    "endpoint exchange through the launcher".into()
                })
            }
            Rendezvous::UniqueId(id) => {
                let root = id.root();
                // Worded without "unique id": under torchrun or a scheduler the id was
                // read from the environment, and the user never saw one.
                Communicator::exchanged_mesh(
                    rank,
                    world,
                    &mut UniqueIdExchange::new(*id),
                    options,
                    || format!("bootstrap at rank 0's root {root}"),
                )
            }
            Rendezvous::Exchange(shared) => {
                Communicator::exchanged_mesh(rank, world, &mut *shared.lock(), options, || {
                    "endpoint exchange".into()
                })
            }
            // The bootstrap crate is a version ahead of this one.
            other => Err(CollectiveError::setup(
                "forming the communicator",
                format!("this version of the collectives cannot form a mesh from {other:?}"),
            )),
        }
    }

    /// Rank `rank` of `world` in the job of `id`, with no tracker or launcher (NCCL's
    /// bootstrap): [`join`](Communicator::join) with [`Bootstrap::unique_id`]. Every
    /// rank calls this with the same id, rank 0 in the process that made the id with
    /// [`UniqueId::new`] (or binding the root of an id from [`UniqueId::at`]). The
    /// mesh binds on the address [`bind_address`](crate::bootstrap::bind_address)
    /// chooses towards the root, the endpoints are exchanged as
    /// [`unique_id`](crate::bootstrap::unique_id) describes, and the mesh opens;
    /// everything within [`CommOptions::timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::{CommOptions, Communicator, ReduceOp};
    /// use switchyard::bootstrap::UniqueId;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let id = UniqueId::new_on([127, 0, 0, 1].into())?;
    /// // Pass `id.to_string()` to the other processes; here they are threads.
    /// let ranks: Vec<_> = (0..2)
    ///     .map(|rank| {
    ///         std::thread::spawn(move || {
    ///             let mut comm = Communicator::from_unique_id(&id, rank, 2, CommOptions::default())?;
    ///             let mut x = [rank as u32 + 1];
    ///             comm.allreduce(&mut x, ReduceOp::Sum)?;
    ///             Ok::<_, switchyard::collective::CollectiveError>(x[0])
    ///         })
    ///     })
    ///     .collect();
    /// for r in ranks {
    ///     assert_eq!(r.join().expect("rank")?, 3);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_unique_id(
        id: &UniqueId,
        rank: usize,
        world: usize,
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        Communicator::join(&Bootstrap::unique_id(*id, rank, world), options)
    }

    /// The communicator for however this process was started:
    /// [`join`](Communicator::join) with [`Bootstrap::from_env`] and
    /// [`CommOptions::from_env`]. A process started by hand is a world of one, and
    /// says so once on stderr (a job started without its launcher otherwise "works"
    /// with every rank alone). Other options, robust mode among them, go through
    /// `join`: `Communicator::join(&boot, options)` with the bootstrap of
    /// [`Bootstrap::from_env`] (or [`Bootstrap::solo`] when it found none).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Setup`] ("reading the environment: ...") for a malformed or
    /// half-set environment, naming the variable; then as [`join`](Communicator::join).
    pub fn from_env() -> Result<Communicator, CollectiveError> {
        let options = CommOptions::from_env()
            .map_err(|e| CollectiveError::setup("reading the environment", e))?;
        match Bootstrap::from_env() {
            Ok(Some(boot)) => Communicator::join(&boot, options),
            Ok(None) => {
                announce_world_of_one();
                Ok(Communicator::solo_with(options))
            }
            Err(e) => Err(CollectiveError::setup("reading the environment", e)),
        }
    }

    /// A world of one rank: every collective returns at once, nothing touches the
    /// network ([`join`](Communicator::join) with [`Bootstrap::solo`]).
    pub fn solo() -> Communicator {
        Communicator::solo_with(CommOptions::default())
    }

    fn solo_with(options: CommOptions) -> Communicator {
        Communicator::with_engine(Box::new(Solo), options, this_host())
    }

    /// A mesh communicator over any [`Link`].
    pub(crate) fn over_link(link: Box<dyn Link>, options: CommOptions) -> Communicator {
        let engine: Box<dyn Engine> = Box::new(MeshEngine::new(link, options.tuning()));
        Communicator::with_engine(engine, options, this_host())
    }

    /// Binds rank `rank` of `size` at `endpoint` (`tcp://127.0.0.1:0` picks a port),
    /// for peers to be connected later.
    pub(crate) fn bind_mesh(
        rank: usize,
        size: usize,
        endpoint: &str,
        options: CommOptions,
    ) -> Result<MeshBuilder, CollectiveError> {
        let (rank32, world32) = check_rank(rank, size)?;
        let link = BoundLink::bind(rank, size, endpoint, options.socket.clone())
            .map_err(|e| e.during(Call::Setup))?;
        Ok(MeshBuilder {
            link,
            rank: rank32,
            world: world32,
            options,
            exchanged: false,
        })
    }

    /// Rank `rank` of a mesh whose endpoints are all known in advance: binds
    /// `endpoints[rank]` and connects to the others. A world of one is solo.
    fn mesh(
        rank: usize,
        endpoints: &[String],
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        if endpoints.len() == 1 && rank == 0 {
            return Ok(Communicator::solo_with(options));
        }
        let endpoint = endpoints
            .get(rank)
            .ok_or_else(|| CollectiveError::InvalidArgument {
                call: Call::Setup,
                reason: format!("rank {rank} has no endpoint among {}", endpoints.len()),
            })?;
        Communicator::bind_mesh(rank, endpoints.len(), endpoint, options)?.connect(endpoints)
    }

    /// The one path of every mesh whose endpoints are exchanged (the launcher's, the
    /// unique id's, the program's own): binds on the address that routes to the
    /// exchange's root (loopback without one, `SWITCHYARD_IFNAME` when set), swaps
    /// the bound endpoint for every rank's within [`CommOptions::timeout`], and
    /// connects. Every endpoint was bound before the exchange handed it out, so a
    /// refused connection means that rank left.
    fn exchanged_mesh(
        rank: usize,
        world: usize,
        exchange: &mut dyn EndpointExchange,
        options: CommOptions,
        stage: impl FnOnce() -> String,
    ) -> Result<Communicator, CollectiveError> {
        check_rank(rank, world)?;
        let endpoint = match exchange.root_hint() {
            Some((host, port)) => crate::bootstrap::bind_address(&host, port)
                .map(crate::bootstrap::tcp_any_port)
                .map_err(|e| CollectiveError::setup("choosing the mesh address", e))?,
            None => "tcp://127.0.0.1:0".into(),
        };
        let timeout = options.timeout;
        let mut builder = Communicator::bind_mesh(rank, world, &endpoint, options)?;
        builder.exchanged = true;
        builder.connect_through(exchange, stage, timeout)
    }

    /// The MPI engine on `MPI_COMM_WORLD` (the process must run under `mpirun`).
    #[cfg(feature = "mpi")]
    fn mpi(options: CommOptions) -> Result<Communicator, CollectiveError> {
        let engine = super::mpi_engine::MpiEngine::new(
            options.timeout,
            options.mpi_arg_checks || options.check,
        )?;
        let processor_name = engine.processor_name().to_string();
        Ok(Communicator::with_engine(
            Box::new(engine),
            options,
            processor_name,
        ))
    }
}

/// The tracker a [`Rendezvous::Tracker`] bootstrap names, as a [`TrackerJoin`].
pub(super) fn tracker_spec(bootstrap: &Bootstrap) -> Option<TrackerJoin> {
    let Rendezvous::Tracker {
        host,
        port,
        task_id,
        protocol,
    } = &bootstrap.rendezvous
    else {
        return None;
    };
    Some(tracker_join(host, *port, task_id, *protocol))
}

/// The [`TrackerJoin`] of the tracker at `host:port` speaking `protocol`, joined as
/// `task_id`.
fn tracker_join(
    host: &str,
    port: u16,
    task_id: &Option<String>,
    protocol: TrackerProtocol,
) -> TrackerJoin {
    let mut spec = TrackerJoin::new(host, port).with_protocol(protocol);
    spec.task_id.clone_from(task_id);
    spec
}

/// `rank` and `world` as `u32`s, or the error of a rank outside the world.
fn check_rank(rank: usize, world: usize) -> Result<(u32, u32), CollectiveError> {
    match (u32::try_from(rank), u32::try_from(world)) {
        (Ok(r), Ok(w)) if w > 0 && r < w => Ok((r, w)),
        _ => Err(CollectiveError::InvalidArgument {
            call: Call::Setup,
            reason: format!("rank {rank} is outside a world of {world}"),
        }),
    }
}

/// One line on stderr, once per process, when no launcher environment was found.
fn announce_world_of_one() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "switchyard: no launcher environment (switchyard launch, mpirun) found; \
             running as a world of one rank"
        );
    });
}
