//! Parameter-server jobs as threads: push, pull, push_pull, sharding, modes, updates.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ps_support;

use ps_support::{Job, config, endpoint, on_workers};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use switchyard_ps::{Group, KvWorker, Mode, Sharding, Update};

/// Four workers, two servers: each round's answer is the exact sum of every worker's
/// push, for keys on both servers.
fn sync_sums(scheme: &str) {
    let config = config(4, 2).with_sharding(Sharding::Range {
        key_space: Some(100),
    });
    let job = Job::start(
        &endpoint(scheme, "sums"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(4, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let mine = (w.rank() + 1) as f32;
        let keys = [1, 50, 99];
        let lens = [2, 3, 1];
        let got = w.push_pull(&keys, &lens, vec![mine; 6])?;
        assert_eq!(got.values(), [10.0; 6], "1+2+3+4 on every element");
        assert_eq!(got.lens(), [2, 3, 1]);
        w.push(&keys, &lens, vec![mine; 6])?;
        w.barrier(Group::Workers)?;
        let got = w.pull(&[99, 1])?;
        assert_eq!(got.get(0), Some(&[20.0][..]));
        assert_eq!(got.get(1), Some(&[20.0, 20.0][..]));
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    job.end_ok();
}

#[test]
fn sync_sums_over_local() {
    sync_sums("local");
}

#[test]
fn sync_sums_over_inproc() {
    sync_sums("inproc");
}

#[test]
fn sync_sums_over_tcp() {
    sync_sums("tcp");
}

#[test]
fn tickets_overlap_and_complete_in_any_order() {
    let config = config(1, 2).with_sharding(Sharding::Hash);
    let job = Job::start(
        &endpoint("local", "tickets"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let mut w = KvWorker::<f32>::join(&job.endpoint, &config).unwrap();
    let tickets: Vec<_> = (0..8u64)
        .map(|k| w.start_push_pull(&[k], &[3], vec![k as f32; 3]).unwrap())
        .collect();
    for (k, t) in tickets.into_iter().enumerate().rev() {
        assert_eq!(w.wait(t).unwrap().values(), [k as f32; 3]);
    }
    // Two pushes of one key in flight: the second lands in the next round.
    let a = w.start_push(&[100], &[1], vec![1.0]).unwrap();
    let b = w.start_push(&[100], &[1], vec![2.0]).unwrap();
    w.wait(b).unwrap();
    w.wait(a).unwrap();
    assert_eq!(w.pull(&[100]).unwrap().values(), [3.0]);
    w.finish().unwrap();
    job.end_ok();
}

/// Ten keys over three servers (ranges of 4, 3 and 3: none lost), one long value
/// split over all three, pulled by a worker that never pushed it.
#[test]
fn uneven_ranges_and_split_values() {
    let config = config(2, 3)
        .with_sharding(Sharding::Range {
            key_space: Some(10),
        })
        .with_split_threshold(64);
    let job = Job::start(
        &endpoint("tcp", "split"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let keys: Vec<u64> = (0..10).collect();
        let lens: Vec<usize> = keys
            .iter()
            .map(|&k| if k == 3 { 1000 } else { 1 })
            .collect();
        let expected: Vec<f32> = keys
            .iter()
            .flat_map(|&k| {
                if k == 3 {
                    (0..1000).map(|i| i as f32).collect()
                } else {
                    vec![k as f32]
                }
            })
            .collect();
        if w.rank() == 0 {
            assert_eq!(w.placement().pieces(3, 1000)?.len(), 3);
            w.init(&keys, &lens, expected.clone())?;
        }
        w.barrier(Group::Workers)?;
        let got = w.pull(&keys)?;
        assert_eq!(got.lens(), lens);
        assert_eq!(got.values(), expected);
        let got = w.push_pull(&[3], &[1000], vec![1.0; 1000])?;
        let plus_two: Vec<f32> = (0..1000).map(|i| i as f32 + 2.0).collect();
        assert_eq!(got.values(), plus_two);
        let err = w.push(&[10], &[1], vec![1.0]).unwrap_err();
        assert!(
            err.to_string()
                .contains("key 10 is outside the key space 0..10"),
            "{err}"
        );
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    job.end_ok();
}

#[test]
fn hash_sharding_serves_every_key() {
    let config = config(2, 3).with_sharding(Sharding::Hash);
    let job = Job::start(
        &endpoint("local", "hash"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let keys: Vec<u64> = (0..300).map(|k| k * 1_000_003).collect();
        let lens = vec![2; keys.len()];
        let values: Vec<f32> = keys.iter().flat_map(|&k| [k as f32, 1.0]).collect();
        let got = w.push_pull(&keys, &lens, values.clone())?;
        let doubled: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
        assert_eq!(got.values(), doubled);
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    job.end_ok();
}

#[test]
fn async_sgd_applies_each_push_at_once() {
    let config = config(2, 1);
    let job = Job::start(
        &endpoint("local", "async"),
        config.clone(),
        Mode::Async,
        Update::Sgd { rate: 0.5 },
    );
    let e = job.endpoint.clone();
    let c = config.clone();
    // Joining waits for every node, so worker 1 joins on its own thread.
    let w1 = std::thread::spawn(move || KvWorker::<f32>::join(&e, &c));
    let mut w0 = KvWorker::<f32>::join(&job.endpoint, &config).unwrap();
    w0.init(&[0], &[1], vec![10.0]).unwrap();
    // No round: worker 1 never pushes, yet every push is applied and answered.
    w0.push(&[0], &[1], vec![2.0]).unwrap();
    assert_eq!(w0.push_pull(&[0], &[1], vec![2.0]).unwrap().values(), [8.0]);
    w0.finish().unwrap();
    w1.join().unwrap().unwrap().finish().unwrap();
    job.end_ok();
}

#[test]
fn custom_update_sees_the_round_sum() {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let update = Update::custom(move |_key, stored: &mut [f32], sum: &[f32]| {
        seen.fetch_add(1, Ordering::Relaxed);
        for (s, g) in stored.iter_mut().zip(sum) {
            *s = s.max(*g);
        }
    });
    let config = config(3, 1);
    let job = Job::start(
        &endpoint("local", "custom"),
        config.clone(),
        Mode::Sync,
        update,
    );
    let e = job.endpoint.clone();
    let results = on_workers(3, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let got = w.push_pull(&[5], &[2], vec![w.rank() as f32, 1.0])?;
        assert_eq!(got.values(), [3.0, 3.0], "max(0, 0+1+2) and max(0, 1+1+1)");
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    job.end_ok();
    assert_eq!(calls.load(Ordering::Relaxed), 1, "one round, one update");
}

#[test]
fn barrier_waits_for_every_worker() {
    let config = config(4, 1);
    let job = Job::start(
        &endpoint("local", "barrier"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let arrived = Arc::new(AtomicU32::new(0));
    let e = job.endpoint.clone();
    let results = on_workers(4, move |i| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        std::thread::sleep(std::time::Duration::from_millis(20 * u64::from(i)));
        arrived.fetch_add(1, Ordering::SeqCst);
        w.barrier(Group::Workers)?;
        assert_eq!(
            arrived.load(Ordering::SeqCst),
            4,
            "nobody leaves before all arrive"
        );
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    job.end_ok();
}

/// Servers take part in `Group::All` before they serve; requests that reach a server
/// while it waits there are kept and answered once it runs.
#[test]
fn barrier_over_all_includes_servers() {
    use switchyard_ps::{KvServer, Scheduler};
    let config = config(2, 2);
    let scheduler = Scheduler::bind(&endpoint("tcp", "all"), &config).unwrap();
    let e = scheduler.endpoint().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (e, c) = (e.clone(), config.clone());
            std::thread::spawn(move || {
                let mut s = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?;
                s.barrier(Group::All)?;
                s.run()
            })
        })
        .collect();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        w.barrier(Group::All)?;
        let got = w.push_pull(&[0, u64::MAX], &[1, 1], vec![1.0, 2.0])?;
        assert_eq!(got.values(), [2.0, 4.0]);
        w.finish()
    });
    for r in results {
        r.expect("worker");
    }
    for s in servers {
        s.join().unwrap().expect("server");
    }
    assert_eq!(sched.join().unwrap().expect("scheduler").barriers, 1);
}
