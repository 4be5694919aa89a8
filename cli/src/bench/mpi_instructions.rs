//! `switchyard bench mpi --instructions`: instructions per message of a 64 B round
//! trip through MPI's self-loopback in one process, ours beside raw MPI, counted by
//! callgrind (see `instructions`).
//!
//! Two ranks cannot be counted this way: each spins while it waits for the other, so
//! a count would measure the waiting. In one process every message is already there
//! when its receiver looks (MPI delivers a small send to its own rank at once), so
//! the count is the work of sending and receiving: ours (a dealer of this rank's own
//! router, the router answering each message) against the same exchange in raw
//! `MPI_Send`/`MPI_Recv` to this rank itself. MPI runs as a singleton (no `mpirun`).

use super::instructions;
use super::{Common, MpiOneArgs};
use mpi::traits::{Communicator as _, Destination as _, Source as _};
use std::time::Duration;
use switchyard::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const SUITE: &str = "mpi";
const SIZE: usize = 64;
const WAIT: Duration = Duration::from_secs(60);

/// One side, once: `count` messages (half as many round trips).
pub(crate) fn run_one(args: &MpiOneArgs) -> Result<()> {
    let round_trips = args.count / 2;
    match args.side.as_str() {
        "ours" => ours(round_trips),
        "baseline" => raw(round_trips),
        other => Err(format!("unknown side {other:?} (ours, baseline)").into()),
    }
}

fn ours(round_trips: usize) -> Result<()> {
    let world = switchyard::transports::mpi::world()?;
    let endpoint = format!("mpi://{}", world.rank);
    let mut router = RouterSocket::bind(&endpoint, SocketOptions::default())?;
    let mut dealer = DealerSocket::connect(&endpoint, SocketOptions::default())?;
    router.await_peers(1, WAIT)?;
    let msg =
        Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Update).with_frame(vec![7u8; SIZE]);
    for _ in 0..round_trips {
        dealer.send(msg.clone())?;
        let (peer, got) = router.recv_from_timeout(WAIT)?;
        router.send_to(&peer, got)?;
        dealer.recv_timeout(WAIT)?;
    }
    Ok(())
}

fn raw(round_trips: usize) -> Result<()> {
    // The backend's MPI, started the same way (MPI_THREAD_MULTIPLE), then rsmpi's
    // world communicator on this thread.
    switchyard::transports::mpi::world()?;
    let comm = mpi::topology::SimpleCommunicator::world();
    let me = comm.this_process();
    let mut buffer = [7u8; SIZE];
    for _ in 0..round_trips {
        for _ in 0..2 {
            me.send(&buffer[..]);
            me.receive_into(&mut buffer[..]);
        }
    }
    Ok(())
}

/// Instructions per message of both sides, one row.
pub(crate) fn run(common: &Common) -> Result<()> {
    if !common.json {
        println!(
            "switchyard bench mpi --instructions: instructions per message of a 64 B round trip \
             through MPI's self-loopback in one process (callgrind; every thread)"
        );
        super::report::header();
    }
    let (ours, base) = instructions::both_sides("mpi-one", &[], common.quick)?;
    instructions::row(
        SUITE,
        "rtt/self",
        SIZE as u64,
        ours,
        base,
        "raw MPI_Send/MPI_Recv to self",
    )
    .emit(common.json);
    Ok(())
}
