//! A worker: push, pull and push_pull of key-value lists, blocking or with a ticket.

use super::data::{self, DataLink};
use super::node::{self, Node};
use super::shard::Placement;
use super::split::{self, KvValues};
use super::wire::{self, Group, HoldAnswer, KvMeta, NodeRole, Refusal, RoundState};
use super::withdraw::{Progress, Verdict, Withdrawal};
use super::{PsConfig, PsError, Value};
use bytes::Bytes;
use std::marker::PhantomData;
use std::time::{Duration, Instant};
use switchyard_msg::fast_hash::{FastMap as HashMap, FastSet as HashSet};

use switchyard_msg::{Kind, Msg};
use switchyard_transports::{Dealer, DealerSocket, Pollable, Poller, Socket};

/// How long a worker waits for the servers' answers to a hold (a live server answers
/// at once) before it reports the push's outcome unknown.
const HOLD_GRACE: Duration = Duration::from_secs(1);

/// One key's values as a reply brought them: (offset, whole length, bytes) pieces.
type Pieces = Vec<(u64, u64, Bytes)>;

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
    owed: std::collections::HashSet<usize>,
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
    /// The data plane, when the job opened one: values go and come there.
    data: Option<DataLink>,
    /// When this worker last looked at its ZeroMQ sockets (see
    /// [`CONTROL_EVERY`](super::server::CONTROL_EVERY)).
    looked: Instant,
    /// On the data plane, each key's values as the answer to this worker's last push
    /// or push_pull of it brought them (FPT's push: a sync round's answer carries the
    /// values after the round), as (offset, whole length, bytes) pieces: a pull of
    /// keys that all have one is a copy of them, with no request. Each entry names
    /// the last request that pushed the key; only its answer fills the entry (two
    /// pushes of a key in flight may be answered in either order).
    cache: HashMap<u64, (u64, Option<Pieces>)>,
    _values: PhantomData<T>,
}

impl<T: Value> KvWorker<T> {
    /// Registers with the scheduler at `scheduler` and connects to every server.
    pub fn join(scheduler: &str, config: &PsConfig) -> Result<Self, PsError> {
        let mut node = Node::join(scheduler, NodeRole::Worker, String::new(), config)?;
        let data = node.data.take();
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
            pending: HashMap::default(),
            totals: HashMap::default(),
            confirmed: HashMap::default(),
            route: (0..names_len).collect(),
            data,
            looked: Instant::now(),
            cache: HashMap::default(),
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

    /// Sets this worker's own [`PsConfig::request_timeout`].
    #[cfg(test)]
    pub(crate) fn set_request_timeout(&mut self, timeout: Duration) {
        self.node.config.request_timeout = timeout;
    }

    /// Whether this worker's values travel on the data plane.
    #[cfg(test)]
    pub(crate) fn on_data_plane(&self) -> bool {
        self.data.is_some()
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

    /// The keys' current values. On the data plane, after this worker's push or
    /// push_pull of every one of the keys in a sync round, the values that push
    /// brought back (the round's outcome, FPT's pull: no request); otherwise asked of
    /// the servers.
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
        if let Some(pieces) = self.cached(keys) {
            return Ok(self.answered_here(keys, pieces));
        }
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

    /// The cached pieces of `keys` (see [`KvWorker::cache`](Self)), `(key index,
    /// offset, total, bytes)`, if every key has them and none appears twice.
    fn cached(&self, keys: &[u64]) -> Option<Vec<(usize, u64, u64, Bytes)>> {
        if keys.is_empty() || self.cache.is_empty() {
            return None;
        }
        let mut seen = HashSet::with_capacity_and_hasher(keys.len(), Default::default());
        let mut pieces = Vec::new();
        for (k, key) in keys.iter().enumerate() {
            if !seen.insert(*key) {
                return None;
            }
            for (offset, total, bytes) in self.cache.get(key)?.1.as_ref()? {
                pieces.push((k, *offset, *total, bytes.clone()));
            }
        }
        Some(pieces)
    }

    /// A pull answered from the cache: a request that owes nothing.
    fn answered_here(&mut self, keys: &[u64], pieces: Vec<(usize, u64, u64, Bytes)>) -> Ticket {
        let id = self.next_id;
        self.next_id += 1;
        let pending = Pending {
            op: Op::Pull,
            keys: keys.to_vec(),
            totals: Vec::new(),
            owed: std::collections::HashSet::new(),
            sent: Vec::new(),
            pieces,
            error: None,
            started: Instant::now(),
            parts: Vec::new(),
            overdue: Withdrawal::OnTime,
        };
        self.pending.insert(id, pending);
        Ticket { id }
    }

    /// Keeps the pieces push or push_pull `id` brought back, per key, when they hold
    /// every value of every key, for the keys it was the last to push.
    fn keep_pieces(&mut self, id: u64, keys: &[u64], pieces: Vec<(usize, u64, u64, Bytes)>) {
        let size = std::mem::size_of::<T>() as u64;
        let mut found = vec![0u64; keys.len()];
        let mut totals = vec![None; keys.len()];
        for (k, _, total, bytes) in &pieces {
            found[*k] += bytes.len() as u64 / size.max(1);
            totals[*k] = Some(*total);
        }
        if (found.iter().zip(&totals)).any(|(f, t)| Some(*f) != *t) {
            return;
        }
        let mut by_key: Vec<Pieces> = vec![Vec::new(); keys.len()];
        for (k, offset, total, bytes) in pieces {
            by_key[k].push((offset, total, bytes));
        }
        for (key, kept) in keys.iter().zip(by_key) {
            if let Some(entry) = self.cache.get_mut(key).filter(|e| e.0 == id) {
                entry.1 = Some(kept);
            }
        }
    }

    /// Sends `msg` to connection `conn` (a server's rank), about server `s`'s keys:
    /// on the data plane when the job has one and `msg` carries values, else on
    /// ZeroMQ.
    fn send_on(&mut self, conn: usize, msg: Msg, s: usize) -> Result<(), PsError> {
        match self.data.as_mut() {
            Some(plane) if data::carries(msg.header.kind) => {
                plane.send(DataLink::server_rank(conn), msg)
            }
            _ => node::send_to(&mut self.servers[conn], msg, &self.names[s]),
        }
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
        if self.control_due() {
            self.node.check()?;
            self.follow_failovers()?;
        }
        let me = self.node.addr();
        let mut owed = std::collections::HashSet::new();
        let mut sent = Vec::new();
        let mut parts = Vec::new();
        for (s, (mut meta, frames)) in requests.into_iter().enumerate() {
            if meta.keys.is_empty() {
                continue;
            }
            meta.elem = std::any::type_name::<T>().to_string();
            if let Some(plane) = self
                .data
                .as_mut()
                .filter(|_| matches!(op, Op::Push | Op::PushPull | Op::Init))
            {
                for key in &meta.keys {
                    if let Some((_, Some(old))) = self.cache.insert(*key, (id, None)) {
                        // A reply's frame, no longer needed once every key it held
                        // is pushed again: the link receives the next one into it.
                        old.into_iter()
                            .for_each(|(_, _, bytes)| plane.recycle(bytes));
                    }
                }
            }
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
            self.send_on(self.route[s], msg, s)?;
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
                return self.complete(id, p);
            }
            if let Some(result) = self.overdue_step(id) {
                return result;
            }
            let control = self.control_due();
            let looked = if control {
                self.node.check().and_then(|()| self.follow_failovers())
            } else {
                Ok(())
            };
            if let Err(e) = looked {
                if let Some(mut p) = self.pending.remove(&id) {
                    let send = p.overdue.end(wire::LET_GO);
                    self.send_decisions(id, &p, send);
                }
                return Err(e);
            }
            self.receive(control)?;
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
            for id in ids {
                let Some(p) = self.pending.get(&id) else {
                    continue;
                };
                if !p.owed.contains(&dead) {
                    continue;
                }
                let again: Vec<Msg> = (p.sent.iter())
                    .filter(|(s, _)| *s == dead)
                    .map(|(_, msg)| msg.clone())
                    .collect();
                for msg in again {
                    self.send_on(self.route[dead], msg, by)?;
                }
                let Some(p) = self.pending.get(&id) else {
                    continue;
                };
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

    /// Receives whatever the servers have sent, waiting one slice at most (with a
    /// data plane: ZeroMQ's answers only when `control`).
    fn receive(&mut self, control: bool) -> Result<(), PsError> {
        if self.data.is_some() {
            return self.receive_both(control);
        }
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

    /// Whether it is time to look at the ZeroMQ sockets again: always without a data
    /// plane; with one, every [`CONTROL_EVERY`](super::server::CONTROL_EVERY).
    fn control_due(&mut self) -> bool {
        if self.data.is_none() {
            return true;
        }
        let now = Instant::now();
        if now.duration_since(self.looked) < super::server::CONTROL_EVERY {
            return false;
        }
        self.looked = now;
        true
    }

    /// [`KvWorker::receive`] with a data plane: when `control`, the answers waiting on
    /// ZeroMQ (to checks and holds), then those of the data plane, waiting
    /// [`DATA_SLICE`](super::server::DATA_SLICE) at most for the first.
    fn receive_both(&mut self, control: bool) -> Result<(), PsError> {
        for s in (0..self.servers.len()).filter(|_| control) {
            while let Ok(msg) = self.servers[s].try_recv() {
                let primary = msg.header.src.id as usize;
                if primary < self.names.len() {
                    self.on_reply(primary, msg);
                }
            }
        }
        let mut until = Instant::now() + super::server::DATA_SLICE;
        loop {
            let got = match self.data.as_mut() {
                Some(plane) => plane.recv(until)?,
                None => None,
            };
            let Some((_, msg)) = got else {
                return Ok(());
            };
            let primary = msg.header.src.id as usize;
            if primary < self.names.len() {
                self.on_reply(primary, msg);
            }
            // Whatever else has come, without waiting.
            until = Instant::now();
        }
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
    fn complete(&mut self, id: u64, p: Pending) -> Result<KvValues<T>, PsError> {
        if let Some(e) = p.error {
            return Err(e);
        }
        if matches!(p.op, Op::Push | Op::PushPull | Op::Init) {
            for (&key, &total) in p.keys.iter().zip(&p.totals) {
                self.confirmed.insert(key, total);
            }
        }
        if p.op == Op::Push && self.data.is_some() && !p.pieces.is_empty() {
            self.keep_pieces(id, &p.keys, p.pieces);
            return Ok(KvValues::default());
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
        let values = KvValues::assemble(p.keys.clone(), lens, &p.pieces).ok_or_else(|| {
            PsError::protocol(
                "servers",
                "their pieces of the values overlap or leave a gap",
            )
        })?;
        if p.op == Op::PushPull && self.data.is_some() {
            self.keep_pieces(id, &p.keys, p.pieces);
        }
        Ok(values)
    }

    /// Waits until every node of `group` (workers or all) has reached the barrier.
    pub fn barrier(&mut self, group: Group) -> Result<(), PsError> {
        // The data plane's output is written by this thread: a push started before the
        // barrier must keep going out, or a round the others wait in never completes.
        let data = &mut self.data;
        self.node.barrier(group, || {
            if let Some(plane) = data.as_mut() {
                plane.advance();
            }
        })
    }

    /// Tells the scheduler this worker has finished. Once every worker has, the
    /// servers stop and the scheduler's [`run`](super::Scheduler::run) returns.
    pub fn finish(mut self) -> Result<(), PsError> {
        self.node.done()
    }
}
