//! The data plane as a job sees it: opened by default, a pull after a push answered
//! here, strangers on the data ports refused, the fallback to ZeroMQ, a server dying
//! mid-round.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::data::tests_hook;
use crate::ps_support::{Job, config, endpoint, on_workers};
use crate::{DataPlane, Group, KvServer, KvWorker, Mode, PsError, Scheduler, Update};
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Two workers push key 1 (on server 0) and key `u64::MAX` (on server 1) for a few
/// rounds, then pull them: each pull is answered from what the push brought back
/// (FPT), so the servers count the pushes only.
#[test]
fn values_travel_on_the_data_plane_and_a_pull_after_a_push_asks_no_server() {
    for scheme in ["local", "tcp"] {
        let job = Job::start(
            &endpoint(scheme, "data-fpt"),
            config(2, 2).with_data_plane(DataPlane::Link),
            Mode::Sync,
            Update::Sum,
        );
        let e = job.endpoint.clone();
        let c = job.config.clone();
        let results = on_workers(2, move |_| {
            let mut w = KvWorker::<f32>::join(&e, &c)?;
            assert!(w.on_data_plane(), "{scheme}");
            let keys = [1, u64::MAX];
            for round in 1..=3 {
                w.push(&keys, &[3, 2], vec![1.0; 5])?;
                let pulled = w.pull(&keys)?;
                assert_eq!(pulled.values(), vec![2.0 * round as f32; 5]);
                assert_eq!(pulled.lens(), [3, 2]);
            }
            // push_pull, then a pull of one of its keys.
            let got = w.push_pull(&keys, &[3, 2], vec![1.0; 5])?;
            assert_eq!(got.values(), vec![8.0; 5]);
            assert_eq!(w.pull(&[u64::MAX])?.values(), [8.0, 8.0]);
            w.finish()
        });
        for r in results {
            r.unwrap();
        }
        let (scheduler, servers) = job.end();
        scheduler.unwrap();
        for s in servers {
            // Each worker's check of its first push (two servers), its 4 pushes of
            // the server's key, and no pull.
            assert_eq!(s.unwrap().requests, 10, "{scheme}");
        }
    }
}

/// Strangers dial every data port as it opens (one silent, one with a hello of a rank
/// that does not exist, one with garbage): the job opens its data plane all the same.
#[test]
fn strangers_on_the_data_ports_hold_up_no_node() {
    let strangers: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let kept = strangers.clone();
    tests_hook::set(Some(Box::new(move |addr| {
        let mut held = kept.lock().unwrap();
        if let Ok(silent) = TcpStream::connect(addr) {
            held.push(silent);
        }
        if let Ok(mut liar) = TcpStream::connect(addr) {
            let _ = liar.write_all(&switchyard_link::framing::encode_hello(99, 3));
            held.push(liar);
        }
        if let Ok(mut noise) = TcpStream::connect(addr) {
            let _ = noise.write_all(b"GET / HTTP/1.0\r\n\r\n");
            held.push(noise);
        }
    })));
    let job = Job::start(
        &endpoint("tcp", "data-strangers"),
        config(2, 1).with_data_plane(DataPlane::Link),
        Mode::Sync,
        Update::Sum,
    );
    let (e, c) = (job.endpoint.clone(), job.config.clone());
    let started = Instant::now();
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &c)?;
        assert!(w.on_data_plane());
        let got = w.push_pull(&[3], &[4], vec![1.0; 4])?;
        assert_eq!(got.values(), [2.0; 4]);
        w.finish()
    });
    tests_hook::set(None);
    for r in results {
        r.unwrap();
    }
    job.end_ok();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(!strangers.lock().unwrap().is_empty(), "the hook ran");
}

/// One node asks for ZeroMQ (`DataPlane::Zmq`, as `SWITCHYARD_PS_DATA=zmq` does), or
/// cannot bind its data-plane socket: every node's values travel over ZeroMQ, and the
/// job's answers are the same.
#[test]
fn the_job_falls_back_to_zeromq_when_one_node_has_no_data_plane() {
    for case in ["asks for zmq", "cannot bind"] {
        let config = config(2, 1).with_data_plane(DataPlane::Link);
        let scheduler = Scheduler::bind(&endpoint("local", "data-fallback"), &config).unwrap();
        let e = scheduler.endpoint().to_string();
        if case == "cannot bind" {
            // Worker 1 (data-plane rank 2).
            tests_hook::fail_bind(&e, 2);
        }
        let sched = std::thread::spawn(move || scheduler.run());
        let (e2, c2) = (e.clone(), config.clone());
        let server = std::thread::spawn(move || {
            let s = KvServer::<f32>::join(&e2, &c2, Mode::Sync, Update::Sum)?;
            assert!(!s.on_data_plane());
            s.run()
        });
        let results = on_workers(2, move |i| {
            let mut c = config.clone();
            if case == "asks for zmq" && i == 1 {
                c = c.with_data_plane(DataPlane::Zmq);
            }
            let mut w = KvWorker::<f32>::join(&e, &c)?;
            assert!(!w.on_data_plane(), "{case}");
            w.push(&[5], &[2], vec![1.0, 2.0])?;
            let pulled = w.pull(&[5])?;
            assert_eq!(pulled.values(), [2.0, 4.0]);
            w.barrier(Group::Workers)?;
            w.finish()
        });
        for r in results {
            r.unwrap();
        }
        server.join().unwrap().unwrap();
        sched.join().unwrap().unwrap();
    }
}

/// A push on the data plane whose round never completes (the other worker does not
/// push) is withdrawn from both servers at the timeout, over ZeroMQ; the next round of
/// both workers sums only their later pushes. (The store's tests take the orders in
/// which the withdrawal overtakes the push.)
#[test]
fn a_withdrawn_push_on_the_data_plane_is_applied_nowhere() {
    let job = Job::start(
        &endpoint("local", "data-withdraw"),
        config(2, 2).with_data_plane(DataPlane::Link),
        Mode::Sync,
        Update::Sum,
    );
    let (e, c) = (job.endpoint.clone(), job.config.clone());
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &c)?;
        assert!(w.on_data_plane());
        w.barrier(Group::Workers)?;
        if w.rank() == 0 {
            w.set_request_timeout(Duration::from_millis(600));
            let err = w.push(&[0, u64::MAX], &[2, 2], vec![5.0; 4]).unwrap_err();
            assert!(matches!(err, PsError::RoundIncomplete { .. }), "{err}");
        }
        w.barrier(Group::Workers)?;
        let got = w.push_pull(&[0, u64::MAX], &[2, 2], vec![1.0; 4])?;
        assert_eq!(got.values(), [2.0; 4]);
        w.finish()
    });
    for r in results {
        r.unwrap();
    }
    job.end_ok();
}

/// Server 1 dies in the middle of a round on the data plane: worker 0's push of a key
/// of server 1 has reached it, worker 1's has not. With replication on, the scheduler
/// hands server 1's keys to server 0, both workers send it what server 1 had not
/// answered (worker 0 again, on the data plane), and the round completes with both
/// pushes counted once.
#[test]
fn a_server_dying_mid_round_on_the_data_plane_is_replaced() {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, Ordering};
    let config = config(2, 2)
        .with_data_plane(DataPlane::Link)
        .with_replication(true)
        .with_liveness(Duration::from_millis(50), Duration::from_secs(3));
    let scheduler = Scheduler::bind(&endpoint("local", "data-dies"), &config).unwrap();
    let e = scheduler.endpoint().to_string();
    let sched = std::thread::spawn(move || scheduler.run());
    let kill = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = (0..2)
        .map(|_| {
            let (e, c, kill) = (e.clone(), config.clone(), kill.clone());
            std::thread::spawn(move || {
                let s = KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?;
                assert!(s.on_data_plane());
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
    let both = Arc::new(Barrier::new(2));
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &config)?;
        assert!(w.on_data_plane());
        // Key u64::MAX is server 1's.
        let key = [u64::MAX];
        let got = if w.rank() == 0 {
            let t = w.start_push_pull(&key, &[4], vec![1.0; 4])?;
            // Time for the push to reach server 1, then it dies.
            std::thread::sleep(Duration::from_millis(300));
            kill.store(true, Ordering::Relaxed);
            both.wait();
            w.wait(t)?
        } else {
            both.wait();
            w.push_pull(&key, &[4], vec![2.0; 4])?
        };
        assert_eq!(got.values(), [3.0; 4]);
        w.finish()
    });
    for r in results {
        r.unwrap();
    }
    for s in servers {
        match s.join().unwrap().unwrap() {
            (0, result) => {
                result.unwrap();
            }
            (_, result) => assert!(matches!(result, Err(PsError::Aborted { .. })), "{result:?}"),
        }
    }
    assert_eq!(sched.join().unwrap().unwrap().failovers, 1);
}

/// A worker starts a push too large for its connection to take at once, then waits at
/// a barrier while the other worker's push of the same key waits for the round: the
/// first worker's output keeps going out during the barrier (its thread writes the
/// data plane, no I/O thread does), so the round completes and both get past.
#[test]
fn a_push_started_before_a_barrier_keeps_going_out_during_it() {
    const LEN: usize = 8 << 20; // 32 MiB of f32: more than a TCP socket takes at once
    let job = Job::start(
        &endpoint("local", "data-barrier"),
        config(2, 1)
            .with_data_plane(DataPlane::Link)
            .with_shared_memory(false)
            .with_request_timeout(Duration::from_secs(10)),
        Mode::Sync,
        Update::Sum,
    );
    let (e, c) = (job.endpoint.clone(), job.config.clone());
    let results = on_workers(2, move |_| {
        let mut w = KvWorker::<f32>::join(&e, &c)?;
        assert!(w.on_data_plane());
        if w.rank() == 0 {
            let t = w.start_push(&[1], &[LEN], vec![1.0; LEN])?;
            w.barrier(Group::Workers)?;
            w.wait(t)?;
        } else {
            w.push(&[1], &[LEN], vec![2.0; LEN])?;
            w.barrier(Group::Workers)?;
        }
        let got = w.pull(&[1])?;
        assert!(got.values().iter().all(|&v| v == 3.0));
        w.finish()
    });
    for r in results {
        r.unwrap();
    }
    job.end_ok();
}
