//! The plan for hand-made states: the cases of recovery without a network.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::{Kind, Plan, Rules, State, decide};
use crate::collective::CollectiveError;

fn at(kind: Kind, version: u64, seq: u64) -> State {
    State {
        kind,
        fresh: false,
        has_local: true,
        version,
        seq,
        attempt: 0,
        call: [1, 4],
        // Holds only what it keeps for good.
        held_from: seq,
    }
}

fn fresh_loading() -> State {
    State {
        kind: Kind::Load,
        fresh: true,
        has_local: false,
        version: 0,
        seq: 0,
        attempt: 1,
        call: [0, 0],
        held_from: 0,
    }
}

fn rules(world: usize) -> Rules {
    Rules::new(world, 5, 2)
}

#[test]
fn states_round_trip_through_their_bytes() {
    let s = State {
        attempt: 3,
        call: [0xdead, 7],
        ..at(Kind::Ack, 9, 12)
    };
    assert_eq!(State::decode(&s.encode()), Ok(s));
    assert!(State::decode(&[9u8; 56]).is_err(), "kind 9 is no kind");
    assert!(State::decode(&[0u8; 55]).is_err());
}

#[test]
fn everyone_in_one_call_runs_it() {
    let states = vec![at(Kind::Call, 2, 3); 4];
    assert_eq!(decide(&states, rules(4)).unwrap(), Plan::Run(Kind::Call));
}

#[test]
fn different_calls_at_one_point_are_a_disagreement_naming_both() {
    let mut states = vec![at(Kind::Call, 0, 1); 3];
    states[2].call = [2, 4];
    let err = decide(&states, rules(3)).unwrap_err();
    assert!(matches!(err, CollectiveError::Disagree { .. }), "{err}");
    assert!(err.to_string().contains("rank 2"), "{err}");
}

#[test]
fn a_restarted_rank_loads_the_checkpoint_and_its_local_model_from_a_successor() {
    let mut states = vec![at(Kind::Call, 3, 2); 5];
    states[1] = fresh_loading();
    let plan = decide(&states, rules(5)).unwrap();
    let Plan::Restore {
        to,
        version,
        source,
        locals,
    } = plan
    else {
        panic!("{plan:?}")
    };
    assert_eq!((to, version, source), (vec![1], 3, Some(0)));
    // Its own model from rank 2 (its first successor), rank 0's from rank 0, rank
    // 4's from rank 4: the copies it must hold again.
    assert_eq!(locals, vec![(1, 2), (0, 0), (4, 4)]);
}

#[test]
fn a_rank_and_all_its_replicas_gone_is_local_model_lost() {
    let mut states = vec![at(Kind::Call, 1, 0); 5];
    for r in [1, 2, 3] {
        states[r] = fresh_loading();
    }
    let err = decide(&states, rules(5)).unwrap_err();
    match err {
        CollectiveError::LocalModelLost {
            rank,
            replicas_tried,
        } => assert_eq!((rank, replicas_tried), (1, vec![1, 2, 3])),
        other => panic!("{other}"),
    }
}

#[test]
fn without_local_models_three_neighbours_may_die_together() {
    let mut states = vec![
        State {
            has_local: false,
            ..at(Kind::Call, 1, 0)
        };
        5
    ];
    for r in [1, 2, 3] {
        states[r] = fresh_loading();
    }
    assert!(matches!(
        decide(&states, rules(5)).unwrap(),
        Plan::Restore { locals, .. } if locals.is_empty()
    ));
}

#[test]
fn a_rank_behind_gets_the_result_from_the_first_keeper_ahead() {
    // world 10, 5 replicas: call 3's result is on the odd ranks.
    let mut states = vec![at(Kind::Call, 2, 5); 10];
    states[4] = at(Kind::Call, 2, 3);
    let plan = decide(&states, rules(10)).unwrap();
    assert_eq!(
        plan,
        Plan::Replay {
            version: 2,
            seq: 3,
            from: 1,
            to: vec![4]
        }
    );
}

#[test]
fn a_result_whose_keepers_are_all_behind_is_lost() {
    let mut states = vec![at(Kind::Call, 0, 1); 4];
    states[0] = at(Kind::Call, 0, 2);
    // world 4 with 2 replicas: call 1 is kept by ranks 1 and 3, both still in it.
    let err = decide(&states, Rules::new(4, 2, 1)).unwrap_err();
    assert!(
        matches!(err, CollectiveError::ResultLost { version: 0, seq: 1, ref keepers } if *keepers == vec![1, 3]),
        "{err}"
    );
}

#[test]
fn checkpoint_steps_replicate_again_for_a_rank_behind_then_commit() {
    let mut states = vec![at(Kind::Ack, 1, 4); 3];
    states[2] = at(Kind::Checkpoint, 1, 4);
    assert_eq!(
        decide(&states, rules(3)).unwrap(),
        Plan::Replicate { behind: vec![2] }
    );
    states[2] = at(Kind::Ack, 1, 4);
    assert_eq!(decide(&states, rules(3)).unwrap(), Plan::Run(Kind::Ack));
    // One rank committed and went on: the others commit without traffic.
    states[0] = at(Kind::Call, 2, 0);
    assert_eq!(decide(&states, rules(3)).unwrap(), Plan::Commit(vec![1, 2]));
}

#[test]
fn at_the_first_start_nobody_has_a_checkpoint() {
    let states = vec![
        State {
            attempt: 0,
            ..fresh_loading()
        };
        3
    ];
    assert_eq!(
        decide(&states, rules(3)).unwrap(),
        Plan::Restore {
            to: vec![0, 1, 2],
            version: 0,
            source: None,
            locals: Vec::new()
        }
    );
}

#[test]
fn a_restarted_rank_that_skips_load_checkpoint_is_refused() {
    let mut states = vec![at(Kind::Call, 2, 0); 3];
    states[1] = State {
        kind: Kind::Call,
        ..fresh_loading()
    };
    let err = decide(&states, rules(3)).unwrap_err();
    assert!(err.to_string().contains("before load_checkpoint"), "{err}");
}

#[test]
fn a_rank_past_a_broadcast_that_is_no_keeper_replays_it_while_it_still_holds_it() {
    // world 10, 5 replicas: call 3 is kept for good by odd ranks only; even ranks
    // finished it (a broadcast) and hold it since the last call all ranks passed (2).
    let mut states = vec![
        State {
            held_from: 2,
            ..at(Kind::Call, 4, 5)
        };
        10
    ];
    for r in [1, 3, 5, 7, 9] {
        states[r] = at(Kind::Call, 4, 3);
    }
    assert_eq!(
        decide(&states, rules(10)).unwrap(),
        Plan::Replay {
            version: 4,
            seq: 3,
            from: 0,
            to: vec![1, 3, 5, 7, 9]
        }
    );
    // Had they dropped it (held from 4 on), it would be lost, and said so.
    for r in [0, 2, 4, 6, 8] {
        states[r].held_from = 4;
    }
    assert!(matches!(
        decide(&states, rules(10)),
        Err(CollectiveError::ResultLost { seq: 3, .. })
    ));
}
