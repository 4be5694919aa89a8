//! The scheduler's orderings, each without a socket or a sleep: the time is an
//! argument, so "after the dead timeout" is an `Instant` a test writes down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const DEAD: Duration = Duration::from_secs(1);
const JOIN: Duration = Duration::from_secs(5);

fn config(workers: usize, servers: usize, replicate: bool) -> PsConfig {
    let mut config = PsConfig::new(workers, servers);
    config.dead_timeout = DEAD;
    config.join_timeout = JOIN;
    config.replicate = replicate;
    config
}

fn worker(n: u64) -> PeerId {
    PeerId::from_index(n)
}

fn server(n: u64) -> PeerId {
    PeerId::from_index(100 + n)
}

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// What the actions send, in order, answers included.
fn sent(actions: &[Action]) -> Vec<(PeerId, Control)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { to, note } | Action::Answer { to, note } => {
                Some((to.clone(), note.clone()))
            }
            Action::Finish(_) => None,
        })
        .collect()
}

fn outcome(actions: Vec<Action>) -> Option<Result<JobReport, PsError>> {
    actions.into_iter().find_map(|a| match a {
        Action::Finish(outcome) => Some(outcome),
        _ => None,
    })
}

fn register(schedule: &mut Schedule, peer: PeerId, role: NodeRole, now: Instant) -> Vec<Action> {
    let endpoint = match role {
        NodeRole::Server => format!("tcp://server-{peer}"),
        NodeRole::Worker => String::new(),
    };
    schedule.on_note(
        peer,
        Control::Register {
            role,
            endpoint,
            data: false,
        },
        now,
    )
}

/// A job whose `workers` workers and `servers` servers registered at `t0`, in that
/// order: worker n is rank n, server n is rank n.
fn running(workers: u64, servers: u64, replicate: bool, t0: Instant) -> Schedule {
    let mut schedule = Schedule::new(&config(workers as usize, servers as usize, replicate), t0);
    for n in 0..workers {
        register(&mut schedule, worker(n), NodeRole::Worker, t0);
    }
    for n in 0..servers {
        register(&mut schedule, server(n), NodeRole::Server, t0);
    }
    assert!(matches!(schedule.phase, Phase::Running));
    schedule
}

fn beat(schedule: &mut Schedule, peer: PeerId, role: NodeRole, rank: u32, now: Instant) {
    let actions = schedule.on_note(peer, Control::Heartbeat { role, rank }, now);
    assert!(matches!(
        actions[..],
        [Action::Answer {
            note: Control::Ack,
            ..
        }]
    ));
}

#[test]
fn every_node_learns_its_rank_and_the_servers_by_rank_once_all_have_registered() {
    let t0 = Instant::now();
    let mut schedule = Schedule::new(&config(1, 2, false), t0);
    assert!(register(&mut schedule, server(7), NodeRole::Server, t0).is_empty());
    assert!(register(&mut schedule, worker(0), NodeRole::Worker, t0).is_empty());
    let actions = register(&mut schedule, server(3), NodeRole::Server, t0);
    let servers = vec![
        format!("tcp://server-{}", server(7)),
        format!("tcp://server-{}", server(3)),
    ];
    let assign = |rank| Control::Assign {
        rank,
        num_workers: 1,
        servers: servers.clone(),
        data: false,
    };
    assert_eq!(
        sent(&actions),
        [
            (server(7), assign(0)),
            (worker(0), assign(0)),
            (server(3), assign(1))
        ]
    );
}

#[test]
fn a_registration_that_does_not_complete_in_time_names_what_came() {
    let t0 = Instant::now();
    let mut schedule = Schedule::new(&config(2, 1, false), t0);
    register(&mut schedule, worker(0), NodeRole::Worker, t0);
    assert!(schedule.on_idle(at(t0, 4_999)).is_empty());
    let Some(Err(PsError::Registration(reason))) = outcome(schedule.on_idle(at(t0, 5_000))) else {
        panic!("expected a registration error");
    };
    assert!(
        reason.contains("1 of 2 workers and 0 of 1 servers"),
        "{reason}"
    );
    assert!(matches!(schedule.phase, Phase::Finished));
}

#[test]
fn a_node_beyond_the_size_of_the_job_is_refused_before_and_after_registration() {
    let t0 = Instant::now();
    let mut schedule = Schedule::new(&config(1, 1, false), t0);
    register(&mut schedule, worker(0), NodeRole::Worker, t0);
    let refused = register(&mut schedule, worker(1), NodeRole::Worker, t0);
    assert!(matches!(&sent(&refused)[..], [(p, Control::Abort { .. })] if *p == worker(1)));
    register(&mut schedule, server(0), NodeRole::Server, t0);
    let late = register(&mut schedule, worker(2), NodeRole::Worker, t0);
    assert!(matches!(&sent(&late)[..], [(p, Control::Abort { reason })]
        if *p == worker(2) && reason.contains("late worker")));
}

#[test]
fn a_barrier_is_released_to_its_group_once_the_whole_group_has_arrived() {
    let t0 = Instant::now();
    let mut schedule = running(2, 1, false, t0);
    let group = Group::Workers;
    assert!(
        schedule
            .on_note(worker(1), Control::Barrier { group }, t0)
            .is_empty()
    );
    let released = schedule.on_note(worker(0), Control::Barrier { group }, t0);
    let mut to: Vec<PeerId> = sent(&released).into_iter().map(|(p, _)| p).collect();
    to.sort();
    assert_eq!(to, [worker(0), worker(1)]);
    assert!(
        sent(&released)
            .iter()
            .all(|(_, n)| *n == Control::Release { group })
    );
    // The count starts again for the next barrier of the same group.
    assert!(
        schedule
            .on_note(worker(0), Control::Barrier { group }, t0)
            .is_empty()
    );
}

/// The ordering bug this state machine was written for: heartbeats that queued while
/// the scheduler's thread was not running are counted before silence is judged.
#[test]
fn silence_is_judged_only_once_the_queued_heartbeats_are_counted() {
    let t0 = Instant::now();
    let mut schedule = running(1, 1, false, t0);
    let late = at(t0, 1_500);
    beat(&mut schedule, worker(0), NodeRole::Worker, 0, late);
    // The server's beat is still queued: no judgement on a note, only when idle.
    beat(&mut schedule, server(0), NodeRole::Server, 0, late);
    assert!(schedule.on_idle(late).is_empty());
    // Without a beat for longer than the dead timeout, the server is named.
    beat(&mut schedule, worker(0), NodeRole::Worker, 0, at(t0, 2_400));
    let actions = schedule.on_idle(at(t0, 2_600));
    let aborts: Vec<_> = sent(&actions).into_iter().map(|(p, _)| p).collect();
    assert!(aborts.contains(&worker(0)) && aborts.contains(&server(0)));
    assert!(
        outcome(actions).is_none(),
        "the worker has not heard the abort yet"
    );
    let ended = Control::Ended {
        role: NodeRole::Worker,
        rank: 0,
    };
    let Some(Err(PsError::NodeSilent { node, .. })) =
        outcome(schedule.on_note(worker(0), ended, at(t0, 2_610)))
    else {
        panic!("expected the silent server to be named");
    };
    assert_eq!(node, format!("server 0 at tcp://server-{}", server(0)));
}

#[test]
fn the_job_ends_once_every_running_node_heard_the_shutdown_or_the_dead_timeout_passed() {
    let t0 = Instant::now();
    let mut schedule = running(2, 2, false, t0);
    let first = schedule.on_note(worker(0), Control::Done, t0);
    assert_eq!(sent(&first), [(worker(0), Control::Ack)]);
    let last = schedule.on_note(worker(1), Control::Done, t0);
    // The workers are done: the shutdown goes to the servers only.
    assert_eq!(
        sent(&last),
        [
            (worker(1), Control::Ack),
            (server(0), Control::Shutdown),
            (server(1), Control::Shutdown)
        ]
    );
    assert!(outcome(last).is_none());
    let ended = |rank| Control::Ended {
        role: NodeRole::Server,
        rank,
    };
    assert!(schedule.on_note(server(0), ended(0), t0).is_empty());
    let report = outcome(schedule.on_note(server(1), ended(1), t0))
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.workers, report.servers, report.failovers),
        (2, 2, 0)
    );

    // A server that never says it heard holds the end for the dead timeout, no more.
    let mut schedule = running(1, 1, false, t0);
    schedule.on_note(worker(0), Control::Done, t0);
    assert!(schedule.on_idle(at(t0, 999)).is_empty());
    assert!(outcome(schedule.on_idle(at(t0, 1_000))).unwrap().is_ok());
}

#[test]
fn a_silent_server_is_failed_over_once_and_the_next_silence_ends_the_job() {
    let t0 = Instant::now();
    let mut schedule = running(1, 3, true, t0);
    let alive = |schedule: &mut Schedule, now, servers: &[u32]| {
        beat(schedule, worker(0), NodeRole::Worker, 0, now);
        for &n in servers {
            beat(schedule, server(n.into()), NodeRole::Server, n, now);
        }
    };
    alive(&mut schedule, at(t0, 900), &[0, 2]);
    let failover = schedule.on_idle(at(t0, 1_100));
    let told: Vec<_> = sent(&failover);
    // Everyone still running hears it, the silent server too (if only slow, it stops).
    assert!(told.contains(&(server(1), Control::Failover { dead: 1, by: 2 })));
    assert!(told.contains(&(worker(0), Control::Failover { dead: 1, by: 2 })));
    assert!(outcome(failover).is_none());
    // A barrier of the servers no longer waits for the dead one.
    let group = Group::Servers;
    assert!(
        schedule
            .on_note(server(0), Control::Barrier { group }, t0)
            .is_empty()
    );
    assert_eq!(
        sent(&schedule.on_note(server(2), Control::Barrier { group }, t0)).len(),
        2
    );
    // One failover per job: the next silent server aborts it.
    alive(&mut schedule, at(t0, 2_000), &[0]);
    let abort = schedule.on_idle(at(t0, 2_200));
    assert!(
        sent(&abort).iter().all(
            |(_, n)| matches!(n, Control::Abort { reason } if reason.starts_with("server 2 "))
        )
    );
    let Phase::Ending { owed, .. } = &schedule.phase else {
        panic!("expected the job to be ending");
    };
    // Nobody waits for the dead to say they heard.
    assert_eq!(owed.len(), 2);
    assert!(!owed.contains(&(NodeRole::Server, 2)) && !owed.contains(&(NodeRole::Server, 1)));
}

#[test]
fn without_replication_a_silent_worker_aborts_the_job_naming_it() {
    let t0 = Instant::now();
    let mut schedule = running(2, 1, false, t0);
    beat(&mut schedule, worker(0), NodeRole::Worker, 0, at(t0, 900));
    beat(&mut schedule, server(0), NodeRole::Server, 0, at(t0, 900));
    assert!(
        schedule.on_idle(at(t0, 1_000)).is_empty(),
        "not yet past the timeout"
    );
    let abort = schedule.on_idle(at(t0, 1_001));
    assert!(sent(&abort)
        .iter()
        .all(|(_, n)| matches!(n, Control::Abort { reason } if reason.starts_with("worker 1 silent for 1.0"))));
    assert!(
        schedule
            .on_idle(at(t0, 2_001))
            .into_iter()
            .any(|a| matches!(
                a,
                Action::Finish(Err(PsError::NodeSilent { ref node, .. })) if node == "worker 1"
            ))
    );
}
