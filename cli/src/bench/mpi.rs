//! `switchyard bench mpi`: our Dealer/Router over MPI against raw `MPI_Send`/`MPI_Recv`
//! of the same sizes, in the same two-rank job.
//!
//! Rank 1 holds the dealer, rank 0 the router and the report. Raw MPI runs on the
//! main thread over `MPI_COMM_WORLD` (MPI granted `MPI_THREAD_MULTIPLE`) while the
//! backend's progress thread uses its own duplicate communicator, so the two never
//! match each other's messages.

use super::report::header;
use super::{Common, Row, median};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Destination as _, Source as _};
use std::time::{Duration, Instant};
use switchyard::prelude::*;
use switchyard::transports::PeerId;
use switchyard::transports::mpi::{ThreadLevel, world};

const SUITE: &str = "mpi";
const SIZES: [usize; 4] = [64, 1024, 64 * 1024, 1024 * 1024];
const WAIT: Duration = Duration::from_secs(60);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Variables by which MPI launchers mark their processes.
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"];

/// Starts `mpirun -np 2` on this same command line and waits for it.
fn relaunch() -> Result<()> {
    let exe = std::env::current_exe()?;
    let status = switchyard_mpirun::command(2)
        .arg(exe)
        .args(std::env::args().skip(1))
        .status()
        .map_err(|e| {
            format!("cannot start mpirun ({e}): install an MPI (apt install openmpi-bin) or run this under your MPI launcher")
        })?;
    if !status.success() {
        return Err(format!("mpirun -np 2 exited with {status}").into());
    }
    Ok(())
}

/// Messages per repetition: about 64 MiB of payload, between 200 and 100k messages.
fn count_for(size: usize, quick: bool) -> usize {
    let n = ((64usize << 20) / size).clamp(200, 100_000);
    if quick { (n / 4).max(200) } else { n }
}

fn probe(size: usize) -> Msg {
    Msg::new(Addr::worker(1, 0), Addr::server(0, 0), Kind::Update)
        .with_frame(payload::frame_from_vec(vec![7u8; size]))
}

/// The two ends of the job: rank 0's router (with its one peer) or rank 1's dealer.
enum End {
    Router(RouterSocket, PeerId),
    Dealer(DealerSocket),
}

struct Job {
    raw: SimpleCommunicator,
    rank: u32,
    end: End,
}

impl Job {
    fn start() -> Result<Job> {
        let world = world()?;
        if world.size != 2 {
            return Err(format!("bench mpi runs on 2 ranks, not {}", world.size).into());
        }
        if world.thread_level != ThreadLevel::Multiple {
            return Err(format!(
                "the raw-MPI baseline calls MPI beside the progress thread and needs \
                 MPI_THREAD_MULTIPLE; this MPI granted {:?}",
                world.thread_level
            )
            .into());
        }
        let end = if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", SocketOptions::default())?;
            router.await_peers(1, WAIT)?;
            let peer = router.peers().pop().ok_or("no peer")?;
            End::Router(router, peer)
        } else {
            End::Dealer(DealerSocket::connect("mpi://0", SocketOptions::default())?)
        };
        Ok(Job {
            raw: SimpleCommunicator::world(),
            rank: world.rank,
            end,
        })
    }

    /// Seconds rank 0 takes to receive `count` messages that rank 1 sends.
    fn ours_stream(&mut self, size: usize, count: usize) -> Result<f64> {
        self.raw.barrier();
        let started = Instant::now();
        match &mut self.end {
            End::Router(router, _) => {
                for _ in 0..count {
                    router.recv_timeout(WAIT)?;
                }
            }
            End::Dealer(dealer) => {
                let msg = probe(size);
                for _ in 0..count {
                    dealer.send(msg.clone())?;
                }
            }
        }
        let secs = started.elapsed().as_secs_f64();
        self.raw.barrier();
        Ok(secs)
    }

    fn raw_stream(&mut self, size: usize, count: usize) -> Result<f64> {
        let mut buffer = vec![7u8; size];
        self.raw.barrier();
        let started = Instant::now();
        if self.rank == 0 {
            let sender = self.raw.process_at_rank(1);
            for _ in 0..count {
                sender.receive_into(&mut buffer[..]);
            }
        } else {
            let receiver = self.raw.process_at_rank(0);
            for _ in 0..count {
                receiver.send(&buffer[..]);
            }
        }
        let secs = started.elapsed().as_secs_f64();
        self.raw.barrier();
        Ok(secs)
    }

    /// Mean round trip in microseconds: rank 0 sends, rank 1 answers.
    fn ours_round_trip(&mut self, size: usize, rounds: usize) -> Result<f64> {
        self.raw.barrier();
        let started = Instant::now();
        match &mut self.end {
            End::Router(router, peer) => {
                let msg = probe(size);
                for _ in 0..rounds {
                    router.send_to(peer, msg.clone())?;
                    router.recv_timeout(WAIT)?;
                }
            }
            End::Dealer(dealer) => {
                for _ in 0..rounds {
                    let msg = dealer.recv_timeout(WAIT)?;
                    dealer.send(msg)?;
                }
            }
        }
        let micros = started.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        self.raw.barrier();
        Ok(micros)
    }

    fn raw_round_trip(&mut self, size: usize, rounds: usize) -> Result<f64> {
        let mut buffer = vec![7u8; size];
        self.raw.barrier();
        let started = Instant::now();
        let other = self.raw.process_at_rank(1 - self.rank as i32);
        for _ in 0..rounds {
            if self.rank == 0 {
                other.send(&buffer[..]);
                other.receive_into(&mut buffer[..]);
            } else {
                other.receive_into(&mut buffer[..]);
                other.send(&buffer[..]);
            }
        }
        let micros = started.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        self.raw.barrier();
        Ok(micros)
    }

    /// CPU use (percent of one core) of this whole process while it waits `window`
    /// for a message with our sockets: the progress thread is all that runs.
    fn ours_idle(&mut self, window: Duration) -> Result<f64> {
        self.raw.barrier();
        let before = process_cpu()?;
        let started = Instant::now();
        match &mut self.end {
            End::Router(router, peer) => {
                router.recv_timeout(WAIT)?;
                router.send_to(peer, probe(0))?;
            }
            End::Dealer(dealer) => {
                std::thread::sleep(window);
                dealer.send(probe(0))?;
                dealer.recv_timeout(WAIT)?;
            }
        }
        let percent = cpu_percent(before, started)?;
        self.raw.barrier();
        Ok(percent)
    }

    /// The same wait in a blocking `MPI_Recv`.
    fn raw_idle(&mut self, window: Duration) -> Result<f64> {
        let mut byte = [0u8; 1];
        self.raw.barrier();
        let before = process_cpu()?;
        let started = Instant::now();
        let other = self.raw.process_at_rank(1 - self.rank as i32);
        if self.rank == 0 {
            other.receive_into(&mut byte[..]);
            other.send(&byte[..]);
        } else {
            std::thread::sleep(window);
            other.send(&byte[..]);
            other.receive_into(&mut byte[..]);
        }
        let percent = cpu_percent(before, started)?;
        self.raw.barrier();
        Ok(percent)
    }

    /// Rank 0's figures; rank 1 returns whatever it measured, which is not reported.
    fn is_reporter(&self) -> bool {
        self.rank == 0
    }
}

/// CPU time of every thread of this process so far (Linux `schedstat`, nanoseconds).
fn process_cpu() -> Result<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task")? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .ok_or("unreadable /proc/self/task/*/schedstat")?;
    }
    Ok(Duration::from_nanos(total))
}

fn cpu_percent(before: Duration, started: Instant) -> Result<f64> {
    let used = process_cpu()?.saturating_sub(before);
    Ok(100.0 * used.as_secs_f64() / started.elapsed().as_secs_f64())
}

/// Runs our side and the raw side alternately `reps` times on the job and returns
/// both medians (the job is shared, so [`super::paired`]'s two closures cannot be).
fn alternate(
    job: &mut Job,
    reps: usize,
    ours: impl Fn(&mut Job) -> Result<f64>,
    raw: impl Fn(&mut Job) -> Result<f64>,
) -> Result<(f64, f64)> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        a.push(ours(job)?);
        b.push(raw(job)?);
    }
    Ok((median(a), median(b)))
}

pub(crate) fn run(common: Common) -> Result<()> {
    if !LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
        return relaunch();
    }
    let common = &common;
    let mut job = Job::start()?;
    let reps = if common.quick { 3 } else { 7 };
    let report = job.is_reporter();
    if report && !common.json {
        println!("switchyard bench mpi: 2 ranks, medians of {reps} alternating repetitions");
        header();
    }
    let emit = |row: Row| {
        if report {
            row.emit(common.json)
        }
    };
    const RAW: &str = "raw MPI_Send/MPI_Recv";
    for size in SIZES {
        if !common.selects(&format!("rate/{size}")) {
            continue;
        }
        let count = count_for(size, common.quick);
        let (ours, raw) = alternate(
            &mut job,
            reps,
            |job| job.ours_stream(size, count),
            |job| job.raw_stream(size, count),
        )?;
        let rate = |secs: f64| count as f64 / secs;
        emit(Row::higher_better(
            SUITE,
            "rate",
            size as u64,
            "msg/s",
            rate(ours),
            rate(raw),
            RAW,
        ));
        if size >= 64 * 1024 {
            let gbps = |secs: f64| (count * size) as f64 / secs / 1e9;
            emit(Row::higher_better(
                SUITE,
                "bandwidth",
                size as u64,
                "GB/s",
                gbps(ours),
                gbps(raw),
                RAW,
            ));
        }
    }
    for size in [64usize, 64 * 1024] {
        if !common.selects(&format!("rtt/{size}")) {
            continue;
        }
        let rounds = match (size, common.quick) {
            (64, false) => 20_000,
            (64, true) => 4_000,
            (_, false) => 4_000,
            (_, true) => 1_000,
        };
        let (ours, raw) = alternate(
            &mut job,
            reps,
            |job| job.ours_round_trip(size, rounds),
            |job| job.raw_round_trip(size, rounds),
        )?;
        emit(Row::lower_better(
            SUITE,
            "rtt",
            size as u64,
            "us",
            ours,
            raw,
            RAW,
        ));
    }
    if common.selects("idle-cpu") {
        let window = if common.quick {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(2)
        };
        let (ours, raw) = alternate(
            &mut job,
            reps.min(3),
            |job| job.ours_idle(window),
            |job| job.raw_idle(window),
        )?;
        emit(Row::lower_better(
            SUITE,
            "idle-cpu",
            0,
            "% of core",
            ours,
            raw,
            "blocking MPI_Recv",
        ));
    }
    Ok(())
}
