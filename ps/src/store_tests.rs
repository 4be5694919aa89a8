#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use switchyard_msg::payload;

fn meta(keys: &[u64], lens: &[u64]) -> KvMeta {
    meta_of::<f32>(keys, lens)
}

fn meta_of<T>(keys: &[u64], lens: &[u64]) -> KvMeta {
    KvMeta {
        keys: keys.to_vec(),
        lens: lens.to_vec(),
        offsets: vec![0; keys.len()],
        totals: lens.to_vec(),
        must_have: true,
        elem: std::any::type_name::<T>().to_string(),
    }
}

/// The error a worker makes of a refusal from `server`.
fn refused(reply: &Reply<u32>, server: &str) -> PsError {
    reply.body.as_ref().unwrap_err().clone().into_error(server)
}

fn req(worker: u32, id: u64, op: Op, keys: &[u64], lens: &[u64], values: Vec<f32>) -> Request<f32> {
    Request {
        worker,
        id,
        op,
        meta: meta(keys, lens),
        values,
        fpt: false,
        shared: None,
    }
}

fn frames(reply: &Reply<u32>) -> &[Bytes] {
    match reply.body.as_ref().unwrap() {
        Answer::Values(_, frames) => frames,
        other => panic!("expected values, got {other:?}"),
    }
}

fn values(reply: &Reply<u32>) -> Vec<f32> {
    frames(reply)
        .iter()
        .flat_map(|f| payload::frame_to_vec::<f32>(f).unwrap())
        .collect()
}

#[test]
fn sync_round_answers_every_worker_with_the_sum() {
    let mut store = Store::<f32, u32>::new("server 0".into(), Mode::Sync, 3, Update::Sum);
    assert!(
        store
            .handle(0, req(0, 1, Op::PushPull, &[7], &[2], vec![1.0, 2.0]))
            .is_empty()
    );
    assert!(
        store
            .handle(1, req(1, 1, Op::PushPull, &[7], &[2], vec![10.0, 20.0]))
            .is_empty()
    );
    assert_eq!(store.waiting(), 2);
    let replies = store.handle(2, req(2, 5, Op::PushPull, &[7], &[2], vec![100.0, 200.0]));
    assert_eq!(replies.len(), 3);
    for r in &replies {
        assert_eq!(values(r), [111.0, 222.0]);
    }
    let mut peers: Vec<_> = replies.iter().map(|r| (r.peer, r.id)).collect();
    peers.sort();
    assert_eq!(peers, [(0, 1), (1, 1), (2, 5)]);
    assert_eq!(store.rounds(), 1);
    assert_eq!(store.waiting(), 0);
}

#[test]
fn a_second_push_from_one_worker_waits_for_the_next_round() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    assert!(
        store
            .handle(0, req(0, 1, Op::Push, &[1], &[1], vec![1.0]))
            .is_empty()
    );
    assert!(
        store
            .handle(0, req(0, 2, Op::Push, &[1], &[1], vec![2.0]))
            .is_empty()
    );
    let first = store.handle(1, req(1, 1, Op::Push, &[1], &[1], vec![3.0]));
    assert_eq!(
        first.len(),
        2,
        "round 1: worker 0's first push and worker 1's"
    );
    let second = store.handle(1, req(1, 2, Op::PushPull, &[1], &[1], vec![4.0]));
    assert_eq!(second.len(), 2, "round 2 takes the deferred push");
    let pp = second.iter().find(|r| r.peer == 1).unwrap();
    assert_eq!(values(pp), [10.0]);
}

#[test]
fn multi_key_request_waits_for_all_its_keys() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sgd { rate: 0.5 });
    assert!(
        store
            .handle(
                0,
                req(0, 1, Op::PushPull, &[1, 2], &[1, 2], vec![2.0, 4.0, 6.0])
            )
            .is_empty()
    );
    let one = store.handle(1, req(1, 1, Op::PushPull, &[1], &[1], vec![2.0]));
    assert_eq!(one.len(), 1, "worker 1's request has only key 1");
    assert_eq!((one[0].peer, values(&one[0])), (1, vec![-2.0]));
    let replies = store.handle(1, req(1, 2, Op::PushPull, &[2], &[2], vec![0.0, 2.0]));
    assert_eq!(replies.len(), 2);
    let w0 = replies.iter().find(|r| r.peer == 0).unwrap();
    assert_eq!(values(w0), [-2.0, -2.0, -4.0]);
}

#[test]
fn async_applies_each_push_at_once() {
    let mut store = Store::<f64, u32>::new("s".into(), Mode::Async, 4, Update::Sum);
    let r = store.handle(
        0,
        Request {
            worker: 0,
            id: 1,
            op: Op::PushPull,
            meta: meta_of::<f64>(&[3], &[1]),
            values: vec![1.5],
            fpt: false,
            shared: None,
        },
    );
    assert_eq!(r.len(), 1);
    let r = store.handle(
        1,
        Request {
            worker: 1,
            id: 1,
            op: Op::PushPull,
            meta: meta_of::<f64>(&[3], &[1]),
            values: vec![1.5],
            fpt: false,
            shared: None,
        },
    );
    let Ok(Answer::Values(_, frames)) = &r[0].body else {
        panic!("expected values, got {:?}", r[0].body);
    };
    assert_eq!(payload::frame_to_vec::<f64>(&frames[0]).unwrap(), [3.0]);
}

#[test]
fn pull_of_a_never_pushed_key_is_refused_with_the_key() {
    let mut store = Store::<f32, u32>::new("server 1".into(), Mode::Sync, 1, Update::Sum);
    let r = store.handle(0, req(0, 1, Op::Pull, &[42], &[0], vec![]));
    let err = refused(&r[0], "server 1");
    assert!(
        matches!(&err, PsError::NeverPushed { key: 42, server } if server == "server 1"),
        "{err}"
    );
}

#[test]
fn a_changed_length_is_refused_and_the_key_kept() {
    let mut store = Store::<f32, u32>::new("server 0".into(), Mode::Async, 1, Update::Sum);
    store.handle(0, req(0, 1, Op::Push, &[5], &[2], vec![1.0, 1.0]));
    let r = store.handle(0, req(0, 2, Op::Push, &[5], &[3], vec![1.0, 1.0, 1.0]));
    let err = refused(&r[0], "server 0");
    assert!(
        matches!(
            err,
            PsError::LengthChanged {
                key: 5,
                stored: 2,
                pushed: 3,
                ..
            }
        ),
        "{err}"
    );
    let r = store.handle(0, req(0, 3, Op::Pull, &[5], &[0], vec![]));
    assert_eq!(values(&r[0]), [1.0, 1.0]);
}

#[test]
fn init_sets_and_custom_update_runs() {
    let update = Update::custom(|key, stored: &mut [f32], agg: &[f32]| {
        for (s, a) in stored.iter_mut().zip(agg) {
            *s = s.max(*a) + key as f32;
        }
    });
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 1, update);
    store.handle(0, req(0, 1, Op::Init, &[1], &[2], vec![5.0, -5.0]));
    let r = store.handle(0, req(0, 2, Op::PushPull, &[1], &[2], vec![0.0, 0.0]));
    assert_eq!(values(&r[0]), [6.0, 1.0]);
}

#[test]
fn duplicate_keys_are_refused() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 1, Update::Sum);
    let r = store.handle(0, req(0, 1, Op::Push, &[1, 1], &[1, 1], vec![1.0, 1.0]));
    assert!(refused(&r[0], "s").to_string().contains("twice"));
}

#[test]
fn a_request_sent_again_is_not_counted_twice() {
    for mode in [Mode::Sync, Mode::Async] {
        let mut store = Store::<f32, u32>::new("s".into(), mode, 1, Update::Sum).with_tracking();
        let first = store.handle(0, req(0, 7, Op::PushPull, &[1], &[1], vec![5.0]));
        assert_eq!(values(&first[0]), [5.0]);
        let changed = store.take_changed();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].1.included, [(0, 7)]);
        // The same request again (a worker resending after a failover): answered with
        // the value that already includes it.
        let again = store.handle(0, req(0, 7, Op::PushPull, &[1], &[1], vec![5.0]));
        assert_eq!(values(&again[0]), [5.0], "{mode:?}");
        let next = store.handle(0, req(0, 8, Op::PushPull, &[1], &[1], vec![1.0]));
        assert_eq!(values(&next[0]), [6.0], "{mode:?}");
    }
}

#[test]
fn an_adopted_store_carries_on_from_the_copy() {
    let mut primary =
        Store::<f32, u32>::new("s0".into(), Mode::Sync, 2, Update::Sum).with_tracking();
    primary.handle(0, req(0, 1, Op::Push, &[4], &[2], vec![1.0, 1.0]));
    primary.handle(1, req(1, 1, Op::Push, &[4], &[2], vec![2.0, 2.0]));
    let copy = primary.take_changed().into_iter().collect();
    let mut replica =
        Store::<f32, u32>::adopt("s1".into(), Mode::Sync, 2, Update::Sum, copy).with_primary(0);
    // Worker 1's round-1 push comes again; worker 0's round-2 push is new.
    let r = replica.handle(1, req(1, 1, Op::PushPull, &[4], &[2], vec![2.0, 2.0]));
    assert_eq!(values(&r[0]), [3.0, 3.0]);
    assert_eq!(r[0].primary, 0);
    assert!(
        replica
            .handle(0, req(0, 2, Op::PushPull, &[4], &[2], vec![1.0, 1.0]))
            .is_empty()
    );
    let r = replica.handle(1, req(1, 2, Op::PushPull, &[4], &[2], vec![1.0, 1.0]));
    assert_eq!(r.len(), 2);
    assert_eq!(values(&r[0]), [5.0, 5.0]);
}

#[test]
fn a_request_of_another_element_type_is_refused_naming_both() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Async, 1, Update::Sum);
    for op in [Op::Push, Op::Pull, Op::Check, Op::Init] {
        let r = store.handle(
            0,
            Request {
                worker: 0,
                id: 1,
                op,
                meta: meta_of::<i32>(&[1], &[1]),
                values: vec![1.0],
                fpt: false,
                shared: None,
            },
        );
        let err = refused(&r[0], "s");
        assert!(
            matches!(&err, PsError::TypeMismatch { stored, sent, .. } if stored == "f32" && sent == "i32"),
            "{op:?}: {err}"
        );
    }
    let r = store.handle(0, req(0, 2, Op::Pull, &[1], &[0], vec![]));
    assert!(r[0].body.is_err(), "the refused push stored nothing");
}

#[test]
fn a_check_holds_new_lengths_until_released_and_pulls_do_not_see_them() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    let r = store.handle(0, req(0, 1, Op::Check, &[7], &[3], vec![]));
    assert!(r[0].body.is_ok());
    // Held, not pushed: a pull does not see it, a push of another length is refused.
    let r = store.handle(1, req(1, 1, Op::Pull, &[7], &[0], vec![]));
    assert!(matches!(
        refused(&r[0], "s"),
        PsError::NeverPushed { key: 7, .. }
    ));
    let r = store.handle(1, req(1, 2, Op::Push, &[7], &[2], vec![1.0; 2]));
    let err = refused(&r[0], "s");
    assert!(
        matches!(
            err,
            PsError::LengthHeld {
                key: 7,
                held: 3,
                pushed: 2,
                worker: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("worker 0's first push"), "{err}");
    // Released by its own request only: then any length may come first.
    assert!(
        store
            .handle(0, req(1, 9, Op::Release, &[7], &[3], vec![]))
            .is_empty()
    );
    let r = store.handle(1, req(1, 3, Op::Push, &[7], &[2], vec![1.0; 2]));
    assert!(matches!(refused(&r[0], "s"), PsError::LengthHeld { .. }));
    store.handle(0, req(0, 1, Op::Release, &[7], &[3], vec![]));
    assert!(
        store
            .handle(1, req(1, 4, Op::Push, &[7], &[2], vec![1.0; 2]))
            .is_empty()
    );
}

fn hold(store: &mut Store<f32, u32>, worker: u32, id: u64, keys: &[u64]) -> HoldAnswer {
    let r = store.handle(
        worker,
        req(worker, id, Op::Hold, keys, &vec![0; keys.len()], vec![]),
    );
    match &r[..] {
        [
            Reply {
                body: Ok(Answer::Hold(answer)),
                ..
            },
        ] => answer.clone(),
        other => panic!("expected a hold answer, got {other:?}"),
    }
}

/// A held push keeps its round from completing; once withdrawn it leaves no trace:
/// the key never had a value, its worker gets no answer, and the round goes on with
/// the other workers' pushes and the withdrawing worker's next one.
#[test]
fn a_held_push_stops_its_round_and_a_withdrawn_one_leaves_no_trace() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 3, Update::Sum);
    assert!(
        store
            .handle(0, req(2, 1, Op::Push, &[4], &[1], vec![1.0]))
            .is_empty()
    );
    let answer = hold(&mut store, 2, 1, &[4]);
    let round = RoundState {
        key: 4,
        pushed: vec![2],
        missing: vec![0, 1],
    };
    assert_eq!(answer, HoldAnswer::Held { round: Some(round) });
    for w in 0..2 {
        let r = store.handle(0, req(w, 1, Op::PushPull, &[4], &[1], vec![10.0]));
        assert!(
            r.is_empty(),
            "a full round with a held push completed: {r:?}"
        );
    }
    let r = store.handle(0, req(2, 1, Op::Withdraw, &[4], &[0], vec![]));
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(store.waiting(), 2, "worker 2's push is no longer answered");
    // Worker 2's next push completes the round of workers 0 and 1, without the
    // withdrawn 1.0.
    let r = store.handle(0, req(2, 2, Op::PushPull, &[4], &[1], vec![100.0]));
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|r| values(r) == [120.0]), "{r:?}");
}

/// On the data plane the hold and the withdrawal (over ZeroMQ) may overtake the push
/// they name: the push that comes after its withdrawal joins no round and is never
/// answered, and the next push of its worker counts as usual.
#[test]
fn a_push_arriving_after_its_withdrawal_is_dropped() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    let answer = hold(&mut store, 1, 7, &[4]);
    assert_eq!(answer, HoldAnswer::Held { round: None });
    assert!(
        store
            .handle(0, req(1, 7, Op::Withdraw, &[4], &[0], vec![]))
            .is_empty()
    );
    let mut late = req(1, 7, Op::Push, &[4], &[1], vec![1000.0]);
    late.fpt = true;
    assert!(
        store.handle(0, late).is_empty(),
        "a withdrawn push is dropped"
    );
    assert_eq!(store.waiting(), 0);
    let r = store.handle(0, req(0, 1, Op::PushPull, &[4], &[1], vec![1.0]));
    assert!(r.is_empty());
    let mut next = req(1, 8, Op::Push, &[4], &[1], vec![2.0]);
    next.fpt = true;
    let r = store.handle(0, next);
    assert_eq!(r.len(), 2);
    // Both answers carry the round's value: the push_pull, and the data plane's push.
    assert!(r.iter().all(|r| values(r) == [3.0]), "{r:?}");
}

/// A hold that comes before its push (it overtook it on the other plane) holds the
/// push's round when the push comes; letting go completes it.
#[test]
fn a_push_arriving_after_its_hold_waits_for_the_let_go() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    assert_eq!(
        hold(&mut store, 1, 7, &[4]),
        HoldAnswer::Held { round: None }
    );
    assert!(
        store
            .handle(0, req(1, 7, Op::Push, &[4], &[1], vec![5.0]))
            .is_empty()
    );
    let r = store.handle(0, req(0, 1, Op::PushPull, &[4], &[1], vec![1.0]));
    assert!(r.is_empty(), "a round with a held push completed: {r:?}");
    let r = store.handle(0, req(1, 7, Op::LetGo, &[4], &[0], vec![]));
    assert_eq!(r.len(), 2);
}

/// A first push withdrawn leaves the key as it was: never pushed, any length free.
#[test]
fn a_withdrawn_first_push_leaves_the_key_never_pushed() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    assert!(
        store
            .handle(0, req(0, 1, Op::Push, &[4], &[2], vec![1.0; 2]))
            .is_empty()
    );
    assert!(matches!(
        hold(&mut store, 0, 1, &[4]),
        HoldAnswer::Held { .. }
    ));
    store.handle(0, req(0, 1, Op::Withdraw, &[4], &[0], vec![]));
    let r = store.handle(0, req(0, 2, Op::Pull, &[4], &[0], vec![]));
    assert!(matches!(
        refused(&r[0], "s"),
        PsError::NeverPushed { key: 4, .. }
    ));
    assert!(
        store
            .handle(0, req(0, 3, Op::Push, &[4], &[3], vec![1.0; 3]))
            .is_empty()
    );
}

/// A push let go after a hold completes the round it was held in.
#[test]
fn a_push_let_go_completes_its_round() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    assert!(
        store
            .handle(0, req(0, 1, Op::PushPull, &[4], &[1], vec![1.0]))
            .is_empty()
    );
    assert!(matches!(
        hold(&mut store, 0, 1, &[4]),
        HoldAnswer::Held { .. }
    ));
    assert!(
        store
            .handle(1, req(1, 1, Op::PushPull, &[4], &[1], vec![2.0]))
            .is_empty()
    );
    // The worker lets go without naming the keys: the hold remembers them.
    let r = store.handle(0, req(0, 1, Op::LetGo, &[], &[], vec![]));
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|r| values(r) == [3.0]), "{r:?}");
}

/// A push some of whose keys are applied already cannot be held: every server must
/// apply it, so the answer says so, here while its other key still waits and after
/// it has been answered.
#[test]
fn a_push_partly_applied_is_not_held() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    assert!(
        store
            .handle(0, req(0, 1, Op::Push, &[4, 5], &[1, 1], vec![1.0, 1.0]))
            .is_empty()
    );
    assert!(
        store
            .handle(1, req(1, 1, Op::Push, &[4], &[1], vec![1.0]))
            .len()
            == 1
    );
    assert_eq!(hold(&mut store, 0, 1, &[4, 5]), HoldAnswer::Applied);
    let r = store.handle(1, req(1, 2, Op::Push, &[5], &[1], vec![1.0]));
    assert_eq!(r.len(), 2, "key 5's round is not held: {r:?}");
    assert_eq!(hold(&mut store, 0, 1, &[4, 5]), HoldAnswer::Applied);
}

/// Large pushes go back to the pool once summed in, and a round's snapshot once every
/// reply carrying it is gone: after the first rounds no request or reply needs a new
/// buffer, and the sums are right although the buffers held older values.
#[test]
fn large_rounds_reuse_the_pools_buffers() {
    const LEN: usize = 50_000;
    let pool = ValuePool::<f32>::default();
    let mut store = Store::<f32, u32>::new("server 0".into(), Mode::Sync, 2, Update::Sum)
        .with_pool(pool.clone());
    let lens = [LEN as u64];
    let mut buffers = std::collections::HashSet::new();
    let mut seen_after = Vec::new();
    for round in 0..6u64 {
        let mut push = |w: u32| -> Vec<f32> {
            let mut v = pool.take(LEN);
            buffers.insert(v.as_ptr() as usize);
            v.fill((w + 1) as f32 * (round + 1) as f32);
            v
        };
        let first = push(0);
        assert!(
            store
                .handle(0, req(0, round, Op::PushPull, &[3], &lens, first))
                .is_empty()
        );
        let second = push(1);
        let replies = store.handle(1, req(1, round, Op::PushPull, &[3], &lens, second));
        let expected: f32 = (1..=round + 1).map(|r| 3.0 * r as f32).sum();
        assert_eq!(replies.len(), 2);
        for r in &replies {
            buffers.insert(frames(r)[0].as_ptr() as usize);
            assert!(values(r).iter().all(|&v| v == expected), "round {round}");
        }
        drop(replies);
        // Two buffers wait for the next round's pushes: the one the sum was made in
        // and the one the snapshot used, back now that the replies are gone (the
        // second push's went back when it was added in, and the snapshot took it).
        assert_eq!(pool.spare(), 2, "round {round}");
        seen_after.push(buffers.len());
    }
    // Three buffers circulate (two pushes and a snapshot), all made in the first two
    // rounds.
    assert_eq!(
        seen_after[1..],
        [seen_after[1]; 5],
        "buffers made: {seen_after:?}"
    );
}

/// A split key's length error names the key's whole lengths (150 stored, 200
/// pushed), not this server's pieces of them; a request that cuts the key into other
/// pieces (workers with other split settings) says so.
#[test]
fn a_split_keys_length_error_names_its_whole_lengths() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Async, 1, Update::Sum);
    let piece = |id, offset: u64, len: u64, total: u64| Request {
        worker: 0,
        id,
        op: Op::Push,
        meta: KvMeta {
            keys: vec![9],
            lens: vec![len],
            offsets: vec![offset],
            totals: vec![total],
            must_have: true,
            elem: std::any::type_name::<f32>().to_string(),
        },
        values: vec![1.0; len as usize],
        fpt: false,
        shared: None,
    };
    assert!(store.handle(0, piece(1, 100, 50, 150))[0].body.is_ok());
    let r = store.handle(0, piece(2, 134, 66, 200));
    let err = refused(&r[0], "s");
    assert!(
        matches!(
            err,
            PsError::LengthChanged {
                key: 9,
                stored: 150,
                pushed: 200,
                ..
            }
        ),
        "{err}"
    );
    let r = store.handle(0, piece(3, 90, 60, 150));
    let err = refused(&r[0], "s");
    assert!(err.to_string().contains("other pieces"), "{err}");
}

/// A push of one key that arrived in one frame is summed from the frame (no copy
/// first); the frames come back through the pool's spent list once the round is done,
/// and a withdrawn one too.
#[test]
fn a_push_in_one_frame_is_summed_in_place_and_its_frame_given_back() {
    let mut store = Store::<f32, u32>::new("s".into(), Mode::Sync, 2, Update::Sum);
    let frame = |v: f32| payload::frame_from_vec(vec![v; 3]);
    let shared = |worker, id, v| {
        let mut r = req(worker, id, Op::PushPull, &[9], &[3], Vec::new());
        r.shared = Some(frame(v));
        r
    };
    assert!(store.handle(0, shared(0, 1, 1.0)).is_empty());
    let r = store.handle(1, shared(1, 1, 2.0));
    assert_eq!(r.len(), 2);
    assert!(r.iter().all(|r| values(r) == [3.0; 3]), "{r:?}");
    assert_eq!(store.pool.take_spent().len(), 2, "both pushes' frames");
    // Withdrawn before it comes: its frame is given back unread.
    assert!(matches!(
        hold(&mut store, 0, 2, &[9]),
        HoldAnswer::Held { round: None }
    ));
    store.handle(0, req(0, 2, Op::Withdraw, &[9], &[0], vec![]));
    assert!(store.handle(0, shared(0, 2, 100.0)).is_empty());
    assert_eq!(store.pool.take_spent().len(), 1);
}
