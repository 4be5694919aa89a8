//! `switchyard bench mpi --instructions`: instructions per message of round trips
//! through MPI's self-loopback in one process, ours beside raw MPI, counted by
//! callgrind (see `instructions`): 64 B (the round-trip row's size) and 64 KiB and
//! 1 MiB (the bandwidth rows' sizes).
//!
//! Two ranks cannot be counted this way: each spins while it waits for the other, so
//! a count would measure the waiting. In one process every message is already there
//! when its receiver looks (MPI delivers a small send to its own rank at once), so
//! the count is the work of sending and receiving: ours (a dealer of this rank's own
//! router, the router answering each message) against the same exchange in raw
//! `MPI_Send`/`MPI_Recv` to this rank itself. MPI runs as a singleton (no `mpirun`).
//! A large send to oneself cannot block (MPI's rendezvous would wait for a receive
//! that comes after it), so above 64 B the baseline posts `MPI_Isend`, receives,
//! then waits for the send; ours needs no such care (its sends never block).

use super::instructions;
use super::{Common, MpiOneArgs};
use mpi::traits::{Communicator as _, Destination as _, Source as _};
use std::time::Duration;
use switchyard::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const SUITE: &str = "mpi";
/// The round-trip row's size, sent with blocking calls in the baseline.
const SMALL: usize = 64;
const WAIT: Duration = Duration::from_secs(60);

/// One side, once: `count` messages of `size` bytes (half as many round trips).
pub(crate) fn run_one(args: &MpiOneArgs) -> Result<()> {
    let round_trips = args.count / 2;
    match args.side.as_str() {
        "ours" => ours(round_trips, args.size),
        "baseline" if args.size <= SMALL => raw(round_trips, args.size),
        "baseline" => raw_immediate(round_trips, args.size),
        other => Err(format!("unknown side {other:?} (ours, baseline)").into()),
    }
}

fn ours(round_trips: usize, size: usize) -> Result<()> {
    let world = switchyard::transports::mpi::world()?;
    let endpoint = format!("mpi://{}", world.rank);
    let mut router = RouterSocket::bind(&endpoint, SocketOptions::default())?;
    let mut dealer = DealerSocket::connect(&endpoint, SocketOptions::default())?;
    router.await_peers(1, WAIT)?;
    let msg =
        Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Update).with_frame(vec![7u8; size]);
    for _ in 0..round_trips {
        dealer.send(msg.clone())?;
        let (peer, got) = router.recv_from_timeout(WAIT)?;
        router.send_to(&peer, got)?;
        dealer.recv_timeout(WAIT)?;
    }
    Ok(())
}

fn raw(round_trips: usize, size: usize) -> Result<()> {
    // The backend's MPI, started the same way (MPI_THREAD_MULTIPLE), then rsmpi's
    // world communicator on this thread.
    switchyard::transports::mpi::world()?;
    let comm = mpi::topology::SimpleCommunicator::world();
    let me = comm.this_process();
    let mut buffer = vec![7u8; size];
    for _ in 0..round_trips {
        for _ in 0..2 {
            me.send(&buffer[..]);
            me.receive_into(&mut buffer[..]);
        }
    }
    Ok(())
}

/// [`raw`] for sizes MPI sends by rendezvous: the send posted first, then the receive
/// (into a second buffer), then the send's completion.
fn raw_immediate(round_trips: usize, size: usize) -> Result<()> {
    switchyard::transports::mpi::world()?;
    let comm = mpi::topology::SimpleCommunicator::world();
    let me = comm.this_process();
    let (mut a, mut b) = (vec![7u8; size], vec![0u8; size]);
    for _ in 0..round_trips {
        for _ in 0..2 {
            mpi::request::scope(|scope| {
                let sent = me.immediate_send(scope, &a[..]);
                me.receive_into(&mut b[..]);
                sent.wait();
            });
            std::mem::swap(&mut a, &mut b);
        }
    }
    Ok(())
}

/// Instructions per message of both sides, one row per size.
pub(crate) fn run(common: &Common) -> Result<()> {
    if !common.json {
        println!(
            "switchyard bench mpi --instructions: instructions per message of round trips \
             through MPI's self-loopback in one process (callgrind; every thread)"
        );
        super::report::header();
    }
    // (size, case, messages of the shorter run in a quick launch; None: the default)
    let cases = [
        (SMALL, "rtt/self", None),
        (64 << 10, "bandwidth/self", Some(200)),
        (1 << 20, "bandwidth/self", Some(40)),
    ];
    for (size, case, low) in cases {
        if !common.selects(&format!("{case}/{size}")) {
            continue;
        }
        let args = ["--size".to_string(), size.to_string()];
        let (ours, base) = match low {
            None => instructions::both_sides("mpi-one", &args, common.quick)?,
            Some(low) => instructions::named_sides(
                "mpi-one",
                ["ours", "baseline"],
                &args,
                instructions::unit_counts(low, common.quick),
            )?,
        };
        let baseline_name = if size <= SMALL {
            "raw MPI_Send/MPI_Recv to self"
        } else {
            "raw MPI_Isend/MPI_Recv/MPI_Wait to self"
        };
        instructions::row(SUITE, case, size as u64, ours, base, baseline_name).emit(common.json);
    }
    Ok(())
}
