//! The rendezvous's decisions, each ordering written down without a socket. A
//! connection is a number (`conn(rank, n)`: the n-th connection of that rank), so a
//! test can say which one was answered, closed or kept.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

/// The `n`-th connection of `rank` (so 10 is rank 1's first, 11 its second).
fn conn(rank: u32, n: u32) -> u32 {
    rank * 10 + n
}

fn check_in(rank: u32, world: u32, generation: u32, endpoint: &str) -> CheckIn {
    CheckIn {
        rank,
        world,
        generation,
        endpoint: endpoint.to_string(),
    }
}

/// Feeds `rank`'s `n`-th check-in at `generation` of a job of `world`, which must be
/// counted.
fn join(
    g: &mut Gathering<u32>,
    (rank, world, generation): (u32, u32, u32),
    n: u32,
    endpoint: &str,
) -> Joined<u32> {
    match g.on_check_in(check_in(rank, world, generation, endpoint), conn(rank, n)) {
        Step::Joined(joined) => joined,
        Step::Refused { refusal, .. } => panic!("rank {rank} refused: {refusal:?}"),
    }
}

/// Feeds a check-in on connection 99, which must be refused (the connection handed
/// back): returns why.
fn refuse(g: &mut Gathering<u32>, check: CheckIn) -> Refusal {
    match g.on_check_in(check, 99) {
        Step::Refused { conn, refusal } => {
            assert_eq!(conn, 99, "another connection was handed back");
            refusal
        }
        Step::Joined(joined) => panic!("joined: {joined:?}"),
    }
}

fn list(endpoints: &[&str]) -> Vec<String> {
    endpoints.iter().map(|e| e.to_string()).collect()
}

/// Who was answered, and with what.
fn answered(joined: &Joined<u32>) -> Vec<(u32, u32, Vec<String>)> {
    joined
        .answers
        .iter()
        .map(|a| (a.conn, a.rank, a.endpoints.clone()))
        .collect()
}

#[test]
fn nobody_is_answered_until_the_last_rank_checks_in_then_everyone_in_rank_order() {
    let mut g = Gathering::new(3);
    let two = join(&mut g, (2, 3, 0), 0, "c");
    assert!(two.answers.is_empty() && !two.completed && !two.replaced);
    let zero = join(&mut g, (0, 3, 0), 0, "a");
    assert!(zero.answers.is_empty() && !zero.completed);
    let one = join(&mut g, (1, 3, 0), 0, "b");
    assert!(one.completed);
    assert_eq!(one.superseded, None);
    let abc = list(&["a", "b", "c"]);
    assert_eq!(
        answered(&one),
        [
            (conn(0, 0), 0, abc.clone()),
            (conn(1, 0), 1, abc.clone()),
            (conn(2, 0), 2, abc),
        ]
    );
}

#[test]
fn a_world_of_one_is_answered_at_its_only_check_in() {
    let mut g = Gathering::new(1);
    let only = join(&mut g, (0, 1, 0), 0, "tcp://a:1");
    assert!(only.completed);
    assert_eq!(answered(&only), [(0, 0, list(&["tcp://a:1"]))]);
}

/// A restarted rank after its generation was answered: answered at once, alone, with
/// its new endpoint; the others' connections are gone and not answered again.
#[test]
fn a_rank_restarted_after_the_answer_is_answered_at_once_with_its_new_endpoint() {
    let mut g = Gathering::new(2);
    join(&mut g, (0, 2, 0), 0, "a1");
    assert!(join(&mut g, (1, 2, 0), 0, "b1").completed);
    let again = join(&mut g, (1, 2, 0), 1, "b2");
    assert!(again.replaced);
    assert!(!again.completed, "a generation completes once");
    assert_eq!(again.superseded, None);
    assert_eq!(answered(&again), [(conn(1, 1), 1, list(&["a1", "b2"]))]);
    // Rank 0 restarts too: it sees rank 1's newest endpoint.
    let zero = join(&mut g, (0, 2, 0), 1, "a2");
    assert_eq!(answered(&zero), [(conn(0, 1), 0, list(&["a2", "b2"]))]);
}

/// A rank restarted while its generation still waited: its old connection is handed
/// back to be closed unanswered, and the new one gets the list with the new endpoint.
#[test]
fn a_rank_restarted_before_the_answer_supersedes_its_waiting_connection() {
    let mut g = Gathering::new(2);
    let first = join(&mut g, (0, 2, 0), 0, "a1");
    assert!(!first.replaced && first.superseded.is_none());
    let second = join(&mut g, (0, 2, 0), 1, "a2");
    assert!(second.replaced);
    assert_eq!(second.superseded, Some(conn(0, 0)));
    assert!(second.answers.is_empty(), "rank 1 has not checked in");
    let one = join(&mut g, (1, 2, 0), 0, "b1");
    let ab = list(&["a2", "b1"]);
    assert_eq!(
        answered(&one),
        [(conn(0, 1), 0, ab.clone()), (conn(1, 0), 1, ab)]
    );
}

/// Each generation gathers apart: rank 0's second communicator is not completed by
/// rank 1's first, nor answered with its endpoints.
#[test]
fn generations_do_not_complete_each_other() {
    let mut g = Gathering::new(2);
    join(&mut g, (0, 2, 0), 0, "a0");
    let later = join(&mut g, (0, 2, 1), 1, "a1");
    assert!(later.answers.is_empty() && !later.replaced);
    let one = join(&mut g, (1, 2, 0), 0, "b0");
    let zero = list(&["a0", "b0"]);
    assert_eq!(
        answered(&one),
        [(conn(0, 0), 0, zero.clone()), (conn(1, 0), 1, zero)]
    );
    let one_later = join(&mut g, (1, 2, 1), 1, "b1");
    let first = list(&["a1", "b1"]);
    assert_eq!(
        answered(&one_later),
        [(conn(0, 1), 0, first.clone()), (conn(1, 1), 1, first)]
    );
}

/// A late check-in at an old generation (a rank restarted into its first communicator
/// while the others are on their second) gets the old generation's list, not the new.
#[test]
fn a_late_check_in_at_an_old_generation_gets_that_generations_list() {
    let mut g = Gathering::new(2);
    join(&mut g, (0, 2, 0), 0, "a0");
    join(&mut g, (1, 2, 0), 0, "b0");
    join(&mut g, (0, 2, 1), 1, "a1");
    join(&mut g, (1, 2, 1), 1, "b1");
    let late = join(&mut g, (1, 2, 0), 2, "b0'");
    assert_eq!(answered(&late), [(conn(1, 2), 1, list(&["a0", "b0'"]))]);
}

#[test]
fn a_wrong_world_size_is_refused_and_changes_nothing() {
    let mut g = Gathering::new(2);
    join(&mut g, (0, 2, 0), 0, "a");
    assert_eq!(
        refuse(&mut g, check_in(1, 3, 0, "evil")),
        Refusal::WrongWorld { claimed: 3 }
    );
    // The refused check-in neither filled rank 1's slot nor answered rank 0.
    let one = join(&mut g, (1, 2, 0), 0, "b");
    assert!(!one.replaced && one.completed);
    assert_eq!(one.answers[0].endpoints, list(&["a", "b"]));
}

#[test]
fn ranks_outside_the_job_are_refused() {
    let mut g = Gathering::new(2);
    assert_eq!(
        refuse(&mut g, check_in(2, 2, 0, "x")),
        Refusal::RankOutside { rank: 2 }
    );
    assert_eq!(
        refuse(&mut g, check_in(u32::MAX, 2, 0, "x")),
        Refusal::RankOutside { rank: u32::MAX }
    );
    // A job of none takes nobody.
    let mut empty = Gathering::new(0);
    assert_eq!(
        refuse(&mut empty, check_in(0, 0, 0, "x")),
        Refusal::RankOutside { rank: 0 }
    );
}

/// Wrong on two counts: the world size is named (it is checked first, as the log has
/// always said).
#[test]
fn the_world_size_is_checked_before_the_rank() {
    let mut g = Gathering::new(2);
    assert_eq!(
        refuse(&mut g, check_in(7, 5, 0, "x")),
        Refusal::WrongWorld { claimed: 5 }
    );
}

/// At the limit a new generation is refused, while the kept ones still take check-ins
/// (a restarted rank's among them).
#[test]
fn past_the_generation_limit_only_kept_generations_take_check_ins() {
    let mut g = Gathering::new(2);
    for generation in 0..MAX_GENERATIONS as u32 {
        join(&mut g, (0, 2, generation), 0, "a");
    }
    let next = MAX_GENERATIONS as u32;
    assert_eq!(
        refuse(&mut g, check_in(0, 2, next, "a")),
        Refusal::TooManyGenerations { generation: next }
    );
    assert_eq!(
        refuse(&mut g, check_in(1, 2, u32::MAX, "b")),
        Refusal::TooManyGenerations {
            generation: u32::MAX
        }
    );
    let last = join(&mut g, (1, 2, next - 1), 0, "b");
    assert!(last.completed);
    assert_eq!(last.answers.len(), 2);
}

/// A refusal is checked before the limit: a wrong world at a new generation past the
/// limit is named for its world size.
#[test]
fn a_wrong_world_past_the_limit_is_named_for_the_world() {
    let mut g = Gathering::new(1);
    for generation in 0..MAX_GENERATIONS as u32 {
        join(&mut g, (0, 1, generation), 0, "a");
    }
    assert_eq!(
        refuse(&mut g, check_in(0, 2, u32::MAX, "a")),
        Refusal::WrongWorld { claimed: 2 }
    );
}

#[test]
fn a_check_in_must_name_the_rank_its_proof_claimed() {
    let check = check_in(0, 2, 0, "x:1");
    assert_eq!(check_claim(None, &check), Ok(()));
    assert_eq!(check_claim(Some(0), &check), Ok(()));
    assert_eq!(
        check_claim(Some(1), &check),
        Err("check-in for rank 0 after authenticating as rank 1".to_string())
    );
}

/// Which connections were refused as unformable, with the exited ranks named.
fn unformable(refused: &[Unformable<u32>]) -> Vec<(u32, u32, u32, Vec<u32>)> {
    refused
        .iter()
        .map(|u| {
            let ranks = u.exited.iter().map(|(r, _)| *r).collect();
            (u.conn, u.rank, u.generation, ranks)
        })
        .collect()
}

/// A later communicator that only some ranks ask for: the rank that exited without it
/// makes the ranks waiting at it refused at once, naming it and how it ended.
#[test]
fn an_exit_refuses_the_ranks_waiting_at_a_generation_it_never_joined() {
    let mut g = Gathering::new(3);
    for rank in 0..3 {
        join(&mut g, (rank, 3, 0), 0, "x");
    }
    let zero = join(&mut g, (0, 3, 1), 1, "a1");
    assert!(zero.unformable.is_empty(), "nobody had exited yet");
    let one = join(&mut g, (1, 3, 1), 1, "b1");
    assert!(one.unformable.is_empty() && !one.completed);
    let refused = g.on_exit(2, "finished (exit status: 0)".into());
    assert_eq!(
        unformable(&refused),
        [(conn(0, 1), 0, 1, vec![2]), (conn(1, 1), 1, 1, vec![2])]
    );
    assert_eq!(refused[0].exited[0].1, "finished (exit status: 0)");
    // Generation 0, answered, is not touched; an exit is reported once per rank.
    assert!(g.on_exit(2, "again".into()).is_empty());
}

/// A rank that checks in after the exit was reported is refused at once, on its own
/// connection; so is every later one at that generation.
#[test]
fn a_check_in_after_the_exit_is_refused_at_once() {
    let mut g = Gathering::new(3);
    assert!(g.on_exit(1, "finished (exit status: 0)".into()).is_empty());
    let zero = join(&mut g, (0, 3, 0), 0, "a");
    assert_eq!(unformable(&zero.unformable), [(conn(0, 0), 0, 0, vec![1])]);
    assert!(zero.answers.is_empty() && !zero.completed);
    let two = join(&mut g, (2, 3, 0), 0, "c");
    assert_eq!(unformable(&two.unformable), [(conn(2, 0), 2, 0, vec![1])]);
    // Rank 0 checked in at generation 0 before it exited: generation 1 misses both,
    // named in rank order.
    assert!(g.on_exit(0, "finished (exit status: 0)".into()).is_empty());
    let late = join(&mut g, (2, 3, 1), 1, "c2");
    assert_eq!(
        unformable(&late.unformable),
        [(conn(2, 1), 2, 1, vec![0, 1])]
    );
}

/// A rank that exits after checking in at a generation does not stop it: the others
/// still complete it. Exits of ranks outside the job are ignored.
#[test]
fn an_exit_after_checking_in_leaves_the_generation_to_form() {
    let mut g = Gathering::new(2);
    join(&mut g, (1, 2, 0), 0, "b");
    assert!(g.on_exit(1, "finished (exit status: 0)".into()).is_empty());
    assert!(g.on_exit(7, "finished (exit status: 0)".into()).is_empty());
    let zero = join(&mut g, (0, 2, 0), 0, "a");
    assert!(zero.completed && zero.unformable.is_empty());
    let ab = list(&["a", "b"]);
    assert_eq!(
        answered(&zero),
        [(conn(0, 0), 0, ab.clone()), (conn(1, 0), 1, ab)],
        "rank 1's connection was still waiting"
    );
    // A restarted rank at the answered generation is answered as before.
    let again = join(&mut g, (0, 2, 0), 1, "a2");
    assert_eq!(answered(&again), [(conn(0, 1), 0, list(&["a2", "b"]))]);
}
