//! `switchyard bench ps`: the parameter server's push+pull against its fused
//! push_pull, and both against a bare Dealer/Router exchange of the same bytes.
//!
//! One job of 4 workers, 2 servers and a scheduler, as threads of this process, the
//! scheduler on `tcp://127.0.0.1`: control messages cross the loopback over ZeroMQ,
//! values travel on the parameter server's data plane, through shared memory as
//! between processes of one host (or, in the rows that say so, over TCP loopback or
//! ZeroMQ). Each request carries 32 keys of 1 KiB, or one key of 1 MiB (split over
//! both servers); servers sum the four workers' pushes of each round (sync mode).
//! Every repetition times both forms in the same job, one after the other, on keys of
//! their own, then the baseline; the figures are medians over repetitions. The baseline exchange has the same shape without the parameter server:
//! each worker sends each server its half of the bytes, each server answers all four
//! once it has heard from all four, with as many bytes back.
//!
//! The last rows put the fused push_pull beside the collective way to sum the same
//! gradients: 4 ranks of a mesh (threads, as the workers are) allreducing each
//! worker's values, each round on a fresh copy of the values as a worker's push gets;
//! over TCP loopback against the data plane over TCP (shared memory off on both), and
//! through shared memory against the data plane through shared memory. One row puts
//! the data plane's push_pull beside the same over ZeroMQ (`SWITCHYARD_PS_DATA=zmq`).
//!
//! `--instructions` counts, with callgrind, the instructions of one round (every
//! worker's request and the servers' work) of each form and of the allreduce, each in
//! a process of its own (`bench ps-one`), instead of timing them.

use super::report::header;
use super::{Common, PsOneArgs, Row, instructions, median};
use bytes::Bytes;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::{CommOptions, Communicator, ReduceOp};
use switchyard::prelude::*;
use switchyard::ps::{
    DataPlane, Group, KvServer, KvWorker, Mode, PsConfig, PsEnv, PsRole, Scheduler, Sharding,
    Update,
};

const SUITE: &str = "ps";
const WORKERS: u32 = 4;
const SERVERS: u32 = 2;
const WAIT: Duration = Duration::from_secs(60);

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What one request carries and how many requests a timing takes.
#[derive(Clone, Copy, Debug)]
struct Shape {
    value_bytes: usize,
    keys: usize,
    iters: usize,
}

impl Shape {
    fn new(value_bytes: usize, quick: bool) -> Shape {
        let (keys, iters) = match (value_bytes >= 1 << 20, quick) {
            (true, true) => (1, 10),
            (true, false) => (1, 40),
            (false, true) => (32, 100),
            (false, false) => (32, 500),
        };
        Shape {
            value_bytes,
            keys,
            iters,
        }
    }

    fn floats(&self) -> usize {
        self.value_bytes / 4
    }

    /// Keys moved (each pushed and pulled once) by all workers in one timing.
    fn keys_moved(&self) -> f64 {
        (WORKERS as usize * self.keys * self.iters) as f64
    }

    /// Bytes moved both ways by all workers in one timing.
    fn bytes_moved(&self) -> f64 {
        self.keys_moved() * self.value_bytes as f64 * 2.0
    }
}

/// What every worker of a job sends: even keys for push then pull, odd keys for
/// push_pull (a range of 2k keys puts half of each set on each server), and the
/// values of one request.
struct Requests {
    even: Vec<u64>,
    odd: Vec<u64>,
    lens: Vec<usize>,
    template: Vec<f32>,
}

impl Requests {
    fn new(shape: Shape) -> Requests {
        let even: Vec<u64> = (0..shape.keys as u64).map(|k| 2 * k).collect();
        let odd = even.iter().map(|k| k + 1).collect();
        Requests {
            even,
            odd,
            lens: vec![shape.floats(); shape.keys],
            template: vec![1.0f32; shape.floats() * shape.keys],
        }
    }

    /// One push then one pull of the even keys.
    fn push_then_pull(&self, w: &mut KvWorker<f32>) -> std::result::Result<(), Error> {
        w.push(&self.even, &self.lens, self.template.clone())?;
        std::hint::black_box(w.pull(&self.even)?);
        Ok(())
    }

    /// One fused push_pull of the odd keys.
    fn push_pull(&self, w: &mut KvWorker<f32>) -> std::result::Result<(), Error> {
        std::hint::black_box(w.push_pull(&self.odd, &self.lens, self.template.clone())?);
        Ok(())
    }
}

/// What a job's values travel on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plane {
    /// The data plane, through shared memory (the default on one host).
    Shm,
    /// The data plane over TCP loopback (shared memory off).
    Tcp,
    /// ZeroMQ, beside the control messages.
    Zmq,
}

/// One job of `WORKERS` workers, `SERVERS` servers (sync, sum) and a scheduler, as
/// threads of this process, the scheduler on tcp loopback, values on `plane`; every
/// worker runs `work` and then finishes. Returns worker 0's result.
fn ps_job<T, F>(shape: Shape, plane: Plane, spin: Option<Duration>, work: F) -> Result<T>
where
    T: Send + 'static,
    F: Fn(&mut KvWorker<f32>, &Requests) -> std::result::Result<T, Error> + Clone + Send + 'static,
{
    let space = 2 * shape.keys as u64;
    let mut config = PsConfig::new(WORKERS as usize, SERVERS as usize)
        .with_sharding(Sharding::Range {
            key_space: Some(space),
        })
        .with_data_plane(match plane {
            Plane::Zmq => DataPlane::Zmq,
            Plane::Shm | Plane::Tcp => DataPlane::Link,
        })
        .with_shared_memory(plane == Plane::Shm);
    if let Some(spin) = spin {
        config = config.with_spin(spin);
    }
    let scheduler = Scheduler::bind("tcp://127.0.0.1:0", &config)?;
    let endpoint = scheduler.endpoint().to_string();
    let sched = thread::spawn(move || scheduler.run().map_err(|e| e.to_string()));
    let servers: Vec<_> = (0..SERVERS)
        .map(|_| {
            let (e, c) = (endpoint.clone(), config.clone());
            thread::spawn(move || -> std::result::Result<(), String> {
                let server = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)
                    .map_err(|e| e.to_string())?;
                server.run().map(|_| ()).map_err(|e| e.to_string())
            })
        })
        .collect();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (e, c, work) = (endpoint.clone(), config.clone(), work.clone());
            thread::spawn(move || -> std::result::Result<T, String> {
                let run = || -> std::result::Result<T, Error> {
                    let mut w = KvWorker::<f32>::join(&e, &c)?;
                    let out = work(&mut w, &Requests::new(shape))?;
                    w.finish()?;
                    Ok(out)
                };
                run().map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut first = None;
    for w in workers {
        let out = w.join().map_err(|_| "a worker thread panicked")??;
        if first.is_none() {
            first = Some(out);
        }
    }
    for s in servers {
        s.join().map_err(|_| "a server thread panicked")??;
    }
    sched
        .join()
        .map_err(|_| "the scheduler thread panicked")??;
    first.ok_or_else(|| "no worker".into())
}

/// Per repetition: seconds for push then pull, seconds for push_pull (worker 0's),
/// values on `plane`. One untimed request of each form first: the first requests of
/// a job check their keys with every server and fill the buffers the later ones
/// reuse (without it, whichever form a job times first came out 1.3-2x slower).
fn ps_timings(shape: Shape, plane: Plane, reps: usize) -> Result<Vec<(f64, f64)>> {
    ps_job(shape, plane, None, move |w, requests| {
        let mut out = Vec::with_capacity(reps);
        requests.push_then_pull(w)?;
        requests.push_pull(w)?;
        for _ in 0..reps {
            w.barrier(Group::Workers)?;
            let started = Instant::now();
            for _ in 0..shape.iters {
                requests.push_then_pull(w)?;
            }
            let separate = started.elapsed().as_secs_f64();
            w.barrier(Group::Workers)?;
            let started = Instant::now();
            for _ in 0..shape.iters {
                requests.push_pull(w)?;
            }
            out.push((separate, started.elapsed().as_secs_f64()));
        }
        Ok(out)
    })
}

/// Seconds for the bare exchange, per repetition (worker 0's).
fn bare_timings(shape: Shape, reps: usize) -> Result<Vec<f64>> {
    let rounds = shape.iters * reps;
    let half = shape.value_bytes * shape.keys / 2;
    let mut endpoints = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..SERVERS {
        let mut router = RouterSocket::bind("tcp://127.0.0.1:0", SocketOptions::default())?;
        endpoints.push(router.endpoint().to_string());
        servers.push(thread::spawn(move || -> std::result::Result<(), String> {
            let answer = Bytes::from(vec![2u8; half]);
            for _ in 0..rounds {
                let mut peers = Vec::with_capacity(WORKERS as usize);
                while peers.len() < WORKERS as usize {
                    let (peer, msg) = router.recv_from_timeout(WAIT).map_err(|e| e.to_string())?;
                    std::hint::black_box(msg.payload_len());
                    peers.push((peer, msg.reply(Kind::Put)));
                }
                for (peer, reply) in peers {
                    let reply = reply.with_frame(answer.clone());
                    router.send_to(&peer, reply).map_err(|e| e.to_string())?;
                }
            }
            Ok(())
        }));
    }
    let start_line = Arc::new(Barrier::new(WORKERS as usize));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (endpoints, start_line) = (endpoints.clone(), start_line.clone());
            thread::spawn(move || -> std::result::Result<Vec<f64>, String> {
                let mut dealers = endpoints
                    .iter()
                    .map(|e| DealerSocket::connect(e, SocketOptions::default()))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let payload = vec![1u8; 2 * half];
                let mut out = Vec::with_capacity(reps);
                for _ in 0..reps {
                    start_line.wait();
                    let started = Instant::now();
                    for seq in 0..shape.iters as u64 {
                        // A fresh buffer per round, one half to each server, as a
                        // worker's values go.
                        let buffer = Bytes::from(payload.clone());
                        for (i, d) in dealers.iter_mut().enumerate() {
                            let msg =
                                Msg::new(Addr::worker(0, id), Addr::server(0, 0), Kind::Update)
                                    .with_seq(seq)
                                    .with_frame(buffer.slice(i * half..(i + 1) * half));
                            d.send(msg).map_err(|e| e.to_string())?;
                        }
                        for d in &mut dealers {
                            std::hint::black_box(d.recv_timeout(WAIT).map_err(|e| e.to_string())?);
                        }
                    }
                    out.push(started.elapsed().as_secs_f64());
                }
                Ok(out)
            })
        })
        .collect();
    let mut first = None;
    for w in workers {
        let timings = w.join().map_err(|_| "a worker thread panicked")??;
        first.get_or_insert(timings);
    }
    for s in servers {
        s.join().map_err(|_| "a server thread panicked")??;
    }
    first.ok_or_else(|| "no worker".into())
}

/// One job of 4 mesh ranks (threads, as the workers are) with `options` (shared
/// memory off for TCP loopback), each running `work`; returns rank 0's result.
fn mesh_job<T, F>(options: CommOptions, work: F) -> Result<T>
where
    T: Send + 'static,
    F: Fn(&mut Communicator) -> std::result::Result<T, String> + Clone + Send + 'static,
{
    let n = WORKERS as usize;
    let exchange = MemoryExchange::new(n);
    let options = options.with_timeout(WAIT);
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let (exchange, options, work) = (exchange.clone(), options.clone(), work.clone());
            thread::spawn(move || -> std::result::Result<T, String> {
                let bootstrap = Bootstrap::from_exchange(rank, n, exchange);
                let mut comm =
                    Communicator::join(&bootstrap, options).map_err(|e| e.to_string())?;
                work(&mut comm)
            })
        })
        .collect();
    let mut first = None;
    for r in ranks {
        let out = r.join().map_err(|_| "a rank thread panicked")??;
        if first.is_none() {
            first = Some(out);
        }
    }
    first.ok_or_else(|| "no rank".into())
}

/// `rounds` allreduces of a worker's values, each on a fresh copy of them as a
/// worker's push gets.
fn allreduce_rounds(
    comm: &mut Communicator,
    shape: Shape,
    rounds: usize,
) -> std::result::Result<(), String> {
    let template = vec![1.0f32; shape.floats() * shape.keys];
    for _ in 0..rounds {
        let mut values = template.clone();
        comm.allreduce(&mut values, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        std::hint::black_box(values);
    }
    Ok(())
}

/// Seconds for `shape.iters` allreduces of a worker's values among 4 mesh ranks over
/// TCP loopback or (`shm`) through shared memory, per repetition (rank 0's).
fn allreduce_timings(shape: Shape, shm: bool, reps: usize) -> Result<Vec<f64>> {
    mesh_job(
        CommOptions::default().with_shared_memory(shm),
        move |comm| {
            let mut out = Vec::with_capacity(reps);
            for _ in 0..reps {
                comm.barrier().map_err(|e| e.to_string())?;
                let started = Instant::now();
                allreduce_rounds(comm, shape, shape.iters)?;
                out.push(started.elapsed().as_secs_f64());
            }
            Ok(out)
        },
    )
}

/// One side of `bench ps --instructions`, once: `count` rounds.
pub(crate) fn run_one(args: &PsOneArgs) -> Result<()> {
    let shape = Shape::new(args.size, true);
    let rounds = args.count;
    // Waits do not spin: under valgrind a spinning rank counts its waiting.
    let spin = Some(Duration::ZERO);
    let fused = move |w: &mut KvWorker<f32>, requests: &Requests| {
        (0..rounds).try_for_each(|_| requests.push_pull(w))
    };
    let allreduce = |shm: bool| {
        mesh_job(
            CommOptions::default()
                .with_spin(Duration::ZERO)
                .with_shared_memory(shm),
            move |comm| allreduce_rounds(comm, shape, rounds),
        )
    };
    match args.side.as_str() {
        "push_pull" => ps_job(shape, Plane::Shm, spin, fused),
        "push_pull-tcp" => ps_job(shape, Plane::Tcp, spin, fused),
        "push_pull-zmq" => ps_job(shape, Plane::Zmq, spin, fused),
        "push+pull" => ps_job(shape, Plane::Shm, spin, move |w, requests| {
            (0..rounds).try_for_each(|_| requests.push_then_pull(w))
        }),
        "node" => run_node(shape, rounds).map_err(|e| -> Box<dyn std::error::Error> { e }),
        "allreduce" => allreduce(false),
        "allreduce-shm" => allreduce(true),
        other => Err(format!(
            "unknown side {other:?} (push_pull, push_pull-tcp, push_pull-zmq, push+pull, allreduce, allreduce-shm)"
        )
        .into()),
    }
}

/// One process of a job of several (`--side node`): its role, the job's shape and the
/// scheduler's address from ps-lite's variables (`PsEnv`, `SWITCHYARD_PS_DATA`
/// included); the values and keys of [`Shape`]. Each worker times `rounds` push_pulls
/// after one untimed and a barrier; worker 0 prints the time of a round. For the
/// parameter server between hosts (network namespaces), where threads of one process
/// cannot go.
fn run_node(shape: Shape, rounds: usize) -> std::result::Result<(), Error> {
    let env =
        PsEnv::from_env()?.ok_or("DMLC_ROLE is not set: --side node is one process of a job")?;
    let config = env.config.clone().with_sharding(Sharding::Range {
        key_space: Some(2 * shape.keys as u64),
    });
    match env.role {
        PsRole::Scheduler => {
            Scheduler::bind(&env.scheduler, &config)?.run()?;
        }
        PsRole::Server => {
            KvServer::<f32>::join(&env.scheduler, &config, Mode::Sync, Update::Sum)?.run()?;
        }
        PsRole::Worker => {
            let mut w = KvWorker::<f32>::join(&env.scheduler, &config)?;
            let requests = Requests::new(shape);
            requests.push_pull(&mut w)?;
            w.barrier(Group::Workers)?;
            let started = Instant::now();
            for _ in 0..rounds {
                requests.push_pull(&mut w)?;
            }
            let round = started.elapsed().as_secs_f64() / rounds.max(1) as f64;
            if w.rank() == 0 {
                let bytes = (config.num_workers * shape.keys * shape.value_bytes * 2) as f64;
                println!(
                    "push_pull {} B x {} keys: {:.1} us a round, {:.3} GB/s",
                    shape.value_bytes,
                    shape.keys,
                    round * 1e6,
                    bytes / round / 1e9
                );
            }
            w.finish()?;
        }
        _ => return Err("a role this bench does not play".into()),
    }
    Ok(())
}

/// `--instructions`: instructions per round (every worker's request, the servers'
/// work, libzmq's threads) of push_pull beside push then pull and beside a mesh
/// allreduce of the same values, counted by callgrind (see `instructions`).
fn run_instructions(common: &Common) -> Result<()> {
    if !common.json {
        println!(
            "switchyard bench ps --instructions: instructions per round of all {WORKERS} workers \
             and {SERVERS} servers (threads of one process; callgrind)"
        );
        header();
    }
    for value_bytes in [1usize << 10, 1 << 20] {
        if !common.selects(&format!("ps/{value_bytes}")) {
            continue;
        }
        let low = if value_bytes >= 1 << 20 { 3 } else { 10 };
        let counts = instructions::unit_counts(low, common.quick);
        let args = ["--size".to_string(), value_bytes.to_string()];
        let side = |name: &str| instructions::one_side("ps-one", name, &args, counts);
        let (fused, separate, allreduce) =
            (side("push_pull")?, side("push+pull")?, side("allreduce")?);
        let (fused_tcp, fused_zmq, allreduce_shm) = (
            side("push_pull-tcp")?,
            side("push_pull-zmq")?,
            side("allreduce-shm")?,
        );
        let size = value_bytes as u64;
        instructions::unit_row(
            SUITE,
            "push_pull",
            size,
            "round",
            fused,
            separate,
            "push then pull",
        )
        .emit(common.json);
        for (case, ours, theirs, baseline) in [
            ("push_pull/zmq", fused, fused_zmq, "push_pull over ZeroMQ"),
            (
                "push_pull tcp/allreduce",
                fused_tcp,
                allreduce,
                "mesh allreduce, 4 ranks, tcp",
            ),
            (
                "push_pull/allreduce",
                fused,
                allreduce_shm,
                "mesh allreduce, 4 ranks, shm",
            ),
        ] {
            instructions::unit_row(SUITE, case, size, "round", ours, theirs, baseline)
                .emit(common.json);
        }
    }
    Ok(())
}

pub(crate) fn run(common: Common) -> Result<()> {
    if common.instructions {
        return run_instructions(&common);
    }
    let reps = if common.quick { 3 } else { 7 };
    if !common.json {
        println!(
            "switchyard bench ps: {WORKERS} workers, {SERVERS} servers, one host, sync rounds; medians of {reps} repetitions"
        );
        header();
    }
    for value_bytes in [1usize << 10, 1 << 20] {
        if !common.selects(&format!("ps/{value_bytes}")) {
            continue;
        }
        let shape = Shape::new(value_bytes, common.quick);
        // One job and one bare exchange per repetition, alternately, so that a slow
        // spell on a shared machine hits both sides alike.
        let (mut separate, mut fused, mut bare) = (Vec::new(), Vec::new(), Vec::new());
        let (mut fused_tcp, mut fused_zmq) = (Vec::new(), Vec::new());
        let (mut allreduce, mut allreduce_shm) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            for (s, f) in ps_timings(shape, Plane::Shm, 1)? {
                separate.push(s);
                fused.push(f);
            }
            fused_tcp.extend(ps_timings(shape, Plane::Tcp, 1)?.into_iter().map(|t| t.1));
            fused_zmq.extend(ps_timings(shape, Plane::Zmq, 1)?.into_iter().map(|t| t.1));
            bare.extend(bare_timings(shape, 1)?);
            allreduce.extend(allreduce_timings(shape, false, 1)?);
            allreduce_shm.extend(allreduce_timings(shape, true, 1)?);
        }
        let (separate, fused, bare) = (median(separate), median(fused), median(bare));
        let (fused_tcp, fused_zmq) = (median(fused_tcp), median(fused_zmq));
        let (allreduce, allreduce_shm) = (median(allreduce), median(allreduce_shm));
        let size = value_bytes as u64;
        let keys = |secs: f64| shape.keys_moved() / secs;
        let gbps = |secs: f64| shape.bytes_moved() / secs / 1e9;
        let rows = [
            Row::higher_better(
                SUITE,
                "push_pull",
                size,
                "keys/s",
                keys(fused),
                keys(separate),
                "push then pull",
            ),
            Row::higher_better(
                SUITE,
                "push_pull",
                size,
                "GB/s",
                gbps(fused),
                gbps(separate),
                "push then pull",
            ),
            Row::higher_better(
                SUITE,
                "push_pull/bare",
                size,
                "GB/s",
                gbps(fused),
                gbps(bare),
                "bare Dealer/Router exchange",
            ),
            Row::higher_better(
                SUITE,
                "push+pull/bare",
                size,
                "GB/s",
                gbps(separate),
                gbps(bare),
                "bare Dealer/Router exchange",
            ),
            Row::higher_better(
                SUITE,
                "push_pull/zmq",
                size,
                "GB/s",
                gbps(fused),
                gbps(fused_zmq),
                "push_pull over ZeroMQ",
            ),
            Row::higher_better(
                SUITE,
                "push_pull tcp/allreduce",
                size,
                "GB/s",
                gbps(fused_tcp),
                gbps(allreduce),
                "mesh allreduce, 4 ranks, tcp",
            ),
            Row::higher_better(
                SUITE,
                "push_pull/allreduce",
                size,
                "GB/s",
                gbps(fused),
                gbps(allreduce_shm),
                "mesh allreduce, 4 ranks, shm",
            ),
        ];
        for row in rows {
            row.emit(common.json);
        }
    }
    Ok(())
}
