//! The scheduler's decisions, without sockets or clocks.
//!
//! [`Schedule`] is the scheduler's state machine: it is fed every control note a node
//! sends ([`Schedule::on_note`]) and told when the receive queue has run dry
//! ([`Schedule::on_idle`]), always with the time as an argument, and answers with the
//! [`Action`]s to take. The serving loop in [`scheduler`](super::scheduler) only moves
//! bytes. Registration, barriers, the end of the job, silence and failover are decided
//! here, so each of their orderings is a short deterministic test (below) rather than a
//! multi-process job that has to be lucky with its timing.
//!
//! Silence is judged only in `on_idle`: after the scheduler's thread was kept from
//! running for a while, the heartbeats that queued meanwhile must be counted before any
//! node is taken for silent (judged after each note, a live server whose beat was
//! still queued behind another's was once failed over, and the real failure later
//! aborted the job).

use super::wire::{Control, Group, NodeRole};
use super::{JobReport, PsConfig, PsError};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_transports::PeerId;

/// What the serving loop must do for the state machine.
#[derive(Debug)]
pub(crate) enum Action {
    /// Send `note` to `to`, waiting a moment at most for room in its queue.
    Send { to: PeerId, note: Control },
    /// Send `note` to `to` only if its queue has room now (heartbeat answers: a node
    /// whose line is full learns of the scheduler from the next one).
    Answer { to: PeerId, note: Control },
    /// The job is over: return this.
    Finish(Result<JobReport, PsError>),
}

#[derive(Debug)]
struct Member {
    role: NodeRole,
    rank: u32,
    endpoint: String,
    main: PeerId,
    beat: Option<PeerId>,
    heard: Instant,
    done: bool,
    /// A server that died and whose keys another serves.
    dead: bool,
    /// Whether the node offered the data plane when it registered.
    offers_data: bool,
    /// Its data-plane control endpoint, once it sent it.
    data: Option<String>,
    /// Whether it opened its data-plane connections, once it said.
    opened: Option<bool>,
}

impl Member {
    fn name(&self) -> String {
        if self.endpoint.is_empty() {
            format!("{} {}", self.role, self.rank)
        } else {
            format!("{} {} at {}", self.role, self.rank, self.endpoint)
        }
    }
}

/// Where the job is.
#[derive(Debug)]
enum Phase {
    /// Waiting for every node to register, until the deadline.
    Registering { started: Instant, deadline: Instant },
    /// Every node knows its rank: barriers, heartbeats, failover.
    Running,
    /// The job's last word went out; waiting until every node still running says it
    /// heard it ([`Control::Ended`]), until the deadline, then finishing with `outcome`.
    Ending {
        owed: HashSet<(NodeRole, u32)>,
        deadline: Instant,
        outcome: Option<Result<JobReport, PsError>>,
    },
    /// [`Action::Finish`] was given.
    Finished,
}

/// The scheduler's state: see the module documentation.
#[derive(Debug)]
pub(crate) struct Schedule {
    num_workers: u32,
    num_servers: u32,
    replicate: bool,
    dead_timeout: Duration,
    phase: Phase,
    members: Vec<Member>,
    main_of: HashMap<PeerId, usize>,
    barriers: HashMap<Group, HashSet<usize>>,
    released: u64,
    failovers: u32,
}

impl Schedule {
    /// A job of `config`'s size whose registration opens at `now`.
    pub(crate) fn new(config: &PsConfig, now: Instant) -> Schedule {
        Schedule {
            num_workers: config.workers_u32(),
            num_servers: config.servers_u32(),
            replicate: config.replicate,
            dead_timeout: config.dead_timeout,
            phase: Phase::Registering {
                started: now,
                deadline: now + config.join_timeout,
            },
            members: Vec::new(),
            main_of: HashMap::new(),
            barriers: HashMap::new(),
            released: 0,
            failovers: 0,
        }
    }

    /// `note` arrived from `from` at `now`.
    pub(crate) fn on_note(&mut self, from: PeerId, note: Control, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match self.phase {
            Phase::Registering { .. } => self.register(from, note, now, &mut actions),
            Phase::Running => self.serve(from, note, now, &mut actions),
            Phase::Ending { ref mut owed, .. } => {
                if let Control::Ended { role, rank } = note {
                    owed.remove(&(role, rank));
                }
                self.finish_if_heard(&mut actions);
            }
            Phase::Finished => {}
        }
        actions
    }

    /// The receive queue was found empty at `now`: deadlines and silence are judged.
    pub(crate) fn on_idle(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Phase::Registering { started, deadline } = self.phase {
            if now >= deadline {
                let error = PsError::Registration(format!(
                    "after {:.1?}, {} of {} workers and {} of {} servers had registered (PsConfig::join_timeout)",
                    now.duration_since(started),
                    self.count(NodeRole::Worker),
                    self.num_workers,
                    self.count(NodeRole::Server),
                    self.num_servers
                ));
                self.phase = Phase::Finished;
                actions.push(Action::Finish(Err(error)));
            }
            return actions;
        }
        match &mut self.phase {
            Phase::Running => self.judge_silence(now, &mut actions),
            Phase::Ending {
                owed,
                deadline,
                outcome,
            } if now >= *deadline => {
                tracing::debug!("ps scheduler: no word that the end was heard from {owed:?}");
                let outcome = outcome.take();
                self.phase = Phase::Finished;
                actions.extend(outcome.map(Action::Finish));
            }
            _ => {}
        }
        actions
    }

    fn count(&self, role: NodeRole) -> u32 {
        self.members.iter().filter(|m| m.role == role).count() as u32
    }

    fn wanted(&self, role: NodeRole) -> u32 {
        match role {
            NodeRole::Worker => self.num_workers,
            NodeRole::Server => self.num_servers,
        }
    }

    fn register(&mut self, from: PeerId, note: Control, now: Instant, actions: &mut Vec<Action>) {
        let Control::Register {
            role,
            endpoint,
            data,
        } = note
        else {
            tracing::warn!("ps scheduler: {note:?} from {from} before registration ended");
            return;
        };
        if self.count(role) >= self.wanted(role) {
            let reason = format!("the job already has all its {role}s; {from} refused");
            tracing::warn!("ps scheduler: {reason}");
            actions.push(Action::Send {
                to: from,
                note: Control::Abort { reason },
            });
            return;
        }
        self.main_of.insert(from.clone(), self.members.len());
        self.members.push(Member {
            role,
            rank: self.count(role),
            endpoint,
            main: from,
            beat: None,
            heard: now,
            done: false,
            dead: false,
            offers_data: data,
            data: None,
            opened: None,
        });
        if self.count(NodeRole::Worker) < self.num_workers
            || self.count(NodeRole::Server) < self.num_servers
        {
            return;
        }
        let mut servers: Vec<(u32, &str)> = self
            .members
            .iter()
            .filter(|m| m.role == NodeRole::Server)
            .map(|m| (m.rank, m.endpoint.as_str()))
            .collect();
        servers.sort();
        let servers: Vec<String> = servers.into_iter().map(|(_, e)| e.to_owned()).collect();
        let data = self.members.iter().all(|m| m.offers_data);
        if !data {
            let zmq: Vec<String> = (self.members.iter())
                .filter(|m| !m.offers_data)
                .map(Member::name)
                .collect();
            tracing::info!(
                "ps scheduler: values travel over ZeroMQ (SWITCHYARD_PS_DATA=zmq or no data plane at {})",
                zmq.join(", ")
            );
        }
        for m in &mut self.members {
            // Silence counts from the moment a node can know it has joined.
            m.heard = now;
            actions.push(Action::Send {
                to: m.main.clone(),
                note: Control::Assign {
                    rank: m.rank,
                    num_workers: self.num_workers,
                    servers: servers.clone(),
                    data,
                },
            });
        }
        tracing::info!(
            "ps scheduler: {} workers and {} servers registered: {servers:?}",
            self.num_workers,
            self.num_servers
        );
        self.phase = Phase::Running;
    }

    fn serve(&mut self, from: PeerId, note: Control, now: Instant, actions: &mut Vec<Action>) {
        match note {
            Control::Heartbeat { role, rank } => {
                let Some(m) = self
                    .members
                    .iter_mut()
                    .find(|m| m.role == role && m.rank == rank)
                else {
                    return;
                };
                m.beat = Some(from.clone());
                m.heard = now;
                actions.push(Action::Answer {
                    to: from,
                    note: Control::Ack,
                });
            }
            Control::Barrier { group } => {
                let Some(&i) = self.main_of.get(&from) else {
                    return;
                };
                let waiting = self.barriers.entry(group).or_default();
                waiting.insert(i);
                let size = self
                    .members
                    .iter()
                    .filter(|m| group.contains(m.role) && !m.dead)
                    .count();
                if waiting.len() == size {
                    for &j in waiting.iter() {
                        actions.push(Action::Send {
                            to: self.members[j].main.clone(),
                            note: Control::Release { group },
                        });
                    }
                    waiting.clear();
                    self.released += 1;
                }
            }
            Control::Done => {
                let Some(&i) = self.main_of.get(&from) else {
                    return;
                };
                self.members[i].done = true;
                actions.push(Action::Send {
                    to: from,
                    note: Control::Ack,
                });
                if self
                    .members
                    .iter()
                    .all(|m| m.role != NodeRole::Worker || m.done)
                {
                    let report = JobReport {
                        workers: self.num_workers,
                        servers: self.num_servers,
                        barriers: self.released,
                        failovers: self.failovers,
                    };
                    self.end_job(Control::Shutdown, None, Ok(report), now, actions);
                }
            }
            Control::DataEndpoint { endpoint } => {
                let Some(&i) = self.main_of.get(&from) else {
                    return;
                };
                self.members[i].data = Some(endpoint);
                self.data_peers_if_all(actions);
            }
            Control::DataOpened { ok } => {
                let Some(&i) = self.main_of.get(&from) else {
                    return;
                };
                self.members[i].opened = Some(ok);
                self.data_chosen_if_all(actions);
            }
            Control::Register { role, .. } => {
                let reason =
                    format!("the job already has all its nodes; a late {role} ({from}) refused");
                tracing::warn!("ps scheduler: {reason}");
                actions.push(Action::Send {
                    to: from,
                    note: Control::Abort { reason },
                });
            }
            other => tracing::warn!("ps scheduler: unexpected {other:?} from {from}"),
        }
    }

    /// The data-plane rank of member `m`: servers first, then workers.
    fn data_rank(&self, m: &Member) -> usize {
        match m.role {
            NodeRole::Server => m.rank as usize,
            NodeRole::Worker => (self.num_servers + m.rank) as usize,
        }
    }

    /// Once every live node sent its data-plane endpoint: the list, by data-plane
    /// rank, to every node (a dead node's entry empty, which makes every node stay
    /// on ZeroMQ).
    fn data_peers_if_all(&mut self, actions: &mut Vec<Action>) {
        if self.members.iter().any(|m| !m.dead && m.data.is_none()) {
            return;
        }
        let mut endpoints = vec![String::new(); self.members.len()];
        for m in &self.members {
            if let Some(slot) = endpoints.get_mut(self.data_rank(m)) {
                *slot = m.data.clone().unwrap_or_default();
            }
        }
        let note = Control::DataPeers { endpoints };
        for m in self.members.iter().filter(|m| !m.dead) {
            actions.push(Action::Send {
                to: m.main.clone(),
                note: note.clone(),
            });
        }
    }

    /// Once every live node said whether it opened the data plane: the verdict to
    /// every node, which uses the data plane only if all did.
    fn data_chosen_if_all(&mut self, actions: &mut Vec<Action>) {
        if self.members.iter().any(|m| !m.dead && m.opened.is_none()) {
            return;
        }
        let link = self.members.iter().all(|m| m.opened == Some(true));
        if !link {
            let failed: Vec<String> = (self.members.iter())
                .filter(|m| m.opened != Some(true))
                .map(Member::name)
                .collect();
            tracing::warn!(
                "ps scheduler: the data plane did not open at {}; values travel over ZeroMQ",
                failed.join(", ")
            );
        }
        for m in self.members.iter().filter(|m| !m.dead) {
            actions.push(Action::Send {
                to: m.main.clone(),
                note: Control::DataChosen { link },
            });
        }
    }

    /// The first node silent for longer than the dead timeout is failed over (a
    /// server, with replication on, once per job) or ends the job.
    fn judge_silence(&mut self, now: Instant, actions: &mut Vec<Action>) {
        let Some(i) = self
            .members
            .iter()
            .position(|m| !m.done && now.duration_since(m.heard) > self.dead_timeout)
        else {
            return;
        };
        let silent = now.duration_since(self.members[i].heard);
        let node = self.members[i].name();
        if let Some(by) = self.failover_target(i) {
            let dead = self.members[i].rank;
            tracing::warn!(
                "ps scheduler: {node} silent for {silent:.1?}; server {by} serves its keys from its replica"
            );
            // The silent server hears it too: if it is only slow, not dead, it learns
            // that its keys are served elsewhere and stops.
            self.broadcast(&Control::Failover { dead, by }, actions);
            self.members[i].done = true;
            self.members[i].dead = true;
            self.failovers += 1;
            return;
        }
        let reason = format!("{node} silent for {silent:.1?}");
        tracing::error!("ps scheduler: {reason}; aborting the job");
        let error = PsError::NodeSilent { node, silent };
        self.end_job(Control::Abort { reason }, Some(i), Err(error), now, actions);
    }

    /// The server that takes over from member `i`, if it can: with replication on, a
    /// dead server's keys live on the next server of the ring; one failover per job,
    /// since the replacing server keeps no second copy.
    fn failover_target(&self, i: usize) -> Option<u32> {
        let m = &self.members[i];
        let servers = self.num_servers;
        if !self.replicate || m.role != NodeRole::Server || servers < 2 || self.failovers > 0 {
            return None;
        }
        let by = (m.rank + 1) % servers;
        self.members
            .iter()
            .any(|n| n.role == NodeRole::Server && n.rank == by && !n.done)
            .then_some(by)
    }

    /// Sends the job's last word to every node still running and waits until each
    /// (but member `silent`, taken for dead) has said it heard it, for the dead timeout
    /// at most. Finishing at once would let a scheduler process exit with the note
    /// still queued in ZeroMQ: its servers would then report the scheduler silent
    /// instead of a clean end, or instead of the node whose death aborted the job.
    fn end_job(
        &mut self,
        note: Control,
        silent: Option<usize>,
        outcome: Result<JobReport, PsError>,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        self.broadcast(&note, actions);
        let owed = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| !m.done && Some(*i) != silent)
            .map(|(_, m)| (m.role, m.rank))
            .collect();
        self.phase = Phase::Ending {
            owed,
            deadline: now + self.dead_timeout,
            outcome: Some(outcome),
        };
        self.finish_if_heard(actions);
    }

    fn finish_if_heard(&mut self, actions: &mut Vec<Action>) {
        if let Phase::Ending { owed, outcome, .. } = &mut self.phase {
            if owed.is_empty() {
                let outcome = outcome.take();
                self.phase = Phase::Finished;
                actions.extend(outcome.map(Action::Finish));
            }
        }
    }

    /// Sends `note` to every node still running, on both its lines.
    fn broadcast(&self, note: &Control, actions: &mut Vec<Action>) {
        for m in self.members.iter().filter(|m| !m.done) {
            for peer in std::iter::once(&m.main).chain(m.beat.as_ref()) {
                actions.push(Action::Send {
                    to: peer.clone(),
                    note: note.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
