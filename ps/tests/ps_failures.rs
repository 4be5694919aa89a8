//! Errors, not hangs: bad requests, dead servers, workers and schedulers, and
//! registrations that do not complete, each ending in an error that names the culprit
//! within the timeout, on every node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ps_support;

use ps_support::{Job, config, endpoint, on_workers};
use std::time::{Duration, Instant};
use switchyard_ps::{Group, KvServer, KvWorker, Mode, PsError, Scheduler, Sharding, Update};

/// How long after `dead_timeout` (1.5 s in these tests) an error may come: a
/// heartbeat, a receive slice, thread start-up on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

#[test]
fn bad_requests_are_errors_and_the_job_goes_on() {
    let config = config(1, 2);
    let job = Job::start(
        &endpoint("tcp", "bad"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let mut w = KvWorker::<f32>::join(&job.endpoint, &config).unwrap();

    let err = w.pull(&[77]).unwrap_err();
    assert!(matches!(err, PsError::NeverPushed { key: 77, .. }), "{err}");

    w.push(&[5], &[2], vec![1.0, 2.0]).unwrap();
    let err = w.pull(&[5, 6]).unwrap_err();
    assert!(err.to_string().contains("key 6 was never pushed"), "{err}");

    let err = w.push(&[5], &[3], vec![1.0; 3]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("key 5") && text.contains("pushed 3") && text.contains("holds 2"),
        "{text}"
    );

    let err = w.push(&[1, 1], &[1, 1], vec![1.0; 2]).unwrap_err();
    assert!(err.to_string().contains("key 1 appears twice"), "{err}");
    let err = w.push(&[1], &[2], vec![1.0; 3]).unwrap_err();
    assert!(
        err.to_string().contains("lengths add up to 2 but 3 values"),
        "{err}"
    );

    // A good request is still served, and the job ends well.
    assert_eq!(
        w.push_pull(&[5], &[2], vec![1.0, 1.0]).unwrap().values(),
        [2.0, 3.0]
    );
    w.finish().unwrap();
    job.end_ok();
}

/// A sync push of keys on two servers that one server refuses (key 1's length
/// changed) is applied by neither: the next round of both workers sums only their
/// good pushes (22, not 112 with the refused 100 in it), at once, and the error is
/// the typed one naming the key and the server.
#[test]
fn a_push_refused_by_one_server_is_applied_by_none() {
    let config = config(2, 2).with_sharding(Sharding::Range { key_space: Some(2) });
    let job = Job::start(
        &endpoint("tcp", "atomic"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        assert_eq!(
            w.push_pull(&[0, 1], &[1, 1], vec![1.0, 1.0])?.values(),
            [2.0, 2.0]
        );
        let refused = if w.rank() == 0 {
            Some(w.push(&[0, 1], &[1, 2], vec![100.0, 5.0, 5.0]).unwrap_err())
        } else {
            None
        };
        w.barrier(Group::Workers)?;
        let started = Instant::now();
        let sum = w.push_pull(&[0, 1], &[1, 1], vec![10.0, 10.0])?;
        let took = started.elapsed();
        w.finish()?;
        Ok((refused, sum.into_values(), took))
    });
    for r in results {
        let (refused, sum, took) = r.unwrap();
        assert_eq!(sum, [22.0, 22.0], "the refused push was applied somewhere");
        assert!(
            took < Duration::from_secs(5),
            "the good push waited {took:?}"
        );
        if let Some(err) = refused {
            assert!(
                matches!(&err, PsError::LengthChanged { key: 1, stored: 1, pushed: 2, server }
                    if server.starts_with("server 1")),
                "{err}"
            );
        }
    }
    job.end_ok();
}

/// An `i32` worker against `f32` servers is refused, naming both types, and stores
/// nothing (the bits of an `i32` 1 read as `f32` are 1e-45).
#[test]
fn a_worker_of_another_element_type_is_refused() {
    let config = config(2, 2);
    let job = Job::start(
        &endpoint("local", "elemtype"),
        config.clone(),
        Mode::Async,
        Update::Sum,
    );
    let (e, c) = (job.endpoint.clone(), config.clone());
    let ints = std::thread::spawn(move || KvWorker::<i32>::join(&e, &c));
    let mut floats = KvWorker::<f32>::join(&job.endpoint, &config).unwrap();
    let mut ints = ints.join().unwrap().unwrap();
    for err in [
        ints.push(&[3], &[2], vec![1, 1]).unwrap_err(),
        ints.pull(&[3]).unwrap_err(),
    ] {
        assert!(
            matches!(&err, PsError::TypeMismatch { stored, sent, .. } if stored == "f32" && sent == "i32"),
            "{err}"
        );
    }
    assert!(matches!(
        floats.pull(&[3]).unwrap_err(),
        PsError::NeverPushed { key: 3, .. }
    ));
    ints.finish().unwrap();
    floats.finish().unwrap();
    job.end_ok();
}

/// An `f64` worker against `f32` servers (another width, so its values do not add up
/// to the count the servers expect) hears of the types too, not of a malformed
/// message.
#[test]
fn a_worker_of_a_wider_element_type_is_refused_naming_the_types() {
    let config = config(1, 1);
    let job = Job::start(
        &endpoint("local", "elemwidth"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let mut doubles = KvWorker::<f64>::join(&job.endpoint, &config).unwrap();
    let err = doubles.push(&[3], &[2], vec![1.0, 1.0]).unwrap_err();
    assert!(
        matches!(&err, PsError::TypeMismatch { stored, sent, .. } if stored == "f32" && sent == "f64"),
        "{err}"
    );
    doubles.finish().unwrap();
    job.end_ok();
}

/// A sync key pushed by only one of two workers: the push fails at
/// `request_timeout`, saying which workers never pushed it, not with a bare timeout.
#[test]
fn a_sync_round_missing_a_worker_says_which() {
    let config = config(2, 1).with_request_timeout(Duration::from_millis(800));
    let job = Job::start(
        &endpoint("local", "partial"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let outcome = if w.rank() == 1 {
            Some(w.push(&[9], &[1], vec![1.0]).unwrap_err())
        } else {
            None
        };
        w.finish()?;
        Ok(outcome)
    });
    let err = results.into_iter().find_map(|r| r.unwrap()).unwrap();
    assert!(
        matches!(&err, PsError::RoundIncomplete { key: 9, pushed, missing, .. }
            if pushed == &[1] && missing == &[0]),
        "{err}"
    );
    job.end_ok();
}

/// Where worker threads wait for each other outside the job (whose barriers time out
/// at the request timeout), for a minute at most.
#[derive(Default)]
struct Meeting {
    arrived: std::sync::Mutex<usize>,
    all_here: std::sync::Condvar,
}

impl Meeting {
    fn wait(&self, n: usize) {
        let mut arrived = self.arrived.lock().unwrap();
        *arrived += 1;
        self.all_here.notify_all();
        let (arrived, timeout) = self
            .all_here
            .wait_timeout_while(arrived, Duration::from_secs(60), |a| *a < n)
            .unwrap();
        assert!(!timeout.timed_out(), "{} of {n} threads met", *arrived);
    }
}

/// Two keys of which server 0 holds one and server 1 the other.
fn keys_on_two_servers(w: &KvWorker<f32>) -> [u64; 2] {
    let placement = w.placement();
    let on = |server| {
        // Small keys and the largest ones: range sharding gives them to the first
        // and the last server, hash sharding to both.
        (0..1_000u64)
            .chain((0..1_000).map(|k| u64::MAX - 1_000 + k))
            .find(|&k| placement.owner(k).ok() == Some(server))
            .expect("a key for each server")
    };
    [on(0), on(1)]
}

/// Worker 0 pushes two keys on two servers in one request; worker 1 pushes the first
/// key at once and the second only after the request timeout. Server 0's round
/// completes with worker 0's push in it, so worker 0's push must be applied by server
/// 1 too: it waits for worker 1's late push instead of being refused there (a server
/// that expired its round on its own clock refused it, and the two keys then held
/// sums of different rounds).
#[test]
fn a_push_that_one_server_applied_is_applied_by_every_server() {
    let timeout = Duration::from_secs(2);
    let config = config(2, 2).with_request_timeout(timeout);
    let job = Job::start(
        &endpoint("local", "applied-by-one"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let pushed = std::sync::Arc::new(Meeting::default());
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        let [a, b] = keys_on_two_servers(&w);
        let outcome = if w.rank() == 0 {
            w.push(&[a, b], &[1, 1], vec![1.0, 10.0])
        } else {
            w.push(&[a], &[1], vec![2.0])?;
            // Past worker 0's request timeout (and any server's), well within twice it.
            std::thread::sleep(timeout + timeout / 2);
            w.push(&[b], &[1], vec![20.0])
        };
        pushed.wait(2);
        let pulled = w.pull(&[a, b])?.values().to_vec();
        w.finish()?;
        Ok((outcome, pulled))
    });
    for (rank, r) in results.into_iter().enumerate() {
        let (outcome, pulled) = r.unwrap();
        assert!(outcome.is_ok(), "worker {rank}: {outcome:?}");
        assert_eq!(pulled, [3.0, 30.0], "worker {rank}");
    }
    job.end_ok();
}

/// The outside test's timing: worker 1 pushes the same two keys (on two servers)
/// 0-70 ms after worker 0's request timeout. Whichever way the race goes, the two
/// servers decide alike: both workers succeed and both keys hold the sum, or both
/// fail with `RoundIncomplete` and both keys keep their values.
#[test]
fn a_push_arriving_at_the_timeout_is_applied_by_both_servers_or_by_neither() {
    let timeout = Duration::from_millis(500);
    for late in [0, 30, 70] {
        let config = config(2, 2).with_request_timeout(timeout);
        let job = Job::start(
            &endpoint("local", "at-the-timeout"),
            config.clone(),
            Mode::Sync,
            Update::Sum,
        );
        let e = job.endpoint.clone();
        // The pushes may take two request timeouts: the workers meet here, not at a
        // barrier of the job, which would time out first.
        let pushed = std::sync::Arc::new(Meeting::default());
        let results = on_workers(2, move |_| {
            let mut w = KvWorker::<f32>::join(&e, &config)?;
            let [a, b] = keys_on_two_servers(&w);
            if w.rank() == 0 {
                w.init(&[a, b], &[1, 1], vec![5.0, 5.0])?;
            }
            w.barrier(Group::Workers)?;
            if w.rank() == 1 {
                std::thread::sleep(timeout + Duration::from_millis(late));
            }
            let outcome = w.push(&[a, b], &[1, 1], vec![1.0, 1.0]);
            pushed.wait(2);
            let pulled = w.pull(&[a, b])?.values().to_vec();
            w.finish()?;
            Ok((outcome, pulled))
        });
        let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
        let applied = results[0].0.is_ok();
        for (rank, (outcome, pulled)) in results.iter().enumerate() {
            if applied {
                assert!(
                    outcome.is_ok(),
                    "late {late} ms, worker {rank}: {outcome:?}"
                );
                assert_eq!(pulled, &[7.0, 7.0], "late {late} ms, worker {rank}");
            } else {
                assert!(
                    matches!(outcome, Err(PsError::RoundIncomplete { .. })),
                    "late {late} ms, worker {rank}: {outcome:?}"
                );
                assert_eq!(pulled, &[5.0, 5.0], "late {late} ms, worker {rank}");
            }
        }
        job.end_ok();
    }
}

/// Server 1 stops (its thread returns without serving): every worker waiting on it
/// gets an error naming it, the scheduler reports it, server 0 returns.
#[test]
fn dead_server_fails_every_worker_in_time() {
    let config = config(2, 2);
    let scheduler = Scheduler::bind(&endpoint("tcp", "deadserver"), &config).unwrap();
    let e = scheduler.endpoint().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (e, c) = (e.clone(), config.clone());
            std::thread::spawn(move || {
                let mut s = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?;
                s.barrier(Group::All)?;
                if s.rank() == 1 {
                    // Dies: the socket closes and the heartbeats stop.
                    return Err(PsError::Finished);
                }
                s.run()
            })
        })
        .collect();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        w.barrier(Group::All)?;
        let started = Instant::now();
        // Key u64::MAX is on server 1 (range sharding over all of u64).
        let err = w
            .push_pull(&[0, u64::MAX], &[1, 1], vec![1.0, 1.0])
            .unwrap_err();
        Ok((err, started.elapsed()))
    });
    for r in results {
        let (err, took) = r.unwrap();
        assert!(err.to_string().contains("server 1"), "{err}");
        assert!(took < config_dead() + SLACK, "took {took:?}");
    }
    // Threads and ranks need not line up: one thread is the dead server 1, the other
    // is server 0, which must have been told to abort.
    let servers: Vec<_> = servers.into_iter().map(|s| s.join().unwrap()).collect();
    assert!(servers.iter().any(|s| matches!(s, Err(PsError::Finished))));
    assert!(
        servers
            .iter()
            .any(|s| matches!(s, Err(PsError::Aborted { .. }))),
        "{servers:?}"
    );
    let err = sched.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, PsError::NodeSilent { node, .. } if node.starts_with("server 1")),
        "{err}"
    );
}

fn config_dead() -> Duration {
    config(1, 1).dead_timeout
}

/// A worker that stops without `finish` is taken for dead: the job is aborted and the
/// other worker's next call fails naming it.
#[test]
fn dead_worker_aborts_the_job() {
    let config = config(2, 1);
    let job = Job::start(
        &endpoint("local", "deadworker"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        w.barrier(Group::Workers)?;
        if w.rank() == 1 {
            drop(w);
            return Ok(None);
        }
        let started = Instant::now();
        let err = w.push_pull(&[3], &[1], vec![1.0]).unwrap_err();
        Ok(Some((err, started.elapsed())))
    });
    let (err, took) = results.into_iter().find_map(|r| r.unwrap()).unwrap();
    assert!(err.to_string().contains("worker 1"), "{err}");
    assert!(took < config_dead() + SLACK, "took {took:?}");
    let (scheduler, servers) = job.end();
    assert!(matches!(scheduler, Err(PsError::NodeSilent { .. })));
    assert!(matches!(servers[0], Err(PsError::Aborted { .. })));
}

#[test]
fn registration_times_out_naming_missing_nodes() {
    let config = config(2, 1).with_join_timeout(Duration::from_millis(300));
    let scheduler = Scheduler::bind(&endpoint("local", "late"), &config).unwrap();
    let err = scheduler.run().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("0 of 2 workers") && text.contains("0 of 1 servers"),
        "{text}"
    );
    assert!(text.contains("PsConfig::join_timeout"), "{text}");
}

#[test]
fn a_node_too_many_is_refused() {
    let config = config(1, 1);
    let job = Job::start(
        &endpoint("local", "extra"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let w = KvWorker::<f32>::join(&job.endpoint, &config).unwrap();
    let err = KvWorker::<f32>::join(&job.endpoint, &config).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    w.finish().unwrap();
    job.end_ok();
}
