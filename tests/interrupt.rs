//! [`Interrupt`]: a rank whose flag is raised while it waits in a call returns
//! `Interrupted` at once, and a rank waiting with it fails naming it, long before the
//! silence timeout. Three ranks as threads over `tcp://127.0.0.1` with the TCP data
//! path; rank 2 never joins the call, so the others would otherwise wait for it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc::channel;
use std::thread;
use std::time::{Duration, Instant};
use switchyard::collective::{
    CollectiveError, CommOptions, Communicator, DataPath, Interrupt, ReduceOp,
};

const SIZE: usize = 3;
/// The silence timeout: an interrupt that did not work would show as a wait this long.
const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn an_interrupted_rank_returns_at_once_and_its_peers_name_it() {
    let stop = Interrupt::new();
    let (endpoint_tx, endpoint_rx) = channel();
    let (all_tx, all_rx): (Vec<_>, Vec<_>) = (0..SIZE).map(|_| channel::<Vec<String>>()).unzip();
    let (release_tx, release_rx) = channel::<()>();
    let mut release_rx = Some(release_rx);
    let ranks: Vec<_> = all_rx
        .into_iter()
        .enumerate()
        .map(|(rank, endpoints)| {
            let mut options = CommOptions::default()
                .with_timeout(TIMEOUT)
                .with_data_path(DataPath::Tcp);
            if rank == 0 {
                options = options.with_interrupt(stop.clone());
            }
            let endpoint_tx = endpoint_tx.clone();
            let release = if rank == 2 { release_rx.take() } else { None };
            thread::spawn(move || {
                let builder =
                    Communicator::bind_mesh(rank, SIZE, "tcp://127.0.0.1:0", options).unwrap();
                endpoint_tx
                    .send((rank, builder.endpoint().to_string()))
                    .unwrap();
                let endpoints = endpoints.recv().unwrap();
                let mut comm = builder.connect(&endpoints).unwrap();
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
    let mut endpoints = vec![String::new(); SIZE];
    for _ in 0..SIZE {
        let (rank, endpoint) = endpoint_rx.recv_timeout(TIMEOUT).unwrap();
        endpoints[rank] = endpoint;
    }
    for tx in &all_tx {
        tx.send(endpoints.clone()).unwrap();
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
