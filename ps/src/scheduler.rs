//! The scheduler: registration, barriers, liveness and the end of the job.
//!
//! ps-lite's ADD_NODE, in switchyard terms: every server and worker registers (a
//! server with the endpoint it serves on); once all have come, each gets its rank and
//! the list of every server's endpoint. Afterwards the scheduler answers heartbeats,
//! releases barriers, and ends the job: with a shutdown to every server once every
//! worker said it is done, or with an abort naming the node that fell silent.

use super::wire::{self, Control, Group, NodeRole};
use super::{PsConfig, PsError};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;
use switchyard_transports::{PeerId, RecvError, Router, RouterSocket, Socket};

/// How long the serving loop receives before it checks for silent nodes.
const SLICE: Duration = Duration::from_millis(20);
/// Longest the scheduler waits on one node's full queue (a node that does not read
/// its line for long is dead or stuck; its silence will tell).
const SEND_WAIT: Duration = Duration::from_millis(50);

/// A scheduler bound to its endpoint, ready to [`run`](Scheduler::run).
#[derive(Debug)]
pub struct Scheduler {
    router: RouterSocket,
    config: PsConfig,
}

/// How a job went, from the scheduler's side.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobReport {
    /// Workers that finished.
    pub workers: u32,
    /// Servers shut down.
    pub servers: u32,
    /// Barriers released.
    pub barriers: u64,
    /// Dead servers replaced by their replicas ([`PsConfig::replicate`]).
    pub failovers: u32,
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

impl Scheduler {
    /// Binds the scheduler's router at `endpoint` (`tcp://host:port`, `local://name`
    /// or `inproc://name`; `tcp://host:0` picks a port, see [`Scheduler::endpoint`]).
    pub fn bind(endpoint: &str, config: &PsConfig) -> Result<Scheduler, PsError> {
        config.check()?;
        let router = RouterSocket::bind(endpoint, config.socket.clone())
            .map_err(|e| PsError::transport(format!("scheduler binding {endpoint}"), e))?;
        Ok(Scheduler {
            router,
            config: config.clone(),
        })
    }

    /// The endpoint nodes connect to.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Runs the job to its end: `Ok` once every worker is done (the servers are told
    /// to stop), an error naming the node when one is silent for
    /// [`PsConfig::dead_timeout`] (everyone is told to abort) or when registration
    /// does not complete within [`PsConfig::join_timeout`].
    pub fn run(mut self) -> Result<JobReport, PsError> {
        let mut members = self.register()?;
        let mut barriers: HashMap<Group, HashSet<usize>> = HashMap::new();
        let mut released = 0u64;
        let mut failovers = 0u32;
        let main_of: HashMap<PeerId, usize> = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.main.clone(), i))
            .collect();
        let beat_of = |members: &[Member], role: NodeRole, rank: u32| {
            members
                .iter()
                .position(|m| m.role == role && m.rank == rank)
        };
        // Whether the last receive found the queue empty. Silence is judged only then:
        // after this thread was kept from running for a while, the heartbeats that
        // queued meanwhile must be counted before any node is taken for silent (judged
        // after each message, a live server whose beat was still queued behind
        // another's was failed over in CI, and the real failure later aborted the job).
        let mut drained = true;
        loop {
            let received = if drained {
                self.router.recv_from_timeout(SLICE)
            } else {
                self.router.try_recv_from()
            };
            drained = received.is_err();
            match received {
                Ok((peer, msg)) => {
                    let note = match wire::read_control(&msg, &peer.to_string()) {
                        Ok(note) => note,
                        Err(e) => {
                            tracing::warn!("ps scheduler: {e}");
                            continue;
                        }
                    };
                    match note {
                        Control::Heartbeat { role, rank } => {
                            if let Some(i) = beat_of(&members, role, rank) {
                                members[i].beat = Some(peer.clone());
                                members[i].heard = Instant::now();
                                let _ = self.router.try_send_to(&peer, self.note(&Control::Ack));
                            }
                        }
                        Control::Barrier { group } => {
                            let Some(&i) = main_of.get(&peer) else {
                                continue;
                            };
                            let waiting = barriers.entry(group).or_default();
                            waiting.insert(i);
                            let size = members
                                .iter()
                                .filter(|m| group.contains(m.role) && !m.dead)
                                .count();
                            if waiting.len() == size {
                                for &j in waiting.iter() {
                                    let main = members[j].main.clone();
                                    self.send(&main, &Control::Release { group });
                                }
                                waiting.clear();
                                released += 1;
                            }
                        }
                        Control::Done => {
                            let Some(&i) = main_of.get(&peer) else {
                                continue;
                            };
                            members[i].done = true;
                            self.send(&peer, &Control::Ack);
                            if members.iter().all(|m| m.role != NodeRole::Worker || m.done) {
                                self.end_job(&members, &Control::Shutdown, None);
                                return Ok(JobReport {
                                    workers: self.config.num_workers,
                                    servers: self.config.num_servers,
                                    barriers: released,
                                    failovers,
                                });
                            }
                        }
                        Control::Register { role, .. } => {
                            let reason = format!(
                                "the job already has all its nodes; a late {role} ({peer}) refused"
                            );
                            tracing::warn!("ps scheduler: {reason}");
                            self.send(&peer, &Control::Abort { reason });
                        }
                        other => tracing::warn!("ps scheduler: unexpected {other:?} from {peer}"),
                    }
                }
                Err(RecvError::Timeout | RecvError::Empty) => {}
                Err(e) => return Err(PsError::protocol("scheduler socket", e)),
            }
            if !drained {
                continue;
            }
            let now = Instant::now();
            if let Some(i) = members
                .iter()
                .position(|m| !m.done && now.duration_since(m.heard) > self.config.dead_timeout)
            {
                let m = &members[i];
                let silent = now.duration_since(m.heard);
                let node = m.name();
                if let Some(by) = self.failover_target(&members, i, failovers) {
                    let dead = members[i].rank;
                    tracing::warn!(
                        "ps scheduler: {node} silent for {silent:.1?}; server {by} serves its keys from its replica"
                    );
                    // The silent server hears it too: if it is only slow, not dead,
                    // it learns that its keys are served elsewhere and stops.
                    self.broadcast(&members, &Control::Failover { dead, by });
                    members[i].done = true;
                    members[i].dead = true;
                    failovers += 1;
                    continue;
                }
                let reason = format!("{node} silent for {silent:.1?}");
                tracing::error!("ps scheduler: {reason}; aborting the job");
                self.end_job(&members, &Control::Abort { reason }, Some(i));
                return Err(PsError::NodeSilent { node, silent });
            }
        }
    }

    /// The server that takes over from member `i`, if it can: with replication on,
    /// a dead server's keys live on the next server of the ring; one failover per
    /// job, since the replacing server keeps no second copy.
    fn failover_target(&self, members: &[Member], i: usize, failovers: u32) -> Option<u32> {
        let m = &members[i];
        let servers = self.config.num_servers;
        if !self.config.replicate || m.role != NodeRole::Server || servers < 2 || failovers > 0 {
            return None;
        }
        let by = (m.rank + 1) % servers;
        members
            .iter()
            .any(|n| n.role == NodeRole::Server && n.rank == by && !n.done)
            .then_some(by)
    }

    /// Waits until every worker and server has registered, then tells each its rank.
    fn register(&mut self) -> Result<Vec<Member>, PsError> {
        let started = Instant::now();
        let deadline = started + self.config.join_timeout;
        let (want_w, want_s) = (self.config.num_workers, self.config.num_servers);
        let mut members: Vec<Member> = Vec::new();
        let count =
            |members: &[Member], role| members.iter().filter(|m| m.role == role).count() as u32;
        while count(&members, NodeRole::Worker) < want_w
            || count(&members, NodeRole::Server) < want_s
        {
            let (peer, msg) = match self.router.recv_from_deadline(Some(deadline)) {
                Ok(got) => got,
                Err(RecvError::Timeout) => {
                    return Err(PsError::Registration(format!(
                        "after {:.1?}, {} of {want_w} workers and {} of {want_s} servers had registered (PsConfig::join_timeout)",
                        started.elapsed(),
                        count(&members, NodeRole::Worker),
                        count(&members, NodeRole::Server)
                    )));
                }
                Err(e) => return Err(PsError::protocol("scheduler socket", e)),
            };
            match wire::read_control(&msg, &peer.to_string()) {
                Ok(Control::Register { role, endpoint }) => {
                    let full = match role {
                        NodeRole::Worker => count(&members, role) >= want_w,
                        NodeRole::Server => count(&members, role) >= want_s,
                    };
                    if full {
                        let reason = format!("the job already has all its {role}s; {peer} refused");
                        tracing::warn!("ps scheduler: {reason}");
                        self.send(&peer, &Control::Abort { reason });
                        continue;
                    }
                    let rank = count(&members, role);
                    members.push(Member {
                        role,
                        rank,
                        endpoint,
                        main: peer,
                        beat: None,
                        heard: started,
                        done: false,
                        dead: false,
                    });
                }
                Ok(other) => {
                    tracing::warn!("ps scheduler: {other:?} from {peer} before registration ended")
                }
                Err(e) => tracing::warn!("ps scheduler: {e}"),
            }
        }
        let mut servers: Vec<(u32, String)> = members
            .iter()
            .filter(|m| m.role == NodeRole::Server)
            .map(|m| (m.rank, m.endpoint.clone()))
            .collect();
        servers.sort();
        let servers: Vec<String> = servers.into_iter().map(|(_, e)| e).collect();
        let now = Instant::now();
        for m in &mut members {
            m.heard = now;
            let note = Control::Assign {
                rank: m.rank,
                num_workers: want_w,
                servers: servers.clone(),
            };
            let main = m.main.clone();
            self.send(&main, &note);
        }
        tracing::info!(
            "ps scheduler: {want_w} workers and {want_s} servers registered: {servers:?}"
        );
        Ok(members)
    }

    fn note(&self, note: &Control) -> Msg {
        wire::control(wire::SCHEDULER, wire::SCHEDULER, note)
    }

    /// Sends `note` to `peer`, waiting a moment at most: the scheduler must not
    /// stall on one node, or it would miss the others' heartbeats.
    fn send(&mut self, peer: &PeerId, note: &Control) {
        let msg = self.note(note);
        if let Err(e) = self
            .router
            .send_to_deadline(peer, msg, Instant::now() + SEND_WAIT)
        {
            tracing::warn!("ps scheduler: {note:?} to {peer} not sent: {}", e.kind);
        }
    }

    /// Sends the job's last word to every node still running and waits until each
    /// (but member `silent`, taken for dead) has said it heard it, for
    /// [`PsConfig::dead_timeout`] at most. Returning at once would let a scheduler
    /// process exit with the note still queued in ZeroMQ: its servers would then
    /// report the scheduler silent instead of a clean end, or instead of the node
    /// whose death aborted the job.
    fn end_job(&mut self, members: &[Member], note: &Control, silent: Option<usize>) {
        self.broadcast(members, note);
        let mut owed: HashSet<(NodeRole, u32)> = members
            .iter()
            .enumerate()
            .filter(|(i, m)| !m.done && Some(*i) != silent)
            .map(|(_, m)| (m.role, m.rank))
            .collect();
        let deadline = Instant::now() + self.config.dead_timeout;
        while !owed.is_empty() {
            let Ok((_, msg)) = self.router.recv_from_deadline(Some(deadline)) else {
                break;
            };
            if let Ok(Control::Ended { role, rank }) = wire::read_control(&msg, "a node") {
                owed.remove(&(role, rank));
            }
        }
        if !owed.is_empty() {
            tracing::debug!("ps scheduler: no word that the end was heard from {owed:?}");
        }
    }

    /// Sends `note` to every node still running, on both its lines.
    fn broadcast(&mut self, members: &[Member], note: &Control) {
        for m in members.iter().filter(|m| !m.done) {
            for peer in std::iter::once(&m.main).chain(m.beat.as_ref()) {
                let msg = self.note(note);
                let _ = self
                    .router
                    .send_to_deadline(peer, msg, Instant::now() + SEND_WAIT);
            }
        }
    }
}
