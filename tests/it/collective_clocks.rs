//! The collectives' two clocks, between threads over real sockets: the silence
//! timeout never fails a call that is making progress, however long it takes; the
//! per-call deadline ends a call however busy it is; a timeout error states the
//! silence it saw.
//!
//! A long call is made by slowing one rank on purpose: [`Slow`] pauses before each
//! message it sends, so that its peers wait a fraction of the timeout between
//! messages while the call as a whole lasts several timeouts.
#![cfg(feature = "zmq")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{EndpointExchange, MemoryExchange};
use switchyard::collective::testing::{
    self, BoundLink, Clock, Link, LinkError, Notice, StreamLink, Tag,
};
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};

/// A link that pauses before every message it sends.
struct Slow {
    inner: Box<dyn Link>,
    pause: Duration,
}

impl Link for Slow {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn send(&mut self, to: usize, tag: Tag, f: Vec<Bytes>, d: Instant) -> Result<(), LinkError> {
        std::thread::sleep(self.pause);
        self.inner.send(to, tag, f, d)
    }
    fn recv(&mut self, from: usize, tag: Tag, d: Instant) -> Result<Vec<Bytes>, LinkError> {
        self.inner.recv(from, tag, d)
    }
    fn abort(&mut self, call: u64, reason: &str) {
        self.inner.abort(call, reason)
    }
    fn send_within(
        &mut self,
        to: usize,
        tag: Tag,
        f: Vec<Bytes>,
        c: Clock,
    ) -> Result<(), LinkError> {
        std::thread::sleep(self.pause);
        self.inner.send_within(to, tag, f, c)
    }
    fn recv_within(&mut self, from: usize, tag: Tag, c: Clock) -> Result<Vec<Bytes>, LinkError> {
        self.inner.recv_within(from, tag, c)
    }
    fn flush_within(&mut self, c: Clock) -> Result<(), LinkError> {
        self.inner.flush_within(c)
    }
    fn abort_blaming(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        self.inner.abort_blaming(call, reason, blames)
    }
    fn notices(&mut self, until: Instant) -> Option<Vec<Notice>> {
        self.inner.notices(until)
    }
    fn alive(&mut self, rank: usize, within: Duration) -> Option<bool> {
        self.inner.alive(rank, within)
    }
}

/// Which data path the ranks use.
#[derive(Clone, Copy)]
enum Path {
    /// TCP streams beside the ZeroMQ control link.
    Tcp,
    /// Everything over ZeroMQ.
    Zmq,
}

/// Runs `body` on `n` ranks (threads) over `path` on 127.0.0.1, rank `slow` pausing
/// `pause` before each message; returns every rank's result and how long it took.
fn world<R: Send + 'static>(
    n: usize,
    path: Path,
    slow: usize,
    pause: Duration,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<(Result<R, CollectiveError>, Duration)> {
    let body = Arc::new(body);
    let board = MemoryExchange::new(n);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (body, mut board, options) = (body.clone(), board.clone(), options.clone());
            std::thread::spawn(move || {
                let setup = Duration::from_secs(20);
                let bound =
                    BoundLink::bind(rank, n, "tcp://127.0.0.1:0", options.socket.clone()).unwrap();
                let endpoints = board
                    .exchange(rank as u32, n as u32, bound.endpoint(), setup)
                    .unwrap();
                let control = bound.connect(&endpoints, setup).unwrap();
                let mut link: Box<dyn Link> = match path {
                    Path::Zmq => Box::new(control),
                    Path::Tcp => Box::new(
                        StreamLink::connect(
                            control,
                            "127.0.0.1",
                            setup,
                            64 << 20,
                            Duration::from_micros(50),
                        )
                        .unwrap(),
                    ),
                };
                if rank == slow {
                    link = Box::new(Slow { inner: link, pause });
                }
                let mut comm = testing::over_link(link, options);
                let started = Instant::now();
                let result = body(&mut comm);
                (result, started.elapsed())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The one long call: an allreduce of 3 blocks of 4 KiB f32s in 4 KiB pieces, the
/// slow rank sending 12 messages (ring) to 16 (direct exchange).
const ELEMS: usize = 3 * 4 * 1024;
/// Pause per message of the slow rank: 12 messages make the call at least 3.1 s,
/// while its peers never wait more than about two pauses for a message.
const PAUSE: Duration = Duration::from_millis(260);
const TIMEOUT: Duration = Duration::from_secs(1);

fn long_call_options(direct_max_ranks: usize) -> CommOptions {
    CommOptions::default()
        .with_timeout(TIMEOUT)
        .with_large_threshold(1024)
        .with_direct_max_ranks(direct_max_ranks)
        .with_piece_bytes(4096)
}

/// The long call on every rank of a world of 3, checked for the right sum.
fn long_call_succeeds(path: Path, direct_max_ranks: usize) {
    let results = world(
        3,
        path,
        1,
        PAUSE,
        long_call_options(direct_max_ranks),
        |comm| {
            let mut buf = vec![(comm.rank() + 1) as f32; ELEMS];
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            Ok(buf)
        },
    );
    for (rank, (result, took)) in results.into_iter().enumerate() {
        eprintln!("rank {rank}: {took:?}");
        let buf = result.unwrap_or_else(|e| panic!("rank {rank} after {took:?}: {e}"));
        assert!(buf.iter().all(|&x| x == 6.0), "rank {rank}");
        // Long enough that the old fixed deadline of one timeout would have ended it.
        assert!(took >= TIMEOUT * 3, "rank {rank} took only {took:?}");
    }
}

#[test]
fn a_long_ring_allreduce_outlasts_the_silence_timeout_over_tcp() {
    long_call_succeeds(Path::Tcp, 0);
}

#[test]
fn a_long_direct_exchange_outlasts_the_silence_timeout_over_tcp() {
    long_call_succeeds(Path::Tcp, 8);
}

#[test]
fn a_long_allreduce_outlasts_the_silence_timeout_over_zeromq() {
    long_call_succeeds(Path::Zmq, 0);
}

/// The same slow call under a per-call deadline of 0.5 s: every rank fails soon
/// after it, at least one naming the deadline, though no peer was ever silent for
/// the timeout.
#[test]
fn the_per_call_deadline_ends_a_busy_call() {
    let deadline = Duration::from_millis(500);
    let options = long_call_options(0)
        .with_timeout(Duration::from_secs(10))
        .with_deadline(Some(deadline));
    let results = world(3, Path::Tcp, 1, PAUSE, options, |comm| {
        let mut buf = vec![1.0f32; ELEMS];
        comm.allreduce(&mut buf, ReduceOp::Sum)
    });
    let mut named = 0;
    for (rank, (result, took)) in results.iter().enumerate() {
        match result {
            Err(CollectiveError::DeadlineExceeded { limit, .. }) => {
                assert_eq!(*limit, deadline);
                let text = result.as_ref().unwrap_err().to_string();
                assert!(text.contains("deadline of 500.00ms"), "{text}");
                named += 1;
            }
            Err(CollectiveError::Aborted { reason, .. }) => {
                assert!(reason.contains("deadline"), "rank {rank}: {reason}")
            }
            other => panic!("rank {rank}: {other:?}"),
        }
        assert!(
            *took < deadline + Duration::from_secs(1),
            "rank {rank}: {took:?}"
        );
    }
    assert!(named > 0, "{results:?}");
}

/// A rank that never calls: its peers' errors state a silence of at least the
/// timeout (not the last poll's), name it, and say where they were waiting.
#[test]
fn a_timeout_states_the_silence_it_saw() {
    let timeout = Duration::from_millis(500);
    let options = CommOptions::default().with_timeout(timeout);
    let results = world(
        3,
        Path::Tcp,
        usize::MAX,
        Duration::ZERO,
        options,
        move |comm| {
            if comm.rank() == 1 {
                std::thread::sleep(timeout * 3);
                return Ok(());
            }
            comm.allreduce(&mut [1i64; 4], ReduceOp::Sum)
        },
    );
    let mut timed_out = 0;
    for rank in [0, 2] {
        let (result, _) = &results[rank];
        let text = result.as_ref().unwrap_err().to_string();
        assert!(text.contains("for rank 1 ("), "rank {rank}: {text}");
        assert!(text.contains("no byte arrived"), "rank {rank}: {text}");
        if let Err(CollectiveError::PeerTimeout { waited, during, .. }) = result {
            assert!(*waited >= timeout, "rank {rank}: {waited:?}");
            assert!(during.contains("step"), "rank {rank}: {during}");
            timed_out += 1;
        }
    }
    assert!(timed_out > 0, "{results:?}");
}

/// At n = 5 on the ring, calls several silence timeouts long (rank 1 slow), one after
/// another, with each rank computing between calls for a fifth of the timeout. No rank
/// ever waits the timeout for a peer that is working, so every call succeeds with the
/// right sum.
#[test]
fn long_ring_calls_at_five_ranks_outlast_the_silence_timeout() {
    let timeout = Duration::from_millis(500);
    let options = CommOptions::default()
        .with_timeout(timeout)
        .with_large_threshold(1024)
        .with_direct_max_ranks(0)
        .with_piece_bytes(4096);
    // 5 blocks of 2 pieces: the slow rank sends 16 messages a call, 1.6 s at 100 ms.
    let elems = 5 * 2 * 1024;
    let results = world(
        5,
        Path::Tcp,
        1,
        Duration::from_millis(100),
        options,
        move |comm| {
            let mut took = Vec::new();
            for call in 0..2 {
                let mut buf = vec![(comm.rank() + call) as f32; elems];
                let started = Instant::now();
                comm.allreduce(&mut buf, ReduceOp::Sum)?;
                took.push(started.elapsed());
                let want = (10 + 5 * call) as f32;
                assert!(buf.iter().all(|&x| x == want), "call {call}: {}", buf[0]);
                std::thread::sleep(timeout / 5);
            }
            Ok(took)
        },
    );
    for (rank, (result, _)) in results.into_iter().enumerate() {
        let took = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        eprintln!("rank {rank}: {took:?}");
        // Every call lasts as long as the slow rank's part of it; the others may
        // enter it later than the slow rank does.
        if rank == 1 {
            for t in took {
                assert!(t >= timeout * 3, "a call took only {t:?}");
            }
        }
    }
}

/// A ring call at n = 5 whose last step sends blocks larger than
/// the kernel's socket buffers, after which every rank computes for twice the silence
/// timeout. A rank must not return while its last block still waits in its own queue:
/// its successor would wait for it, silent, for as long as it computes. Afterwards
/// every rank arrives at the next call together and it succeeds too.
#[test]
fn a_ring_call_hands_all_its_data_over_before_it_returns() {
    let timeout = Duration::from_secs(1);
    let options = CommOptions::default()
        .with_timeout(timeout)
        .with_direct_max_ranks(0)
        .with_piece_bytes(16 << 20);
    // Blocks of 8 MiB, each sent whole.
    let elems = 5 * (2 << 20);
    let results = world(
        5,
        Path::Tcp,
        usize::MAX,
        Duration::ZERO,
        options,
        move |comm| {
            let mut buf = vec![1.0f32; elems];
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            assert!(buf.iter().all(|&x| x == 5.0));
            std::thread::sleep(timeout * 2);
            let mut small = [comm.rank() as u64; 4];
            comm.allreduce(&mut small, ReduceOp::Sum)?;
            assert_eq!(small, [10; 4]);
            Ok(())
        },
    );
    for (rank, (result, took)) in results.into_iter().enumerate() {
        result.unwrap_or_else(|e| panic!("rank {rank} after {took:?}: {e}"));
    }
}
