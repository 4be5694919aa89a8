//! The progress thread's table of peers when a dealer closes around a router's
//! restart on the same rank. Inside the crate, because a test must hold the progress
//! thread between two commands (a queued [`Command::Run`] that waits), which the
//! public, blocking `run_on_progress_thread` cannot do.
//!
//! Regression: a router bound right after a dealer of the same rank closed inherited
//! that dealer as a live peer until the dealer's bye came back through MPI's
//! self-loopback, so `await_peers` could count a dealer that no longer existed (the
//! mpi conformance suite's `reconnect_after_restart` and `send_to_all` failed about
//! once in ten runs on a loaded machine).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::engine::{Command, Engine, Job};
use crate::{Dealer, DealerSocket, Router, RouterSocket, SocketOptions, TransportError};
use crossbeam_channel::{Receiver, Sender, bounded};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// The progress thread held inside a closure: commands submitted meanwhile are taken
/// in one batch once it is released, with no MPI receive between them. Dropping it
/// releases the thread, so a failing test never leaves it held.
struct Hold {
    release: Sender<()>,
}

impl Hold {
    /// Queues the holding closure and waits until the progress thread runs it.
    fn start(engine: &Engine) -> Hold {
        let (hold, running) = Hold::queue(engine);
        running
            .recv_timeout(WAIT)
            .expect("the progress thread runs the holding closure");
        hold
    }

    /// Queues the holding closure; the receiver hears when it starts to run.
    fn queue(engine: &Engine) -> (Hold, Receiver<()>) {
        let (running_tx, running) = bounded(1);
        let (release, released) = bounded::<()>(1);
        let job: Job = Box::new(move |_comm| {
            let _ = running_tx.send(());
            // Bounded, so that a test that never releases cannot stall the job.
            let _ = released.recv_timeout(WAIT);
        });
        engine.submit(Command::Run(job)).unwrap();
        (Hold { release }, running)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.release.send(());
    }
}

fn own_endpoint(engine: &Engine) -> String {
    format!("mpi://{}", engine.world.rank)
}

/// A dealer closed, its router dropped and a new one bound on the same rank, all
/// while the progress thread is held: the new router must not count the closed
/// dealer, even before anything is received (the old code inherited it here and
/// forgot it only when the bye came back through the loopback).
#[test]
#[ignore = "runs inside mpirun, started by mpi_peer_table_on_2_ranks"]
fn a_router_bound_after_a_close_does_not_inherit_the_dealer() {
    let engine = Engine::get().unwrap();
    let own = own_endpoint(engine);
    let options = SocketOptions::default();
    let mut router = RouterSocket::bind(&own, options.clone()).unwrap();
    let dealer = DealerSocket::connect(&own, options.clone()).unwrap();
    assert_eq!(router.await_peers(1, WAIT).unwrap(), 1);

    let first = Hold::start(engine);
    drop(dealer);
    drop(router);
    let mut router = RouterSocket::bind(&own, options.clone()).unwrap();
    // Taken right after the close, the unbind and the bind, before any receive.
    let (second, second_running) = Hold::queue(engine);
    drop(first);
    second_running
        .recv_timeout(WAIT)
        .expect("the progress thread reaches the second hold");
    let err = router
        .await_peers(1, Duration::from_millis(200))
        .expect_err("the closed dealer is no peer of the new router");
    assert!(
        matches!(err, TransportError::PeersMissing { connected: 0, .. }),
        "{err}"
    );
    assert!(router.peers().is_empty(), "{:?}", router.peers());
    drop(second);

    // The restarted router serves a new dealer, and only that one.
    let fresh = DealerSocket::connect(&own, options).unwrap();
    assert_eq!(router.await_peers(1, WAIT).unwrap(), 1);
    assert_eq!(router.peers(), vec![fresh.identity().clone()]);
}

/// A dealer whose connect timed out before its hello was even received is never a
/// peer of a router bound afterwards (with no bye through MPI for this rank's own
/// dealers, a late hello must not make it one).
#[test]
#[ignore = "runs inside mpirun, started by mpi_peer_table_on_2_ranks"]
fn a_dealer_closed_before_its_hello_arrives_is_never_a_peer() {
    let engine = Engine::get().unwrap();
    let own = own_endpoint(engine);
    let held = Hold::start(engine);
    let quick = SocketOptions::default().with_connect_timeout(Duration::from_millis(100));
    let err = DealerSocket::connect(&own, quick).expect_err("nobody answers while held");
    assert!(matches!(err, TransportError::Unreachable { .. }), "{err}");
    let mut router = RouterSocket::bind(&own, SocketOptions::default()).unwrap();
    drop(held);

    // The closed dealer's hello went out before this one's, and MPI keeps one
    // source's order on a tag: once this dealer is connected, the other's hello has
    // been handled, and every event it caused is queued ahead of this one's.
    let fresh = DealerSocket::connect(&own, SocketOptions::default()).unwrap();
    assert_eq!(router.await_peers(1, WAIT).unwrap(), 1);
    assert_eq!(router.peers(), vec![fresh.identity().clone()]);
}

/// The tests above in every rank of a 2-rank job (each against its own router).
#[test]
fn mpi_peer_table_on_2_ranks() {
    switchyard_mpirun::expect_ranks_pass(2, "backend::mpi::tests::a_", Duration::from_secs(120));
}
