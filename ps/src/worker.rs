//! A worker: push, pull and push_pull of key-value lists, blocking or with a ticket.

use super::node::{self, Node};
use super::shard::Placement;
use super::split::{self, KvValues};
use super::wire::{self, Group, HoldAnswer, KvMeta, NodeRole, Refusal, RoundState};
use super::withdraw::{Progress, Verdict, Withdrawal};
use super::{PsConfig, PsError, Value};
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::time::{Duration, Instant};

use switchyard_msg::{Kind, Msg};
use switchyard_transports::{Dealer, DealerSocket, Pollable, Poller, Socket};

/// How long a worker waits for the servers' answers to a hold (a live server answers
/// at once) before it reports the push's outcome unknown.
const HOLD_GRACE: Duration = Duration::from_secs(1);

/// A request in flight, returned by the `start_*` calls; [`KvWorker::wait`] ends it.
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a ticket must be waited on to learn whether the request succeeded"]
pub struct Ticket {
    id: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Push,
    PushPull,
    Pull,
    Init,
    Check,
}

#[derive(Debug)]
struct Pending {
    op: Op,
    keys: Vec<u64>,
    /// Push and init: each key's whole length, confirmed once every server took it.
    totals: Vec<u64>,
    /// The servers (by the rank whose keys they are about) yet to answer.
    owed: HashSet<usize>,
    /// With replication on: each server's request, to send again to its replica if
    /// the server dies before answering (frames are shared, not copied).
    sent: Vec<(usize, Msg)>,
    /// (key index, offset, total, bytes) of every piece received.
    pieces: Vec<(usize, u64, u64, Bytes)>,
    error: Option<PsError>,
    started: Instant,
    /// Push and push_pull: each server's part of the request (its keys), for a
    /// withdrawal.
    parts: Vec<(usize, KvMeta)>,
    /// Where a push that outwaited the request timeout stands.
    overdue: Withdrawal,
}

/// A worker of a parameter-server job.
///
/// Keys are `u64`; each key's value is a vector of `T` whose length is fixed by its
/// first push. Values handed over as a `Vec` travel without a copy: the vector
/// becomes one [`Bytes`] and each server gets slices of it. Every call has a blocking
/// form and a `start_*` form that returns a [`Ticket`] for [`KvWorker::wait`], so
/// that requests to different keys overlap. Call [`KvWorker::finish`] at the end: a
/// worker that stops without it is taken for dead and the job is aborted.
///
/// Singa's kinds map onto these calls: Get = [`pull`](KvWorker::pull), Put =
/// [`init`](KvWorker::init), Update = [`push_pull`](KvWorker::push_pull); Sync
/// between server groups is what a synchronous round does for every key.
#[derive(Debug)]
pub struct KvWorker<T: Value> {
    node: Node,
    placement: Placement,
    servers: Vec<DealerSocket>,
    names: Vec<String>,
    poller: Poller,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    totals: HashMap<u64, u64>,
    /// Keys whose length every server holding them accepted: a push of these
    /// lengths cannot be refused by one server and taken by another, so it needs no
    /// check first.
    confirmed: HashMap<u64, u64>,
    /// Which connection reaches each server's keys: itself, or after a failover the
    /// server that took them over.
    route: Vec<usize>,
    _values: PhantomData<T>,
}

impl<T: Value> KvWorker<T> {
    /// Registers with the scheduler at `scheduler` and connects to every server.
    pub fn join(scheduler: &str, config: &PsConfig) -> Result<Self, PsError> {
        let node = Node::join(scheduler, NodeRole::Worker, String::new(), config)?;
        let mut servers = Vec::new();
        let mut names = Vec::new();
        // A registered server answers as soon as it serves; one that does not within
        // the liveness timeout is as good as dead.
        let options = config
            .socket
            .clone()
            .with_connect_timeout(config.dead_timeout);
        for (rank, endpoint) in node.servers.iter().enumerate() {
            let name = format!("server {rank} at {endpoint}");
            let dealer = DealerSocket::connect(endpoint, options.clone()).map_err(|e| {
                PsError::transport(format!("worker {} connecting to {name}", node.rank), e)
            })?;
            servers.push(dealer);
            names.push(name);
        }
        let names_len = names.len();
        let placement = Placement::new(config.sharding, servers.len(), config.split_threshold);
        Ok(KvWorker {
            node,
            placement,
            servers,
            names,
            poller: Poller::new(),
            next_id: 1,
            pending: HashMap::new(),
            totals: HashMap::new(),
            confirmed: HashMap::new(),
            route: (0..names_len).collect(),
            _values: PhantomData,
        })
    }

    /// This worker's rank (0-based, among workers).
    pub fn rank(&self) -> usize {
        self.node.rank as usize
    }

    /// Number of workers in the job.
    pub fn num_workers(&self) -> usize {
        self.node.num_workers as usize
    }

    /// Where keys go.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Adds `values` (cut by `lens`, one length per key) to the keys' current round.
    pub fn push(&mut self, keys: &[u64], lens: &[usize], values: Vec<T>) -> Result<(), PsError> {
        let t = self.start_push(keys, lens, values)?;
        self.wait(t).map(|_| ())
    }

    /// Pushes, then returns the keys' values after the round (ps-lite's push_pull,
    /// FPT's fused push: one message each way).
    pub fn push_pull(
        &mut self,
        keys: &[u64],
        lens: &[usize],
        values: Vec<T>,
    ) -> Result<KvValues<T>, PsError> {
        let t = self.start_push_pull(keys, lens, values)?;
        self.wait(t)
    }

    /// The keys' current values.
    pub fn pull(&mut self, keys: &[u64]) -> Result<KvValues<T>, PsError> {
        let t = self.start_pull(keys)?;
        self.wait(t)
    }

    /// Sets the keys' values (Singa's Put): no round, the last writer wins.
    pub fn init(&mut self, keys: &[u64], lens: &[usize], values: Vec<T>) -> Result<(), PsError> {
        let t = self.start_send(Op::Init, keys, lens, values)?;
        self.wait(t).map(|_| ())
    }

    /// Starts a [`push`](KvWorker::push).
    pub fn start_push(
        &mut self,
        keys: &[u64],
        lens: &[usize],
        values: Vec<T>,
    ) -> Result<Ticket, PsError> {
        self.start_send(Op::Push, keys, lens, values)
    }

    /// Starts a [`push_pull`](KvWorker::push_pull).
    pub fn start_push_pull(
        &mut self,
        keys: &[u64],
        lens: &[usize],
        values: Vec<T>,
    ) -> Result<Ticket, PsError> {
        self.start_send(Op::PushPull, keys, lens, values)
    }

    /// Starts a [`pull`](KvWorker::pull).
    pub fn start_pull(&mut self, keys: &[u64]) -> Result<Ticket, PsError> {
        let known: Option<Vec<u64>> = keys.iter().map(|k| self.totals.get(k).copied()).collect();
        let requests = split::pull_requests(&self.placement, keys, known.as_deref())?;
        self.send_all(Op::Pull, keys, Vec::new(), requests)
    }

    fn start_send(
        &mut self,
        op: Op,
        keys: &[u64],
        lens: &[usize],
        values: Vec<T>,
    ) -> Result<Ticket, PsError> {
        let requests = split::push_requests(&self.placement, keys, lens, values)?;
        let totals: Vec<u64> = lens.iter().map(|&l| l as u64).collect();
        let servers = requests.iter().filter(|(m, _)| !m.keys.is_empty()).count();
        let known = keys
            .iter()
            .zip(&totals)
            .all(|(k, t)| self.confirmed.get(k) == Some(t));
        if servers > 1 && !known {
            self.check_first(keys, &totals, &requests)?;
        }
        for (&key, &total) in keys.iter().zip(&totals) {
            self.totals.insert(key, total);
        }
        self.send_all(op, keys, totals, requests)
    }

    /// The first phase of a push or init that reaches several servers with keys
    /// whose lengths are not confirmed yet: every server checks its part (lengths,
    /// element type) and holds the lengths of new keys; if any refuses, the others
    /// let go and nothing is sent, so that a push is applied everywhere or nowhere.
    fn check_first(
        &mut self,
        keys: &[u64],
        totals: &[u64],
        requests: &[(KvMeta, Vec<Bytes>)],
    ) -> Result<(), PsError> {
        let checks: Vec<(KvMeta, Vec<Bytes>)> = requests
            .iter()
            .map(|(meta, _)| (meta.clone(), Vec::new()))
            .collect();
        let ticket = self.send_all(Op::Check, keys, totals.to_vec(), checks.clone())?;
        let id = ticket.id;
        let Err(error) = self.wait(ticket) else {
            return Ok(());
        };
        let me = self.node.addr();
        for (s, (meta, _)) in checks.into_iter().enumerate() {
            if meta.keys.is_empty() {
                continue;
            }
            let to = wire::addr(NodeRole::Server, s as u32);
            let release = wire::kv_msg(me, to, wire::RELEASE, id, &meta, Vec::new());
            // A release that does not arrive leaves only a held length behind,
            // which the key's next correct push takes over.
            if let Ok(msg) = release {
                let _ = node::send_to(&mut self.servers[self.route[s]], msg, &self.names[s]);
            }
        }
        Err(error)
    }

    /// Sends each server its request (servers with no key are skipped, except by a
    /// pull of unknown keys, which asks all) and records what is owed.
    fn send_all(
        &mut self,
        op: Op,
        keys: &[u64],
        totals: Vec<u64>,
        requests: Vec<(KvMeta, Vec<Bytes>)>,
    ) -> Result<Ticket, PsError> {
        let id = self.next_id;
        self.next_id += 1;
        let kind: Kind = match op {
            Op::Push => wire::PUSH,
            Op::PushPull => wire::PUSH_PULL,
            Op::Pull => wire::PULL,
            Op::Init => wire::INIT,
            Op::Check => wire::CHECK,
        };
        self.node.check()?;
        self.follow_failovers()?;
        let me = self.node.addr();
        let mut owed = HashSet::new();
        let mut sent = Vec::new();
        let mut parts = Vec::new();
        for (s, (mut meta, frames)) in requests.into_iter().enumerate() {
            if meta.keys.is_empty() {
                continue;
            }
            meta.elem = std::any::type_name::<T>().to_string();
            if matches!(op, Op::Push | Op::PushPull) {
                parts.push((s, meta.clone()));
            }
            let msg = wire::kv_msg(
                me,
                wire::addr(NodeRole::Server, s as u32),
                kind,
                id,
                &meta,
                frames,
            )?;
            if self.node.config.replicate {
                sent.push((s, msg.clone()));
            }
            node::send_to(&mut self.servers[self.route[s]], msg, &self.names[s])?;
            owed.insert(s);
        }
        let pending = Pending {
            op,
            keys: keys.to_vec(),
            totals,
            owed,
            sent,
            pieces: Vec::new(),
            error: None,
            started: Instant::now(),
            parts,
            overdue: Withdrawal::OnTime,
        };
        self.pending.insert(id, pending);
        Ok(Ticket { id })
    }

    /// Waits for a request to complete: the keys' values for a pull or push_pull,
    /// empty values for a push or init.
    ///
    /// A push whose sync rounds have not completed within
    /// [`PsConfig::request_timeout`] is withdrawn from every server it reached, in
    /// two phases: each server holds it (no round with it completes), then, if none
    /// has applied any of it, each takes it out and the call fails with
    /// [`PsError::RoundIncomplete`]; if one has, the others keep it and the call waits
    /// one more timeout for them. So a push is applied by every server or by none.
    pub fn wait(&mut self, ticket: Ticket) -> Result<KvValues<T>, PsError> {
        let id = ticket.id;
        loop {
            let Some(p) = self.pending.get(&id) else {
                return Err(PsError::BadArguments(format!(
                    "ticket {id} is not in flight"
                )));
            };
            if p.owed.is_empty() || p.error.is_some() {
                let mut p = self.pending.remove(&id).ok_or(PsError::Finished)?;
                if p.error.is_some() {
                    // A refusal: whatever still holds the push lets go of it, as
                    // the refusing server applied none of it.
                    let send = p.overdue.end(wire::WITHDRAW);
                    self.send_decisions(id, &p, send);
                }
                return self.complete(p);
            }
            if let Some(result) = self.overdue_step(id) {
                return result;
            }
            if let Err(e) = self.node.check().and_then(|()| self.follow_failovers()) {
                if let Some(mut p) = self.pending.remove(&id) {
                    let send = p.overdue.end(wire::LET_GO);
                    self.send_decisions(id, &p, send);
                }
                return Err(e);
            }
            self.receive()?;
        }
    }

    /// Moves request `id` on once it has waited past the request timeout: a push is
    /// held, then withdrawn or kept ([`Withdrawal`]); anything else fails with
    /// [`PsError::Timeout`]. `Some` is the call's result.
    fn overdue_step(&mut self, id: u64) -> Option<Result<KvValues<T>, PsError>> {
        let timeout = self.node.config.request_timeout;
        let grace = HOLD_GRACE.max(self.node.config.dead_timeout);
        let p = self.pending.get_mut(&id)?;
        let waited = p.started.elapsed();
        if !matches!(p.op, Op::Push | Op::PushPull) {
            if waited <= timeout {
                return None;
            }
            let p = self.pending.remove(&id)?;
            return Some(Err(self.timed_out(id, &p, "to answer")));
        }
        let parts: Vec<usize> = p.parts.iter().map(|(s, _)| *s).collect();
        let progress = Progress {
            parts: &parts,
            owed: &p.owed,
            waited,
        };
        let step = p.overdue.step(progress, Instant::now(), timeout, grace);
        let Some(verdict) = step.verdict else {
            let p = self.pending.remove(&id)?;
            self.send_decisions(id, &p, step.send);
            self.pending.insert(id, p);
            return None;
        };
        let p = self.pending.remove(&id)?;
        self.send_decisions(id, &p, step.send);
        Some(Err(match verdict {
            Verdict::Withdrawn { server, round } => {
                let round = round.unwrap_or_else(|| RoundState {
                    key: p.keys.first().copied().unwrap_or_default(),
                    pushed: Vec::new(),
                    missing: Vec::new(),
                });
                PsError::RoundIncomplete {
                    key: round.key,
                    server: self.names.get(server).cloned().unwrap_or_default(),
                    pushed: round.pushed,
                    missing: round.missing,
                    waited: p.started.elapsed(),
                }
            }
            Verdict::TimedOut { what } => self.timed_out(id, &p, what),
        }))
    }

    /// The error of request `id` that waited too long for the servers it still owes.
    fn timed_out(&self, id: u64, p: &Pending, what: &str) -> PsError {
        let owed: Vec<&str> = p.owed.iter().map(|&s| self.names[s].as_str()).collect();
        PsError::Timeout {
            what: format!("worker {} waiting for request {id} {what}", self.node.rank),
            waited: p.started.elapsed(),
            owed: owed.join(", "),
            setting: "PsConfig::request_timeout",
        }
    }

    /// Sends push `id`'s withdrawal messages (a kind to a server each) to its servers.
    fn send_decisions(&mut self, id: u64, p: &Pending, send: Vec<(Kind, usize)>) {
        let me = self.node.addr();
        for (kind, s) in send {
            let Some((_, meta)) = p.parts.iter().find(|(part, _)| *part == s) else {
                continue;
            };
            let to = wire::addr(NodeRole::Server, s as u32);
            // One that does not arrive means the server is gone, which the scheduler
            // reports to everyone (or, a hold unanswered, the push times out).
            if let Ok(msg) = wire::kv_msg(me, to, kind, id, meta, Vec::new()) {
                let _ = node::send_to(&mut self.servers[self.route[s]], msg, &self.names[s]);
            }
        }
    }

    /// Sends the requests a dead server had not answered to the server that now
    /// serves its keys, and sends there from now on.
    fn follow_failovers(&mut self) -> Result<(), PsError> {
        for (dead, by) in self.node.take_failovers() {
            let (dead, by) = (dead as usize, by as usize);
            if dead >= self.route.len() || by >= self.route.len() {
                continue;
            }
            tracing::warn!(
                "ps worker {}: server {dead} is gone; server {by} serves its keys",
                self.node.rank
            );
            self.route[dead] = self.route[by];
            // In request order: the replica takes a request whose id is not above
            // the last one it has from this worker as already counted.
            let mut ids: Vec<u64> = self.pending.keys().copied().collect();
            ids.sort_unstable();
            for (id, p) in ids
                .iter()
                .filter_map(|id| Some((*id, self.pending.get(id)?)))
            {
                if !p.owed.contains(&dead) {
                    continue;
                }
                for (_, msg) in p.sent.iter().filter(|(s, _)| *s == dead) {
                    node::send_to(
                        &mut self.servers[self.route[dead]],
                        msg.clone(),
                        &self.names[by],
                    )?;
                }
                if p.overdue.awaits(dead) {
                    // A hold the dead server did not answer goes to its successor too.
                    if let Some((_, meta)) = p.parts.iter().find(|(s, _)| *s == dead) {
                        let me = self.node.addr();
                        let to = wire::addr(NodeRole::Server, dead as u32);
                        let msg = wire::kv_msg(me, to, wire::HOLD, id, meta, Vec::new())?;
                        node::send_to(&mut self.servers[self.route[dead]], msg, &self.names[by])?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Receives whatever the servers have sent, waiting one slice at most.
    fn receive(&mut self) -> Result<(), PsError> {
        let ready = {
            let socks: Vec<&dyn Pollable> =
                self.servers.iter().map(|d| d as &dyn Pollable).collect();
            self.poller.poll(&socks, node::SLICE).map_err(|e| {
                PsError::transport(format!("worker {} polling its servers", self.node.rank), e)
            })?
        };
        let Some(first) = ready else { return Ok(()) };
        for s in (first..self.servers.len()).chain(0..first) {
            while let Ok(msg) = self.servers[s].try_recv() {
                // Answers name the server whose keys they are about: after a
                // failover one connection carries answers for two.
                let primary = msg.header.src.id as usize;
                if primary < self.names.len() {
                    self.on_reply(primary, msg);
                }
            }
        }
        Ok(())
    }

    fn on_reply(&mut self, s: usize, msg: Msg) {
        let name = &self.names[s];
        let Some(p) = self.pending.get_mut(&msg.header.seq) else {
            if msg.header.kind == wire::HOLD_ANSWER
                && matches!(HoldAnswer::read(&msg, name), Ok(HoldAnswer::Held { .. }))
            {
                // Held after the worker gave up on the answers: let go, so that the
                // push's rounds are not kept from completing for ever.
                let me = self.node.addr();
                let to = wire::addr(NodeRole::Server, s as u32);
                let meta = KvMeta::default();
                if let Ok(msg) =
                    wire::kv_msg(me, to, wire::LET_GO, msg.header.seq, &meta, Vec::new())
                {
                    let _ = node::send_to(&mut self.servers[self.route[s]], msg, name);
                }
                return;
            }
            tracing::debug!(
                "ps worker {}: reply to request {} no longer waited on",
                self.node.rank,
                msg.header.seq
            );
            return;
        };
        if msg.header.kind == wire::HOLD_ANSWER {
            match HoldAnswer::read(&msg, name) {
                Ok(answer) => p.overdue.on_answer(s, answer),
                Err(e) => {
                    p.error.get_or_insert(e);
                }
            }
            return;
        }
        p.owed.remove(&s);
        if msg.header.kind == wire::REFUSE {
            p.error
                .get_or_insert(Refusal::read(&msg).into_error(name.as_str()));
            return;
        }
        let parsed = wire::read_meta(&msg, name).and_then(|(meta, count)| {
            let size = std::mem::size_of::<T>() as u64;
            let frames = msg.frames().get(1..).unwrap_or_default();
            let data = match frames {
                [one] => one.clone(),
                many => Bytes::from(many.concat()),
            };
            if data.len() as u64 != count * size {
                return Err(PsError::protocol(
                    name,
                    format!("{} value bytes for {count} values", data.len()),
                ));
            }
            Ok((meta, data, size as usize))
        });
        match parsed {
            Ok((meta, data, size)) => {
                let mut at = 0usize;
                for i in 0..meta.keys.len() {
                    let len = meta.lens[i] as usize * size;
                    if let Some(k) = p.keys.iter().position(|&k| k == meta.keys[i]) {
                        p.pieces.push((
                            k,
                            meta.offsets[i],
                            meta.totals[i],
                            data.slice(at..at + len),
                        ));
                    }
                    at += len;
                }
            }
            Err(e) => {
                p.error.get_or_insert(e);
            }
        }
    }

    /// Puts the pieces of a finished request together.
    fn complete(&mut self, p: Pending) -> Result<KvValues<T>, PsError> {
        if let Some(e) = p.error {
            return Err(e);
        }
        if matches!(p.op, Op::Push | Op::PushPull | Op::Init) {
            for (&key, &total) in p.keys.iter().zip(&p.totals) {
                self.confirmed.insert(key, total);
            }
        }
        if matches!(p.op, Op::Push | Op::Init | Op::Check) {
            return Ok(KvValues::default());
        }
        let n = p.keys.len();
        let mut totals: Vec<Option<u64>> = vec![None; n];
        let mut found = vec![0u64; n];
        for (k, _, total, bytes) in &p.pieces {
            if totals[*k].is_some_and(|t| t != *total) {
                return Err(PsError::protocol(
                    "servers",
                    format!("key {}: pieces disagree on its length", p.keys[*k]),
                ));
            }
            totals[*k] = Some(*total);
            found[*k] += (bytes.len() / std::mem::size_of::<T>()) as u64;
        }
        let mut lens = Vec::with_capacity(n);
        for k in 0..n {
            let key = p.keys[k];
            let Some(total) = totals[k] else {
                let server = match self.placement.owner(key) {
                    Ok(s) if self.totals.contains_key(&key) => self.names[s].clone(),
                    _ => "every server".to_string(),
                };
                return Err(PsError::NeverPushed { key, server });
            };
            if found[k] != total {
                return Err(PsError::Remote {
                    node: "servers".into(),
                    reason: format!(
                        "key {key}: {} of its {total} values found (a server lost its piece?)",
                        found[k]
                    ),
                });
            }
            self.totals.insert(key, total);
            self.confirmed.insert(key, total);
            lens.push(total as usize);
        }
        KvValues::assemble(p.keys, lens, &p.pieces).ok_or_else(|| {
            PsError::protocol(
                "servers",
                "their pieces of the values overlap or leave a gap",
            )
        })
    }

    /// Waits until every node of `group` (workers or all) has reached the barrier.
    pub fn barrier(&mut self, group: Group) -> Result<(), PsError> {
        self.node.barrier(group, || {})
    }

    /// Tells the scheduler this worker has finished. Once every worker has, the
    /// servers stop and the scheduler's [`run`](super::Scheduler::run) returns.
    pub fn finish(mut self) -> Result<(), PsError> {
        self.node.done()
    }
}
