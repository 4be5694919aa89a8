//! Forming a [`Communicator`]: a world of one, a mesh over any [`Link`] or over the
//! transports, the launcher's rendezvous, or MPI.

use super::engine::{Engine, Solo};
use super::error::{Call, CollectiveError};
use super::mesh::MeshEngine;
use super::options::{CommOptions, DataPath};
// Through the re-exports, which stay whatever files the links live in.
use super::{BoundLink, Communicator, Link, StreamLink, TrackerJoin};
use crate::bootstrap::{Bootstrap, Rendezvous, UniqueId};

/// A mesh communicator whose endpoint is bound but whose peers are not connected:
/// hand [`MeshBuilder::endpoint`] to the other ranks, then [`MeshBuilder::connect`].
#[derive(Debug)]
pub struct MeshBuilder {
    link: BoundLink,
    options: CommOptions,
    /// Every endpoint was bound before the rendezvous handed it out, so one that
    /// refuses a connection belongs to a rank that left.
    exchanged: bool,
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
                let mut stream = StreamLink::connect_with_heartbeat(
                    link,
                    &host,
                    self.options.setup_timeout(),
                    self.options.socket.limits.max_frame_bytes,
                    self.options.spin,
                    self.options.heartbeat,
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
    /// A world of one rank: every collective returns at once, nothing touches the
    /// network.
    pub fn solo() -> Communicator {
        Communicator::solo_with(CommOptions::default())
    }

    fn solo_with(options: CommOptions) -> Communicator {
        Communicator::with_engine(Box::new(Solo), options, this_host())
    }

    /// A mesh communicator over any [`Link`].
    pub fn over_link(link: Box<dyn Link>, options: CommOptions) -> Communicator {
        let engine: Box<dyn Engine> = Box::new(MeshEngine::new(link, options.tuning()));
        Communicator::with_engine(engine, options, this_host())
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
        Ok(MeshBuilder {
            link,
            options,
            exchanged: false,
        })
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

    /// The communicator of a process started by `switchyard launch` (a mesh on the
    /// address [`Bootstrap::bind_endpoint`] chooses, endpoints exchanged through the
    /// launcher's rendezvous), under a
    /// rabit/XGBoost tracker ([`from_tracker`](Communicator::from_tracker)) or by
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
                    return Ok(Communicator::solo_with(options));
                }
                // On the address that reaches the launcher's host (loopback when it
                // is this machine), or the SWITCHYARD_IFNAME interface's.
                let endpoint = boot
                    .bind_endpoint()
                    .map_err(|e| setup(format!("choosing the mesh address: {e}")))?;
                let mut builder = Communicator::bind_mesh(rank, size, &endpoint, options)?;
                builder.exchanged = true;
                let endpoints = boot
                    .exchange(builder.endpoint(), builder.options.timeout)
                    .map_err(|e| setup(format!("endpoint exchange: {e}")))?;
                builder.connect(&endpoints)
            }
            Rendezvous::UniqueId(id) => {
                // Read from MASTER_ADDR or a scheduler: the user never saw a unique id.
                let what = format!("bootstrap at rank 0's root {}", id.root());
                let (rank, world) = (boot.rank as usize, boot.world_size as usize);
                Communicator::init_as(id, rank, world, options, &what)
            }
            Rendezvous::Tracker {
                host,
                port,
                task_id,
                protocol,
            } => {
                let mut spec = TrackerJoin::new(host.clone(), *port).with_protocol(*protocol);
                spec.task_id = task_id.clone();
                Communicator::from_tracker(&spec, options)
            }
        }
    }

    /// Rank `rank` of `world` in the job of `id`, with no tracker or launcher (NCCL's
    /// bootstrap): every rank calls this with the same id, rank 0 in the process that
    /// made the id with [`UniqueId::new`] (or binding the root of an id from
    /// [`UniqueId::at`]). The mesh binds on the address
    /// [`bind_address`](crate::bootstrap::bind_address) chooses towards the root, the
    /// endpoints are exchanged as [`unique_id`](crate::bootstrap::unique_id) describes,
    /// and the mesh opens; everything within [`CommOptions::timeout`].
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
    ///             let mut comm = Communicator::init(&id, rank, 2, CommOptions::default())?;
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
    pub fn init(
        id: &UniqueId,
        rank: usize,
        world: usize,
        options: CommOptions,
    ) -> Result<Communicator, CollectiveError> {
        Communicator::init_as(
            id,
            rank,
            world,
            options,
            &format!("unique-id bootstrap of {id}"),
        )
    }

    /// [`init`](Communicator::init), its errors introduced by `what`.
    fn init_as(
        id: &UniqueId,
        rank: usize,
        world: usize,
        options: CommOptions,
        what: &str,
    ) -> Result<Communicator, CollectiveError> {
        let setup = |reason: String| CollectiveError::InvalidArgument {
            call: Call::Setup,
            reason,
        };
        let (rank32, world32) = match (u32::try_from(rank), u32::try_from(world)) {
            (Ok(r), Ok(w)) if w > 0 && r < w => (r, w),
            _ => return Err(setup(format!("rank {rank} is outside a world of {world}"))),
        };
        let root = id.root();
        let ip = crate::bootstrap::bind_address(&root.ip().to_string(), root.port())
            .map_err(|e| setup(format!("choosing the mesh address: {e}")))?;
        let timeout = options.timeout;
        let mut builder =
            Communicator::bind_mesh(rank, world, &crate::bootstrap::tcp_any_port(ip), options)?;
        builder.exchanged = true;
        let endpoints = crate::bootstrap::unique_id::exchange(
            id,
            rank32,
            world32,
            ip,
            builder.endpoint(),
            timeout,
        )
        .map_err(|e| setup(format!("{what}: {e}")))?;
        if world == 1 {
            return Ok(Communicator::solo_with(builder.options));
        }
        builder.connect(&endpoints)
    }

    /// The communicator for however this process was started: see
    /// [`from_bootstrap`](Communicator::from_bootstrap); a process started by hand is
    /// a world of one, and says so once on stderr (a job started without its launcher
    /// otherwise "works" with every rank alone). Options come from
    /// [`CommOptions::from_env`].
    pub fn from_env() -> Result<Communicator, CollectiveError> {
        Communicator::from_env_with(CommOptions::from_env())
    }

    /// [`from_env`](Communicator::from_env) with the given options.
    pub fn from_env_with(options: CommOptions) -> Result<Communicator, CollectiveError> {
        match Bootstrap::from_env() {
            Ok(Some(boot)) => Communicator::from_bootstrap(&boot, options),
            Ok(None) => {
                announce_world_of_one();
                Ok(Communicator::solo_with(options))
            }
            Err(e) => Err(CollectiveError::InvalidArgument {
                call: Call::Setup,
                reason: e.to_string(),
            }),
        }
    }

    /// The MPI engine on `MPI_COMM_WORLD` (the process must run under `mpirun`).
    #[cfg(feature = "mpi")]
    pub fn mpi(options: CommOptions) -> Result<Communicator, CollectiveError> {
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
