//! The scheduler's death as its nodes see it: a scheduler played by hand (through the
//! crate-private `testing` hooks) assigns ranks and then falls silent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::ps_support::config;
use crate::testing;
use crate::{Group, KvServer, KvWorker, Mode, NodeRole, PsError, Update};
use std::time::{Duration, Instant};
use switchyard_transports::{Router, RouterSocket, Socket};

/// How long after `dead_timeout` (1.5 s in these tests) an error may come: a
/// heartbeat, a receive slice, thread start-up on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);

fn config_dead() -> Duration {
    config(1, 1).dead_timeout
}

/// The scheduler assigns ranks and then dies: the worker and the server each report
/// it within the timeout instead of waiting forever.
#[test]
fn dead_scheduler_is_noticed_by_workers_and_servers() {
    let config = config(1, 1);
    let mut fake = RouterSocket::bind("tcp://127.0.0.1:0", config.socket.clone()).unwrap();
    let e = fake.endpoint().to_string();
    let (e2, c2) = (e.clone(), config.clone());
    let server = std::thread::spawn(move || {
        let s = KvServer::<f32>::join(&e2, &c2, Mode::Sync, Update::Sum)?;
        let started = Instant::now();
        let result = s.run();
        Ok::<_, PsError>((result, started.elapsed()))
    });
    let (e3, c3) = (e.clone(), config.clone());
    let worker = std::thread::spawn(move || {
        let mut w = KvWorker::<f32>::join(&e3, &c3)?;
        let started = Instant::now();
        let result = w.barrier(Group::Workers);
        Ok::<_, PsError>((result, started.elapsed()))
    });
    // Registration by hand, the way the scheduler does it, then silence.
    let mut peers = Vec::new();
    let mut server_endpoint = String::new();
    while peers.len() < 2 {
        let (peer, msg) = fake.recv_from_timeout(Duration::from_secs(20)).unwrap();
        let (role, endpoint) = testing::registration(&msg).expect("a registration");
        if role == NodeRole::Server {
            server_endpoint = endpoint;
        }
        peers.push(peer);
    }
    for peer in &peers {
        let assign = testing::assign(0, 1, vec![server_endpoint.clone()]);
        fake.send_to(peer, assign).unwrap();
    }
    drop(fake);
    let (w, took) = worker.join().unwrap().unwrap();
    let err = w.unwrap_err();
    assert!(err.to_string().contains("scheduler at"), "{err}");
    assert!(took < config_dead() + SLACK, "took {took:?}");
    let (s, took) = server.join().unwrap().unwrap();
    let err = s.unwrap_err();
    assert!(err.to_string().contains("scheduler at"), "{err}");
    assert!(took < config_dead() + SLACK, "took {took:?}");
}
