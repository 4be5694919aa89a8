//! Singa-style parameter server over several processes on this machine.
//!
//! Worker threads `Get` parameter shards from server threads, then for a number of
//! steps send `Update`s carrying gradients; a server averages the gradients of all
//! workers for a parameter, applies them, and `Put`s the new value back to every
//! worker. Worker `k` fits its own target `t_k`, and the targets average to `t`, so the
//! synchronous run has a closed form every worker checks at the end:
//! `w_T = t * (1 - (1 - lr)^T)` (starting from `w_0 = 0`).
//!
//! Run with no setup; it launches its own processes (two worker processes of two
//! workers each, one process with two servers):
//!
//! ```text
//! cargo run --release --example param_server
//! cargo run --release --example param_server -- --workers 6 --servers 3 --steps 50
//! ```
//!
//! Or, built with the MPI backend, under `mpirun` (the flags OpenMPI needs as root in a
//! container and on a machine with fewer cores than ranks):
//!
//! ```text
//! cargo build --release --features mpi --example param_server
//! mpirun --allow-run-as-root --oversubscribe -np 3 target/release/examples/param_server
//! ```
//!
//! Exits non-zero if any number fails to check out.

use std::process::ExitCode;
use std::time::Duration;
use switchyard::bootstrap::Bootstrap;
use switchyard::prelude::*;
use switchyard_launch::{LaunchOptions, run_local};

const WAIT: Duration = Duration::from_secs(30);
const LEARNING_RATE: f32 = 0.5;

#[derive(Clone, Copy, Debug)]
struct Config {
    workers: u32,
    servers: u32,
    params: u32,
    dim: usize,
    steps: u64,
}

fn parse_args() -> Result<Config, String> {
    let mut config = Config {
        workers: 4,
        servers: 2,
        params: 8,
        dim: 4096,
        steps: 30,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--workers" => config.workers = number(&value)? as u32,
            "--servers" => config.servers = number(&value)? as u32,
            "--params" => config.params = number(&value)? as u32,
            "--dim" => config.dim = number(&value)? as usize,
            "--steps" => config.steps = number(&value)?,
            _ => {
                return Err(format!(
                    "unknown flag {flag}; flags: --workers --servers --params --dim --steps"
                ));
            }
        }
    }
    if config.workers == 0 || config.servers == 0 || config.params == 0 {
        return Err("--workers, --servers and --params must be at least 1".into());
    }
    Ok(config)
}

fn layout(config: &Config) -> ClusterLayout {
    ClusterLayout::new(1, config.workers, 1, config.servers)
        .with_workers_per_process(2)
        .with_servers_per_process(2)
}

/// Worker `k`'s target for parameter `p`: spread around the common target so that
/// only the average over workers converges to `common_target`.
fn target(config: &Config, worker: u32, param: u32) -> Vec<f32> {
    let offset = worker as f32 - (config.workers as f32 - 1.0) / 2.0;
    (0..config.dim)
        .map(|i| common_target(param, i) + 0.25 * offset)
        .collect()
}

fn common_target(param: u32, i: usize) -> f32 {
    ((param as usize * 7919 + i) as f32 * 0.001).sin()
}

fn server_of(config: &Config, param: u32) -> Addr {
    Addr::server(0, param % config.servers)
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn worker(config: Config, mut socket: StubSocket) -> Result<f32, Error> {
    let me = socket.addr();
    let targets: Vec<Vec<f32>> = (0..config.params)
        .map(|p| target(&config, me.id, p))
        .collect();
    let mut weights: Vec<Vec<f32>> = vec![Vec::new(); config.params as usize];
    for p in 0..config.params {
        socket
            .send(Msg::new(me, server_of(&config, p), Kind::Get).with_target(Target::Param(p)))?;
    }
    let receive_all =
        |socket: &mut StubSocket, weights: &mut Vec<Vec<f32>>, seq: u64| -> Result<(), Error> {
            for _ in 0..config.params {
                let put = socket.recv_timeout(WAIT)?;
                let Target::Param(p) = put.header.target else {
                    return Err(format!("{me}: Put without a parameter target").into());
                };
                if put.header.kind != Kind::Put || put.header.seq != seq {
                    return Err(format!(
                        "{me}: expected Put seq {seq}, got {:?} seq {}",
                        put.header.kind, put.header.seq
                    )
                    .into());
                }
                weights[p as usize] = payload::frame_to_vec::<f32>(&put.frames()[0])?;
            }
            Ok(())
        };
    receive_all(&mut socket, &mut weights, 0)?;
    for step in 0..config.steps {
        for p in 0..config.params {
            let grad: Vec<f32> = weights[p as usize]
                .iter()
                .zip(&targets[p as usize])
                .map(|(w, t)| w - t)
                .collect();
            let update = Msg::new(me, server_of(&config, p), Kind::Update)
                .with_target(Target::Param(p))
                .with_seq(step)
                .with_frame(payload::frame_from_vec(grad));
            socket.send(update)?;
        }
        receive_all(&mut socket, &mut weights, step + 1)?;
    }
    let shrink = 1.0 - (1.0 - LEARNING_RATE).powi(config.steps as i32);
    let mut worst = 0.0f32;
    for p in 0..config.params {
        for (i, w) in weights[p as usize].iter().enumerate() {
            worst = worst.max((w - common_target(p, i) * shrink).abs());
        }
    }
    for s in 0..config.servers {
        socket.send(Msg::new(me, Addr::server(0, s), Kind::Stop))?;
    }
    if worst > 1e-4 {
        return Err(format!("{me}: weights off the closed form by {worst}").into());
    }
    Ok(worst)
}

struct Shard {
    value: Vec<f32>,
    sum: Vec<f32>,
    count: u32,
}

fn server(config: Config, mut socket: StubSocket) -> Result<u64, Error> {
    let me = socket.addr();
    let mut shards: std::collections::HashMap<u32, Shard> = (0..config.params)
        .filter(|p| server_of(&config, *p) == me)
        .map(|p| {
            (
                p,
                Shard {
                    value: vec![0.0; config.dim],
                    sum: vec![0.0; config.dim],
                    count: 0,
                },
            )
        })
        .collect();
    let mut stops = 0;
    let mut updates = 0u64;
    while stops < config.workers {
        let msg = socket.recv_timeout(WAIT)?;
        let param = match msg.header.target {
            Target::Param(p) => p,
            _ => 0,
        };
        match msg.header.kind {
            Kind::Stop => stops += 1,
            Kind::Get => {
                let shard = shards
                    .get(&param)
                    .ok_or_else(|| format!("{me}: no parameter {param}"))?;
                let reply = msg
                    .reply(Kind::Put)
                    .with_frame(payload::frame_from_slice(&shard.value));
                socket.send(reply)?;
            }
            Kind::Update => {
                updates += 1;
                let shard = shards
                    .get_mut(&param)
                    .ok_or_else(|| format!("{me}: no parameter {param}"))?;
                let grad = payload::frame_as_slice::<f32>(&msg.frames()[0])
                    .map(<[f32]>::to_vec)
                    .or_else(|_| payload::frame_to_vec::<f32>(&msg.frames()[0]))?;
                if grad.len() != shard.sum.len() {
                    return Err(format!(
                        "{me}: gradient of {} values for {} weights",
                        grad.len(),
                        shard.sum.len()
                    )
                    .into());
                }
                shard.sum.iter_mut().zip(&grad).for_each(|(s, g)| *s += g);
                shard.count += 1;
                if shard.count == config.workers {
                    let scale = LEARNING_RATE / config.workers as f32;
                    shard
                        .value
                        .iter_mut()
                        .zip(&shard.sum)
                        .for_each(|(w, s)| *w -= scale * s);
                    shard.sum.iter_mut().for_each(|s| *s = 0.0);
                    shard.count = 0;
                    // One frame shared by every reply: cloning it copies no data.
                    let frame = payload::frame_from_slice(&shard.value);
                    for k in 0..config.workers {
                        let put = Msg::new(me, Addr::worker(0, k), Kind::Put)
                            .with_target(Target::Param(param))
                            .with_seq(msg.header.seq + 1)
                            .with_frame(frame.clone());
                        socket.send(put)?;
                    }
                }
            }
            other => return Err(format!("{me}: unexpected {other:?}").into()),
        }
    }
    Ok(updates)
}

fn run_process(config: Config, boot: Bootstrap) -> Result<(), Error> {
    let layout = layout(&config);
    let needed = layout.num_processes()?;
    if needed != boot.world_size as usize {
        return Err(format!(
            "this layout needs {needed} processes, the job has {} (mpirun -np {needed})",
            boot.world_size
        )
        .into());
    }
    let bound = Stub::bind(
        layout,
        boot.rank as usize,
        &boot.stub_endpoint(),
        SocketOptions::default(),
    )?;
    let endpoints = boot.exchange(bound.endpoint(), Duration::from_secs(60))?;
    let stub = bound.start(endpoints)?;
    let mut threads = Vec::new();
    for &addr in stub.local_addresses() {
        let socket = stub.socket(addr)?;
        threads.push(std::thread::spawn(move || -> Result<String, Error> {
            Ok(match addr.role {
                Role::Worker => format!(
                    "{addr}: converged, max error {:.2e}",
                    worker(config, socket)?
                ),
                _ => format!("{addr}: applied {} updates", server(config, socket)?),
            })
        }));
    }
    for thread in threads {
        let line = thread.join().map_err(|_| "a thread panicked")??;
        println!("{line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let config = match parse_args() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("param_server: {e}");
            return ExitCode::from(2);
        }
    };
    let result: Result<(), Error> = match Bootstrap::from_env() {
        Ok(Some(boot)) => run_process(config, boot),
        Ok(None) => (|| {
            let processes = layout(&config).num_processes()? as u32;
            let program = std::env::current_exe()?.to_string_lossy().into_owned();
            println!(
                "param_server: {} workers, {} servers, {} parameters of {} floats, {} steps, {processes} processes",
                config.workers, config.servers, config.params, config.dim, config.steps
            );
            let options = LaunchOptions::new(processes, program)
                .with_args(std::env::args().skip(1).collect())
                .with_timeout(Duration::from_secs(300));
            run_local(&options)?;
            println!("param_server: every worker matched the closed form");
            Ok(())
        })(),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("param_server: {e}");
            ExitCode::FAILURE
        }
    }
}
