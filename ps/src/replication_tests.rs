//! Server replication: a server killed mid-run is replaced by its ring neighbour and
//! training goes on with exact sums.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ps_support::{config, endpoint, on_workers};
use crate::{KvServer, KvWorker, Mode, PsError, Scheduler, Update};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const ROUNDS: u32 = 30;
const KILL_AFTER: u32 = 5;

/// Three workers push `rank + 1` into every element of three keys for 30 rounds:
/// key 0 lives on server 0, key `u64::MAX` on server 1, key 7 (200 values) is split
/// over both. Server 1 stops dead after round 5. Every round's answer must still be
/// exactly `6 * round`, and so must a final pull.
fn replacement_keeps_sums_exact(scheme: &str) {
    // A longer silence than the other tests' 1.5 s: one failover is allowed per job,
    // so a live server taken for dead on a loaded machine (its heartbeats not run for
    // 1.5 s) spends it, and the real death after it aborts the job (seen once in CI).
    let config = config(3, 2)
        .with_replication(true)
        .with_split_threshold(100)
        .with_liveness(Duration::from_millis(50), Duration::from_secs(3));
    let scheduler = Scheduler::bind(&endpoint(scheme, "replica"), &config).unwrap();
    let e = scheduler.endpoint().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let kill = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (e, c, kill) = (e.clone(), config.clone(), kill.clone());
            std::thread::spawn(move || {
                let s = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?;
                let rank = s.rank();
                let result = if rank == 1 {
                    s.run_until(&kill)
                } else {
                    s.run()
                };
                Ok::<_, PsError>((rank, result))
            })
        })
        .collect();
    let killer = kill.clone();
    let results = on_workers(3, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let mine = (w.rank() + 1) as f32;
        let keys = [0, 7, u64::MAX];
        let lens = [4, 200, 4];
        for round in 1..=ROUNDS {
            let got = w.push_pull(&keys, &lens, vec![mine; 208])?;
            let want = 6.0 * round as f32;
            assert!(
                got.values().iter().all(|&v| v == want),
                "round {round}: {:?} != {want}",
                &got.values()[..8]
            );
            if round == KILL_AFTER && w.rank() == 0 {
                killer.store(true, Ordering::Relaxed);
            }
        }
        let got = w.pull(&keys)?;
        assert!(got.values().iter().all(|&v| v == 6.0 * ROUNDS as f32));
        w.finish()
    });
    for r in results {
        r.expect("every worker ends well");
    }
    for s in servers {
        match s.join().unwrap().unwrap() {
            (0, result) => {
                result.expect("server 0 ends well");
            }
            (_, result) => assert!(matches!(result, Err(PsError::Aborted { .. })), "{result:?}"),
        }
    }
    let report = sched.join().unwrap().expect("the job ends well");
    assert_eq!(report.failovers, 1);
}

#[test]
fn killed_server_is_replaced_over_local() {
    replacement_keeps_sums_exact("local");
}

#[test]
fn killed_server_is_replaced_over_tcp() {
    replacement_keeps_sums_exact("tcp");
}

/// Without replication the same death ends the job (the default).
#[test]
fn without_replication_a_dead_server_still_aborts() {
    let config = config(1, 2);
    let scheduler = Scheduler::bind(&endpoint("local", "noreplica"), &config).unwrap();
    let e = scheduler.endpoint().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let kill = Arc::new(AtomicBool::new(false));
    let (gone_tx, gone) = std::sync::mpsc::channel();
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (e, c, kill, gone_tx) = (e.clone(), config.clone(), kill.clone(), gone_tx.clone());
            std::thread::spawn(move || {
                let s = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?;
                if s.rank() == 1 {
                    let result = s.run_until(&kill);
                    let _ = gone_tx.send(());
                    result
                } else {
                    s.run()
                }
            })
        })
        .collect();
    let mut w = KvWorker::<f32>::join(&e, &config).unwrap();
    kill.store(true, Ordering::Relaxed);
    gone.recv_timeout(std::time::Duration::from_secs(10))
        .expect("server 1 stops");
    let err = w.push_pull(&[u64::MAX], &[1], vec![1.0]).unwrap_err();
    assert!(err.to_string().contains("server 1"), "{err}");
    assert!(matches!(
        sched.join().unwrap(),
        Err(PsError::NodeSilent { .. })
    ));
    for s in servers {
        assert!(s.join().unwrap().is_err());
    }
}
