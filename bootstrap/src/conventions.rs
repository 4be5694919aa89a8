//! The environment conventions of launchers users already have, read into a
//! [`UniqueId`] bootstrap: rank, world size and a root that rank 0 binds.
//!
//! | convention | rank, size | root host | root port |
//! |---|---|---|---|
//! | torchrun, Kubernetes training operators | `RANK`, `WORLD_SIZE` | `MASTER_ADDR` | `MASTER_PORT` |
//! | OpenMPI's `mpirun` | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | see below | see below |
//! | MPICH/Hydra, Slurm PMI | `PMI_RANK`, `PMI_SIZE` | see below | see below |
//! | `srun` | `SLURM_PROCID`, `SLURM_NTASKS` | see below | see below |
//!
//! For the schedulers the root host is `MASTER_ADDR` when set, else the first host of
//! `SLURM_STEP_NODELIST`, else of `SLURM_JOB_NODELIST` (where Slurm puts task 0; the
//! compact `node[01-03,07]` form is understood), else `SLURM_LAUNCH_NODE_IPADDR`,
//! else `127.0.0.1` when every rank runs on this host (`OMPI_COMM_WORLD_LOCAL_SIZE`
//! equal to the size); otherwise `MASTER_ADDR` is reported missing. The node lists
//! come before the launch node because `srun` may run on a login node outside the
//! allocation, where rank 0 is not. The port is `MASTER_PORT`, else
//! [`DEFAULT_PORT`] plus `SLURM_JOB_ID mod 1000` under Slurm (so that two jobs
//! sharing a node rarely collide). The job tag is derived from the convention, the
//! root and the job id (`SWITCHYARD_JOB_ID`, else the scheduler's), so every rank
//! computes the same one and two jobs with their own ids on one root stay apart. The world
//! size is not part of it: ranks told different sizes reach the same root, which
//! refuses the odd ones naming both sizes, where different tags read as strangers.

use super::BootstrapError;
use super::unique_id::UniqueId;
use std::net::{SocketAddr, ToSocketAddrs};
use switchyard_net::env::{self, EnvError, Lookup};

/// The root port when `MASTER_PORT` is unset (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// A convention's name (for the debug trace) and its rank/size variables.
const SCHEDULERS: [(&str, &str, &str); 3] = [
    (
        "mpirun (OpenMPI)",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ),
    ("mpirun (PMI)", "PMI_RANK", "PMI_SIZE"),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS"),
];

/// Appended to a scheduler's half-set error: the other way to run under `mpirun`.
const MPI_HINT: &str = " (without the MPI engine, switchyard bootstraps mpirun's and \
                        srun's ranks over TCP from both; or rebuild with `--features mpi` \
                        to let MPI do it)";

/// What a convention yields.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) convention: &'static str,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    pub(crate) id: UniqueId,
}

fn missing(var: &str, because: &str) -> BootstrapError {
    EnvError::missing(var, format!("it set, since {because}")).into()
}

fn number(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
    partner: &str,
    hint: &str,
) -> Result<u32, BootstrapError> {
    env::u32(lookup, var)?.ok_or_else(|| missing(var, &format!("{partner} is set{hint}")))
}

/// `torchrun`'s variables: `None` when none of the four is set; a half-set group is an
/// error naming the first missing one.
pub(crate) fn torchrun(lookup: &(impl Lookup + ?Sized)) -> Result<Option<Found>, BootstrapError> {
    const VARS: [&str; 4] = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"];
    let Some(present) = VARS.into_iter().find(|v| env::text(lookup, v).is_some()) else {
        return Ok(None);
    };
    // MASTER_* alone may accompany a scheduler's variables, which give the rank.
    if env::text(lookup, "RANK").is_none()
        && env::text(lookup, "WORLD_SIZE").is_none()
        && scheduler_present(lookup)
    {
        return Ok(None);
    }
    if let Some(absent) = VARS.into_iter().find(|v| env::text(lookup, v).is_none()) {
        return Err(missing(
            absent,
            &format!("{present} is set: the torchrun convention needs {VARS:?}"),
        ));
    }
    let (rank, world) = rank_and_size(lookup, "RANK", "WORLD_SIZE", "")?;
    let root = root_addr(
        "MASTER_ADDR",
        &env::text(lookup, "MASTER_ADDR").unwrap_or_default(),
        port(lookup)?,
    )?;
    let id = UniqueId::at(root, tag(&["torchrun", &root.to_string(), &job_id(lookup)]));
    Ok(Some(Found {
        convention: "torchrun (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE)",
        rank,
        world,
        id,
    }))
}

fn scheduler_present(lookup: &(impl Lookup + ?Sized)) -> bool {
    SCHEDULERS
        .iter()
        .any(|(_, r, s)| env::text(lookup, r).is_some() || env::text(lookup, s).is_some())
}

/// A scheduler's variables (`mpirun`, `srun`), or `None`.
pub(crate) fn scheduler(lookup: &(impl Lookup + ?Sized)) -> Result<Option<Found>, BootstrapError> {
    let Some(&(convention, rank_var, size_var)) = SCHEDULERS
        .iter()
        .find(|(_, r, s)| env::text(lookup, r).is_some() || env::text(lookup, s).is_some())
    else {
        return Ok(None);
    };
    let (rank, world) = rank_and_size(lookup, rank_var, size_var, MPI_HINT)?;
    let port = port(lookup)?;
    let node_list = ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"]
        .into_iter()
        .find_map(|var| env::text(lookup, var).map(|list| (var, list)));
    let (var, host) = if let Some(h) = env::text(lookup, "MASTER_ADDR") {
        ("MASTER_ADDR", h)
    } else if let Some((var, list)) = node_list {
        let first = first_host(&list).ok_or_else(|| {
            EnvError::malformed(
                var,
                list.clone(),
                "a Slurm node list starting with a host name",
            )
        })?;
        (var, first)
    } else if let Some(h) = env::text(lookup, "SLURM_LAUNCH_NODE_IPADDR") {
        ("SLURM_LAUNCH_NODE_IPADDR", h)
    } else if env::text(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE")
        .is_some_and(|l| l.trim() == world.to_string())
    {
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "127.0.0.1".to_string())
    } else {
        return Err(missing(
            "MASTER_ADDR",
            &format!(
                "{convention} gives no root host (no SLURM_STEP_NODELIST, \
                 SLURM_JOB_NODELIST, SLURM_LAUNCH_NODE_IPADDR, nor every rank on this \
                 host): set MASTER_ADDR to rank 0's host"
            ),
        ));
    };
    let root = root_addr(var, &host, port)?;
    let id = UniqueId::at(root, tag(&[convention, &root.to_string(), &job_id(lookup)]));
    Ok(Some(Found {
        convention,
        rank,
        world,
        id,
    }))
}

fn rank_and_size(
    lookup: &(impl Lookup + ?Sized),
    rank_var: &'static str,
    size_var: &'static str,
    hint: &str,
) -> Result<(u32, u32), BootstrapError> {
    let rank = number(lookup, rank_var, size_var, hint)?;
    let world = number(lookup, size_var, rank_var, hint)?;
    if world == 0 || rank >= world {
        return Err(EnvError::malformed(
            rank_var,
            rank.to_string(),
            format!("a rank below {size_var}={world}"),
        )
        .into());
    }
    Ok((rank, world))
}

fn port(lookup: &(impl Lookup + ?Sized)) -> Result<u16, BootstrapError> {
    if let Some(port) = env::port(lookup, "MASTER_PORT")? {
        return Ok(port);
    }
    // Only an offset: a job id that is not a number leaves torchrun's port as it is.
    let offset = env::text(lookup, "SLURM_JOB_ID")
        .and_then(|j| j.parse::<u64>().ok())
        .map_or(0, |j| (j % 1000) as u16);
    Ok(DEFAULT_PORT + offset)
}

/// `host` resolved, IPv4 first (the mesh is IPv4).
fn root_addr(var: &str, host: &str, port: u16) -> Result<SocketAddr, BootstrapError> {
    let bare = host.trim().trim_start_matches('[').trim_end_matches(']');
    let all: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| EnvError::malformed(var, host, format!("a host name that resolves ({e})")))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| EnvError::malformed(var, host, "a host name with an address").into())
}

/// The job id, when one is known, so two jobs on one root differ: `SWITCHYARD_JOB_ID`
/// first (the one a user sets for jobs started by hand, as for the job secret's
/// credentials), else the scheduler's.
fn job_id(lookup: &(impl Lookup + ?Sized)) -> String {
    [
        switchyard_secret::ENV_JOB_ID,
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "OMPI_MCA_ess_base_jobid",
        "PMI_JOBID",
    ]
    .into_iter()
    .find_map(|v| env::text(lookup, v))
    .unwrap_or_default()
}

/// FNV-1a over the parts: the same in every process (std's hasher is seeded per
/// process).
fn tag(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The first host of a Slurm node list: `a,b` gives `a`, `node[01-03,07],x` gives
/// `node01`, `rack[2-3]-n[5]` gives `rack2-n5`.
pub(crate) fn first_host(list: &str) -> Option<String> {
    super::slurm::expand_node_list(list)?.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node[01-03,07]").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu5,gpu6").as_deref(), Some("gpu5"));
        assert_eq!(first_host("n[7]").as_deref(), Some("n7"));
        assert_eq!(first_host("rack[2-3]-n[5,9]").as_deref(), Some("rack2-n5"));
        assert_eq!(first_host("a[10-12],b[1-2]").as_deref(), Some("a10"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host(","), None);
    }

    /// Two jobs started by hand on one `MASTER_PORT` with their own `SWITCHYARD_JOB_ID`
    /// get different tags, so each root closes the other job's ranks (they formed one
    /// mixed world before); ranks of one job still agree.
    #[test]
    fn switchyard_job_id_separates_jobs_on_one_root() {
        let tag_of = |job: &str| {
            let vars = [
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29511"),
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("SWITCHYARD_JOB_ID", job),
            ];
            torchrun(&vars).ok().flatten().map(|f| f.id.tag())
        };
        assert!(tag_of("a").is_some());
        assert_eq!(tag_of("a"), tag_of("a"));
        assert_ne!(tag_of("a"), tag_of("b"));
        // Unset (empty) is no job id: the tag without one, as before.
        let without = [
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
        ];
        let plain = torchrun(&without).ok().flatten().map(|f| f.id.tag());
        assert_eq!(tag_of(""), plain);
    }

    #[test]
    fn tags_are_stable_and_separate_parts() {
        assert_eq!(tag(&["a", "b"]), tag(&["a", "b"]));
        assert_ne!(tag(&["ab", ""]), tag(&["a", "b"]));
    }
}
