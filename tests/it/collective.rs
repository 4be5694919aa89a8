//! The mesh engine's collectives with every rank a thread of this process: the
//! shared suite (`collective_suite/`) over each link it runs on, then what is
//! particular to a link (timeouts, lost peers, mismatched calls, a huge buffer).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::collective_suite::{self, World};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::testing::{self, MemoryLink, MemorySchedule};
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp, RobustOptions};

/// `f16` and `bf16` on every algorithm, against `f64` references (TCP and shared
/// memory need the `zmq` feature's `tcp://` endpoints).
#[cfg(feature = "zmq")]
mod half;

static JOB: AtomicUsize = AtomicUsize::new(0);

/// Endpoints for a fresh job of `n` ranks over `scheme` (`local` or `inproc`).
fn endpoints(scheme: &str, n: usize) -> Vec<String> {
    let job = JOB.fetch_add(1, Ordering::Relaxed);
    (0..n)
        .map(|r| {
            format!(
                "{scheme}://collective-test-{}-{job}-{r}",
                std::process::id()
            )
        })
        .collect()
}

fn options() -> CommOptions {
    CommOptions::default().with_timeout(Duration::from_secs(20))
}

/// Runs `body` on `n` ranks, each a thread with its own communicator, and returns
/// their results in rank order.
fn on_ranks<R: Send + 'static>(
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    on_ranks_over("local", n, options, body)
}

fn on_ranks_over<R: Send + 'static>(
    scheme: &str,
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    on_ranks_with(scheme, n, move |_| options.clone(), body)
}

/// [`on_ranks_over`] with rank `r`'s options `options(r)`.
fn on_ranks_with<R: Send + 'static>(
    scheme: &str,
    n: usize,
    options: impl Fn(usize) -> CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    let endpoints = endpoints(scheme, n);
    let body = Arc::new(body);
    // On TCP every rank binds port 0 and the real endpoints go through the board.
    let board = MemoryExchange::new(n);
    // A world of one is solo on every scheme (`Bootstrap::endpoints` binds nothing).
    let tcp = scheme == "tcp" && n > 1;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (endpoints, body, options) = (endpoints.clone(), body.clone(), options(rank));
            let board = board.clone();
            std::thread::spawn(move || {
                let mut comm = if tcp {
                    Communicator::join(&Bootstrap::from_exchange(rank, n, board), options)?
                } else {
                    Communicator::join(&Bootstrap::endpoints(rank, &endpoints), options)?
                };
                assert_eq!(comm.rank(), rank);
                assert_eq!(comm.world_size(), n);
                assert_eq!(comm.is_distributed(), n > 1);
                body(&mut comm)
            })
        })
        .collect();
    collect(handles.into_iter().map(|h| h.join()).collect())
}

/// Every rank's result in rank order; fails naming every rank that failed.
fn collect<R>(outcomes: Vec<std::thread::Result<Result<R, CollectiveError>>>) -> Vec<R> {
    let failures: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(rank, outcome)| match outcome {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("rank {rank}: {e}")),
            Err(_) => Some(format!("rank {rank} panicked")),
        })
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    outcomes
        .into_iter()
        .filter_map(|outcome| outcome.ok().and_then(Result::ok))
        .collect()
}

/// The mesh over `local://` in-process queues: a `SocketLink` on the local backend.
struct Local;

impl World for Local {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        on_ranks_over("local", n, options, body)
    }
}

/// The mesh over ZeroMQ `inproc://`: a `SocketLink` on the zmq backend.
#[cfg(feature = "zmq")]
struct Inproc;

#[cfg(feature = "zmq")]
impl World for Inproc {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        on_ranks_over("inproc", n, options, body)
    }
}

/// The mesh over ZeroMQ `tcp://` with the TCP data path: a `StreamLink` carrying the
/// collectives' messages beside the ZeroMQ control link, over TCP connections
/// (`Stream { shared_memory: false }`) or with every pair of ranks on shared memory
/// (`true`, the default for ranks on one host).
#[cfg(feature = "zmq")]
struct Stream {
    shared_memory: bool,
}

#[cfg(feature = "zmq")]
impl World for Stream {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        let options = options
            .with_data_path(switchyard::collective::DataPath::Tcp)
            .with_shared_memory(self.shared_memory);
        on_ranks_over("tcp", n, options, body)
    }
}

/// The mesh over `tcp://` with the TCP data path, its ranks on hosts of
/// `per_host` ranks each (rank `r` on host `r / per_host`, the last host with what is
/// left): each rank announces its host (`CommOptions::host_id`), so the ranks of a
/// host talk through shared memory and share a host board, the hosts over TCP, and
/// allreduces run hierarchically. All in this process: the host identity is what
/// decides, as it is for ranks in network namespaces of one machine.
#[cfg(feature = "zmq")]
struct Hosts {
    per_host: usize,
}

#[cfg(feature = "zmq")]
impl World for Hosts {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        let per_host = self.per_host.max(1);
        let options = options
            .with_data_path(switchyard::collective::DataPath::Tcp)
            .with_shared_memory(true);
        on_ranks_with(
            "tcp",
            n,
            move |rank| {
                options
                    .clone()
                    .with_host_id(format!("host-{}", rank / per_host))
            },
            body,
        )
    }
}

/// The mesh over the deterministic in-memory link, on `MemorySchedule`.
struct Memory(MemorySchedule);

/// The robust engine (agreements, replay records) over the mesh on the in-memory link.
struct RobustMemory(MemorySchedule);

/// Runs `body` on `n` threads, each with the communicator `form` makes of its
/// in-memory link on `schedule`.
fn over_memory<R: Send + 'static>(
    schedule: MemorySchedule,
    n: usize,
    options: CommOptions,
    form: fn(MemoryLink, CommOptions) -> Communicator,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    let body = Arc::new(body);
    let handles: Vec<_> = MemoryLink::world_with(n, schedule)
        .into_iter()
        .enumerate()
        .map(|(rank, link)| {
            let (body, options) = (body.clone(), options.clone());
            std::thread::spawn(move || {
                let mut comm = form(link, options);
                assert_eq!((comm.rank(), comm.world_size()), (rank, n));
                body(&mut comm)
            })
        })
        .collect();
    collect(handles.into_iter().map(|h| h.join()).collect())
}

impl World for Memory {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        over_memory(
            self.0,
            n,
            options,
            |link, options| testing::over_link(Box::new(link), options),
            body,
        )
    }
}

impl World for RobustMemory {
    fn run<R: Send + 'static>(
        &self,
        n: usize,
        options: CommOptions,
        body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
    ) -> Vec<R> {
        let form = |link: MemoryLink, options| {
            let robust = RobustOptions::default();
            let comm = testing::robust_over_link(Box::new(link), options, robust);
            assert_eq!(comm.engine_name(), "robust");
            comm
        };
        over_memory(self.0, n, options, form, body)
    }
}

collective_suite::instantiate!(over_local, crate::collective::Local);
#[cfg(feature = "zmq")]
collective_suite::instantiate!(over_zmq_inproc, crate::collective::Inproc);
#[cfg(feature = "zmq")]
collective_suite::instantiate!(
    over_zmq_tcp_stream,
    crate::collective::Stream {
        shared_memory: false
    }
);
#[cfg(feature = "zmq")]
collective_suite::instantiate!(
    over_shared_memory,
    crate::collective::Stream {
        shared_memory: true
    }
);
#[cfg(feature = "zmq")]
collective_suite::instantiate!(over_hosts_of_two, crate::collective::Hosts { per_host: 2 });
#[cfg(feature = "zmq")]
collective_suite::instantiate!(
    over_hosts_of_three,
    crate::collective::Hosts { per_host: 3 }
);
collective_suite::instantiate!(
    over_memory,
    crate::collective::Memory(crate::collective::MemorySchedule::RoundRobin)
);
collective_suite::instantiate!(
    over_memory_seeded,
    crate::collective::Memory(crate::collective::MemorySchedule::Seeded(2026))
);
collective_suite::instantiate!(
    robust_over_memory_seeded,
    crate::collective::RobustMemory(crate::collective::MemorySchedule::Seeded(2026))
);

#[test]
fn a_buffer_larger_than_64_mib() {
    // 17 Mi f32 = 68 MiB per rank, through the ring with default pieces.
    let len = 17 << 20;
    let results = on_ranks(
        3,
        options().with_timeout(Duration::from_secs(120)),
        move |comm| {
            let r = comm.rank() as f32;
            let mut buf: Vec<f32> = (0..len).map(|i| (i % 1000) as f32 + r).collect();
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            let wrong = (0..len)
                .filter(|&i| buf[i] != 3.0 * (i % 1000) as f32 + 3.0)
                .count();
            Ok(wrong)
        },
    );
    assert_eq!(results, [0, 0, 0]);
}

/// Runs `body` on `n` ranks and returns each rank's result, errors included.
fn outcomes<R: Send + 'static>(
    n: usize,
    options: CommOptions,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<Result<R, CollectiveError>> {
    on_ranks(n, options, move |comm| Ok(body(comm)))
}

#[test]
fn mismatched_lengths_are_an_error_naming_the_rank_not_a_hang() {
    let started = std::time::Instant::now();
    let results = outcomes(4, options(), |comm| {
        let len = if comm.rank() == 2 { 9 } else { 8 };
        let mut buf = vec![1.0f32; len];
        comm.allreduce(&mut buf, ReduceOp::Sum)
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let text: Vec<String> = results.iter().map(|r| format!("{r:?}")).collect();
    assert!(results.iter().all(Result::is_err), "{text:#?}");
    // Someone must have seen rank 2's 9 elements (or rank 2 someone's 8) and said so.
    assert!(
        results.iter().any(|r| matches!(
            r,
            Err(CollectiveError::SizeMismatch {
                rank: 2,
                ours: 8,
                theirs: 9,
                ..
            }) | Err(CollectiveError::SizeMismatch {
                me: 2,
                ours: 9,
                theirs: 8,
                ..
            })
        )),
        "{text:#?}"
    );
    for r in &results {
        assert!(
            r.as_ref()
                .unwrap_err()
                .to_string()
                .starts_with("allreduce: "),
            "{text:#?}"
        );
    }
}

#[test]
fn different_operations_or_roots_are_an_error() {
    let results = outcomes(2, options(), |comm| {
        let op = if comm.rank() == 0 {
            ReduceOp::Sum
        } else {
            ReduceOp::Max
        };
        let mut buf = [1u32; 3];
        comm.allreduce(&mut buf, op)
    });
    assert!(
        results.iter().all(|r| matches!(
            r,
            Err(CollectiveError::CallMismatch { .. }) | Err(CollectiveError::Aborted { .. })
        )),
        "{results:?}"
    );
    // A rank that receives from a rank with another root notices; one that only
    // sends cannot (documented on Communicator::broadcast) unless checked mode is on.
    // Here rank 2 waits for rank 1, which never sends; rank 0's message (root 0)
    // arrives meanwhile, is checked on arrival whatever its step, and ends the wait
    // (not the deadline).
    let started = std::time::Instant::now();
    let results = outcomes(3, options().with_timeout(Duration::from_secs(1)), |comm| {
        let mut buf = [0u8; 4];
        let root = if comm.rank() == 2 { 1 } else { 0 };
        comm.broadcast(&mut buf, root)
    });
    // The error's kind tells a mismatch from the 1 s deadline (that would be a
    // PeerTimeout); the bound only says the call ended.
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        matches!(
            &results[2],
            Err(CollectiveError::CallMismatch { rank: 0, ours, theirs, .. })
                if ours.contains("root 1") && theirs.contains("root 0")
        ),
        "{results:?}"
    );
}

#[test]
fn a_silent_peer_is_a_timeout_naming_it() {
    let timeout = Duration::from_millis(500);
    let results = outcomes(3, options().with_timeout(timeout), move |comm| {
        let mut buf = [1i64; 4];
        if comm.rank() == 1 {
            // Rank 1 is alive but never calls (a hung peer).
            std::thread::sleep(timeout * 3);
            return Ok(());
        }
        comm.allreduce(&mut buf, ReduceOp::Sum)
    });
    for rank in [0, 2] {
        match &results[rank] {
            Err(CollectiveError::PeerTimeout {
                rank: 1, waited, ..
            }) => {
                assert!(
                    *waited >= timeout && *waited < timeout * 2 + Duration::from_secs(1),
                    "{waited:?}"
                )
            }
            Err(CollectiveError::Aborted { .. }) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CollectiveError::PeerTimeout { rank: 1, .. }))),
        "{results:?}"
    );
}

#[test]
fn arguments_no_rank_could_use_are_refused_before_any_traffic() {
    let mut comm = Communicator::solo();
    assert_eq!(comm.world_size(), 1);
    assert!(!comm.is_distributed());
    assert!(!comm.processor_name().is_empty());
    let mut floats = [1.0f32];
    let err = comm.allreduce(&mut floats, ReduceOp::BitOr).unwrap_err();
    assert!(
        matches!(err, CollectiveError::InvalidArgument { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("BitOr"), "{err}");
    let err = comm.broadcast(&mut floats, 1).unwrap_err();
    assert!(
        err.to_string().contains("root 1 is outside a world of 1"),
        "{err}"
    );
    let mut out = [0.0f32; 3];
    let err = comm.allgather(&floats, &mut out).unwrap_err();
    assert!(err.to_string().contains("out holds 3 elements"), "{err}");
}

#[cfg(feature = "zmq")]
#[test]
fn over_tcp_a_peer_that_leaves_is_lost_at_once_not_at_the_deadline() {
    a_peer_that_leaves_is_lost_at_once(false, "tcp://127.0.0.1:");
}

/// Over shared memory the peer's end is its Unix socket closing.
#[cfg(feature = "zmq")]
#[test]
fn over_shared_memory_a_peer_that_leaves_is_lost_at_once_not_at_the_deadline() {
    a_peer_that_leaves_is_lost_at_once(true, "shm://127.0.0.1:");
}

/// Ranks that share a host make allreduces, broadcasts, allgathers, reduce-scatters
/// and barriers on the host board, and only then: a rank that waits for a peer says where, and with
/// shared memory off (or above the board's slot) it waits in another algorithm. The
/// late rank is the broadcasts' root (a root on the board need not wait for anyone).
#[cfg(feature = "zmq")]
#[test]
fn calls_of_ranks_on_one_host_take_the_host_board() {
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Allreduce,
        Broadcast,
        Allgather,
        ReduceScatter,
        Barrier,
    }
    let waiting_in = |op: Op, shared_memory: bool, len: usize, board_max: usize| {
        let options = options()
            .with_timeout(Duration::from_millis(300))
            .with_shared_memory(shared_memory)
            .with_board_max_bytes(board_max);
        let results = on_ranks_over("tcp", 2, options, move |comm| {
            if comm.rank() == 1 {
                // Late for the call: rank 0 waits for it past its timeout.
                std::thread::sleep(Duration::from_millis(1500));
                return Ok(None);
            }
            let mut buf = vec![1u32; len];
            let mut all = vec![0u32; 2 * len];
            Ok(Some(match op {
                Op::Allreduce => comm.allreduce(&mut buf, ReduceOp::Sum),
                Op::Broadcast => comm.broadcast(&mut buf, 1),
                Op::Allgather => comm.allgather(&buf, &mut all),
                Op::ReduceScatter => comm.reduce_scatter(&mut buf, ReduceOp::Sum).map(|_| ()),
                Op::Barrier => comm.barrier(),
            }))
        });
        match &results[0] {
            Some(Err(CollectiveError::PeerTimeout {
                rank: 1, during, ..
            })) => Some(during.clone()),
            other => panic!("{op:?}, shared memory {shared_memory}, {len} elements: {other:?}"),
        }
    };
    let ops = [
        Op::Allreduce,
        Op::Broadcast,
        Op::Allgather,
        Op::ReduceScatter,
        Op::Barrier,
    ];
    for op in ops {
        let on_board = waiting_in(op, true, 2, usize::MAX).unwrap_or_default();
        assert!(on_board.contains("host board"), "{op:?}: {on_board}");
        let without = waiting_in(op, false, 2, usize::MAX).unwrap_or_default();
        assert!(!without.contains("host board"), "{op:?}: {without}");
    }
    // 4 MiB: past the board's slot and the large threshold alike, on the board in
    // pieces by default, off it past `board_max_bytes`.
    for op in [
        Op::Allreduce,
        Op::Broadcast,
        Op::Allgather,
        Op::ReduceScatter,
    ] {
        let large = waiting_in(op, true, 1 << 20, usize::MAX).unwrap_or_default();
        assert!(large.contains("host board"), "{op:?}: {large}");
        let limited = waiting_in(op, true, 1 << 20, 1 << 20).unwrap_or_default();
        assert!(!limited.contains("host board"), "{op:?}: {limited}");
    }
}

/// A broadcast's root on the host board returns once its data is written, before the
/// others arrive, and runs at most one board call ahead of them: its next call waits
/// for their parts of this one. The others still get every call's data.
#[cfg(feature = "zmq")]
#[test]
fn a_broadcast_root_on_the_board_returns_before_the_others_arrive() {
    let late = Duration::from_millis(1500);
    let results = on_ranks_over("tcp", 2, options(), move |comm| {
        let started = Instant::now();
        if comm.rank() == 1 {
            std::thread::sleep(late);
        }
        let mut first = vec![comm.rank() as u32 + 7; 4];
        comm.broadcast(&mut first, 0)?;
        let first_done = started.elapsed();
        let mut second = vec![comm.rank() as u32 + 70; 4];
        comm.broadcast(&mut second, 0)?;
        Ok((first, second, first_done, started.elapsed()))
    });
    let (first, second, root_first, root_second) = results[0].clone();
    assert!(root_first < late / 3, "the root waited {root_first:?}");
    assert!(
        root_second >= late / 2,
        "a second call waits for the first's parts: {root_second:?}"
    );
    assert_eq!((first, second), (vec![7; 4], vec![70; 4]));
    let (first, second, ..) = results[1].clone();
    assert_eq!((first, second), (vec![7; 4], vec![70; 4]));
}

/// Two hosts of two ranks with a 300 ms silence timeout, the hierarchy on or off,
/// where rank `late` sleeps past everyone's timeout (its result `None`) and every
/// other rank runs `call` once.
fn two_hosts_with_a_late_rank(
    late: usize,
    hierarchical: bool,
    call: impl Fn(&mut Communicator) -> Result<(), CollectiveError> + Send + Sync + 'static,
) -> Vec<Option<Result<(), CollectiveError>>> {
    let options = options()
        .with_timeout(Duration::from_millis(300))
        .with_shared_memory(true)
        .with_hierarchical(hierarchical);
    Hosts { per_host: 2 }.run(4, options, move |comm| {
        if comm.rank() == late {
            std::thread::sleep(Duration::from_millis(1500));
            return Ok(None);
        }
        Ok(Some(call(comm)))
    })
}

/// Two hosts of two ranks: an allreduce runs within each host, then between the
/// leaders (ranks 0 and 2), then from each leader to its host. With rank 3 late,
/// rank 2 times out within its host, and rank 0, which finished its own host's phase
/// with rank 1, fails among the leaders with rank 2's reason (or its own timeout on
/// rank 2); both errors name the phase. With the hierarchy off, the flat algorithm
/// waits instead. Results of a hierarchical world are the suite's (`over_hosts_*`).
#[cfg(feature = "zmq")]
#[test]
fn an_allreduce_across_hosts_runs_within_hosts_then_among_leaders() {
    let errors = |hierarchical: bool, len: usize| {
        let results = two_hosts_with_a_late_rank(3, hierarchical, move |comm| {
            comm.allreduce(&mut vec![1u32; len], ReduceOp::Sum)
        });
        let mut errors = results
            .into_iter()
            .enumerate()
            .map(|(rank, result)| match result {
                Some(Err(e)) => Some(e),
                None if rank == 3 => None,
                other => {
                    panic!("hierarchical {hierarchical}, {len} elements, rank {rank}: {other:?}")
                }
            });
        let rank_0 = errors.next().flatten().expect("rank 0's error");
        let rank_2 = errors.nth(1).flatten().expect("rank 2's error");
        (rank_0, rank_2)
    };
    for len in [2, 1 << 18] {
        let (rank_0, rank_2) = errors(true, len);
        assert!(
            matches!(
                rank_0,
                CollectiveError::PeerTimeout { rank: 2, .. }
                    | CollectiveError::Aborted { rank: 2, .. }
            ),
            "{len}: {rank_0:?}"
        );
        assert!(
            matches!(rank_2, CollectiveError::PeerTimeout { rank: 3, .. }),
            "{rank_2:?}"
        );
        let (rank_0, rank_2) = (rank_0.to_string(), rank_2.to_string());
        assert!(rank_0.contains("hierarchy of hosts"), "{len}: {rank_0}");
        assert!(
            rank_2.contains("hierarchy of hosts, within the host: host board"),
            "{len}: {rank_2}"
        );
        let (rank_0, rank_2) = errors(false, len);
        assert!(!rank_0.to_string().contains("hierarchy"), "{len}: {rank_0}");
        assert!(!rank_2.to_string().contains("hierarchy"), "{len}: {rank_2}");
    }
}

/// A broadcast across hosts goes among one rank per host (the root on its own) and
/// then within each host: with the root, rank 2 (second host, with rank 3), late,
/// rank 0 waits for it among the hosts and rank 3 on its host's board, and each says
/// so. With the hierarchy off both wait in a flat algorithm.
#[cfg(feature = "zmq")]
#[test]
fn a_broadcast_across_hosts_runs_among_hosts_then_within_them() {
    let errors = |hierarchical: bool, len: usize| {
        let results = two_hosts_with_a_late_rank(2, hierarchical, move |comm| {
            comm.broadcast(&mut vec![comm.rank() as u32; len], 2)
        });
        let error_of = |rank: usize| match &results[rank] {
            Some(Err(e @ CollectiveError::PeerTimeout { rank: 2, .. })) => e.to_string(),
            other => panic!("hierarchical {hierarchical}, {len} elements, rank {rank}: {other:?}"),
        };
        (error_of(0), error_of(3))
    };
    for len in [2, 1 << 18] {
        let (rank_0, rank_3) = errors(true, len);
        assert!(
            rank_0.contains("hierarchy of hosts, among the hosts' leaders"),
            "{len}: {rank_0}"
        );
        assert!(
            rank_3.contains("hierarchy of hosts, from the leader to its host: host board"),
            "{len}: {rank_3}"
        );
        let (rank_0, rank_3) = errors(false, len);
        assert!(!rank_0.contains("hierarchy"), "{len}: {rank_0}");
        assert!(!rank_3.contains("hierarchy"), "{len}: {rank_3}");
    }
}

/// A mismatch found within a host's phase names world ranks, not places on the host:
/// rank 3 (on the second host with rank 2) allreduces 2047 elements where the others
/// allreduce 2048, and both ranks of that host say so with their own numbers.
#[cfg(feature = "zmq")]
#[test]
fn a_mismatch_across_hosts_names_world_ranks() {
    for check in [false, true] {
        mismatch_across_hosts(check);
    }
}

/// [`a_mismatch_across_hosts_names_world_ranks`] in checked mode or not.
#[cfg(feature = "zmq")]
fn mismatch_across_hosts(check: bool) {
    let options = options()
        .with_timeout(Duration::from_secs(5))
        .with_shared_memory(true)
        .with_check(check);
    let results = Hosts { per_host: 2 }.run(4, options, |comm| {
        let len = if comm.rank() == 3 { 2047 } else { 2048 };
        let mut buf = vec![1.0f32; len];
        Ok(comm
            .allreduce(&mut buf, ReduceOp::Sum)
            .map_err(|e| e.to_string()))
    });
    for rank in [2, 3] {
        let error = results[rank].as_ref().expect_err("a mismatch must fail");
        assert!(
            error.contains("f32 x 2047") && error.contains("f32 x 2048"),
            "rank {rank}: {error}"
        );
        assert!(
            error.contains("rank 2") && error.contains("rank 3"),
            "rank {rank}: {error}"
        );
        assert!(
            !error.contains("(rank 0)") && !error.contains("(rank 1)"),
            "rank {rank}: {error}"
        );
    }
    assert!(results.iter().all(Result::is_err), "{results:?}");
}

#[cfg(feature = "zmq")]
fn a_peer_that_leaves_is_lost_at_once(shared_memory: bool, scheme: &str) {
    let timeout = Duration::from_secs(30);
    let started = std::time::Instant::now();
    let options = options()
        .with_timeout(timeout)
        .with_shared_memory(shared_memory);
    let results = on_ranks_over("tcp", 3, options, |comm| {
        if comm.rank() == 2 {
            // Closes its connections, as a process that dies does.
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut buf = [1u32; 8];
        Ok(Some(comm.allreduce(&mut buf, ReduceOp::Sum)))
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Whoever notices first names rank 2; the other may instead see that rank leave
    // after its error, or its abort notice.
    for rank in [0, 1] {
        match &results[rank] {
            Some(Err(CollectiveError::PeerLost { endpoint, .. })) => {
                assert!(endpoint.starts_with(scheme), "{endpoint}")
            }
            Some(Err(CollectiveError::Aborted { .. })) => {}
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Some(Err(CollectiveError::PeerLost { rank: 2, .. })))),
        "{results:?}"
    );
}

#[test]
fn over_memory_waits_no_rank_can_satisfy_end_at_once_on_every_schedule() {
    for schedule in [
        MemorySchedule::RoundRobin,
        MemorySchedule::Seeded(1),
        MemorySchedule::Seeded(2),
    ] {
        // Rank 2 waits for rank 1, which never calls: with every other rank done,
        // the in-memory link knows nothing can come, long before the 20 s deadline.
        // (Ranks 0 and 1 make no call: a broadcast of theirs from another root would
        // end rank 2's wait as a mismatch first.)
        let started = std::time::Instant::now();
        let results = Memory(schedule).run(3, options(), |comm| {
            let mut buf = [0u8; 4];
            if comm.rank() != 2 {
                return Ok(Ok(()));
            }
            Ok(comm.broadcast(&mut buf, 1))
        });
        assert!(started.elapsed() < Duration::from_secs(5), "{schedule:?}");
        assert!(results[..2].iter().all(Result::is_ok), "{results:?}");
        assert!(
            matches!(
                results[2],
                Err(CollectiveError::PeerTimeout { rank: 1, .. })
            ),
            "{schedule:?}: {results:?}"
        );

        // Mismatched lengths: every rank fails, one of them naming rank 2's 9 elements.
        let results = Memory(schedule).run(4, options(), |comm| {
            let len = if comm.rank() == 2 { 9 } else { 8 };
            let mut buf = vec![1.0f32; len];
            Ok(comm.allreduce(&mut buf, ReduceOp::Sum))
        });
        assert!(started.elapsed() < Duration::from_secs(10), "{schedule:?}");
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(
            results.iter().any(|r| matches!(
                r,
                Err(CollectiveError::SizeMismatch { rank: 2, .. })
                    | Err(CollectiveError::SizeMismatch { me: 2, .. })
            )),
            "{schedule:?}: {results:?}"
        );
    }
}

/// Five ranks on three made-up hosts (0-1, 2-3, and 4, whose shared memory is off):
/// each pair on one host talks through shared memory, every other pair over TCP, in
/// one world. Every collective gives the same results as on any single path, at sizes
/// below and above the algorithms' thresholds and the rings' 1 MiB.
#[cfg(feature = "zmq")]
#[test]
fn shared_memory_and_tcp_pairs_mix_in_one_world() {
    let n = 5;
    let board = MemoryExchange::new(n);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let board = board.clone();
            let options = options()
                .with_host_id(format!("host{}", rank / 2))
                .with_shared_memory(rank != 4);
            std::thread::spawn(move || -> Result<(), CollectiveError> {
                let mut comm =
                    Communicator::join(&Bootstrap::from_exchange(rank, n, board), options)?;
                for len in [1usize, 1000, 300_000, 700_000] {
                    let mut buf: Vec<f64> =
                        (0..len).map(|i| (i % 97) as f64 + rank as f64).collect();
                    comm.allreduce(&mut buf, ReduceOp::Sum)?;
                    for (i, v) in buf.iter().enumerate() {
                        assert_eq!(
                            *v,
                            5.0 * (i % 97) as f64 + 10.0,
                            "allreduce of {len}, element {i}"
                        );
                    }
                    let mut data: Vec<u32> = vec![rank as u32; len];
                    comm.broadcast(&mut data, 3)?;
                    assert!(data.iter().all(|&v| v == 3), "broadcast of {len}");
                    let mine: Vec<u32> = (0..len).map(|i| (rank * len + i) as u32).collect();
                    let mut all = vec![0u32; len * n];
                    comm.allgather(&mine, &mut all)?;
                    assert!(
                        all.iter().enumerate().all(|(i, &v)| v == i as u32),
                        "allgather of {len}"
                    );
                }
                comm.barrier()
            })
        })
        .collect();
    collect(handles.into_iter().map(|h| h.join()).collect());
}

/// Two ranks that fit the host's cores (so their waits spin, 1 ms by default) but that
/// the scheduler put on one core, as it does beside other work: a rank that waits
/// gives up the core its peer needs instead of spinning on it. Measured in processor
/// time, which is what a spin burns, and not in wall time, which other work on the
/// machine decides: spinning, each call burned a whole spin (or a scheduler slice) of
/// each rank's time, about 1 ms.
#[cfg(all(feature = "zmq", target_os = "linux"))]
#[test]
fn ranks_put_on_one_core_give_it_up_to_each_other_instead_of_spinning() {
    const CALLS: u32 = 1000;
    let results = on_ranks_over("tcp", 2, options(), move |comm| {
        // SAFETY: a zeroed set is a valid empty `cpu_set_t`; pid 0 is this thread.
        let pinned = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        assert!(pinned, "{}", std::io::Error::last_os_error());
        let mut buf = vec![1.0f32; 2];
        comm.allreduce(&mut buf, ReduceOp::Sum)?;
        let before = thread_cpu_time();
        for _ in 0..CALLS {
            buf.fill(1.0);
            comm.allreduce(&mut buf, ReduceOp::Sum)?;
            assert_eq!(buf, [2.0, 2.0]);
        }
        Ok(thread_cpu_time() - before)
    });
    for (rank, burned) in results.iter().enumerate() {
        // A tenth of a millisecond a call: a tenth of what one spin burns (the
        // first 5 ms of waits beside the peer spin as usual, and are counted).
        assert!(
            *burned < Duration::from_micros(100) * CALLS,
            "rank {rank} burned {burned:?} of processor time in {CALLS} calls"
        );
    }
}

/// The processor time this thread has used.
#[cfg(all(feature = "zmq", target_os = "linux"))]
fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    assert!(ok, "{}", std::io::Error::last_os_error());
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
