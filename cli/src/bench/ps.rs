//! `switchyard bench ps`: the parameter server's push+pull against its fused
//! push_pull, and both against a bare Dealer/Router exchange of the same bytes.
//!
//! One job of 4 workers, 2 servers and a scheduler, as threads of this process over
//! `tcp://127.0.0.1` (so every byte crosses the loopback as it would between
//! processes). Each request carries 32 keys of 1 KiB, or one key of 1 MiB (split over
//! both servers); servers sum the four workers' pushes of each round (sync mode).
//! Every repetition times both forms in the same job, one after the other, on keys of
//! their own, then the baseline; the figures are medians over repetitions. The baseline exchange has the same shape without the parameter server:
//! each worker sends each server its half of the bytes, each server answers all four
//! once it has heard from all four, with as many bytes back.
//!
//! A last row puts the fused push_pull beside the collective way to sum the same
//! gradients: 4 ranks of a mesh (threads, as the workers are) allreducing each
//! worker's values, over TCP loopback like the parameter server's sockets (shared
//! memory off), each round on a fresh copy of the values as a worker's push gets.

use super::report::header;
use super::{Common, Row, median};
use bytes::Bytes;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::{CommOptions, Communicator, ReduceOp};
use switchyard::prelude::*;
use switchyard::ps::{Group, KvServer, KvWorker, Mode, PsConfig, Scheduler, Sharding, Update};

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

/// Per repetition: seconds for push then pull, seconds for push_pull (worker 0's).
fn ps_timings(shape: Shape, reps: usize) -> Result<Vec<(f64, f64)>> {
    // Even keys for push+pull, odd keys for push_pull: a range of 2k keys puts half
    // of each set on each server.
    let space = 2 * shape.keys as u64;
    let config = PsConfig::new(WORKERS, SERVERS).with_sharding(Sharding::Range {
        key_space: Some(space),
    });
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
            let (e, c) = (endpoint.clone(), config.clone());
            thread::spawn(move || worker_timings(&e, &c, shape, reps).map_err(|e| e.to_string()))
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
    sched
        .join()
        .map_err(|_| "the scheduler thread panicked")??;
    first.ok_or_else(|| "no worker".into())
}

fn worker_timings(
    endpoint: &str,
    config: &PsConfig,
    shape: Shape,
    reps: usize,
) -> std::result::Result<Vec<(f64, f64)>, Error> {
    let mut w = KvWorker::<f32>::join(endpoint, config)?;
    let even: Vec<u64> = (0..shape.keys as u64).map(|k| 2 * k).collect();
    let odd: Vec<u64> = even.iter().map(|k| k + 1).collect();
    let lens = vec![shape.floats(); shape.keys];
    let template = vec![1.0f32; shape.floats() * shape.keys];
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        w.barrier(Group::Workers)?;
        let started = Instant::now();
        for _ in 0..shape.iters {
            w.push(&even, &lens, template.clone())?;
            std::hint::black_box(w.pull(&even)?);
        }
        let separate = started.elapsed().as_secs_f64();
        w.barrier(Group::Workers)?;
        let started = Instant::now();
        for _ in 0..shape.iters {
            std::hint::black_box(w.push_pull(&odd, &lens, template.clone())?);
        }
        out.push((separate, started.elapsed().as_secs_f64()));
    }
    w.finish()?;
    Ok(out)
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

/// Seconds for `shape.iters` allreduces of a worker's values among 4 mesh ranks over
/// TCP loopback, per repetition (rank 0's).
fn allreduce_timings(shape: Shape, reps: usize) -> Result<Vec<f64>> {
    let n = WORKERS as usize;
    let exchange = MemoryExchange::new(n);
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let exchange = exchange.clone();
            thread::spawn(move || -> std::result::Result<Vec<f64>, String> {
                let options = CommOptions::default()
                    .with_shared_memory(false)
                    .with_timeout(WAIT);
                let bootstrap = Bootstrap::from_exchange(rank, n, exchange);
                let mut comm =
                    Communicator::join(&bootstrap, options).map_err(|e| e.to_string())?;
                let template = vec![1.0f32; shape.floats() * shape.keys];
                let mut out = Vec::with_capacity(reps);
                for _ in 0..reps {
                    comm.barrier().map_err(|e| e.to_string())?;
                    let started = Instant::now();
                    for _ in 0..shape.iters {
                        let mut values = template.clone();
                        comm.allreduce(&mut values, ReduceOp::Sum)
                            .map_err(|e| e.to_string())?;
                        std::hint::black_box(values);
                    }
                    out.push(started.elapsed().as_secs_f64());
                }
                Ok(out)
            })
        })
        .collect();
    let mut first = None;
    for r in ranks {
        let timings = r.join().map_err(|_| "a rank thread panicked")??;
        first.get_or_insert(timings);
    }
    first.ok_or_else(|| "no rank".into())
}

pub(crate) fn run(common: Common) -> Result<()> {
    let reps = if common.quick { 3 } else { 7 };
    if !common.json {
        println!(
            "switchyard bench ps: {WORKERS} workers, {SERVERS} servers, tcp loopback, sync rounds; medians of {reps} repetitions"
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
        let mut allreduce = Vec::new();
        for _ in 0..reps {
            for (s, f) in ps_timings(shape, 1)? {
                separate.push(s);
                fused.push(f);
            }
            bare.extend(bare_timings(shape, 1)?);
            allreduce.extend(allreduce_timings(shape, 1)?);
        }
        let (separate, fused, bare) = (median(separate), median(fused), median(bare));
        let allreduce = median(allreduce);
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
                "push_pull/allreduce",
                size,
                "GB/s",
                gbps(fused),
                gbps(allreduce),
                "mesh allreduce, 4 ranks, tcp",
            ),
        ];
        for row in rows {
            row.emit(common.json);
        }
    }
    Ok(())
}
