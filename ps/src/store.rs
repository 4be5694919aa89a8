//! A server's keys and rounds, without sockets: requests in, replies out.
//!
//! In [`Mode::Sync`] a key's round collects one push from every worker, adds them up
//! in worker rank order (in [`Value::Acc`], rounded once: see [`Value`]), applies the
//! [`Update`] once and answers every push of the round together (a
//! push_pull with the updated value, which all of them share: one copy per round, not
//! per worker). A worker that pushes a key again before the round is complete waits
//! for the next round. In [`Mode::Async`] every push is applied and answered at once.
//!
//! A store has no clock: a round waits until every worker has pushed. A worker whose
//! push waits too long withdraws it in two phases ([`Op::Hold`], then [`Op::LetGo`] or
//! [`Op::Withdraw`]), and since it asks every server of the push before any of them
//! lets go of it, the push is applied by all of them or by none.

use super::pool::ValuePool;
use super::update::{Mode, Update};
use super::value::sum_in_order;
use super::wire::{HoldAnswer, KvMeta, Refusal, RoundState, Runs};
use super::{PsError, Value};
use bytes::Bytes;
use std::collections::VecDeque;
use switchyard_msg::fast_hash::{FastMap as HashMap, FastSet as HashSet};

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Push,
    PushPull,
    Pull,
    Init,
    /// Check a push's keys and hold the lengths of new ones (the first phase of a push
    /// to several servers).
    Check,
    /// Let go of what a [`Op::Check`] of the same request held.
    Release,
    /// Keep the push of the same request from completing any round, and say whether
    /// some of it is applied already.
    Hold,
    /// End a [`Op::Hold`]: the push stays in its rounds.
    LetGo,
    /// End a [`Op::Hold`]: the push leaves its rounds and is never answered.
    Withdraw,
}

/// One request, decoded.
#[derive(Debug)]
pub(crate) struct Request<T> {
    pub(crate) worker: u32,
    pub(crate) id: u64,
    pub(crate) op: Op,
    pub(crate) meta: KvMeta,
    pub(crate) values: Vec<T>,
    /// A push on the data plane: in a sync round it is answered, as a push_pull
    /// is, with the keys' values after the round (FPT's push), so that the worker's
    /// next pull of them is a copy of what it has.
    pub(crate) fpt: bool,
    /// A push of one key: its values as the frame they arrived in (checked to hold
    /// `T`s, aligned), `values` left empty. A sync round sums them from there instead
    /// of a copy; every other use copies them into `values` first.
    pub(crate) shared: Option<Bytes>,
}

impl<T: Value> Request<T> {
    /// Moves [`Request::shared`] into `values` (a copy into a buffer of `pool`).
    fn own_values(&mut self, pool: &ValuePool<T>) {
        if let Some(frame) = self.shared.take() {
            self.values = Piece::Shared(frame).into_vec(pool);
        }
    }
}

/// One key's values in a round: a buffer of the server's own, or a slice of the frame
/// they arrived in (see [`Request::shared`]).
pub(crate) enum Piece<T> {
    Owned(Vec<T>),
    Shared(Bytes),
}

impl<T: Value> Piece<T> {
    /// A frame as values, when its length and alignment hold `T`s.
    pub(crate) fn fits(frame: &Bytes) -> bool {
        bytemuck::try_cast_slice::<u8, T>(frame).is_ok()
    }

    fn as_slice(&self) -> &[T] {
        match self {
            Piece::Owned(v) => v,
            // Checked by `fits` before the frame was taken as values.
            Piece::Shared(frame) => bytemuck::try_cast_slice(frame).unwrap_or_default(),
        }
    }

    /// The values in a buffer of their own: the buffer, or a copy of the frame (which
    /// goes to the pool's spent frames).
    fn into_vec(self, pool: &ValuePool<T>) -> Vec<T> {
        match self {
            Piece::Owned(v) => v,
            Piece::Shared(frame) => {
                // Checked by `fits` before the frame was taken as values.
                let values: &[T] = bytemuck::try_cast_slice(&frame).unwrap_or_default();
                let mut out = pool.take(values.len());
                switchyard_msg::copy::copy_elements(&mut out, values);
                pool.spend(frame);
                out
            }
        }
    }

    /// Done with: the buffer back to the pool, the frame to the pool's spent frames
    /// (which the server gives back to its data plane).
    fn release(self, pool: &ValuePool<T>) {
        match self {
            Piece::Owned(v) => pool.give(v),
            Piece::Shared(frame) => pool.spend(frame),
        }
    }
}

/// One answer: to whom, for which request, and what.
#[derive(Debug)]
pub(crate) struct Reply<P> {
    pub(crate) peer: P,
    pub(crate) id: u64,
    /// The server whose keys the reply is about.
    pub(crate) primary: u32,
    pub(crate) body: Result<Answer, Refusal>,
}

/// What a server answers when it does not refuse.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The keys' values (a pull or push_pull; empty for a push, init or check).
    Values(KvMeta, Vec<Bytes>),
    /// The answer to a [`Op::Hold`].
    Hold(HoldAnswer),
}

impl Answer {
    fn empty() -> Answer {
        Answer::Values(KvMeta::default(), Vec::new())
    }
}

type ReqKey = (u32, u64);

struct Contribution<T> {
    worker: u32,
    req: ReqKey,
    index: usize,
    wants_value: bool,
    values: Piece<T>,
}

/// A key's state as a replica keeps it: enough to carry on the key's rounds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Backup<T> {
    pub(crate) value: Vec<T>,
    pub(crate) offset: u64,
    pub(crate) total: u64,
    /// Per worker, the last request whose push is in `value`.
    pub(crate) included: Vec<(u32, u64)>,
}

struct Entry<T> {
    value: Vec<T>,
    offset: u64,
    total: u64,
    /// False while the key is only held by a [`Op::Check`]: it has a length but no
    /// value yet, and pulls do not see it.
    pushed: bool,
    /// The request whose check holds the key, while `pushed` is false.
    held_by: Option<ReqKey>,
    /// Per worker, the last request whose push is in `value`: a request sent again
    /// after a failover is answered, not added twice.
    included: HashMap<u32, u64>,
    /// The sync round in progress: at most one push per worker, in arrival order (summed
    /// in rank order), kept apart until the round completes so that a withdrawn one
    /// leaves no trace.
    round: Vec<Contribution<T>>,
    /// The workers of `round`.
    from: HashSet<u32>,
    /// Pushes of workers already in `round`, for the rounds after it.
    deferred: VecDeque<Contribution<T>>,
}

struct Pending<P> {
    peer: P,
    /// Whether the answer carries the keys' values.
    wants: bool,
    meta: KvMeta,
    slots: Vec<Option<Bytes>>,
    remaining: usize,
}

/// A server's state: its keys, the rounds in progress, the requests waiting on them.
pub(crate) struct Store<T, P> {
    name: String,
    mode: Mode,
    workers: usize,
    update: Update<T>,
    keys: HashMap<u64, Entry<T>>,
    pending: HashMap<ReqKey, Pending<P>>,
    rounds: u64,
    /// Keys whose value changed since [`Store::take_changed`] last ran, recorded
    /// only when `track` is on (a server that replicates).
    changed: Vec<u64>,
    track: bool,
    primary: u32,
    /// Buffers of request values (given back once summed in) and of reply snapshots.
    pool: ValuePool<T>,
    /// Requests whose workers are deciding whether to withdraw them, with their keys:
    /// no round with one of them in it completes.
    holds: HashMap<ReqKey, Vec<u64>>,
    /// Pushes withdrawn before they arrived (the withdrawal travels over ZeroMQ, the
    /// push may come later on the data plane): dropped when they come.
    withdrawn: HashSet<ReqKey>,
}

impl<T: Value, P: Clone> Store<T, P> {
    /// A store named `name` (in errors) for `workers` workers.
    pub(crate) fn new(name: String, mode: Mode, workers: usize, update: Update<T>) -> Self {
        Store {
            name,
            mode,
            workers: workers.max(1),
            update,
            keys: HashMap::default(),
            pending: HashMap::default(),
            rounds: 0,
            changed: Vec::new(),
            track: false,
            primary: 0,
            pool: ValuePool::default(),
            holds: HashMap::default(),
            withdrawn: HashSet::default(),
        }
    }

    /// Shares `pool`'s buffers (the one requests are decoded into).
    pub(crate) fn with_pool(mut self, pool: ValuePool<T>) -> Self {
        self.pool = pool;
        self
    }

    /// Sets the rank of the server whose keys these are (named in replies).
    pub(crate) fn with_primary(mut self, primary: u32) -> Self {
        self.primary = primary;
        self
    }

    /// Records which keys change, for [`Store::take_changed`].
    pub(crate) fn with_tracking(mut self) -> Self {
        self.track = true;
        self
    }

    fn note_change(&mut self, key: u64) {
        if self.track {
            self.changed.push(key);
        }
    }

    /// A store that carries on from a replica's copy of another server's keys.
    pub(crate) fn adopt(
        name: String,
        mode: Mode,
        workers: usize,
        update: Update<T>,
        backup: std::collections::HashMap<u64, Backup<T>>,
    ) -> Self {
        let mut store = Store::new(name, mode, workers, update);
        for (key, b) in backup {
            store.keys.insert(
                key,
                Entry {
                    value: b.value,
                    offset: b.offset,
                    total: b.total,
                    pushed: true,
                    held_by: None,
                    included: b.included.into_iter().collect(),
                    round: Vec::new(),
                    from: HashSet::default(),
                    deferred: VecDeque::new(),
                },
            );
        }
        store
    }

    /// The keys whose value changed since the last call, as a replica keeps them.
    pub(crate) fn take_changed(&mut self) -> Vec<(u64, Backup<T>)> {
        let mut keys = std::mem::take(&mut self.changed);
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter_map(|k| {
                let e = self.keys.get(&k).filter(|e| e.pushed)?;
                let included = e.included.iter().map(|(w, id)| (*w, *id)).collect();
                Some((
                    k,
                    Backup {
                        value: e.value.clone(),
                        offset: e.offset,
                        total: e.total,
                        included,
                    },
                ))
            })
            .collect()
    }

    /// Rounds completed (sync) or pushes applied (async), over all keys.
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds
    }

    /// Requests waiting for a round to complete.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Handles one request from `peer` and returns the replies it makes possible.
    pub(crate) fn handle(&mut self, peer: P, mut req: Request<T>) -> Vec<Reply<P>> {
        if self.mode == Mode::Async || !matches!(req.op, Op::Push | Op::PushPull) {
            req.own_values(&self.pool);
        }
        match req.op {
            Op::Release => {
                self.release(&req);
                return Vec::new();
            }
            Op::Hold => return vec![self.hold(peer, &req)],
            Op::LetGo => return self.let_go(&req),
            Op::Withdraw => return self.withdraw(&req),
            Op::Push | Op::PushPull if self.withdrawn.remove(&(req.worker, req.id)) => {
                // Its worker has reported the round incomplete: as if it never came.
                self.pool.give(req.values);
                if let Some(frame) = req.shared {
                    self.pool.spend(frame);
                }
                return Vec::new();
            }
            _ => {}
        }
        if let Err(e) = self.validate(&req) {
            return vec![Reply {
                peer,
                id: req.id,
                primary: self.primary,
                body: Err(Refusal::from_error(&e)),
            }];
        }
        match req.op {
            Op::Check => {
                for i in 0..req.meta.keys.len() {
                    let entry = self.entry(&req.meta, i);
                    if !entry.pushed && entry.held_by.is_none() {
                        entry.held_by = Some((req.worker, req.id));
                    }
                }
                vec![Reply {
                    peer,
                    id: req.id,
                    primary: self.primary,
                    body: Ok(Answer::empty()),
                }]
            }
            Op::Release | Op::Hold | Op::LetGo | Op::Withdraw => Vec::new(),
            Op::Pull => {
                let (meta, frames) = self.pull(&req.meta);
                vec![Reply {
                    peer,
                    id: req.id,
                    primary: self.primary,
                    body: Ok(Answer::Values(meta, frames)),
                }]
            }
            Op::Init => {
                let mut at = 0;
                for i in 0..req.meta.keys.len() {
                    let len = req.meta.lens[i] as usize;
                    let entry = self.entry(&req.meta, i);
                    switchyard_msg::copy::copy_elements(
                        &mut entry.value,
                        &req.values[at..at + len],
                    );
                    entry.pushed = true;
                    at += len;
                    self.note_change(req.meta.keys[i]);
                }
                self.pool.give(req.values);
                vec![Reply {
                    peer,
                    id: req.id,
                    primary: self.primary,
                    body: Ok(Answer::empty()),
                }]
            }
            Op::Push | Op::PushPull if self.mode == Mode::Async => {
                let mut at = 0;
                for i in 0..req.meta.keys.len() {
                    let len = req.meta.lens[i] as usize;
                    let key = req.meta.keys[i];
                    let update = self.update.clone();
                    let entry = self.entry(&req.meta, i);
                    entry.pushed = true;
                    let piece = &req.values[at..at + len];
                    at += len;
                    let last = entry.included.entry(req.worker).or_insert(0);
                    if *last >= req.id {
                        // Sent again after a failover, and already applied.
                        continue;
                    }
                    *last = req.id;
                    update.apply(key, &mut entry.value, piece);
                    self.rounds += 1;
                    self.note_change(key);
                }
                self.pool.give(req.values);
                let body = if req.op == Op::PushPull {
                    let (meta, frames) = self.pull(&req.meta);
                    Answer::Values(meta, frames)
                } else {
                    Answer::empty()
                };
                vec![Reply {
                    peer,
                    id: req.id,
                    primary: self.primary,
                    body: Ok(body),
                }]
            }
            Op::Push | Op::PushPull => self.sync_push(peer, req),
        }
    }

    fn validate(&self, req: &Request<T>) -> Result<(), PsError> {
        let meta = &req.meta;
        if let Some(e) = type_mismatch::<T>(meta, self.name.clone()) {
            return Err(e);
        }
        let mut seen = HashSet::with_capacity_and_hasher(meta.keys.len(), Default::default());
        for (i, &key) in meta.keys.iter().enumerate() {
            if !seen.insert(key) {
                return Err(PsError::BadArguments(format!(
                    "key {key} appears twice in one request"
                )));
            }
            let entry = self.keys.get(&key);
            if req.op == Op::Pull {
                if meta.must_have && !entry.is_some_and(|e| e.pushed) {
                    return Err(PsError::NeverPushed {
                        key,
                        server: self.name.clone(),
                    });
                }
                continue;
            }
            let Some(e) = entry else {
                continue;
            };
            // Whole lengths first: a split key's pieces differ when its length does,
            // and the user knows the key by its whole length.
            if e.total != meta.totals[i] {
                return Err(match e.held_by.filter(|_| !e.pushed) {
                    Some((worker, _)) => PsError::LengthHeld {
                        key,
                        held: e.total,
                        pushed: meta.totals[i],
                        worker,
                        server: self.name.clone(),
                    },
                    None => PsError::LengthChanged {
                        key,
                        stored: e.total,
                        pushed: meta.totals[i],
                        server: self.name.clone(),
                    },
                });
            }
            if e.value.len() as u64 != meta.lens[i] || e.offset != meta.offsets[i] {
                return Err(PsError::BadArguments(format!(
                    "key {key}: this request cuts it into other pieces than the key's first push (values {}..{} here, {}..{} at {}); every worker must use the same number of servers, sharding and split threshold",
                    meta.offsets[i],
                    meta.offsets[i] + meta.lens[i],
                    e.offset,
                    e.offset + e.value.len() as u64,
                    self.name
                )));
            }
        }
        Ok(())
    }

    /// Drops the keys that the check of `req` held and nothing pushed since.
    fn release(&mut self, req: &Request<T>) {
        let by = Some((req.worker, req.id));
        for key in &req.meta.keys {
            if self.keys.get(key).is_some_and(|e| {
                !e.pushed && e.held_by == by && e.round.is_empty() && e.deferred.is_empty()
            }) {
                self.keys.remove(key);
            }
        }
    }

    /// The first phase of a withdrawal: holds `req`'s push in every round it is in
    /// (unless some of it is applied already, which the answer says).
    fn hold(&mut self, peer: P, req: &Request<T>) -> Reply<P> {
        let by = (req.worker, req.id);
        let answer = if self.is_applied(by, &req.meta.keys) {
            HoldAnswer::Applied
        } else {
            self.holds.insert(by, req.meta.keys.clone());
            HoldAnswer::Held {
                round: self.round_of(by, &req.meta.keys),
            }
        };
        Reply {
            peer,
            id: req.id,
            primary: self.primary,
            body: Ok(Answer::Hold(answer)),
        }
    }

    /// Whether some of request `by` (about `keys`) is in the stored values.
    fn is_applied(&self, by: ReqKey, keys: &[u64]) -> bool {
        if let Some(p) = self.pending.get(&by) {
            return p.slots.iter().any(Option::is_some);
        }
        keys.iter().any(|k| {
            self.keys
                .get(k)
                .and_then(|e| e.included.get(&by.0))
                .is_some_and(|&last| last >= by.1)
        })
    }

    /// The round of the first of `keys` that request `by` waits in.
    fn round_of(&self, by: ReqKey, keys: &[u64]) -> Option<RoundState> {
        keys.iter().find_map(|&key| {
            let e = self.keys.get(&key)?;
            let waits = e.round.iter().chain(&e.deferred).any(|c| c.req == by);
            waits.then(|| {
                let mut pushed: Vec<u32> = e.from.iter().copied().collect();
                pushed.sort_unstable();
                let missing = (0..self.workers as u32)
                    .filter(|w| !e.from.contains(w))
                    .collect();
                RoundState {
                    key,
                    pushed,
                    missing,
                }
            })
        })
    }

    /// The keys of a hold that `req` ends: those the hold named (a worker that gave up
    /// waiting for the hold's answer lets go without naming them).
    fn end_hold(&mut self, req: &Request<T>) -> Vec<u64> {
        self.holds
            .remove(&(req.worker, req.id))
            .unwrap_or_else(|| req.meta.keys.clone())
    }

    /// Whether request `by`'s push of `key` waits in the key's rounds here.
    #[cfg(test)]
    pub(crate) fn waits(&self, by: ReqKey, key: u64) -> bool {
        self.waits_in(by, key)
    }

    /// [`Store::waits`].
    fn waits_in(&self, by: ReqKey, key: u64) -> bool {
        self.keys
            .get(&key)
            .is_some_and(|e| e.round.iter().chain(&e.deferred).any(|c| c.req == by))
    }

    /// Ends a hold with the push kept: its rounds complete if they are full.
    fn let_go(&mut self, req: &Request<T>) -> Vec<Reply<P>> {
        let keys = self.end_hold(req);
        let mut done = Vec::new();
        for key in keys {
            self.settle(key, &mut done);
        }
        self.complete(done)
    }

    /// Ends a hold with the push taken out of its rounds, as if it had never come; it
    /// is not answered (the worker has reported the round incomplete).
    fn withdraw(&mut self, req: &Request<T>) -> Vec<Reply<P>> {
        let by = (req.worker, req.id);
        let keys = self.end_hold(req);
        let waits = keys.iter().any(|&k| self.waits_in(by, k));
        if self.pending.remove(&by).is_none() && !waits {
            // Not here yet: it is on its way on the other plane.
            self.withdrawn.insert(by);
        }
        let mut done = Vec::new();
        for key in keys {
            let Some(e) = self.keys.get_mut(&key) else {
                continue;
            };
            for c in e.round.iter().filter(|c| c.req == by) {
                e.from.remove(&c.worker);
            }
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut e.round)
                .into_iter()
                .partition(|c| c.req == by);
            e.round = kept;
            let (gone_later, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut e.deferred)
                .into_iter()
                .partition(|c| c.req == by);
            e.deferred = kept.into();
            for c in gone.into_iter().chain(gone_later) {
                c.values.release(&self.pool);
            }
            self.settle(key, &mut done);
            if self.keys.get(&key).is_some_and(|e| {
                !e.pushed && e.held_by.is_none() && e.round.is_empty() && e.deferred.is_empty()
            }) {
                // Only this push had given the key its length: it never happened.
                self.keys.remove(&key);
            }
        }
        self.complete(done)
    }

    fn entry(&mut self, meta: &KvMeta, i: usize) -> &mut Entry<T> {
        self.keys.entry(meta.keys[i]).or_insert_with(|| Entry {
            value: vec![T::default(); meta.lens[i] as usize],
            offset: meta.offsets[i],
            total: meta.totals[i],
            pushed: false,
            held_by: None,
            included: HashMap::default(),
            round: Vec::new(),
            from: HashSet::default(),
            deferred: VecDeque::new(),
        })
    }

    /// The stored pieces of the keys in `meta` that this server holds.
    fn pull(&self, meta: &KvMeta) -> (KvMeta, Vec<Bytes>) {
        let mut out = KvMeta::default();
        let mut frames = Vec::new();
        for &key in &meta.keys {
            if let Some(e) = self.keys.get(&key).filter(|e| e.pushed) {
                out.keys.push(key);
                out.lens.push(e.value.len() as u64);
                out.offsets.push(e.offset);
                out.totals.push(e.total);
                frames.push(self.pool.frame_of(&e.value));
            }
        }
        (out, coalesce(frames))
    }

    fn sync_push(&mut self, peer: P, req: Request<T>) -> Vec<Reply<P>> {
        let key_of = (req.worker, req.id);
        let n = req.meta.keys.len();
        let wants_value = req.op == Op::PushPull || req.fpt;
        let mut done = Vec::new();
        let pieces = match req.shared {
            Some(frame) => vec![Piece::Shared(frame)],
            None => self
                .pieces(req.values, &req.meta.lens)
                .into_iter()
                .map(Piece::Owned)
                .collect(),
        };
        self.pending.insert(
            key_of,
            Pending {
                peer,
                wants: wants_value,
                meta: req.meta.clone(),
                slots: vec![None; n],
                remaining: n,
            },
        );
        let pool = self.pool.clone();
        for (i, piece) in pieces.into_iter().enumerate() {
            // The key gets a value (and pulls see it) when its first round completes.
            let entry = self.entry(&req.meta, i);
            if entry
                .included
                .get(&req.worker)
                .is_some_and(|&last| last >= req.id)
            {
                // Sent again after a failover, and already in the value: answer it.
                let frame = if wants_value {
                    pool.frame_of(&entry.value)
                } else {
                    Bytes::new()
                };
                piece.release(&pool);
                done.push((key_of, i, frame));
                continue;
            }
            let c = Contribution {
                worker: req.worker,
                req: key_of,
                index: i,
                wants_value,
                values: piece,
            };
            self.feed(req.meta.keys[i], c, &mut done);
        }
        let mut replies = Vec::new();
        if n == 0 {
            done.clear();
            if let Some(p) = self.pending.remove(&key_of) {
                replies.push(finish(key_of.1, self.primary, p));
            }
        }
        replies.extend(self.complete(done));
        replies
    }

    /// A request's `values` cut into one piece per key (`lens`): the buffer itself
    /// for a request of one key (the usual large gradient), which goes back to the
    /// pool once summed in; copies of its parts otherwise, the buffer going back to
    /// the pool at its full length (the next request that takes it writes over it;
    /// an emptied one would be zero-filled first, 6% of a round of 16-key requests).
    fn pieces(&self, values: Vec<T>, lens: &[u64]) -> Vec<Vec<T>> {
        if lens.len() == 1 {
            return vec![values];
        }
        let mut pieces = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for len in lens {
            let end = at.saturating_add(*len as usize);
            pieces.push(values.get(at..end).map(<[T]>::to_vec).unwrap_or_default());
            at = end;
        }
        self.pool.give(values);
        pieces
    }

    /// The replies of the requests whose last piece is among `done`.
    fn complete(&mut self, done: Vec<(ReqKey, usize, Bytes)>) -> Vec<Reply<P>> {
        let mut replies = Vec::new();
        for (req, index, frame) in done {
            let Some(p) = self.pending.get_mut(&req) else {
                continue;
            };
            p.slots[index] = Some(frame);
            p.remaining -= 1;
            if p.remaining == 0 {
                if let Some(p) = self.pending.remove(&req) {
                    replies.push(finish(req.1, self.primary, p));
                }
            }
        }
        replies
    }

    /// Adds one worker's push of `key` to the key's round (or, if the worker is in it
    /// already, to the rounds after it) and completes rounds as far as they go.
    fn feed(&mut self, key: u64, c: Contribution<T>, done: &mut Vec<(ReqKey, usize, Bytes)>) {
        let Some(e) = self.keys.get_mut(&key) else {
            c.values.release(&self.pool);
            return;
        };
        e.deferred.push_back(c);
        self.settle(key, done);
    }

    /// Moves the pushes waiting for `key`'s next rounds into its round while their
    /// workers are not in it, and completes the round whenever every worker is in it
    /// and no push of it is held.
    fn settle(&mut self, key: u64, done: &mut Vec<(ReqKey, usize, Bytes)>) {
        let workers = self.workers;
        let update = self.update.clone();
        let pool = &self.pool;
        let holds = &self.holds;
        let Some(e) = self.keys.get_mut(&key) else {
            return;
        };
        loop {
            let mut later = VecDeque::new();
            while let Some(c) = e.deferred.pop_front() {
                if e.from.insert(c.worker) {
                    e.round.push(c);
                } else {
                    later.push_back(c);
                }
            }
            e.deferred = later;
            if e.round.len() < workers || e.round.iter().any(|c| holds.contains_key(&c.req)) {
                return;
            }
            let mut round = std::mem::take(&mut e.round);
            // Summed in worker rank order, not arrival order: the same bits whatever
            // order the pushes came in, and on every server of a split key.
            round.sort_unstable_by_key(|c| c.worker);
            let mut round = round.into_iter();
            let Some(first) = round.next() else {
                return;
            };
            let mut sum = first.values.into_vec(pool);
            let rest: Vec<Contribution<T>> = round.collect();
            let slices: Vec<&[T]> = rest.iter().map(|c| c.values.as_slice()).collect();
            sum_in_order(&mut sum, &slices);
            let mut waiters = vec![(first.req, first.index, first.wants_value)];
            for c in rest {
                c.values.release(pool);
                waiters.push((c.req, c.index, c.wants_value));
            }
            update.apply(key, &mut e.value, &sum);
            pool.give(sum);
            e.pushed = true;
            self.rounds += 1;
            if self.track {
                self.changed.push(key);
            }
            for ((worker, id), _, _) in &waiters {
                let last = e.included.entry(*worker).or_insert(*id);
                *last = (*last).max(*id);
            }
            let snapshot = if waiters.iter().any(|w| w.2) {
                pool.frame_of(&e.value)
            } else {
                Bytes::new()
            };
            for (req, index, _) in waiters {
                done.push((req, index, snapshot.clone()));
            }
            e.from.clear();
        }
    }
}

/// The error for a request whose element type is not `T`, the one `server` stores.
pub(crate) fn type_mismatch<T>(meta: &KvMeta, server: String) -> Option<PsError> {
    let stored = std::any::type_name::<T>();
    (meta.elem != stored).then(|| PsError::TypeMismatch {
        server,
        stored: stored.to_string(),
        sent: if meta.elem.is_empty() {
            "no element type".to_string()
        } else {
            meta.elem.clone()
        },
    })
}

fn finish<P>(id: u64, primary: u32, p: Pending<P>) -> Reply<P> {
    if !p.wants {
        return Reply {
            peer: p.peer,
            id,
            primary,
            body: Ok(Answer::empty()),
        };
    }
    let frames = p.slots.into_iter().map(Option::unwrap_or_default).collect();
    Reply {
        peer: p.peer,
        id,
        primary,
        body: Ok(Answer::Values(p.meta, coalesce(frames))),
    }
}

/// One frame per key while that stays under the decoder's frame limit, else one
/// frame for all.
fn coalesce(frames: Vec<Bytes>) -> Vec<Bytes> {
    if frames.len() <= 512 {
        return frames;
    }
    let mut runs = Runs::default();
    let joined = Bytes::from(frames.concat());
    runs.add(&joined, 0, joined.len());
    runs.finish(&joined)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
