//! `switchyard bench transport`: what our sockets cost over the raw library under them.

use super::report::header;
use super::{Common, Row, TransportOneArgs, instructions, median, paired};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};
use switchyard::prelude::*;

const SUITE: &str = "transport";
const SIZES: [usize; 4] = [64, 1024, 64 * 1024, 1024 * 1024];
const WAIT: Duration = Duration::from_secs(60);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Messages per repetition: about 128 MiB of payload, between 256 and 200k messages.
fn count_for(size: usize, quick: bool) -> usize {
    let n = ((128usize << 20) / size).clamp(256, 200_000);
    if quick { (n / 4).max(256) } else { n }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    Local,
    Inproc,
    Tcp,
}

impl Transport {
    fn bind_endpoint(self) -> String {
        match self {
            Transport::Local => format!("local://{}", unique("local")),
            Transport::Inproc => format!("inproc://{}", unique("inproc")),
            Transport::Tcp => "tcp://127.0.0.1:0".into(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Inproc => "inproc",
            Transport::Tcp => "tcp",
        }
    }
}

fn probe_msg() -> Msg {
    Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Update).with_target(Target::Param(1))
}

/// A bound router and a dealer connected to it (connected from another thread, since
/// a dealer waits for the router's READY).
fn pair(transport: Transport) -> Result<(RouterSocket, DealerSocket)> {
    let mut router = RouterSocket::bind(&transport.bind_endpoint(), SocketOptions::default())?;
    let endpoint = router.endpoint().to_string();
    let connecting = thread::spawn(move || {
        DealerSocket::connect(&endpoint, SocketOptions::default()).map_err(|e| e.to_string())
    });
    router.await_peers(1, WAIT)?;
    let dealer = connecting.join().map_err(|_| "connect thread panicked")??;
    Ok((router, dealer))
}

/// Dealer -> router: seconds to move `count` messages of `size` bytes through our sockets.
fn ours_rate(transport: Transport, size: usize, count: usize) -> Result<f64> {
    let (mut router, mut dealer) = pair(transport)?;
    let frame = Bytes::from(vec![0xa5u8; size]);
    let start = Instant::now();
    let sender = thread::spawn(move || -> std::result::Result<(), String> {
        for seq in 0..count as u64 {
            dealer
                .send(probe_msg().with_seq(seq).with_frame(frame.clone()))
                .map_err(|e| e.to_string())?;
        }
        // Keep the dealer open until the router has everything.
        thread::sleep(Duration::from_millis(1));
        dealer
            .recv_timeout(WAIT)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let mut peer = None;
    for _ in 0..count {
        let (from, msg) = router.recv_from_timeout(WAIT)?;
        std::hint::black_box(msg.frames()[0].len());
        peer = Some(from);
    }
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(peer) = peer {
        router.send_to(&peer, probe_msg())?;
    }
    sender.join().map_err(|_| "sender panicked")??;
    Ok(elapsed)
}

/// A raw libzmq ROUTER and a DEALER connected to it, with the same high-water marks as
/// our sockets' default. The context is returned so that it outlives the sockets.
fn raw_zmq_pair(transport: Transport) -> Result<(zmq::Context, zmq::Socket, zmq::Socket)> {
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER)?;
    router.set_rcvhwm(1000)?;
    router.set_sndhwm(1000)?;
    let endpoint = match transport {
        Transport::Inproc => {
            let e = format!("inproc://{}", unique("raw"));
            router.bind(&e)?;
            e
        }
        _ => {
            router.bind("tcp://127.0.0.1:*")?;
            router
                .get_last_endpoint()?
                .map_err(|_| "endpoint not UTF-8")?
        }
    };
    let dealer = ctx.socket(zmq::DEALER)?;
    dealer.set_sndhwm(1000)?;
    dealer.set_rcvhwm(1000)?;
    dealer.connect(&endpoint)?;
    Ok((ctx, router, dealer))
}

/// The same over raw libzmq: two frames per message (a header-sized frame and the
/// payload), sent with `zmq::Socket::send` and received into `zmq::Message`s.
fn raw_zmq_rate(transport: Transport, size: usize, count: usize) -> Result<f64> {
    let (_ctx, router, dealer) = raw_zmq_pair(transport)?;
    let header = [0x53u8; 60];
    let payload = vec![0xa5u8; size];
    let start = Instant::now();
    let sender = thread::spawn(move || -> std::result::Result<(), zmq::Error> {
        for _ in 0..count {
            dealer.send(&header[..], zmq::SNDMORE)?;
            dealer.send(&payload[..], 0)?;
        }
        dealer.recv_msg(0).map(|_| ())
    });
    let mut part = zmq::Message::new();
    let mut identity = zmq::Message::new();
    for _ in 0..count {
        router.recv(&mut identity, 0)?;
        router.recv(&mut part, 0)?;
        router.recv(&mut part, 0)?;
        std::hint::black_box(part.len());
    }
    let elapsed = start.elapsed().as_secs_f64();
    router.send(&identity[..], zmq::SNDMORE)?;
    router.send(&b"done"[..], 0)?;
    sender.join().map_err(|_| "sender panicked")??;
    Ok(elapsed)
}

/// A bare bounded crossbeam channel carrying the same `Msg`s: the floor under `local`.
fn crossbeam_rate(size: usize, count: usize) -> Result<f64> {
    let (tx, rx) = crossbeam_channel::bounded::<Msg>(1000);
    let frame = Bytes::from(vec![0xa5u8; size]);
    let start = Instant::now();
    let sender = thread::spawn(move || {
        for seq in 0..count as u64 {
            if tx
                .send(probe_msg().with_seq(seq).with_frame(frame.clone()))
                .is_err()
            {
                break;
            }
        }
    });
    for _ in 0..count {
        let msg = rx.recv_timeout(WAIT)?;
        std::hint::black_box(msg.frames()[0].len());
    }
    let elapsed = start.elapsed().as_secs_f64();
    sender.join().map_err(|_| "sender panicked")?;
    Ok(elapsed)
}

/// Median round trip of a 64 B message over our sockets, in microseconds.
fn ours_rtt(transport: Transport, rounds: usize) -> Result<f64> {
    let (mut router, mut dealer) = pair(transport)?;
    let echo = thread::spawn(move || -> std::result::Result<(), String> {
        for _ in 0..rounds {
            let (peer, msg) = router.recv_from_timeout(WAIT).map_err(|e| e.to_string())?;
            router.send_to(&peer, msg).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let frame = Bytes::from(vec![1u8; 64]);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        dealer.send(probe_msg().with_frame(frame.clone()))?;
        dealer.recv_timeout(WAIT)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().map_err(|_| "echo panicked")??;
    Ok(median(samples))
}

/// The same round trip over raw libzmq.
fn raw_zmq_rtt(transport: Transport, rounds: usize) -> Result<f64> {
    let (_ctx, router, dealer) = raw_zmq_pair(transport)?;
    let echo = thread::spawn(move || -> std::result::Result<(), zmq::Error> {
        for _ in 0..rounds {
            let parts = router.recv_multipart(0)?;
            router.send_multipart(parts, 0)?;
        }
        Ok(())
    });
    let header = [0x53u8; 60];
    let payload = [1u8; 64];
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        dealer.send(&header[..], zmq::SNDMORE)?;
        dealer.send(&payload[..], 0)?;
        dealer.recv_multipart(0)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().map_err(|_| "echo panicked")??;
    Ok(median(samples))
}

/// Median round trip over a bare crossbeam channel pair: the cost of waking a blocked
/// thread twice, the floor under every in-process hop.
fn crossbeam_rtt(rounds: usize) -> Result<f64> {
    let (to_echo, echo_rx) = crossbeam_channel::bounded::<Msg>(1000);
    let (to_main, main_rx) = crossbeam_channel::bounded::<Msg>(1000);
    let echo = thread::spawn(move || {
        for _ in 0..rounds {
            let Ok(msg) = echo_rx.recv_timeout(WAIT) else {
                break;
            };
            if to_main.send(msg).is_err() {
                break;
            }
        }
    });
    let frame = Bytes::from(vec![1u8; 64]);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        to_echo.send(probe_msg().with_frame(frame.clone()))?;
        main_rx.recv_timeout(WAIT)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().map_err(|_| "echo panicked")?;
    Ok(median(samples))
}

/// Median round trip between a worker and a server in two stubs linked over tcp
/// loopback (both stubs in this process; the path is the same as across processes).
fn stub_rtt(rounds: usize, recv_spin: Duration) -> Result<f64> {
    let layout = ClusterLayout::new(1, 1, 1, 1);
    let a = Stub::bind(
        layout.clone(),
        0,
        "tcp://127.0.0.1:0",
        SocketOptions::default().with_recv_spin(recv_spin),
    )?;
    let b = Stub::bind(
        layout,
        1,
        "tcp://127.0.0.1:0",
        SocketOptions::default().with_recv_spin(recv_spin),
    )?;
    let endpoints = vec![a.endpoint().to_string(), b.endpoint().to_string()];
    let a = a.start(endpoints.clone())?;
    let b = b.start(endpoints)?;
    let mut worker = a.worker(0, 0)?;
    let mut server = b.server(0, 0)?;
    let echo = thread::spawn(move || -> std::result::Result<(), String> {
        for _ in 0..rounds + 1 {
            let msg = server.recv_timeout(WAIT).map_err(|e| e.to_string())?;
            let reply = msg.reply(Kind::Put).with_frame(msg.frames()[0].clone());
            server.send(reply).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let frame = Bytes::from(vec![1u8; 64]);
    // The first message opens the worker's connection to the server's process.
    worker.send(probe_msg().with_frame(frame.clone()))?;
    worker.recv_timeout(WAIT)?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        worker.send(probe_msg().with_frame(frame.clone()))?;
        worker.recv_timeout(WAIT)?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().map_err(|_| "echo panicked")??;
    Ok(median(samples))
}

impl Transport {
    fn from_name(name: &str) -> Result<Transport> {
        match name {
            "local" => Ok(Transport::Local),
            "inproc" => Ok(Transport::Inproc),
            "tcp" => Ok(Transport::Tcp),
            other => Err(format!("unknown transport {other:?} (local, inproc, tcp)").into()),
        }
    }
}

/// One side of one rate case, once: what `--instructions` counts under callgrind.
pub(crate) fn run_one(args: &TransportOneArgs) -> Result<()> {
    let transport = Transport::from_name(&args.transport)?;
    match (args.side.as_str(), transport) {
        ("ours", t) => ours_rate(t, args.size, args.count)?,
        ("baseline", Transport::Local) => crossbeam_rate(args.size, args.count)?,
        ("baseline", t) => raw_zmq_rate(t, args.size, args.count)?,
        (other, _) => return Err(format!("unknown side {other:?} (ours, baseline)").into()),
    };
    Ok(())
}

/// `--instructions`: instructions per message of the 64 B and 1 KiB rate cases, ours
/// beside the baseline (see `instructions`).
fn run_instructions(common: &Common) -> Result<()> {
    if !common.json {
        println!(
            "switchyard bench transport --instructions: instructions per message (callgrind; every thread of the process)"
        );
        header();
    }
    for transport in [Transport::Local, Transport::Inproc, Transport::Tcp] {
        for size in [64usize, 1024] {
            let case = format!("rate/{}", transport.name());
            if !common.selects(&format!("{case}/{size}")) {
                continue;
            }
            let args =
                ["--transport", transport.name(), "--size", &size.to_string()].map(String::from);
            let (ours, base) = instructions::both_sides("transport-one", &args, common.quick)?;
            let baseline_name = match transport {
                Transport::Local => "bare crossbeam channel".to_string(),
                t => format!("raw libzmq {}", t.name()),
            };
            instructions::row(SUITE, &case, size as u64, ours, base, &baseline_name)
                .emit(common.json);
        }
    }
    Ok(())
}

/// Runs `ours` and `baseline` alternately `reps` times and returns both medians.
pub(crate) fn run(common: Common) -> Result<()> {
    let common = &common;
    if common.instructions {
        return run_instructions(common);
    }
    let reps = if common.quick { 3 } else { 7 };
    if !common.json {
        println!("switchyard bench transport: medians of {reps} alternating repetitions");
        header();
    }
    for transport in [Transport::Local, Transport::Inproc, Transport::Tcp] {
        for size in SIZES {
            if !common.selects(&format!("rate/{}/{size}", transport.name())) {
                continue;
            }
            // Local frames are never copied, so size does not change the work: use the
            // small-message count for every size to keep timings well above noise.
            let count = match transport {
                Transport::Local => count_for(64, common.quick),
                _ => count_for(size, common.quick),
            };
            let (ours, base) = match transport {
                Transport::Local => paired(
                    reps,
                    || ours_rate(transport, size, count),
                    || crossbeam_rate(size, count),
                )?,
                _ => paired(
                    reps,
                    || ours_rate(transport, size, count),
                    || raw_zmq_rate(transport, size, count),
                )?,
            };
            let baseline_name = match transport {
                Transport::Local => "bare crossbeam channel".to_string(),
                t => format!("raw libzmq {}", t.name()),
            };
            let case = format!("rate/{}", transport.name());
            let rate = |secs: f64| count as f64 / secs;
            Row::higher_better(
                SUITE,
                &case,
                size as u64,
                "msg/s",
                rate(ours),
                rate(base),
                &baseline_name,
            )
            .emit(common.json);
            if size >= 64 * 1024 {
                let gbps = |secs: f64| (count * size) as f64 / secs / 1e9;
                let case = format!("bandwidth/{}", transport.name());
                Row::higher_better(
                    SUITE,
                    &case,
                    size as u64,
                    "GB/s",
                    gbps(ours),
                    gbps(base),
                    &baseline_name,
                )
                .emit(common.json);
            }
        }
    }
    let rounds = if common.quick { 1000 } else { 5000 };
    if common.selects("rtt/local") {
        let (ours, base) = paired(
            reps,
            || ours_rtt(Transport::Local, rounds),
            || crossbeam_rtt(rounds),
        )?;
        Row::lower_better(
            SUITE,
            "rtt/local",
            64,
            "rtt_us",
            ours,
            base,
            "bare crossbeam channel",
        )
        .emit(common.json);
    }
    for transport in [Transport::Inproc, Transport::Tcp] {
        let case = format!("rtt/{}", transport.name());
        if !common.selects(&case) {
            continue;
        }
        let (ours, base) = paired(
            reps,
            || ours_rtt(transport, rounds),
            || raw_zmq_rtt(transport, rounds),
        )?;
        let name = format!("raw libzmq {}", transport.name());
        Row::lower_better(SUITE, &case, 64, "rtt_us", ours, base, &name).emit(common.json);
    }
    // The stub's thread sockets poll for `recv_spin` (200 us by default) before they
    // park; the second row parks at once, like the raw baseline, and shows the cost of
    // the hop itself.
    for (case, spin) in [
        ("rtt/stub-tcp", SocketOptions::default().recv_spin),
        ("rtt/stub-tcp-parked", Duration::ZERO),
    ] {
        if !common.selects(case) {
            continue;
        }
        let (ours, base) = paired(
            reps,
            || stub_rtt(rounds, spin),
            || raw_zmq_rtt(Transport::Tcp, rounds),
        )?;
        Row::lower_better(SUITE, case, 64, "rtt_us", ours, base, "raw libzmq tcp")
            .emit(common.json);
        if !common.json {
            println!(
                "{case}: {:.1} us per stub hop beyond raw libzmq (round trip difference / 2)",
                (ours - base) / 2.0
            );
        }
    }
    Ok(())
}
