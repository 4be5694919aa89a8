//! `Bootstrap::from_env` / `Communicator::from_env` with the torchrun and scheduler
//! conventions. Each case runs in child processes (this test binary again) with its
//! environment set only there: no thread of this binary mutates the environment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard::collective::{Communicator, ReduceOp};
use switchyard::launch::{Bootstrap, LaunchError, Rendezvous};

/// Set in a child: which case it runs.
const CHILD: &str = "SWITCHYARD_TEST_ENV_CHILD";

/// Every variable any convention reads; cleared in each child before its own are set.
const ALL: [&str; 27] = [
    "SWITCHYARD_RANK",
    "SWITCHYARD_WORLD_SIZE",
    "SWITCHYARD_RENDEZVOUS",
    "SWITCHYARD_IFNAME",
    "DMLC_TRACKER_URI",
    "DMLC_TRACKER_PORT",
    "DMLC_TASK_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "PMI_JOBID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_NODELIST",
    "SLURM_LAUNCH_NODE_IPADDR",
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "SWITCHYARD_COLLECTIVE_TIMEOUT",
    "SWITCHYARD_RENDEZVOUS_TIMEOUT",
];

/// Kills the children still running when dropped (a failed test leaves none).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn child(case: &str, vars: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_case", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .env("SWITCHYARD_COLLECTIVE_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in ALL {
        if v != "SWITCHYARD_COLLECTIVE_TIMEOUT" {
            cmd.env_remove(v);
        }
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits for every child (at most 60 s in all); each must pass its case.
fn all_pass(mut children: Children) {
    let until = Instant::now() + Duration::from_secs(60);
    for i in 0..children.0.len() {
        loop {
            if let Some(status) = children.0[i].try_wait().unwrap() {
                let out = children.0[i].wait_with_output_ref();
                assert!(status.success(), "child {i} failed:\n{out}");
                assert!(
                    out.contains("1 passed"),
                    "child {i} did not run its case:\n{out}"
                );
                break;
            }
            assert!(Instant::now() < until, "child {i} still running after 60 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

trait OutputRef {
    fn wait_with_output_ref(&mut self) -> String;
}

impl OutputRef for Child {
    fn wait_with_output_ref(&mut self) -> String {
        use std::io::Read;
        let mut text = String::new();
        if let Some(o) = self.stdout.as_mut() {
            let _ = o.read_to_string(&mut text);
        }
        if let Some(e) = self.stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    }
}

/// A root port for `MASTER_PORT`, free now and outside Linux's ephemeral range
/// (32768-60999 by default). A port the OS handed out for `:0` and that was closed
/// again may be handed to any other socket of the tests running beside this one
/// before rank 0 binds it (CI saw exactly that: "Address already in use"); ports
/// below the range are only ever taken by an explicit bind.
fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let start = seed.finish();
    (0..4000u64)
        .map(|i| 20_000 + ((start + i * 7919) % 12_000) as u16)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port in 20000-31999")
}

fn env_error(r: Result<Option<Bootstrap>, LaunchError>) -> &'static str {
    match r {
        Err(LaunchError::Env { var, .. }) => var,
        other => panic!("expected an environment error, got {other:?}"),
    }
}

/// The body of a child process; outside one it has nothing to check.
#[test]
fn child_case() {
    let Ok(case) = std::env::var(CHILD) else {
        return;
    };
    match case.as_str() {
        // A rank of a job: join, allreduce rank + 1, check the sum.
        "rank" => {
            let mut comm = Communicator::from_env().unwrap();
            let n = comm.world_size() as u64;
            assert!(n > 1);
            let mut x = [comm.rank() as u64 + 1];
            comm.allreduce(&mut x, ReduceOp::Sum).unwrap();
            assert_eq!(x[0], n * (n + 1) / 2);
        }
        "half-torchrun" => {
            assert_eq!(env_error(Bootstrap::from_env()), "MASTER_PORT");
        }
        "half-slurm" => {
            assert_eq!(env_error(Bootstrap::from_env()), "SLURM_NTASKS");
        }
        "no-root-host" => {
            assert_eq!(env_error(Bootstrap::from_env()), "MASTER_ADDR");
        }
        "slurm-nodelist" => {
            let boot = Bootstrap::from_env().unwrap().unwrap();
            assert_eq!((boot.rank, boot.world_size), (1, 4));
            match boot.rendezvous {
                Rendezvous::UniqueId(id) => {
                    assert!(id.root().ip().is_loopback(), "{id}");
                    assert_eq!(id.root().port(), 29500 + 7);
                }
                other => panic!("expected a unique-id root, got {other:?}"),
            }
        }
        "dmlc-wins" => {
            let boot = Bootstrap::from_env().unwrap().unwrap();
            assert!(
                matches!(boot.rendezvous, Rendezvous::Tracker { .. }),
                "{boot:?}"
            );
        }
        other => panic!("unknown case {other}"),
    }
}

fn job(vars: impl Fn(usize) -> Vec<(&'static str, String)>, n: usize) {
    let children = Children((0..n).map(|r| child("rank", &vars(r))).collect());
    all_pass(children);
}

#[test]
fn torchrun_variables() {
    let port = free_port().to_string();
    job(
        |r| {
            vec![
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
                ("RANK", r.to_string()),
                ("WORLD_SIZE", "3".into()),
            ]
        },
        3,
    );
}

// With the `mpi` feature, OpenMPI's and PMI's variables select the MPI engine
// (MPI_Init under a real mpirun), so the TCP bootstrap cases below are for builds
// without it; `.ci/run` runs both builds.
#[cfg(not(feature = "mpi"))]
#[test]
fn openmpi_variables_all_on_this_host() {
    let port = free_port().to_string();
    job(
        |r| {
            vec![
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "2".into()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
                ("MASTER_PORT", port.clone()),
            ]
        },
        2,
    );
}

#[test]
fn srun_variables_with_the_launch_node() {
    let port = free_port().to_string();
    job(
        |r| {
            vec![
                ("SLURM_PROCID", r.to_string()),
                ("SLURM_NTASKS", "3".into()),
                ("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
            ]
        },
        3,
    );
}

// With the `mpi` feature, OpenMPI's and PMI's variables select the MPI engine
// (MPI_Init under a real mpirun), so the TCP bootstrap cases below are for builds
// without it; `.ci/run` runs both builds.
#[cfg(not(feature = "mpi"))]
#[test]
fn pmi_variables_with_master_addr() {
    let port = free_port().to_string();
    job(
        |r| {
            vec![
                ("PMI_RANK", r.to_string()),
                ("PMI_SIZE", "2".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
            ]
        },
        2,
    );
}

// With the `mpi` feature, OpenMPI's and PMI's variables select the MPI engine
// (MPI_Init under a real mpirun), so the TCP bootstrap cases below are for builds
// without it; `.ci/run` runs both builds.
#[cfg(not(feature = "mpi"))]
#[test]
fn half_set_environments_name_the_missing_variable() {
    let s = |v: &str| v.to_string();
    let cases = [
        (
            "half-torchrun",
            vec![
                ("MASTER_ADDR", s("127.0.0.1")),
                ("RANK", s("0")),
                ("WORLD_SIZE", s("2")),
            ],
        ),
        ("half-slurm", vec![("SLURM_PROCID", s("0"))]),
        (
            "no-root-host",
            vec![
                ("OMPI_COMM_WORLD_RANK", s("0")),
                ("OMPI_COMM_WORLD_SIZE", s("2")),
            ],
        ),
        (
            "slurm-nodelist",
            vec![
                ("SLURM_PROCID", s("1")),
                ("SLURM_NTASKS", s("4")),
                ("SLURM_JOB_NODELIST", s("localhost,other[1-2]")),
                ("SLURM_JOB_ID", s("1007")),
            ],
        ),
        (
            "dmlc-wins",
            vec![
                ("DMLC_TRACKER_URI", s("127.0.0.1")),
                ("DMLC_TRACKER_PORT", s("9091")),
                ("RANK", s("0")),
                ("WORLD_SIZE", s("2")),
                ("MASTER_ADDR", s("127.0.0.1")),
                ("MASTER_PORT", s("29500")),
            ],
        ),
    ];
    all_pass(Children(
        cases.iter().map(|(case, vars)| child(case, vars)).collect(),
    ));
}
