//! `Bootstrap::from_env` / `Communicator::from_env` with the torchrun and scheduler
//! conventions. What only reads variables goes through `Bootstrap::from_lookup` with
//! the variables injected; the jobs that form communicators run in child processes
//! (this test binary again) with their environment set only there: no thread of this
//! binary mutates the environment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use switchyard::bootstrap::EndpointExchange;
use switchyard::bootstrap::{Bootstrap, BootstrapError, Rendezvous};
use switchyard::collective::{CommOptions, Communicator, ReduceOp};

/// Set in a child: which case it runs.
const CHILD: &str = "SWITCHYARD_TEST_ENV_CHILD";

/// Every variable any convention reads; cleared in each child before its own are set.
const ALL: [&str; 28] = [
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
    "SLURM_STEP_NODELIST",
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
    cmd.arg(support::test_name(module_path!(), "child_case"))
        .args(["--exact", "--nocapture", "--test-threads=1"])
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

/// The environment error of `r`: its variable, and the whole message.
fn env_error(r: Result<Option<Bootstrap>, BootstrapError>) -> (String, String) {
    match r {
        Err(BootstrapError::Env(e)) => (e.var().to_string(), e.to_string()),
        other => panic!("expected an environment error, got {other:?}"),
    }
}

/// A rank that dies between the exchange and the mesh: it exchanges its bound mesh
/// endpoint through the launcher, says so, then stalls until killed.
#[derive(Debug)]
struct StallAfterExchange(Bootstrap);

impl EndpointExchange for StallAfterExchange {
    fn exchange(
        &mut self,
        _rank: u32,
        _world: u32,
        endpoint: &str,
        _timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        use std::io::Write;
        let endpoints = self.0.exchange(endpoint, Duration::from_secs(30))?;
        println!("EXCHANGED");
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(120));
        Ok(endpoints)
    }

    /// The launcher's rendezvous, whose route picks the mesh address as for any
    /// launched rank.
    fn root_hint(&self) -> Option<(String, u16)> {
        let Rendezvous::Launcher(addr) = &self.0.rendezvous else {
            return None;
        };
        let (host, port) = addr.rsplit_once(':')?;
        Some((host.to_string(), port.parse().ok()?))
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
        // A rank whose setup must fail, naming the rank in EXPECT_LEFT, which left.
        "expect-left" => {
            let who = std::env::var("EXPECT_LEFT").unwrap();
            let Err(err) = Communicator::from_env() else {
                panic!("setup succeeded without a rank");
            };
            let text = err.to_string();
            assert!(
                who.split(',').any(|r| text.contains(&format!("rank {r} ")))
                    && text.contains("left"),
                "{text}"
            );
            println!("setup failed as expected: {text}");
        }
        // A rank whose setup must fail with an error containing EXPECT_TEXT.
        "expect-error" => {
            let want = std::env::var("EXPECT_TEXT").unwrap();
            let Err(err) = Communicator::from_env() else {
                panic!("setup succeeded");
            };
            let text = err.to_string();
            assert!(text.contains(&want), "{text}");
            // Every case is a torchrun-style job, which makes no unique id.
            assert!(!text.contains("unique-id"), "{text}");
            println!("setup failed as expected: {text}");
        }
        // Prints the unique id the environment gives, for a test that plays a rank.
        "print-id" => match Bootstrap::from_env().unwrap().unwrap().rendezvous {
            Rendezvous::UniqueId(id) => println!("ID {id}"),
            other => panic!("expected a unique-id root, got {other:?}"),
        },
        // Binds its mesh endpoint and exchanges it, says so, then stalls until killed
        // (a rank that dies between the exchange and the mesh).
        "stall-after-exchange" => {
            let boot = Bootstrap::from_env().unwrap().unwrap();
            let (rank, world) = (boot.rank as usize, boot.world_size as usize);
            let stalling = Bootstrap::from_exchange(rank, world, StallAfterExchange(boot));
            // Killed long before the stall ends.
            let _ = Communicator::join(&stalling, CommOptions::default());
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
    let missing = |vars: &[(&str, &str)]| env_error(Bootstrap::from_lookup(vars)).0;
    let half_torchrun = [
        ("MASTER_ADDR", "127.0.0.1"),
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
    ];
    assert_eq!(missing(&half_torchrun), "MASTER_PORT");
    assert_eq!(missing(&[("SLURM_PROCID", "0")]), "SLURM_NTASKS");
    let no_root_host = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")];
    assert_eq!(missing(&no_root_host), "MASTER_ADDR");

    let slurm_nodelist = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_NODELIST", "localhost,other[1-2]"),
        ("SLURM_JOB_ID", "1007"),
    ];
    let boot = Bootstrap::from_lookup(&slurm_nodelist).unwrap().unwrap();
    assert_eq!((boot.rank, boot.world_size), (1, 4));
    match boot.rendezvous {
        Rendezvous::UniqueId(id) => {
            assert!(id.root().ip().is_loopback(), "{id}");
            assert_eq!(id.root().port(), 29500 + 7);
        }
        other => panic!("expected a unique-id root, got {other:?}"),
    }

    // `srun` on a login node: the launch node is not where task 0 runs; the step's
    // first node is.
    let srun_from_a_login_node = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LAUNCH_NODE_IPADDR", "192.0.2.7"),
        ("SLURM_JOB_NODELIST", "192.0.2.8,localhost"),
        ("SLURM_STEP_NODELIST", "localhost,other[1-2]"),
    ];
    match Bootstrap::from_lookup(&srun_from_a_login_node)
        .unwrap()
        .unwrap()
        .rendezvous
    {
        Rendezvous::UniqueId(id) => assert!(id.root().ip().is_loopback(), "{id}"),
        other => panic!("expected a unique-id root, got {other:?}"),
    }

    let dmlc_wins = [
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];
    let boot = Bootstrap::from_lookup(&dmlc_wins).unwrap().unwrap();
    assert!(
        matches!(boot.rendezvous, Rendezvous::Tracker { .. }),
        "{boot:?}"
    );
}

/// Every convention's malformed value: an error naming the variable and the value.
#[test]
fn a_malformed_value_names_the_variable_and_the_value() {
    let torchrun = |var: &'static str, bad: &'static str| {
        let mut vars = vec![
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
        ];
        vars.push((var, bad));
        vars
    };
    let launcher = |var: &'static str, bad: &'static str| {
        let mut vars = vec![
            ("SWITCHYARD_RANK", "0"),
            ("SWITCHYARD_WORLD_SIZE", "2"),
            ("SWITCHYARD_RENDEZVOUS", "127.0.0.1:5000"),
        ];
        vars.push((var, bad));
        vars
    };
    let mut cases = vec![
        torchrun("RANK", "first"),
        torchrun("RANK", "2"),
        torchrun("WORLD_SIZE", "-2"),
        torchrun("MASTER_PORT", "0"),
        torchrun("MASTER_PORT", "http"),
        launcher("SWITCHYARD_RANK", "one"),
        launcher("SWITCHYARD_RANK", "5"),
        launcher("SWITCHYARD_WORLD_SIZE", "2.0"),
    ];
    // Without the MPI engine these are read as a scheduler's convention (with it,
    // OpenMPI's variables start MPI).
    if cfg!(not(feature = "mpi")) {
        cases.push(vec![
            ("SLURM_PROCID", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("SLURM_NTASKS", "n"),
        ]);
        cases.push(vec![
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", ","),
        ]);
    }
    // The last pair of each case is the malformed one.
    for vars in cases {
        let &(var, bad) = vars.last().unwrap();
        let (named, text) = env_error(Bootstrap::from_lookup(vars.as_slice()));
        assert_eq!(named, var, "{text}");
        assert!(
            text.starts_with(&format!("{var}={bad:?}: expected ")),
            "{text}"
        );
    }
}

fn torchrun_vars(port: &str, rank: usize, world: usize) -> Vec<(&'static str, String)> {
    vec![
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
    ]
}

/// Waits (at most `limit`) for every child to exit, and returns how long that took;
/// each must pass its case.
fn all_pass_within(mut children: Children, limit: Duration) -> Duration {
    let started = Instant::now();
    for i in 0..children.0.len() {
        loop {
            if let Some(status) = children.0[i].try_wait().unwrap() {
                let out = children.0[i].wait_with_output_ref();
                assert!(status.success(), "child {i} failed:\n{out}");
                assert!(out.contains("1 passed"), "child {i} did not run:\n{out}");
                break;
            }
            assert!(
                started.elapsed() < limit,
                "child {i} still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    started.elapsed()
}

/// The unique id a torchrun job on `port` of `world` ranks derives (from a child).
fn torchrun_id(port: &str, world: usize) -> switchyard::bootstrap::UniqueId {
    let mut c = Children(vec![child("print-id", &torchrun_vars(port, 1, world))]);
    let out = {
        let status = c.0[0].wait().unwrap();
        let out = c.0[0].wait_with_output_ref();
        assert!(status.success(), "{out}");
        out
    };
    let (_, id) = out.split_once("ID ").expect(&out);
    id.split_whitespace().next().unwrap().parse().unwrap()
}

/// Checks in at `id`'s root as `rank` of `world` by hand, with a ring listener that
/// is closed when the returned pair is dropped (retrying until rank 0 listens, 30 s
/// at most).
fn fake_check_in(
    id: &switchyard::bootstrap::UniqueId,
    rank: u32,
    world: u32,
) -> (std::net::TcpStream, std::net::TcpListener) {
    use std::io::Write;
    let ring = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ring_addr = ring.local_addr().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(30);
    let mut root = loop {
        match std::net::TcpStream::connect_timeout(&id.root(), Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < until, "rank 0's root never listened: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let mut out = b"SYUI".to_vec();
    out.extend_from_slice(&id.tag().to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&world.to_le_bytes());
    out.extend_from_slice(&(ring_addr.len() as u32).to_le_bytes());
    out.extend_from_slice(ring_addr.as_bytes());
    root.write_all(&out).unwrap();
    (root, ring)
}

/// With the other ranks' setup bounded by 20 s, one that notices a departure "at once"
/// is done well within this.
const PROMPTLY: Duration = Duration::from_secs(8);

/// A rank that checked in at the root and then died (its connection closed) while the
/// root still waited for another: the root tells every rank at once, naming it.
#[test]
fn a_rank_gone_while_the_root_waits_is_named_at_once() {
    let port = free_port().to_string();
    let world = 4;
    let id = torchrun_id(&port, world);
    let expect = |r: usize| {
        let mut v = torchrun_vars(&port, r, world);
        v.push(("EXPECT_LEFT", "2".into()));
        v
    };
    // Ranks 0 and 1 come; rank 2 checks in and dies; rank 3 never comes. Rank 1 may
    // check in before or after rank 2 dies: told either way.
    let children = Children((0..2).map(|r| child("expect-left", &expect(r))).collect());
    let fake = fake_check_in(&id, 2, world as u32);
    drop(fake);
    let took = all_pass_within(children, Duration::from_secs(40));
    assert!(
        took < PROMPTLY,
        "the ranks took {took:?} to notice rank 2 left"
    );
}

/// A rank that was answered by the root and died before its ring connections: its
/// ring neighbours are refused (and its successor's predecessor never comes); both
/// end at once, naming it.
#[test]
fn a_rank_gone_during_the_ring_is_named_at_once() {
    use std::io::Read;
    let port = free_port().to_string();
    let world = 3;
    let id = torchrun_id(&port, world);
    let expect = |r: usize, left: &str| {
        let mut v = torchrun_vars(&port, r, world);
        v.push(("EXPECT_LEFT", left.to_string()));
        v
    };
    // Rank 1 is refused by rank 2 and gives up at once; rank 0 sees its predecessor
    // rank 2 gone. Whichever gives up first, the other may see that one leave first.
    let children = Children(vec![
        child("expect-left", &expect(0, "2,1")),
        child("expect-left", &expect(1, "2,0")),
    ]);
    let (mut root, ring) = fake_check_in(&id, 2, world as u32);
    // The root's answer comes once ranks 0 and 1 checked in: then rank 2 dies.
    root.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut magic = [0u8; 8];
    root.read_exact(&mut magic).unwrap();
    assert_eq!(&magic[..4], b"SYUI");
    assert_eq!(&magic[4..], &0u32.to_le_bytes(), "the root refused rank 2");
    drop((root, ring));
    let took = all_pass_within(children, Duration::from_secs(40));
    assert!(
        took < PROMPTLY,
        "the ranks took {took:?} to notice rank 2 left"
    );
}

/// A rank killed after the endpoint exchange, while the others open the mesh: they
/// end at once, naming it, instead of waiting out their timeout.
#[test]
fn a_rank_killed_before_the_mesh_is_named_at_once() {
    use std::io::BufRead;
    let port = free_port().to_string();
    let world = 3;
    let expect = |r: usize| {
        let mut v = torchrun_vars(&port, r, world);
        // The other survivor may give up first, and then be seen gone first.
        v.push(("EXPECT_LEFT", format!("2,{}", 1 - r)));
        v
    };
    let mut children = Children((0..2).map(|r| child("expect-left", &expect(r))).collect());
    children.0.push(child(
        "stall-after-exchange",
        &torchrun_vars(&port, 2, world),
    ));
    let stdout = children.0[2].stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains("EXCHANGED") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("rank 2 never finished its exchange");
    children.0[2].kill().unwrap();
    children.0[2].wait().unwrap();
    let victim = children.0.pop();
    let took = all_pass_within(children, Duration::from_secs(40));
    drop(victim);
    assert!(
        took < PROMPTLY,
        "the ranks took {took:?} to notice rank 2 left"
    );
}

/// Connections that say nothing, opened on `MASTER_PORT` as soon as rank 0 listens and
/// before the other ranks start, delay no rank: with the job secret on and eight of them
/// held open, the job still passes within `PROMPTLY`.
#[test]
fn idle_connections_on_the_root_port_delay_no_rank() {
    let port = free_port().to_string();
    let world = 3;
    let vars = |r: usize| {
        let mut v = torchrun_vars(&port, r, world);
        v.push((
            "SWITCHYARD_JOB_SECRET",
            "0123456789abcdef0123456789abcdef".into(),
        ));
        v
    };
    let mut children = Children(vec![child("rank", &vars(0))]);
    let root: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let mut idle = Vec::new();
    while idle.len() < 8 {
        match std::net::TcpStream::connect_timeout(&root, Duration::from_secs(1)) {
            Ok(s) => idle.push(s),
            Err(e) => {
                assert!(Instant::now() < until, "rank 0 never listened: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    children
        .0
        .extend((1..world).map(|r| child("rank", &vars(r))));
    let took = all_pass_within(children, Duration::from_secs(40));
    drop(idle);
    assert!(
        took < PROMPTLY,
        "the job took {took:?} behind idle connections"
    );
}

/// Ranks told different `WORLD_SIZE`s: each is told that the sizes disagree (both
/// read "a wrong job tag is answered by closing" before), and without any mention of
/// a unique id, which a torchrun user never made.
#[test]
fn a_world_size_mismatch_is_named_on_every_rank() {
    let port = free_port().to_string();
    let with = |r: usize, world: usize, text: &str| {
        let mut v = torchrun_vars(&port, r, world);
        v.push(("EXPECT_TEXT", text.to_string()));
        v.push(("SWITCHYARD_COLLECTIVE_TIMEOUT", "3".into()));
        v
    };
    let children = Children(vec![
        child("expect-error", &with(0, 2, "rank 1 from 127.0.0.1")),
        child(
            "expect-error",
            &with(1, 3, "refused world size 3: the root's world size is 2"),
        ),
    ]);
    all_pass_within(children, Duration::from_secs(30));
}

/// Rank 0 whose `MASTER_ADDR` is not an address of its host is told so, not that
/// every rank (itself included) never checked in.
#[test]
fn rank_zero_that_cannot_reach_master_addr_is_told_why() {
    let port = free_port().to_string();
    let mut vars = torchrun_vars(&port, 0, 2);
    // TEST-NET-1: no host here has it.
    vars[0].1 = "192.0.2.1".into();
    vars.push(("EXPECT_TEXT", "MASTER_ADDR) must name rank 0's host".into()));
    vars.push(("SWITCHYARD_COLLECTIVE_TIMEOUT", "2".into()));
    vars.push(("SWITCHYARD_IFNAME", "lo".into()));
    all_pass_within(
        Children(vec![child("expect-error", &vars)]),
        Duration::from_secs(30),
    );
}
