//! [`Interrupt`]: a rank whose flag is raised while it waits in a call returns
//! `Interrupted` at once, and a rank waiting with it fails naming it, long before the
//! silence timeout. Three ranks as threads over `tcp://127.0.0.1` with the TCP data
//! path; rank 2 never joins the call, so the others would otherwise wait for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, MemoryExchange};
use switchyard::collective::{
    CollectiveError, CommOptions, Communicator, DataPath, Interrupt, ReduceOp,
};

const SIZE: usize = 3;
/// The silence timeout: an interrupt that did not work would show as a wait this long.
const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn an_interrupted_rank_returns_at_once_and_its_peers_name_it() {
    let stop = Interrupt::new();
    let board = MemoryExchange::new(SIZE);
    let (joined_tx, joined_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    let mut release_rx = Some(release_rx);
    let ranks: Vec<_> = (0..SIZE)
        .map(|rank| {
            let mut options = CommOptions::default()
                .with_timeout(TIMEOUT)
                .with_data_path(DataPath::Tcp);
            if rank == 0 {
                options = options.with_interrupt(stop.clone());
            }
            let (joined_tx, board) = (joined_tx.clone(), board.clone());
            let release = if rank == 2 { release_rx.take() } else { None };
            thread::spawn(move || {
                let boot = Bootstrap::from_exchange(rank, SIZE, board);
                let mut comm = Communicator::join(&boot, options).unwrap();
                joined_tx.send(rank).unwrap();
                if let Some(release) = release {
                    // In the mesh, but never in the call: the others wait for it.
                    let _ = release.recv_timeout(TIMEOUT);
                    return None;
                }
                let mut buf = vec![1.0f32; 1024];
                let started = Instant::now();
                let result = comm.allreduce(&mut buf, ReduceOp::Sum);
                Some((result, started.elapsed()))
            })
        })
        .collect();
    // The flag goes up once every rank is in the mesh, while two wait in the call.
    for _ in 0..SIZE {
        joined_rx.recv_timeout(TIMEOUT).unwrap();
    }
    thread::sleep(Duration::from_millis(300));
    stop.raise();
    let mut results: Vec<_> = ranks
        .into_iter()
        .take(2)
        .map(|r| r.join().unwrap())
        .collect();
    release_tx.send(()).unwrap();
    let (second, second_took) = results.pop().unwrap().unwrap();
    let (first, first_took) = results.pop().unwrap().unwrap();
    assert!(
        matches!(first, Err(CollectiveError::Interrupted { rank: 0, .. })),
        "{first:?}"
    );
    assert!(first_took < Duration::from_secs(2), "{first_took:?}");
    match second {
        Err(CollectiveError::Aborted {
            rank: 0, reason, ..
        }) => {
            assert!(reason.contains("interrupted on rank 0"), "{reason}");
        }
        other => panic!("rank 1 should name rank 0: {other:?}"),
    }
    assert!(second_took < Duration::from_secs(5), "{second_took:?}");
}

/// Forms a mesh of `size` ranks as threads on the TCP data path, rank 0 watching
/// `stop`, and runs `body` on each; returns every rank's result and how long its
/// body took.
fn mesh_of<R: Send + 'static>(
    size: usize,
    stop: &Interrupt,
    body: impl Fn(usize, &mut Communicator) -> R + Send + Sync + Clone + 'static,
) -> Vec<(R, Duration)> {
    let board = MemoryExchange::new(size);
    let ranks: Vec<_> = (0..size)
        .map(|rank| {
            let mut options = CommOptions::default()
                .with_timeout(TIMEOUT)
                .with_data_path(DataPath::Tcp);
            if rank == 0 {
                options = options.with_interrupt(stop.clone());
            }
            let (board, body) = (board.clone(), body.clone());
            thread::spawn(move || {
                let boot = Bootstrap::from_exchange(rank, size, board);
                let mut comm = Communicator::join(&boot, options).unwrap();
                let started = Instant::now();
                let result = body(rank, &mut comm);
                (result, started.elapsed())
            })
        })
        .collect();
    ranks.into_iter().map(|r| r.join().unwrap()).collect()
}

/// The busy path. Rank 1's broadcast reached rank 0's socket
/// before rank 0 called, so rank 0's call never has to wait for a byte: it must
/// still see the raised flag, fail with `Interrupted`, and tell rank 1, whose next
/// call fails at once naming rank 0 instead of waiting out the timeout.
#[test]
fn an_interrupt_ends_a_call_whose_data_is_already_there() {
    let stop = Interrupt::new();
    let raise = stop.clone();
    let results = mesh_of(2, &stop, move |rank, comm| {
        let mut data = vec![rank as u8; 16 << 10];
        if rank == 0 {
            // The root's message lands in this rank's socket meanwhile.
            thread::sleep(Duration::from_millis(300));
            raise.raise();
            return comm.broadcast(&mut data, 1);
        }
        comm.broadcast(&mut data, 1)?;
        comm.barrier()
    });
    let (first, _) = &results[0];
    assert!(
        matches!(first, Err(CollectiveError::Interrupted { rank: 0, .. })),
        "{first:?}"
    );
    let (second, second_took) = &results[1];
    match second {
        Err(CollectiveError::Aborted {
            rank: 0, reason, ..
        }) => {
            assert!(reason.contains("interrupted on rank 0"), "{reason}")
        }
        other => panic!("rank 1 should name rank 0: {other:?}"),
    }
    assert!(*second_took < Duration::from_secs(5), "{second_took:?}");
}

/// The flag raised while three ranks move data call after call
/// (16 MiB allreduces): rank 0 stops within a second, and the others fail naming it
/// within seconds, long before the 30 s timeout.
#[test]
fn an_interrupt_ends_a_call_that_is_moving_data() {
    let stop = Interrupt::new();
    let raise = stop.clone();
    let raised = Arc::new(Mutex::new(None::<Instant>));
    let raised_at = raised.clone();
    let results = mesh_of(3, &stop, move |rank, comm| {
        let mut buf = vec![1.0f32; 4 << 20];
        if rank == 0 {
            let (raise, raised_at) = (raise.clone(), raised_at.clone());
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(500));
                *raised_at.lock().unwrap() = Some(Instant::now());
                raise.raise();
            });
        }
        let mut outcome = Ok(());
        for _ in 0..400 {
            outcome = comm.allreduce(&mut buf, ReduceOp::Sum);
            if outcome.is_err() {
                break;
            }
            buf.fill(1.0);
        }
        (outcome, Instant::now())
    });
    let raised = raised.lock().unwrap().expect("the flag was raised");
    let ((first, first_end), _) = &results[0];
    assert!(
        matches!(first, Err(CollectiveError::Interrupted { rank: 0, .. })),
        "{first:?}"
    );
    let stopped = first_end.saturating_duration_since(raised);
    assert!(
        stopped < Duration::from_secs(1),
        "rank 0 stopped {stopped:?} after the flag"
    );
    for (rank, ((result, end), _)) in results.iter().enumerate().skip(1) {
        match result {
            Err(CollectiveError::Aborted { reason, .. }) => {
                assert!(
                    reason.contains("interrupted on rank 0"),
                    "rank {rank}: {reason}"
                )
            }
            other => panic!("rank {rank} should name rank 0: {other:?}"),
        }
        let told = end.saturating_duration_since(raised);
        assert!(
            told < Duration::from_secs(5),
            "rank {rank} ended {told:?} after the flag"
        );
    }
}
