//! A worker for the multi-host tests (`cli/tests/it/netns_*.rs`), where each "host" is a
//! network namespace: it forms a communicator, says who it is and where, runs a loop of
//! allreduces and broadcasts checked against their closed form, and exits non-zero
//! with the error on any failure.
//!
//! ```text
//! netns_worker MODE [--iters N] [--timeout SECS] [--progress EVERY] [--ignore-sigterm 1]
//!                    [--ifname NAME] [--rank R --world N [--id ID]] [--len ELEMENTS]
//! ```
//!
//! `MODE` is how the communicator is formed:
//!
//! - `tracker`: joins the rabit tracker named by `DMLC_TRACKER_URI`/`DMLC_TRACKER_PORT`
//!   (`DMLC_TASK_ID` as the task id) with `Communicator::join` (a tracker bootstrap), even when
//!   `switchyard launch` also set its own rendezvous: the tracker's ranks are sorted
//!   by host, and its mesh binds the address that routes to the tracker;
//! - `env`: `Communicator::from_env`, whatever convention the environment follows;
//! - `uid`: `Communicator::from_unique_id` with `--rank` and `--world`; rank 0 without `--id`
//!   makes the id (`UniqueId::new`) and prints `id=ID` first, the others get `--id ID`.
//!
//! `--ifname NAME` sets `SWITCHYARD_IFNAME` for this process (as a site's login
//! environment would on a real host).
//!
//! Output, one line each, for the test to parse:
//!
//! - `id=ID` (mode `uid`, rank 0 only): the unique id to hand to the other ranks;
//! - `joined rank=R world=N addr=A task=T host=H engine=E`: `A` is the local address
//!   of the route to the tracker or rendezvous (the host's address as its peers see
//!   it), `H` the host's name, `E` the communicator's engine (`mesh` or `mpi`);
//! - `iter K` every `--progress` iterations (default 100);
//! - `done iters=N` at the end; on failure `netns_worker: rank R: ERROR` on stderr.
//!
//! `--iters 0` loops until an error (the partition test ends it so).
//! `--ignore-sigterm 1` lets the process outlive the launcher's SIGTERM (not its
//! SIGKILL after the grace period): when the first rank of a broken job exits, the
//! launcher stops the others at once, and the partition test wants to see every
//! survivor's own error.

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;
use switchyard::bootstrap::{Bootstrap, ENV_IFNAME, UniqueId};
use switchyard::collective::{CommOptions, Communicator, ReduceOp, TrackerJoin};

type Error = Box<dyn std::error::Error>;

/// The parsed command line.
struct Args {
    mode: String,
    iters: u64,
    timeout: Option<Duration>,
    progress: u64,
    ignore_sigterm: bool,
    rank: Option<usize>,
    world: Option<usize>,
    id: Option<UniqueId>,
    /// Elements of each allreduce (`--len`, default 1024).
    len: usize,
}

fn parse() -> Result<Args, Error> {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .ok_or("usage: netns_worker tracker|env [options]")?;
    let mut parsed = Args {
        mode,
        iters: 10,
        timeout: None,
        progress: 100,
        ignore_sigterm: false,
        rank: None,
        world: None,
        id: None,
        len: 1024,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--iters" => parsed.iters = value.parse()?,
            "--timeout" => parsed.timeout = Some(Duration::from_secs_f64(value.parse()?)),
            "--progress" => parsed.progress = value.parse::<u64>()?.max(1),
            "--ignore-sigterm" => parsed.ignore_sigterm = value == "1",
            "--rank" => parsed.rank = Some(value.parse()?),
            "--world" => parsed.world = Some(value.parse()?),
            "--len" => parsed.len = value.parse()?,
            "--id" => parsed.id = Some(value.parse()?),
            // Before any thread starts: nothing reads the environment concurrently.
            // SAFETY: parsing runs before any thread starts, so nothing reads the environment concurrently.
            "--ifname" => unsafe { std::env::set_var(ENV_IFNAME, value) },
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(parsed)
}

fn var(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|e| format!("{name}: {e}").into())
}

/// The local address of the route to `host:port` (a UDP connect sends nothing).
fn local_ip_towards(host: &str, port: u16) -> Option<IpAddr> {
    let target = (host, port).to_socket_addrs().ok()?.next()?;
    let socket = UdpSocket::bind(if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })
    .ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// The host and port this process was pointed at: the unique id's root, the tracker,
/// the launcher's rendezvous, `MASTER_ADDR`/`MASTER_PORT`, or Slurm's launch node.
fn root(args: &Args, id: Option<UniqueId>) -> Option<(String, u16)> {
    if let Some(id) = id.or(args.id) {
        return Some((id.root().ip().to_string(), id.root().port()));
    }
    let pair = |h: &str, p: &str| -> Option<(String, u16)> {
        Some((std::env::var(h).ok()?, std::env::var(p).ok()?.parse().ok()?))
    };
    pair("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT")
        .or_else(|| {
            let rv = std::env::var("SWITCHYARD_RENDEZVOUS").ok()?;
            let (h, p) = rv.rsplit_once(':')?;
            Some((h.to_string(), p.parse().ok()?))
        })
        .or_else(|| pair("MASTER_ADDR", "MASTER_PORT"))
        // Any port does for a route; Slurm's default port depends on the job id.
        .or_else(|| Some((std::env::var("SLURM_LAUNCH_NODE_IPADDR").ok()?, 9)))
}

/// The communicator, and the unique id when this process made it.
fn communicator(args: &Args) -> Result<(Communicator, Option<UniqueId>), Error> {
    let mut made = None;
    let mut options = CommOptions::from_env()?;
    if let Some(t) = args.timeout {
        options = options.with_timeout(t);
    }
    let comm = match args.mode.as_str() {
        "tracker" => {
            let port = var("DMLC_TRACKER_PORT")?.parse()?;
            let mut join = TrackerJoin::new(var("DMLC_TRACKER_URI")?, port);
            if let Ok(task) = std::env::var("DMLC_TASK_ID") {
                join = join.with_task_id(task);
            }
            Communicator::join(&Bootstrap::tracker(join), options)?
        }
        "env" => {
            let boot = Bootstrap::from_env()?.unwrap_or_else(Bootstrap::solo);
            Communicator::join(&boot, options)?
        }
        "uid" => {
            let rank = args.rank.ok_or("mode uid needs --rank")?;
            let world = args.world.ok_or("mode uid needs --world")?;
            let id = match args.id {
                Some(id) => id,
                None if rank == 0 => {
                    let id = UniqueId::new()?;
                    println!("id={id}");
                    made = Some(id);
                    id
                }
                None => return Err("mode uid needs --id on ranks other than 0".into()),
            };
            Communicator::from_unique_id(&id, rank, world, options)?
        }
        other => return Err(format!("unknown mode {other}").into()),
    };
    Ok((comm, made))
}

fn run(args: &Args, rank: &mut Option<usize>) -> Result<(), Error> {
    let (mut comm, made) = communicator(args)?;
    let (r, n) = (comm.rank(), comm.world_size());
    *rank = Some(r);
    let addr = root(args, made)
        .and_then(|(h, p)| local_ip_towards(&h, p))
        .map_or_else(|| "?".to_string(), |a| a.to_string());
    let task = std::env::var("DMLC_TASK_ID").unwrap_or_else(|_| "-".into());
    // The host's name as its UTS namespace says (the test cluster gives each host one).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "?".to_string(), |h| h.trim().to_string());
    let engine = comm.engine_name();
    println!("joined rank={r} world={n} addr={addr} task={task} host={host} engine={engine}");
    let mut k: u64 = 0;
    while args.iters == 0 || k < args.iters {
        // Every rank contributes rank + k: the sum is n(n-1)/2 + n k everywhere.
        let mut values = vec![(r as u64) + k; args.len];
        comm.allreduce(&mut values, ReduceOp::Sum)?;
        let expected = (n * (n - 1) / 2) as u64 + n as u64 * k;
        if let Some(bad) = values.iter().find(|&&v| v != expected) {
            return Err(format!("iteration {k}: sum {bad}, expected {expected}").into());
        }
        // A broadcast from a root that moves round the ranks (across hosts, one that
        // leads its host in turn with one that does not).
        let root = (k % n as u64) as usize;
        let mut values = vec![(r as u64) * 1000 + k; args.len];
        comm.broadcast(&mut values, root)?;
        let expected = root as u64 * 1000 + k;
        if let Some(bad) = values.iter().find(|&&v| v != expected) {
            return Err(format!("iteration {k}: broadcast {bad}, expected {expected}").into());
        }
        k += 1;
        if k % args.progress == 0 {
            println!("iter {k}");
        }
    }
    println!("done iters={k}");
    comm.finalize()?;
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("netns_worker: {e}");
            return ExitCode::from(2);
        }
    };
    if args.ignore_sigterm {
        // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let mut rank = None;
    match run(&args, &mut rank) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let who = rank.map_or_else(|| "rank ?".to_string(), |r| format!("rank {r}"));
            eprintln!("netns_worker: {who}: {e}");
            ExitCode::FAILURE
        }
    }
}
