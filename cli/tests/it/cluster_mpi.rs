//! OpenMPI's `mpirun` across the hosts of the test cluster (`cluster/`,
//! `scripts/test-cluster.sh`), launching its daemons over the cluster's real sshd
//! (`plm_rsh_args=-F ssh_config`): a program built with the `mpi` feature runs on
//! MPI's own collectives across hosts, and `switchyard launch --launcher mpi` places
//! each process with `mpirun --host`.
//!
//! Needs root, openssh-server and OpenMPI: without them every test says why and
//! returns, unless `SWITCHYARD_REQUIRE_CLUSTER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::cluster::{Cluster, Joined};
use crate::support::{example, run_bounded};
use std::process::Command;
use std::time::Duration;

/// A hostfile of every host with two slots, and OpenMPI's variables for the cluster.
fn mpi_across(cluster: &Cluster, command: &mut Command) -> std::path::PathBuf {
    cluster.openmpi_env(command);
    let hosts: Vec<usize> = (0..cluster.len()).collect();
    cluster.write_hostfile("mpi_hosts", &hosts, 2)
}

/// Checks `world` joined ranks, rank `r` on `node{r / 2}`, each with `engine`, and
/// that each finished 20 iterations.
fn check(text: &str, world: usize, engine: &str) {
    let seen = Joined::all(text);
    assert_eq!(seen.len(), world, "{text}");
    for (rank, j) in seen.iter().enumerate() {
        assert_eq!((j.rank, j.world), (rank, world), "{seen:?}");
        assert_eq!(j.host, Cluster::name(rank / 2), "rank {rank}: {seen:?}");
        assert_eq!(j.engine, engine, "rank {rank}: {seen:?}");
    }
    let done = text
        .lines()
        .filter(|l| l.ends_with("done iters=20"))
        .count();
    assert_eq!(done, world, "{text}");
}

#[test]
fn mpirun_over_ssh_runs_a_job_across_hosts() {
    let Some(cluster) = Cluster::up_with_mpirun(3) else {
        return;
    };
    let mut c = cluster.command(0, "mpirun");
    let hostfile = mpi_across(&cluster, &mut c);
    c.arg("--hostfile").arg(&hostfile).args(["-np", "6"]);
    // Built with the `mpi` feature, the ranks run on MPI's own collectives. Without
    // it they bootstrap a mesh over TCP from OpenMPI's variables, which name no root
    // host across hosts: `MASTER_ADDR` (rank 0 runs on node0), passed by `-x`.
    let engine = if cfg!(feature = "mpi") {
        "mpi"
    } else {
        c.args(["-x", "MASTER_ADDR=node0", "-x", "MASTER_PORT=29400"]);
        "mesh"
    };
    c.arg(example("netns_worker"))
        .args(["env", "--iters", "20", "--timeout", "20"]);
    let (out, _) = run_bounded(c, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    check(&stdout, 6, engine);
}

#[test]
fn switchyard_launch_places_each_process_with_mpirun_on_its_host() {
    let Some(cluster) = Cluster::up_with_mpirun(3) else {
        return;
    };
    let mut c = cluster.command(0, env!("CARGO_BIN_EXE_switchyard"));
    let hostfile = mpi_across(&cluster, &mut c);
    c.args(["launch", "-n", "6", "--launcher", "mpi", "--hostfile"])
        .arg(&hostfile)
        .args(["--host", &Cluster::addr(0).to_string()])
        .args(["--timeout", "90", "--rendezvous-timeout", "40", "--"])
        .arg(example("netns_worker"))
        .args(["env", "--iters", "20", "--timeout", "20"]);
    let (out, _) = run_bounded(c, Duration::from_secs(150));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The launcher's own rendezvous wins over mpirun's one-process worlds: a mesh.
    check(&stdout, 6, "mesh");
}
