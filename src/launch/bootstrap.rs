use super::{rendezvous, LaunchError, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE};
use std::time::Duration;

/// What a process learns from whoever started it: its rank, the job size, and how to
/// learn every rank's endpoint.
///
/// Two starters are recognised: `switchyard launch` (the `SWITCHYARD_*` variables,
/// endpoints swapped at its rendezvous) and, in builds with the `mpi` feature,
/// `mpirun` (OpenMPI's `OMPI_COMM_WORLD_*`, or `PMI_RANK`/`PMIX_RANK` of MPICH and
/// Slurm), where rank and size come from MPI itself and every endpoint is `mpi://RANK`.
///
/// # Examples
///
/// ```
/// use switchyard::launch::Bootstrap;
/// # fn main() -> Result<(), switchyard::launch::LaunchError> {
/// // Outside `switchyard launch` and `mpirun` there is nothing to bootstrap from.
/// let launched = ["SWITCHYARD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
///     .iter()
///     .any(|v| std::env::var_os(v).is_some());
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
    /// `mpirun` wired the processes: rank `r`'s endpoint is `mpi://r`.
    Mpi,
}

/// Variables by which MPI launchers mark their processes.
const MPI_RANK_VARS: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"];

fn var(name: &'static str) -> Result<String, LaunchError> {
    std::env::var(name).map_err(|e| LaunchError::Env {
        var: name,
        value: String::new(),
        reason: e.to_string(),
    })
}

fn number(name: &'static str) -> Result<u32, LaunchError> {
    let value = var(name)?;
    value.trim().parse::<u32>().map_err(|_| LaunchError::Env {
        var: name,
        value: value.clone(),
        reason: "not a non-negative integer".into(),
    })
}

impl Bootstrap {
    /// Reads the starter's environment. `Ok(None)` when neither `switchyard launch`
    /// nor an MPI launcher started the process; an error names any variable that is
    /// missing or malformed, or says that an `mpirun`-started program was built without
    /// the `mpi` feature.
    pub fn from_env() -> Result<Option<Bootstrap>, LaunchError> {
        if std::env::var_os(ENV_RANK).is_none() {
            return Bootstrap::from_mpi_env();
        }
        let rank = number(ENV_RANK)?;
        let world_size = number(ENV_WORLD_SIZE)?;
        if world_size == 0 || rank >= world_size {
            return Err(LaunchError::Env {
                var: ENV_RANK,
                value: rank.to_string(),
                reason: format!("must be below {ENV_WORLD_SIZE}={world_size}"),
            });
        }
        let rendezvous = Rendezvous::Launcher(var(ENV_RENDEZVOUS)?);
        Ok(Some(Bootstrap {
            rank,
            world_size,
            rendezvous,
        }))
    }

    fn from_mpi_env() -> Result<Option<Bootstrap>, LaunchError> {
        let Some(marker) = MPI_RANK_VARS
            .into_iter()
            .find(|v| std::env::var_os(v).is_some())
        else {
            return Ok(None);
        };
        #[cfg(feature = "mpi")]
        {
            let _ = marker;
            let world = switchyard_transports::mpi::world().map_err(|e| LaunchError::Env {
                var: "OMPI_COMM_WORLD_RANK",
                value: String::new(),
                reason: format!("started by an MPI launcher, but MPI did not start: {e}"),
            })?;
            Ok(Some(Bootstrap {
                rank: world.rank,
                world_size: world.size,
                rendezvous: Rendezvous::Mpi,
            }))
        }
        #[cfg(not(feature = "mpi"))]
        Err(LaunchError::Env {
            var: marker,
            value: std::env::var(marker).unwrap_or_default(),
            reason: "started by an MPI launcher, but this build has no MPI backend: \
                     rebuild with `--features mpi`, or start it with `switchyard launch`"
                .into(),
        })
    }

    /// Where this process's stub should bind: `mpi://RANK` under `mpirun`, otherwise
    /// `tcp://127.0.0.1:0` (any free port on loopback, since `switchyard launch` starts
    /// every process on this machine).
    pub fn stub_endpoint(&self) -> String {
        match &self.rendezvous {
            Rendezvous::Mpi => format!("mpi://{}", self.rank),
            Rendezvous::Launcher(_) => "tcp://127.0.0.1:0".into(),
        }
    }

    /// Sends this process's endpoint to the rendezvous and returns every rank's, in
    /// rank order, waiting at most `timeout` for the others.
    ///
    /// Under `mpirun` nothing travels: the endpoints are `mpi://0` .. `mpi://N-1`, and
    /// `endpoint` must be this rank's.
    pub fn exchange(&self, endpoint: &str, timeout: Duration) -> Result<Vec<String>, LaunchError> {
        match &self.rendezvous {
            Rendezvous::Launcher(addr) => {
                rendezvous::exchange(addr, self.rank, self.world_size, endpoint, timeout)
            }
            Rendezvous::Mpi => {
                if endpoint != self.stub_endpoint() {
                    return Err(LaunchError::Rendezvous {
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
        }
    }
}
