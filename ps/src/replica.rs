//! Server replication: each server keeps a copy of its predecessor's keys, so that
//! the job survives the death of one server ([`super::PsConfig::replicate`]).
//!
//! After a request changes keys, the server sends their new values (and which request
//! of each worker they include) to the next server of the ring and holds its replies
//! until that server acknowledges: a worker never sees a value its server's replica
//! does not have. When the scheduler declares the server dead, the replica serves its
//! keys from the copy; workers send it again the requests the dead server had not
//! answered, and the `included` marks keep a push from being added twice.

use super::data::Back;
use super::store::{Backup, Reply};
use super::wire::{self, ReplicaMeta, Runs};
use super::{PsError, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::thread::JoinHandle;
use switchyard_msg::{Addr, Msg, payload};
use switchyard_transports::{Dealer, DealerSocket, Socket, SocketOptions, TransportError};

/// Copies of other servers' keys, by the server they belong to.
#[derive(Debug, Default)]
pub(crate) struct Backups<T> {
    by_server: HashMap<u32, HashMap<u64, Backup<T>>>,
}

impl<T: Value> Backups<T> {
    /// Stores the keys of a [`wire::REPLICA`] message from server `primary`.
    pub(crate) fn store(&mut self, primary: u32, msg: &Msg, from: &str) -> Result<(), PsError> {
        let (meta, count) = wire::read_replica_meta(msg, from)?;
        let values = wire::read_values::<T>(msg, count, from)?;
        let keys = self.by_server.entry(primary).or_default();
        let mut at = 0usize;
        for (i, included) in meta.included.into_iter().enumerate() {
            let len = meta.kv.lens[i] as usize;
            let backup = Backup {
                value: values[at..at + len].to_vec(),
                offset: meta.kv.offsets[i],
                total: meta.kv.totals[i],
                included,
            };
            keys.insert(meta.kv.keys[i], backup);
            at += len;
        }
        Ok(())
    }

    /// The copy of server `primary`'s keys, taken out (to serve them).
    pub(crate) fn take(&mut self, primary: u32) -> HashMap<u64, Backup<T>> {
        self.by_server.remove(&primary).unwrap_or_default()
    }
}

/// A server's line to its replica, and the replies it holds until the replica has
/// what they show.
#[derive(Debug)]
pub(crate) struct ReplicaLink {
    /// The replica's rank.
    pub(crate) target: u32,
    endpoint: String,
    connecting: Option<JoinHandle<Result<DealerSocket, TransportError>>>,
    dealer: Option<DealerSocket>,
    queued: VecDeque<Msg>,
    held: BTreeMap<u64, Vec<Reply<Back>>>,
    next_id: u64,
}

impl ReplicaLink {
    /// Starts connecting to the replica on another thread: the replica answers the
    /// connection from its serving loop, which may not have started yet, and it may be
    /// connecting to its own replica, around the ring, at the same moment.
    pub(crate) fn start(target: u32, endpoint: &str, options: SocketOptions) -> ReplicaLink {
        let e = endpoint.to_string();
        let connecting = std::thread::Builder::new()
            .name(format!("ps-replica-{target}-connect"))
            .spawn(move || DealerSocket::connect(&e, options))
            .ok();
        ReplicaLink {
            target,
            endpoint: endpoint.to_string(),
            connecting,
            dealer: None,
            queued: VecDeque::new(),
            held: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// The socket to wait on for acknowledgements, once connected.
    pub(crate) fn dealer(&self) -> Option<&DealerSocket> {
        self.dealer.as_ref()
    }

    /// Sends the changed keys to the replica and holds `replies` until it
    /// acknowledges them.
    pub(crate) fn replicate<T: Value>(
        &mut self,
        me: Addr,
        changed: Vec<(u64, Backup<T>)>,
        replies: Vec<Reply<Back>>,
    ) -> Result<(), PsError> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = message(me, self.target, id, changed)?;
        self.queued.push_back(msg);
        self.held.insert(id, replies);
        self.flush()
    }

    fn flush(&mut self) -> Result<(), PsError> {
        let Some(dealer) = self.dealer.as_mut() else {
            return Ok(());
        };
        while let Some(msg) = self.queued.pop_front() {
            if let Err(e) = dealer.send(msg) {
                return Err(PsError::Send {
                    to: format!("replica server {} at {}", self.target, self.endpoint),
                    reason: e.kind.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Finishes connecting when the connection is made, sends what waited for it, and
    /// returns the replies the replica's acknowledgements release.
    pub(crate) fn pump(&mut self) -> Result<Vec<Reply<Back>>, PsError> {
        if self
            .connecting
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
        {
            if let Some(handle) = self.connecting.take() {
                let dealer = handle
                    .join()
                    .map_err(|_| PsError::Send {
                        to: format!("replica server {}", self.target),
                        reason: "connect thread panicked".into(),
                    })?
                    .map_err(|e| {
                        PsError::transport(
                            format!(
                                "connecting to replica server {} at {}",
                                self.target, self.endpoint
                            ),
                            e,
                        )
                    })?;
                self.dealer = Some(dealer);
            }
        }
        self.flush()?;
        let mut released = Vec::new();
        let Some(dealer) = self.dealer.as_mut() else {
            return Ok(released);
        };
        while let Ok(ack) = dealer.try_recv() {
            if ack.header.kind == wire::REPLICA_ACK {
                // Acknowledgements come in order; everything up to this one is safe.
                let later = self.held.split_off(&(ack.header.seq + 1));
                let done = std::mem::replace(&mut self.held, later);
                released.extend(done.into_values().flatten());
            }
        }
        Ok(released)
    }

    /// Every held reply, released because the replica is gone (its copy with it).
    pub(crate) fn release_all(self) -> Vec<Reply<Back>> {
        self.held.into_values().flatten().collect()
    }
}

/// Replica message `id` from `me` to server `target`, carrying the `changed` keys.
pub(crate) fn message<T: Value>(
    me: Addr,
    target: u32,
    id: u64,
    changed: Vec<(u64, Backup<T>)>,
) -> Result<Msg, PsError> {
    let mut meta = ReplicaMeta::default();
    let mut values: Vec<T> = Vec::new();
    for (key, b) in changed {
        meta.kv.keys.push(key);
        meta.kv.lens.push(b.value.len() as u64);
        meta.kv.offsets.push(b.offset);
        meta.kv.totals.push(b.total);
        meta.included.push(b.included);
        values.extend_from_slice(&b.value);
    }
    let buffer = payload::frame_from_vec(values);
    let mut runs = Runs::default();
    runs.add(&buffer, 0, buffer.len());
    wire::replica_msg(
        me,
        wire::addr(wire::NodeRole::Server, target),
        id,
        &meta,
        runs.finish(&buffer),
    )
}

/// The acknowledgement of replica message `msg`.
pub(crate) fn ack(me: Addr, msg: &Msg) -> Msg {
    Msg::new(me, msg.header.src, wire::REPLICA_ACK).with_seq(msg.header.seq)
}
