//! A server's decisions between its sockets: which store serves a request, what a
//! failover changes.
//!
//! [`Routing`] holds the server's stores (its own keys, and a dead server's keys once
//! it serves them from their replica) and the replicas it keeps for its neighbour. It
//! is fed decoded requests, failover notices and replica messages, and answers with
//! the replies to send; the serving loop in [`server`](super::server)
//! does the receiving, the sending and the replica line. So the failover orderings
//! (a worker that hears of a failover before this server does, a request for keys
//! nobody here holds) are deterministic tests below rather than timing-dependent jobs.

use super::data::Back;
use super::pool::ValuePool;
use super::replica::Backups;
use super::store::{self, Backup, Op, Reply, Request, Store};
use super::update::{Mode, Update};
use super::wire::{self, Refusal};
use super::{PsError, ServerReport, Value};
use std::collections::BTreeMap;
use switchyard_msg::Msg;

/// A request as it arrived: who sent it, whose keys it is about, and its decoded body
/// (or why it could not be decoded, which is answered as a refusal).
#[derive(Debug)]
pub(crate) struct Incoming<T> {
    peer: Back,
    id: u64,
    /// The server whose keys the request is about (not this one after a failover).
    primary: u32,
    request: Result<Request<T>, PsError>,
}

impl<T: Value> Incoming<T> {
    /// Decodes a worker's request message from `peer`, its values into a buffer of
    /// `pool`. A push on the data plane is FPT's: answered with the values after
    /// its round.
    pub(crate) fn decode(peer: Back, msg: &Msg, pool: &ValuePool<T>) -> Incoming<T> {
        let request = decode(msg, &peer, pool).map(|mut r| {
            r.fpt = matches!(peer, Back::Link(_));
            r
        });
        Incoming {
            id: msg.header.seq,
            primary: msg.header.dst.id,
            request,
            peer,
        }
    }
}

/// What to send for one step of the routing.
#[derive(Debug)]
pub(crate) struct Routed<T> {
    /// Answers to workers.
    pub(crate) replies: Vec<Reply<Back>>,
    /// Values of this server's own keys that changed: the replies wait until the
    /// replica has them (when this server replicates).
    pub(crate) changed: Vec<(u64, Backup<T>)>,
}

impl<T> Routed<T> {
    fn nothing() -> Routed<T> {
        Routed {
            replies: Vec::new(),
            changed: Vec::new(),
        }
    }

    fn extend(&mut self, other: Routed<T>) {
        self.replies.extend(other.replies);
        self.changed.extend(other.changed);
    }
}

/// Where a server stands in its job.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// The server's rank.
    pub(crate) rank: u32,
    /// Servers in the job.
    pub(crate) servers: u32,
    /// Workers in the job.
    pub(crate) workers: usize,
    /// Whether each server's keys are replicated on the next server.
    pub(crate) replicate: bool,
}

/// The server's state between its sockets: see the module documentation.
pub(crate) struct Routing<T: Value> {
    rank: u32,
    servers: u32,
    name: String,
    mode: Mode,
    workers: usize,
    update: Update<T>,
    replicate: bool,
    stores: BTreeMap<u32, Store<T, Back>>,
    backups: Backups<T>,
    /// Requests for the keys of the server this one replicates, sent by a worker that
    /// heard of that server's failover before this server did: kept until the notice.
    held: Vec<Incoming<T>>,
    requests: u64,
    /// Value buffers of requests and replies, shared with the stores.
    pool: ValuePool<T>,
}

impl<T: Value> std::fmt::Debug for Routing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("name", &self.name)
            .field("serving", &self.stores.keys().collect::<Vec<_>>())
            .field("held", &self.held.len())
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

impl<T: Value> Routing<T> {
    /// The server `shape.rank`, named `name` in messages, serving its keys with
    /// `mode` and `update`.
    pub(crate) fn new(shape: Shape, name: String, mode: Mode, update: Update<T>) -> Routing<T> {
        let Shape {
            rank,
            servers,
            workers,
            replicate,
        } = shape;
        let pool = ValuePool::default();
        let mut own = Store::new(name.clone(), mode, workers, update.clone())
            .with_primary(rank)
            .with_pool(pool.clone());
        if replicate {
            own = own.with_tracking();
        }
        Routing {
            rank,
            servers,
            name,
            mode,
            workers,
            update,
            replicate,
            stores: BTreeMap::from([(rank, own)]),
            backups: Backups::default(),
            held: Vec::new(),
            requests: 0,
            pool,
        }
    }

    /// The pool that request values are decoded into ([`Incoming::decode`]).
    pub(crate) fn pool(&self) -> &ValuePool<T> {
        &self.pool
    }

    /// The report of a job that ended well.
    pub(crate) fn report(&self) -> ServerReport {
        ServerReport {
            rank: self.rank,
            rounds: self.stores.values().map(Store::rounds).sum(),
            requests: self.requests,
        }
    }

    /// A worker's request.
    pub(crate) fn route(&mut self, incoming: Incoming<T>) -> Routed<T> {
        self.requests += 1;
        let Incoming {
            peer,
            id,
            primary,
            request,
        } = incoming;
        if !self.stores.contains_key(&primary) && self.replicate && self.is_replica_of(primary) {
            // A worker heard of the failover before we did: keep the request until
            // our own notice comes.
            self.held.push(Incoming {
                peer,
                id,
                primary,
                request,
            });
            return Routed::nothing();
        }
        let Some(store) = self.stores.get_mut(&primary) else {
            let reason = format!("{} does not hold server {primary}'s keys", self.name);
            return Routed {
                replies: vec![refusal(peer, id, primary, Refusal::Other(reason))],
                changed: Vec::new(),
            };
        };
        let replies = match request {
            Ok(request) => store.handle(peer, request),
            Err(e) => {
                tracing::warn!("ps {}: {e}", self.name);
                vec![refusal(peer, id, primary, Refusal::from_error(&e))]
            }
        };
        // Only this server's own keys are replicated: the keys of a dead server it
        // serves have no second copy left.
        let changed = if primary == self.rank {
            store.take_changed()
        } else {
            Vec::new()
        };
        Routed { replies, changed }
    }

    /// A replica message from server `primary` (the one this server backs up).
    pub(crate) fn keep_replica(&mut self, primary: u32, msg: &Msg) -> Result<(), PsError> {
        self.backups
            .store(primary, msg, &format!("server {primary}"))
    }

    /// The scheduler's notice that server `dead` is gone and server `by` serves its
    /// keys. This server stops if it is the one declared dead; if it takes over, it
    /// serves the dead server's keys from its replica, the held requests first.
    pub(crate) fn failover(&mut self, dead: u32, by: u32) -> Result<Routed<T>, PsError> {
        if dead == self.rank {
            return Err(PsError::Aborted {
                reason: format!("the scheduler declared {} dead", self.name),
            });
        }
        let mut routed = Routed::nothing();
        if by == self.rank {
            tracing::warn!(
                "ps {}: serving server {dead}'s keys from its replica",
                self.name
            );
            let adopted = Store::adopt(
                format!("server {dead} (served by {})", self.name),
                self.mode,
                self.workers,
                self.update.clone(),
                self.backups.take(dead),
            )
            .with_primary(dead)
            .with_pool(self.pool.clone());
            self.stores.insert(dead, adopted);
            for incoming in std::mem::take(&mut self.held) {
                // Counted when it arrived.
                self.requests -= 1;
                routed.extend(self.route(incoming));
            }
        }
        Ok(routed)
    }

    /// Whether this server keeps the copy of server `primary`'s keys.
    fn is_replica_of(&self, primary: u32) -> bool {
        let servers = self.servers;
        servers > 1 && primary < servers && (primary + 1) % servers == self.rank
    }
}

fn refusal(peer: Back, id: u64, primary: u32, refusal: Refusal) -> Reply<Back> {
    Reply {
        peer,
        id,
        primary,
        body: Err(refusal),
    }
}

fn decode<T: Value>(msg: &Msg, peer: &Back, pool: &ValuePool<T>) -> Result<Request<T>, PsError> {
    let from = format!("worker {} ({peer})", msg.header.src.id);
    let op = match msg.header.kind {
        k if k == wire::PUSH => Op::Push,
        k if k == wire::PUSH_PULL => Op::PushPull,
        k if k == wire::PULL => Op::Pull,
        k if k == wire::INIT => Op::Init,
        k if k == wire::CHECK => Op::Check,
        k if k == wire::RELEASE => Op::Release,
        k if k == wire::HOLD => Op::Hold,
        k if k == wire::LET_GO => Op::LetGo,
        k if k == wire::WITHDRAW => Op::Withdraw,
        other => return Err(PsError::protocol(from, format!("unexpected {other:?}"))),
    };
    let (meta, count) = wire::read_meta(msg, &from)?;
    // Before the values are read: values of another width would not add up to the
    // count, and the worker should hear of the type, not of a malformed message.
    if !matches!(op, Op::Release | Op::Hold | Op::LetGo | Op::Withdraw) {
        let server = format!("the server (request from {from})");
        if let Some(e) = store::type_mismatch::<T>(&meta, server) {
            return Err(e);
        }
    }
    let frames = msg.frames().get(1..).unwrap_or_default();
    let size = std::mem::size_of::<T>() as u64;
    // A push of one key in one frame (a large gradient) is summed from its frame.
    let shared = match frames {
        [frame]
            if matches!(op, Op::Push | Op::PushPull)
                && meta.keys.len() == 1
                && frame.len() as u64 == count.saturating_mul(size)
                && store::Piece::<T>::fits(frame) =>
        {
            Some(frame.clone())
        }
        _ => None,
    };
    let values = if shared.is_some()
        || matches!(
            op,
            Op::Pull | Op::Check | Op::Release | Op::Hold | Op::LetGo | Op::Withdraw
        ) {
        Vec::new()
    } else {
        wire::read_values_into::<T>(msg, count, &from, |len| pool.take(len))?
    };
    Ok(Request {
        worker: msg.header.src.id,
        id: msg.header.seq,
        op,
        meta,
        values,
        fpt: false,
        shared,
    })
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
