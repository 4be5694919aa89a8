//! A server's routing and failover, each ordering written down without a socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::replica;
use crate::store::Answer;
use crate::wire::{KvMeta, NodeRole};
use switchyard_msg::payload;
use switchyard_transports::PeerId;

fn routing(rank: u32, servers: u32, replicate: bool) -> Routing<f32> {
    let shape = Shape {
        rank,
        servers,
        workers: 1,
        replicate,
    };
    let name = format!("server {rank}");
    Routing::new(shape, name, Mode::Sync, Update::Sum)
}

/// Request `id` of worker 0 about server `primary`'s key 5.
fn request(id: u64, primary: u32, op: Op, values: Vec<f32>) -> Incoming<f32> {
    let meta = KvMeta {
        keys: vec![5],
        lens: vec![2],
        offsets: vec![0],
        totals: vec![2],
        must_have: true,
        elem: std::any::type_name::<f32>().to_string(),
    };
    Incoming {
        peer: Back::Zmq(PeerId::from_index(0)),
        id,
        primary,
        request: Ok(Request {
            worker: 0,
            id,
            op,
            meta,
            values,
            fpt: false,
            shared: None,
        }),
    }
}

fn values(reply: &Reply<Back>) -> Vec<f32> {
    let Ok(Answer::Values(_, frames)) = &reply.body else {
        panic!("expected values, got {:?}", reply.body);
    };
    frames
        .iter()
        .flat_map(|f| payload::frame_to_vec::<f32>(f).unwrap())
        .collect()
}

#[test]
fn a_request_sent_after_a_failover_this_server_has_not_heard_of_waits_for_the_notice() {
    let mut server1 = routing(1, 3, true);
    let early = server1.route(request(7, 0, Op::Push, vec![1.0, 2.0]));
    assert!(early.replies.is_empty() && early.changed.is_empty());
    let served = server1.failover(0, 1).unwrap();
    let [reply] = &served.replies[..] else {
        panic!("expected the held push answered, got {:?}", served.replies);
    };
    // Answered in the dead server's name: the worker counts answers by it.
    assert_eq!((reply.id, reply.primary), (7, 0));
    assert!(reply.body.is_ok());
    // Its keys have no second copy left to keep up to date.
    assert!(served.changed.is_empty());
    let pulled = server1.route(request(8, 0, Op::Pull, Vec::new()));
    assert_eq!(values(&pulled.replies[0]), [1.0, 2.0]);
    assert_eq!(server1.report().requests, 2);
}

#[test]
fn a_request_for_keys_this_server_does_not_hold_is_refused_naming_both_servers() {
    // Server 1 backs up server 0, not server 2; and without replication nobody.
    for (mut server1, primary) in [(routing(1, 3, true), 2), (routing(1, 3, false), 0)] {
        let routed = server1.route(request(3, primary, Op::Pull, Vec::new()));
        let [
            Reply {
                primary: p,
                body: Err(Refusal::Other(reason)),
                ..
            },
        ] = &routed.replies[..]
        else {
            panic!("expected one refusal, got {:?}", routed.replies);
        };
        assert_eq!(*p, primary);
        assert_eq!(
            *reason,
            format!("server 1 does not hold server {primary}'s keys")
        );
    }
}

#[test]
fn a_server_the_scheduler_declares_dead_stops() {
    let mut server1 = routing(1, 3, true);
    let Err(PsError::Aborted { reason }) = server1.failover(1, 2) else {
        panic!("expected the server to stop");
    };
    assert_eq!(reason, "the scheduler declared server 1 dead");
    // Another server's failover to a third leaves this one as it was.
    let mut server1 = routing(1, 3, true);
    assert!(server1.failover(2, 0).unwrap().replies.is_empty());
}

#[test]
fn the_replica_of_a_dead_server_serves_its_last_replicated_values() {
    let mut server0 = routing(0, 2, true);
    let pushed = server0.route(request(1, 0, Op::Push, vec![3.0, 4.0]));
    assert_eq!(pushed.replies.len(), 1);
    assert_eq!(
        pushed.changed.len(),
        1,
        "a replicating server hands its change on"
    );
    let msg = replica::message(wire::addr(NodeRole::Server, 0), 1, 0, pushed.changed).unwrap();

    let mut server1 = routing(1, 2, true);
    server1.keep_replica(0, &msg).unwrap();
    server1.failover(0, 1).unwrap();
    let pulled = server1.route(request(2, 0, Op::Pull, Vec::new()));
    assert_eq!(values(&pulled.replies[0]), [3.0, 4.0]);

    // Without replication nothing is handed on.
    let mut alone = routing(0, 2, false);
    assert!(
        alone
            .route(request(1, 0, Op::Push, vec![3.0, 4.0]))
            .changed
            .is_empty()
    );
}

#[test]
fn an_undecodable_request_is_refused_with_the_reason() {
    let mut server0 = routing(0, 1, false);
    let mut bad = request(4, 0, Op::Push, Vec::new());
    bad.request = Err(PsError::protocol("worker 0", "unexpected kind"));
    let routed = server0.route(bad);
    let [
        Reply {
            id: 4,
            body: Err(Refusal::Other(reason)),
            ..
        },
    ] = &routed.replies[..]
    else {
        panic!("expected one refusal, got {:?}", routed.replies);
    };
    assert!(reason.contains("unexpected kind"), "{reason}");
}
