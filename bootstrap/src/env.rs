use super::exchange::{EndpointExchange, LauncherExchange, SharedExchange, UniqueIdExchange};
use super::{BootstrapError, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE};
use super::{ENV_TRACKER_PROTOCOL, TrackerJoin, TrackerProtocol};
use std::time::Duration;
use switchyard_net::env::{self, EnvError, Lookup};

/// What a process learns from whoever started it: its rank, the job size, and how to
/// learn every rank's endpoint.
///
/// Three starters are recognised, in this order of precedence:
///
/// 1. `switchyard launch` (the `SWITCHYARD_*` variables, endpoints swapped at its
///    rendezvous);
/// 2. a rabit/XGBoost tracker (`DMLC_TRACKER_URI` and `DMLC_TRACKER_PORT`, optional
///    `DMLC_TASK_ID`, as set by `switchyard launch`, XGBoost's `worker_envs()` or
///    dmlc-core's launchers): [`Rendezvous::Tracker`]; the tracker assigns the rank
///    when the process joins it (see [`Rendezvous::Tracker`]);
/// 3. torchrun's `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`: rank 0 roots a
///    [`UniqueId`](super::UniqueId) bootstrap on `MASTER_PORT`
///    ([`Rendezvous::UniqueId`]);
/// 4. in builds with the `mpi` feature, `mpirun` (OpenMPI's `OMPI_COMM_WORLD_*`, or
///    `PMI_RANK`/`PMIX_RANK` of MPICH and Slurm), where rank and size come from MPI
///    itself and every endpoint is `mpi://RANK`;
/// 5. without it, `mpirun` and `srun`'s variables (`OMPI_COMM_WORLD_RANK`/`SIZE`,
///    `PMI_RANK`/`PMI_SIZE`, `SLURM_PROCID`/`SLURM_NTASKS`), again a
///    [`Rendezvous::UniqueId`] with the mesh on ZeroMQ/TCP; where the root is is
///    described in [`conventions`](super::conventions).
///
/// A debug trace names the convention picked; a half-set one is an error naming the
/// missing variable.
///
/// A program that forms its job itself builds one instead: [`Bootstrap::unique_id`],
/// [`Bootstrap::tracker`], `Bootstrap::mpi` (feature `mpi`), [`Bootstrap::endpoints`],
/// [`Bootstrap::from_exchange`] or [`Bootstrap::solo`]. Either way the facade's
/// `Communicator::join` forms the communicator from it.
///
/// # Examples
///
/// ```
/// use switchyard_bootstrap::Bootstrap;
/// # fn main() -> Result<(), switchyard_bootstrap::BootstrapError> {
/// // Outside `switchyard launch`, a tracker and `mpirun` there is nothing to
/// // bootstrap from.
/// let launched = [
///     "SWITCHYARD_RANK",
///     "RANK",
///     "WORLD_SIZE",
///     "MASTER_ADDR",
///     "MASTER_PORT",
///     "SLURM_PROCID",
///     "SLURM_NTASKS",
///     "PMI_SIZE",
///     "OMPI_COMM_WORLD_SIZE",
///     "DMLC_TRACKER_URI",
///     "DMLC_TRACKER_PORT",
///     "OMPI_COMM_WORLD_RANK",
///     "PMI_RANK",
///     "PMIX_RANK",
/// ]
/// .iter()
/// .any(|v| std::env::var_os(v).is_some());
/// if !launched {
///     assert!(Bootstrap::from_env()?.is_none());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// This process's rank.
    pub rank: u32,
    /// Number of processes.
    pub world_size: u32,
    /// How endpoints are exchanged.
    pub rendezvous: Rendezvous,
}

/// How a [`Bootstrap`]ped process learns the other ranks' endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rendezvous {
    /// `switchyard launch`'s rendezvous at `host:port`.
    Launcher(String),
    /// A tracker-less bootstrap rooted at rank 0 ([`UniqueId`](super::UniqueId)), as
    /// read from the `MASTER_ADDR`/`RANK` convention or a scheduler's variables
    /// (see [`conventions`](super::conventions)).
    UniqueId(super::UniqueId),
    /// `mpirun` wired the processes: rank `r`'s endpoint is `mpi://r`.
    Mpi,
    /// A rabit/XGBoost tracker at `host:port` assigns ranks and links the workers
    /// ([`Bootstrap::tracker`]).
    ///
    /// The rank is only known after joining: until then [`Bootstrap::rank`] is 0 and
    /// [`Bootstrap::world_size`] is `DMLC_NUM_WORKER` (0 when unset).
    Tracker {
        /// The tracker's host name or address (`DMLC_TRACKER_URI`).
        host: String,
        /// The tracker's port (`DMLC_TRACKER_PORT`).
        port: u16,
        /// This worker's identity across restarts (`DMLC_TASK_ID`), if any.
        task_id: Option<String>,
        /// Which protocol the tracker speaks: classic unless
        /// `SWITCHYARD_TRACKER_PROTOCOL=json`
        /// ([`ENV_TRACKER_PROTOCOL`](super::ENV_TRACKER_PROTOCOL)).
        protocol: TrackerProtocol,
    },
    /// Every rank's endpoint is known in advance (`endpoints[r]` is rank `r`'s):
    /// nothing is exchanged ([`Bootstrap::endpoints`]).
    Endpoints(Vec<String>),
    /// A world of one: no other rank, nothing to exchange ([`Bootstrap::solo`]).
    Solo,
    /// The program's own [`EndpointExchange`](super::EndpointExchange)
    /// ([`Bootstrap::from_exchange`]).
    Exchange(SharedExchange),
}

/// Environment variable naming the tracker's host (rabit, XGBoost ≤ 2.0, dmlc-core).
const ENV_DMLC_TRACKER_URI: &str = "DMLC_TRACKER_URI";
/// Environment variable naming the tracker's port.
const ENV_DMLC_TRACKER_PORT: &str = "DMLC_TRACKER_PORT";
/// Environment variable holding this worker's task id.
const ENV_DMLC_TASK_ID: &str = "DMLC_TASK_ID";
/// Environment variable holding the process's role (`worker`, `server`, ...).
const ENV_DMLC_ROLE: &str = "DMLC_ROLE";
/// Environment variable holding the number of workers (informational: the tracker
/// decides).
const ENV_DMLC_NUM_WORKER: &str = "DMLC_NUM_WORKER";

/// Variables by which MPI launchers mark their processes.
const MPI_RANK_VARS: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"];

/// `name` as a count that must be set: `because` says why it is needed.
fn needed_u32(lookup: &(impl Lookup + ?Sized), name: &str, because: &str) -> Result<u32, EnvError> {
    env::u32(lookup, name)?
        .ok_or_else(|| EnvError::missing(name, format!("{}, {because}", env::INTEGER)))
}

impl Bootstrap {
    /// Rank `rank` of `world` in the job of `id`, with no tracker or launcher (NCCL's
    /// bootstrap): every rank uses the same id, rank 0 in the process that made it
    /// with [`UniqueId::new`](super::UniqueId::new) (or binding the root of an id from
    /// [`UniqueId::at`](super::UniqueId::at)).
    pub fn unique_id(id: super::UniqueId, rank: usize, world: usize) -> Bootstrap {
        Bootstrap {
            rank: saturate(rank),
            world_size: saturate(world),
            rendezvous: Rendezvous::UniqueId(id),
        }
    }

    /// A worker of the rabit/XGBoost tracker `spec`, which assigns the rank when the
    /// worker joins it: until then [`Bootstrap::rank`] and [`Bootstrap::world_size`]
    /// are 0.
    pub fn tracker(spec: TrackerJoin) -> Bootstrap {
        Bootstrap {
            rank: 0,
            world_size: 0,
            rendezvous: Rendezvous::Tracker {
                host: spec.host,
                port: spec.port,
                task_id: spec.task_id,
                protocol: spec.protocol,
            },
        }
    }

    /// A process of an MPI job (started by `mpirun`), whose rank and size MPI gives.
    ///
    /// # Errors
    ///
    /// MPI did not start.
    #[cfg(feature = "mpi")]
    pub fn mpi() -> Result<Bootstrap, BootstrapError> {
        let world =
            switchyard_transports::mpi::world().map_err(|e| BootstrapError::Rendezvous {
                addr: "mpirun".into(),
                reason: format!("started by an MPI launcher, but MPI did not start: {e}"),
            })?;
        Ok(Bootstrap {
            rank: world.rank,
            world_size: world.size,
            rendezvous: Rendezvous::Mpi,
        })
    }

    /// Rank `rank` of a job whose endpoints are all known in advance (`endpoints[r]`
    /// is rank `r`'s, e.g. `tcp://10.0.0.2:7000` or `local://name`): the rank binds
    /// its own and connects to the others.
    pub fn endpoints(rank: usize, endpoints: &[String]) -> Bootstrap {
        Bootstrap {
            rank: saturate(rank),
            world_size: saturate(endpoints.len()),
            rendezvous: Rendezvous::Endpoints(endpoints.to_vec()),
        }
    }

    /// Rank `rank` of `world`, whose endpoints go through the program's own
    /// `exchange` (a [`MemoryExchange`](super::MemoryExchange) for ranks that are
    /// threads of one process). The mesh binds on the address that routes to the
    /// exchange's [`root_hint`](EndpointExchange::root_hint), loopback without one.
    ///
    /// The bootstrap's clones share the exchange (and compare equal): give every rank
    /// a bootstrap of its own.
    pub fn from_exchange(
        rank: usize,
        world: usize,
        exchange: impl EndpointExchange + 'static,
    ) -> Bootstrap {
        Bootstrap {
            rank: saturate(rank),
            world_size: saturate(world),
            rendezvous: Rendezvous::Exchange(SharedExchange::new(exchange)),
        }
    }

    /// A world of one rank.
    pub fn solo() -> Bootstrap {
        Bootstrap {
            rank: 0,
            world_size: 1,
            rendezvous: Rendezvous::Solo,
        }
    }

    /// Reads the starter's environment. `Ok(None)` when neither `switchyard launch`
    /// nor an MPI launcher started the process; an error names any variable that is
    /// missing or malformed, or says that an `mpirun`-started program was built without
    /// the `mpi` feature.
    pub fn from_env() -> Result<Option<Bootstrap>, BootstrapError> {
        Bootstrap::from_lookup(&env::ProcessEnv)
    }

    /// As [`Bootstrap::from_env`], with variables from `lookup` (a map or a closure in
    /// a test). An empty variable counts as unset.
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Env`] naming the variable, its value and what was expected.
    pub fn from_lookup(
        lookup: &(impl Lookup + ?Sized),
    ) -> Result<Option<Bootstrap>, BootstrapError> {
        if env::text(lookup, ENV_RANK).is_none() {
            if let Some(tracker) = Bootstrap::from_tracker_lookup(lookup)? {
                tracing::debug!("bootstrap: a rabit/XGBoost tracker (DMLC_TRACKER_URI)");
                return Ok(Some(tracker));
            }
            if let Some(found) = super::conventions::torchrun(lookup)? {
                return Ok(Some(Bootstrap::rooted(found)));
            }
            // With the MPI engine built in, mpirun's processes use it.
            #[cfg(feature = "mpi")]
            if MPI_RANK_VARS.iter().any(|v| lookup.get(v).is_some()) {
                return Bootstrap::from_mpi_lookup(lookup);
            }
            if let Some(found) = super::conventions::scheduler(lookup)? {
                return Ok(Some(Bootstrap::rooted(found)));
            }
            return Bootstrap::from_mpi_lookup(lookup);
        }
        tracing::debug!("bootstrap: switchyard launch (SWITCHYARD_RANK)");
        let because = format!("{ENV_RANK} is set (switchyard launch sets both)");
        let rank = needed_u32(lookup, ENV_RANK, &because)?;
        let world_size = needed_u32(lookup, ENV_WORLD_SIZE, &because)?;
        if world_size == 0 || rank >= world_size {
            return Err(EnvError::malformed(
                ENV_RANK,
                rank.to_string(),
                format!("a rank below {ENV_WORLD_SIZE}={world_size}"),
            )
            .into());
        }
        let rendezvous = Rendezvous::Launcher(env::required(
            lookup,
            ENV_RENDEZVOUS,
            &format!("the launcher's rendezvous host:port, since {because}"),
        )?);
        Ok(Some(Bootstrap {
            rank,
            world_size,
            rendezvous,
        }))
    }

    fn rooted(found: super::conventions::Found) -> Bootstrap {
        tracing::debug!(
            convention = found.convention,
            rank = found.rank,
            world = found.world,
            root = %found.id.root(),
            "bootstrap: a unique-id root from the environment"
        );
        Bootstrap {
            rank: found.rank,
            world_size: found.world,
            rendezvous: Rendezvous::UniqueId(found.id),
        }
    }

    /// The DMLC tracker variables: none set is `None`; a task id, a URI or a port
    /// without the URI and the port is an error naming the missing one. A URI of
    /// `NULL` (or empty) means no tracker, as for XGBoost's workers. `DMLC_ROLE`, when
    /// set, must be `worker`: servers and schedulers do not join the tracker. Robust
    /// mode reads them beside `switchyard launch`'s own variables, which name its
    /// tracker too.
    ///
    /// # Errors
    ///
    /// [`BootstrapError::Env`] naming the variable that is missing or malformed.
    pub fn from_tracker_lookup(
        lookup: &(impl Lookup + ?Sized),
    ) -> Result<Option<Bootstrap>, BootstrapError> {
        let set = |v: &str| env::text(lookup, v).is_some();
        // Set but empty is "no tracker" too: the blank-is-unset rule, then this.
        if lookup
            .get(ENV_DMLC_TRACKER_URI)
            .is_some_and(|u| u.trim() == "NULL")
            || lookup.get(ENV_DMLC_TRACKER_URI).is_some() && !set(ENV_DMLC_TRACKER_URI)
        {
            return Ok(None);
        }
        let present = [
            ENV_DMLC_TRACKER_URI,
            ENV_DMLC_TRACKER_PORT,
            ENV_DMLC_TASK_ID,
        ]
        .into_iter()
        .find(|v| set(v));
        let Some(present) = present else {
            return Ok(None);
        };
        let because = format!(
            "{present} is set: joining a tracker needs {ENV_DMLC_TRACKER_URI} and \
             {ENV_DMLC_TRACKER_PORT}"
        );
        if let Some(absent) = [ENV_DMLC_TRACKER_URI, ENV_DMLC_TRACKER_PORT]
            .into_iter()
            .find(|v| !set(v))
        {
            return Err(EnvError::missing(absent, format!("it set, since {because}")).into());
        }
        if let Some(role) = env::text(lookup, ENV_DMLC_ROLE) {
            if role != "worker" {
                return Err(EnvError::malformed(
                    ENV_DMLC_ROLE,
                    role,
                    "worker beside tracker variables: only workers join the tracker",
                )
                .into());
            }
        }
        let host = env::required(lookup, ENV_DMLC_TRACKER_URI, &because)?;
        let port = env::port(lookup, ENV_DMLC_TRACKER_PORT)?
            .ok_or_else(|| EnvError::missing(ENV_DMLC_TRACKER_PORT, because.clone()))?;
        let task_id = env::text(lookup, ENV_DMLC_TASK_ID);
        let world_size = env::u32(lookup, ENV_DMLC_NUM_WORKER)?.unwrap_or(0);
        // The protocol's own parser, which also takes `rabit` and any case.
        let protocol = env::parse::<TrackerProtocol>(
            lookup,
            ENV_TRACKER_PROTOCOL,
            "classic or json (the tracker protocol)",
        )?
        .unwrap_or(TrackerProtocol::Classic);
        Ok(Some(Bootstrap {
            rank: 0,
            world_size,
            rendezvous: Rendezvous::Tracker {
                host,
                port,
                task_id,
                protocol,
            },
        }))
    }

    fn from_mpi_lookup(
        lookup: &(impl Lookup + ?Sized),
    ) -> Result<Option<Bootstrap>, BootstrapError> {
        let Some(marker) = MPI_RANK_VARS.into_iter().find(|v| lookup.get(v).is_some()) else {
            return Ok(None);
        };
        #[cfg(feature = "mpi")]
        {
            let _ = marker;
            Bootstrap::mpi().map(Some)
        }
        #[cfg(not(feature = "mpi"))]
        Err(EnvError::malformed(
            marker,
            lookup.get(marker).unwrap_or_default(),
            "no MPI launcher's rank without a size variable (OMPI_COMM_WORLD_SIZE, \
             PMI_SIZE, SLURM_NTASKS) in a build without the MPI backend: rebuild with \
             `--features mpi`, or start it with `switchyard launch`",
        )
        .into())
    }

    /// Where this process's stub should bind: `mpi://RANK` under `mpirun`; otherwise
    /// any free port on the address [`bind_address`](super::bind_address) chooses for
    /// the rendezvous or tracker host (`SWITCHYARD_IFNAME`, else the route to that
    /// host: `tcp://127.0.0.1:0` when it is on loopback). When no address can be
    /// chosen this falls back to `tcp://0.0.0.0:0`; [`bind_endpoint`](Bootstrap::bind_endpoint)
    /// returns the error instead.
    pub fn stub_endpoint(&self) -> String {
        self.bind_endpoint()
            .unwrap_or_else(|_| "tcp://0.0.0.0:0".into())
    }

    /// [`stub_endpoint`](Bootstrap::stub_endpoint), or the error naming why no address
    /// could be chosen (a `SWITCHYARD_IFNAME` that matches nothing, a root host that
    /// does not resolve or has no route).
    pub fn bind_endpoint(&self) -> Result<String, BootstrapError> {
        let (host, port) = match &self.rendezvous {
            Rendezvous::Mpi => return Ok(format!("mpi://{}", self.rank)),
            Rendezvous::Launcher(addr) => split_host_port(addr)?,
            Rendezvous::Tracker { host, port, .. } => (host.clone(), *port),
            Rendezvous::UniqueId(id) => (id.root().ip().to_string(), id.root().port()),
            Rendezvous::Endpoints(endpoints) => {
                return endpoints.get(self.rank as usize).cloned().ok_or_else(|| {
                    BootstrapError::Rendezvous {
                        addr: "the endpoint list".into(),
                        reason: format!(
                            "rank {} has no endpoint among {}",
                            self.rank,
                            endpoints.len()
                        ),
                    }
                });
            }
            Rendezvous::Solo => return Ok("tcp://127.0.0.1:0".into()),
            Rendezvous::Exchange(shared) => match shared.lock().root_hint() {
                Some(hint) => hint,
                None => return Ok("tcp://127.0.0.1:0".into()),
            },
        };
        Ok(tcp_any_port(super::bind_address(&host, port)?))
    }

    /// Sends this process's endpoint to the rendezvous and returns every rank's, in
    /// rank order, waiting at most `timeout` for the others.
    ///
    /// Under `switchyard launch` each call of a process is its next generation
    /// (see [`rendezvous`](super::rendezvous)): the n-th call of every rank is
    /// gathered with the n-th calls of the others, so that a process may form one
    /// communicator after another.
    ///
    /// Under `mpirun` nothing travels: the endpoints are `mpi://0` .. `mpi://N-1`, and
    /// `endpoint` must be this rank's.
    pub fn exchange(
        &self,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        match &self.rendezvous {
            Rendezvous::Launcher(addr) => LauncherExchange::new(addr.clone()).exchange(
                self.rank,
                self.world_size,
                endpoint,
                timeout,
            ),
            Rendezvous::Mpi => {
                if endpoint != self.stub_endpoint() {
                    return Err(BootstrapError::Rendezvous {
                        addr: "mpirun".into(),
                        reason: format!(
                            "under mpirun rank {} is reached at {}, not {endpoint}; bind \
                             Bootstrap::stub_endpoint()",
                            self.rank,
                            self.stub_endpoint()
                        ),
                    });
                }
                Ok((0..self.world_size).map(|r| format!("mpi://{r}")).collect())
            }
            Rendezvous::UniqueId(id) => {
                UniqueIdExchange::new(*id).exchange(self.rank, self.world_size, endpoint, timeout)
            }
            Rendezvous::Exchange(shared) => {
                shared
                    .lock()
                    .exchange(self.rank, self.world_size, endpoint, timeout)
            }
            Rendezvous::Tracker { host, port, .. } => Err(BootstrapError::Rendezvous {
                addr: format!("{host}:{port}"),
                reason: "a tracker assigns ranks and links workers itself: join it with \
                         Communicator::join (or Communicator::from_env)"
                    .into(),
            }),
            // Known in advance: this rank's own may be the one bound (a port picked).
            Rendezvous::Endpoints(endpoints) => {
                let mut all = endpoints.clone();
                if let Some(mine) = all.get_mut(self.rank as usize) {
                    *mine = endpoint.to_string();
                }
                Ok(all)
            }
            Rendezvous::Solo => Ok(vec![endpoint.to_string()]),
        }
    }
}

/// `n` as a rank or world size; one past `u32` cannot be a rank of any world, and
/// `Communicator::join` refuses it as one outside the world.
fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `tcp://IP:0`, with IPv6 addresses in brackets: the endpoint a mesh binds on `ip`.
pub fn tcp_any_port(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(ip) => format!("tcp://[{ip}]:0"),
        ip => format!("tcp://{ip}:0"),
    }
}

/// `host:port` (or `[v6]:port`) split; an error names the address.
///
/// # Errors
///
/// [`BootstrapError::Rendezvous`] naming `addr`: no port, a port that is not a
/// number, or no host.
pub fn split_host_port(addr: &str) -> Result<(String, u16), BootstrapError> {
    let bad = |reason: &str| BootstrapError::Rendezvous {
        addr: addr.to_string(),
        reason: reason.to_string(),
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| bad("not a host:port address"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| bad("the port is not a number (0..65535)"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("no host before the port"));
    }
    Ok((host.to_string(), port))
}
