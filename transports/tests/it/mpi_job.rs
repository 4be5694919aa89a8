//! The `mpi` backend between ranks: each `in_mpi_job` test runs in every rank of an
//! `mpirun` job that a plain test below starts, so `cargo test --features mpi` covers
//! them with no setup. Rank 0 holds the router; the other ranks are dealers.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::mpirun::{expect_ranks_pass, expect_ranks_pass_with, run_ranks};

const WAIT: Duration = Duration::from_secs(30);

/// Tests run inside every rank.
mod in_mpi_job {
    use super::WAIT;
    use std::collections::HashMap;
    use std::time::Duration;
    use switchyard_msg::{Addr, Kind, Msg, payload};
    use switchyard_transports::{
        Dealer, DealerSocket, Router, RouterSocket, SendErrorKind, Socket, SocketOptions,
        TransportError, mpi,
    };

    const THREADS: u64 = 2;
    /// Messages per dealer thread: 200, times `SWITCHYARD_TEST_SCALE` (every rank reads
    /// the same environment from mpirun).
    fn messages() -> u64 {
        200 * crate::support::scale()
    }

    /// Message `seq` of dealer thread `thread` on `rank`: a header and, for some
    /// sequence numbers, frames large enough to go as in-place blocks.
    fn message(rank: u32, thread: u64, seq: u64) -> Msg {
        let mut msg = Msg::new(
            Addr::worker(rank, thread as u32),
            Addr::server(0, 0),
            Kind::Update,
        )
        .with_seq(seq);
        let sizes: &[usize] = match seq % 5 {
            0 => &[],
            1 => &[8],
            2 => &[1 << 20],
            3 => &[0, 70_000, 3],
            _ => &[20_000],
        };
        for (i, &n) in sizes.iter().enumerate() {
            let fill = (rank as u64 * 31 + thread * 7 + seq + i as u64) as u8;
            msg.push_frame(payload::frame_from_vec(vec![fill; n]));
        }
        msg
    }

    /// Dealers on every other rank (two threads each) send to rank 0's router; the
    /// router checks each peer's order and every byte, and answers each message.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn order_and_frames_between_ranks() {
        let world = mpi::world().unwrap();
        assert!(world.size >= 2);
        let dealers = (world.size as u64 - 1) * THREADS;
        if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", SocketOptions::default()).unwrap();
            router.await_peers(dealers as usize, WAIT).unwrap();
            let mut next: HashMap<_, u64> = HashMap::new();
            for _ in 0..dealers * messages() {
                let (peer, got) = router.recv_from_timeout(WAIT).unwrap();
                let from = got.header.src;
                let seq = next.entry(peer.clone()).or_default();
                assert_eq!(got.header.seq, *seq, "out of order from {peer}");
                *seq += 1;
                assert_eq!(got, message(from.group, from.id as u64, got.header.seq));
                router
                    .send_to(&peer, got.reply(Kind::Put).with_seq(got.header.seq))
                    .unwrap();
            }
            assert!(next.values().all(|&n| n == messages()));
            assert_eq!(router.dropped_malformed(), 0);
        } else {
            let threads: Vec<_> = (0..THREADS)
                .map(|thread| {
                    std::thread::spawn(move || {
                        let mut dealer =
                            DealerSocket::connect("mpi://0", SocketOptions::default()).unwrap();
                        for seq in 0..messages() {
                            dealer.send(message(world.rank, thread, seq)).unwrap();
                        }
                        for seq in 0..messages() {
                            let reply = dealer.recv_timeout(WAIT).unwrap();
                            assert_eq!(reply.header.kind, Kind::Put);
                            assert_eq!(reply.header.seq, seq);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    /// Messages taken by the progress thread (into the socket's inbox, while its
    /// thread is away) and messages the socket's thread receives itself keep one
    /// order: each side pauses now and then, long enough for the progress thread to
    /// step in, and reads with waits and with tries in turn.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn order_across_the_hand_over() {
        let world = mpi::world().unwrap();
        let dealers = world.size as u64 - 1;
        let pause = || std::thread::sleep(Duration::from_millis(3));
        // A try, or a wait, by the message's number: both paths get their turns.
        fn next<T, E: std::fmt::Debug>(n: u64, mut attempt: impl FnMut(bool) -> Result<T, E>) -> T {
            if n % 3 == 0 {
                let give_up = std::time::Instant::now() + WAIT;
                loop {
                    if let Ok(found) = attempt(true) {
                        return found;
                    }
                    assert!(std::time::Instant::now() < give_up, "nothing arrived");
                    std::thread::yield_now();
                }
            }
            attempt(false).unwrap()
        }
        if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", SocketOptions::default()).unwrap();
            router.await_peers(dealers as usize, WAIT).unwrap();
            let mut next_seq: HashMap<_, u64> = HashMap::new();
            for n in 0..dealers * messages() {
                if n % 10 == 0 {
                    pause();
                }
                let (peer, got) = next(n, |try_only| {
                    if try_only {
                        router.try_recv_from()
                    } else {
                        router.recv_from_timeout(WAIT)
                    }
                });
                let seq = next_seq.entry(peer.clone()).or_default();
                assert_eq!(got.header.seq, *seq, "out of order from {peer}");
                *seq += 1;
                let from = got.header.src;
                assert_eq!(got, message(from.group, from.id as u64, got.header.seq));
                router
                    .send_to(&peer, got.reply(Kind::Put).with_seq(got.header.seq))
                    .unwrap();
            }
            assert_eq!(router.dropped_malformed(), 0);
        } else {
            let mut dealer = DealerSocket::connect("mpi://0", SocketOptions::default()).unwrap();
            for seq in 0..messages() {
                dealer.send(message(world.rank, 0, seq)).unwrap();
            }
            for seq in 0..messages() {
                if seq % 7 == 0 {
                    pause();
                }
                let reply = next(seq, |try_only| {
                    if try_only {
                        dealer.try_recv()
                    } else {
                        dealer.recv_timeout(WAIT)
                    }
                });
                assert_eq!(reply.header.seq, seq);
            }
        }
    }

    /// A router that does not read: the dealer on rank 1 blocks at its high-water
    /// mark and gets its message back; every message it was told went out arrives, in
    /// order, once the router reads.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn high_water_mark_between_ranks() {
        let world = mpi::world().unwrap();
        let options = SocketOptions::default()
            .with_hwm(4)
            .with_send_timeout(Duration::from_millis(300));
        if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", options).unwrap();
            router.await_peers(world.size as usize - 1, WAIT).unwrap();
            // Not reading while the dealers fill up.
            std::thread::sleep(Duration::from_secs(2));
            let mut finished = 0;
            let mut next: HashMap<_, u64> = HashMap::new();
            while finished < world.size - 1 {
                let (peer, got) = router.recv_from_timeout(WAIT).unwrap();
                let expected = next.entry(peer).or_default();
                if got.header.kind == Kind::Stop {
                    assert_eq!(got.header.seq, *expected, "messages were lost");
                    finished += 1;
                } else {
                    assert_eq!(got.header.seq, *expected);
                    *expected += 1;
                }
            }
        } else {
            let mut dealer = DealerSocket::connect("mpi://0", options).unwrap();
            let frame = payload::frame_from_vec(vec![5u8; 256 * 1024]);
            let mut sent = 0;
            loop {
                let msg = Msg::new(Addr::worker(world.rank, 0), Addr::server(0, 0), Kind::Put)
                    .with_seq(sent)
                    .with_frame(frame.clone());
                match dealer.send(msg) {
                    Ok(()) => sent += 1,
                    Err(e) => {
                        assert_eq!(e.kind, SendErrorKind::Timeout, "{e}");
                        assert_eq!(e.msg.header.seq, sent);
                        break;
                    }
                }
                assert!(sent < 1000, "never reached the high-water mark");
            }
            let stop = Msg::new(Addr::worker(world.rank, 0), Addr::server(0, 0), Kind::Stop)
                .with_seq(sent);
            dealer.send_timeout(stop, WAIT).unwrap();
        }
    }

    /// Endpoints MPI cannot serve are typed errors naming the reason.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn endpoint_errors() {
        let world = mpi::world().unwrap();
        let other = (world.rank + 1) % world.size;
        let err =
            RouterSocket::bind(&format!("mpi://{other}"), SocketOptions::default()).unwrap_err();
        assert!(
            matches!(&err, TransportError::InvalidEndpoint { reason, .. }
                if reason.contains("binds its own rank")),
            "{err}"
        );
        let outside = format!("mpi://{}", world.size);
        let err = DealerSocket::connect(&outside, SocketOptions::default()).unwrap_err();
        assert!(
            matches!(&err, TransportError::InvalidEndpoint { reason, .. }
                if reason.contains("outside this MPI job")),
            "{err}"
        );
        let own = format!("mpi://{}", world.rank);
        let _router = RouterSocket::bind(&own, SocketOptions::default()).unwrap();
        let err = RouterSocket::bind(&own, SocketOptions::default()).unwrap_err();
        assert!(matches!(err, TransportError::AddrInUse { .. }), "{err}");
    }

    /// Closures on the progress thread: they may borrow the caller's stack, get the
    /// collectives' communicator (which returns errors rather than aborting), and a
    /// panic comes back to the caller while the progress thread goes on serving.
    #[test]
    #[ignore = "runs inside mpirun"]
    fn closures_on_the_progress_thread() {
        let world = mpi::world().unwrap();
        let mut seen = Vec::new();
        let rank = mpi::run_on_progress_thread(|comm| {
            let mut rank = -1;
            // SAFETY: a plain MPI query on the progress thread.
            let code = unsafe { ::mpi::ffi::MPI_Comm_rank(comm, &mut rank) };
            seen.push(code);
            rank
        })
        .unwrap();
        assert_eq!((rank, seen), (world.rank as i32, vec![0]));

        // An invalid count is an error code with MPI's text, not an abort.
        let (code, text) = mpi::run_on_progress_thread(|comm| {
            let mut byte = 0u8;
            // SAFETY: MPI rejects the negative count before touching the buffer.
            unsafe {
                let code = ::mpi::ffi::MPI_Bcast(
                    (&mut byte as *mut u8).cast(),
                    -1,
                    ::mpi::ffi::RSMPI_UINT8_T,
                    0,
                    comm,
                );
                (code, mpi::error_string(code))
            }
        })
        .unwrap();
        assert_ne!(code, 0);
        assert!(text.to_lowercase().contains("count"), "{text}");

        let nested = mpi::run_on_progress_thread(|_| mpi::run_on_progress_thread(|_| ())).unwrap();
        assert!(
            matches!(&nested, Err(TransportError::Backend { reason, .. }) if reason.contains("wait for itself")),
            "{nested:?}"
        );

        let panicked =
            std::panic::catch_unwind(|| mpi::run_on_progress_thread(|_| panic!("on purpose")));
        let message = panicked.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"on purpose"));
        // The progress thread survived: closures and sockets still work.
        assert_eq!(mpi::run_on_progress_thread(|_| 7).unwrap(), 7);
        let own = format!("mpi://{}", world.rank);
        let mut router = RouterSocket::bind(&own, SocketOptions::default()).unwrap();
        let mut dealer = DealerSocket::connect(&own, SocketOptions::default()).unwrap();
        dealer
            .send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Put))
            .unwrap();
        router.recv_timeout(WAIT).unwrap();
    }

    /// Rank 1 dies (SIGABRT) while rank 0 waits for it.
    #[test]
    #[ignore = "runs inside mpirun, started by a_dead_rank_ends_the_job"]
    fn rank_one_aborts() {
        let world = mpi::world().unwrap();
        if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", SocketOptions::default()).unwrap();
            router.await_peers(1, WAIT).unwrap();
            router.recv_timeout(WAIT).unwrap();
            // Rank 1 never sends again; only mpirun can end this wait early.
            let _ = router.recv_timeout(Duration::from_secs(120));
        } else {
            let mut dealer = DealerSocket::connect("mpi://0", SocketOptions::default()).unwrap();
            dealer
                .send(Msg::new(Addr::worker(1, 0), Addr::server(0, 0), Kind::Put))
                .unwrap();
            std::thread::sleep(Duration::from_millis(200));
            std::process::abort();
        }
    }

    /// Rank 1 fails a test (exit status 101) while rank 0 waits for it.
    #[test]
    #[ignore = "runs inside mpirun, started by a_failing_rank_ends_the_job"]
    fn rank_one_fails() {
        let world = mpi::world().unwrap();
        if world.rank == 0 {
            let mut router = RouterSocket::bind("mpi://0", SocketOptions::default()).unwrap();
            router.await_peers(1, WAIT).unwrap();
            let _ = router.recv_timeout(Duration::from_secs(120));
        } else {
            let _dealer = DealerSocket::connect("mpi://0", SocketOptions::default()).unwrap();
            panic!("rank 1 gives up on purpose");
        }
    }
}

#[test]
fn order_and_frames_on_2_ranks() {
    expect_ranks_pass(
        2,
        "mpi_job::in_mpi_job::order_and_frames_between_ranks",
        Duration::from_secs(180),
    );
}

#[test]
fn order_across_the_hand_over_on_3_ranks() {
    expect_ranks_pass(
        3,
        "mpi_job::in_mpi_job::order_across_the_hand_over",
        Duration::from_secs(180),
    );
}

#[test]
fn order_and_frames_through_the_progress_thread_on_2_ranks() {
    expect_ranks_pass_with(
        2,
        "mpi_job::in_mpi_job::order_and_frames_between_ranks",
        Duration::from_secs(180),
        &[(switchyard_transports::mpi::ENV_MPI_DIRECT, "0")],
    );
}

#[test]
fn order_and_frames_on_3_ranks() {
    expect_ranks_pass(
        3,
        "mpi_job::in_mpi_job::order_and_frames_between_ranks",
        Duration::from_secs(180),
    );
}

#[test]
fn closures_on_the_progress_thread_on_2_ranks() {
    expect_ranks_pass(
        2,
        "mpi_job::in_mpi_job::closures_on_the_progress_thread",
        Duration::from_secs(120),
    );
}

#[test]
fn endpoint_errors_on_2_ranks() {
    expect_ranks_pass(
        2,
        "mpi_job::in_mpi_job::endpoint_errors",
        Duration::from_secs(120),
    );
}

#[test]
fn high_water_mark_on_3_ranks() {
    expect_ranks_pass(
        3,
        "mpi_job::in_mpi_job::high_water_mark_between_ranks",
        Duration::from_secs(180),
    );
}

/// MPI is not fault tolerant: a rank that dies takes the job down, quickly, and
/// mpirun's report names it. Rank 0 would otherwise wait 120 s.
#[test]
fn a_dead_rank_ends_the_job() {
    let job = run_ranks(
        2,
        "mpi_job::in_mpi_job::rank_one_aborts",
        Duration::from_secs(90),
    );
    assert!(!job.success, "the job must fail:\n{}", job.output);
    assert!(
        job.elapsed < Duration::from_secs(60),
        "took {:?}",
        job.elapsed
    );
    assert!(
        job.output.contains("rank 1"),
        "mpirun's report names rank 1:\n{}",
        job.output
    );
}

/// A rank that exits with a failure status skips `MPI_Finalize`, so the job ends
/// instead of every rank waiting for it; both switchyard and mpirun name the rank.
#[test]
fn a_failing_rank_ends_the_job() {
    let job = run_ranks(
        2,
        "mpi_job::in_mpi_job::rank_one_fails",
        Duration::from_secs(90),
    );
    assert!(!job.success, "the job must fail:\n{}", job.output);
    assert!(
        job.elapsed < Duration::from_secs(60),
        "took {:?}",
        job.elapsed
    );
    assert!(
        job.output
            .contains("switchyard: mpi rank 1 exits with status 101 without MPI_Finalize"),
        "{}",
        job.output
    );
}
