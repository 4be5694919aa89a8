//! The parameter server's messages: kinds, the key-value metadata frame, control notes.
//!
//! Every message is a switchyard [`Msg`] of kind [`Kind::User`] with a code below.
//! Key-value requests and replies carry [`KvMeta`] (bincode) in frame 0 and the values
//! in frames 1.., whose concatenation is the values of every key in order (a frame
//! boundary may fall anywhere, so that a sender can hand over slices of the caller's
//! buffer without copying them). The request id travels in [`Msg::header`]`.seq`.
//! Control notes ([`Control`]) travel in frame 0 of a [`CONTROL`] message.

use super::{PsError, Value};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use switchyard_msg::{Addr, Kind, Msg, payload};

/// Base of the parameter server's [`Kind::User`] codes ("PS").
const BASE: u16 = 0x5053;
/// Push: add the values to the key's round.
pub(crate) const PUSH: Kind = Kind::User(BASE);
/// Pull: answer with the stored values.
pub(crate) const PULL: Kind = Kind::User(BASE + 1);
/// Push, then answer with the stored values after the round (ps-lite's push_pull).
pub(crate) const PUSH_PULL: Kind = Kind::User(BASE + 2);
/// Set the stored values (Singa's Put).
pub(crate) const INIT: Kind = Kind::User(BASE + 3);
/// A server's answer to a request.
pub(crate) const REPLY: Kind = Kind::User(BASE + 4);
/// A server's refusal of a request; frame 0 is a [`Refusal`] (bincode).
pub(crate) const REFUSE: Kind = Kind::User(BASE + 5);
/// A control note, [`Control`] in frame 0.
pub(crate) const CONTROL: Kind = Kind::User(BASE + 6);
/// A server's changed keys for its replica: [`ReplicaMeta`] in frame 0, then values.
pub(crate) const REPLICA: Kind = Kind::User(BASE + 7);
/// The replica has stored a [`REPLICA`] message (same sequence number).
pub(crate) const REPLICA_ACK: Kind = Kind::User(BASE + 8);
/// The first phase of a push or init that reaches more than one server: check the
/// keys' lengths and element type and hold the lengths of keys not yet stored, so that
/// the push itself is either accepted by every server or sent to none.
pub(crate) const CHECK: Kind = Kind::User(BASE + 9);
/// Lets go of what a [`CHECK`] held (same sequence number): another server refused.
pub(crate) const RELEASE: Kind = Kind::User(BASE + 10);
/// The first phase of withdrawing a push whose sync round did not complete in time
/// (same sequence number as the push): the server answers [`HOLD_ANSWER`] and, unless
/// some of the push is already applied, keeps every round it is in from completing
/// until the worker decides ([`LET_GO`] or [`WITHDRAW`]).
pub(crate) const HOLD: Kind = Kind::User(BASE + 11);
/// A server's answer to a [`HOLD`]: a [`HoldAnswer`] in frame 0.
pub(crate) const HOLD_ANSWER: Kind = Kind::User(BASE + 12);
/// Ends a [`HOLD`]: another server had already applied the push, so it stays in its
/// rounds here too, which may now complete.
pub(crate) const LET_GO: Kind = Kind::User(BASE + 13);
/// Ends a [`HOLD`]: every server held the push, so each takes it out of its rounds and
/// never answers it; the worker reports the round incomplete.
pub(crate) const WITHDRAW: Kind = Kind::User(BASE + 14);

/// Most bytes a metadata or control frame may have.
const META_LIMIT: usize = 64 << 20;
/// Most value frames a sender puts in one message (the decoder's default limit is
/// 1024); past it the runs are copied into one frame.
const MAX_RUNS: usize = 512;

/// What a node is.
///
/// Non-exhaustive: it travels in registrations, so a later version may add a role
/// without breaking programs that match on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum NodeRole {
    /// Computes, pushes and pulls.
    Worker,
    /// Holds a share of the keys.
    Server,
}

impl std::fmt::Display for NodeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeRole::Worker => "worker",
            NodeRole::Server => "server",
        })
    }
}

/// Which nodes a barrier waits for.
///
/// Non-exhaustive: it travels in barrier requests, so a later version may add a group
/// without breaking programs that match on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Group {
    /// Every worker.
    Workers,
    /// Every server.
    Servers,
    /// Every worker and every server.
    All,
}

impl Group {
    /// Whether a node of role `role` belongs to the group.
    pub(crate) fn contains(self, role: NodeRole) -> bool {
        matches!(
            (self, role),
            (Group::All, _)
                | (Group::Workers, NodeRole::Worker)
                | (Group::Servers, NodeRole::Server)
        )
    }
}

/// Control notes between nodes and the scheduler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// A node asks to join; a server gives the endpoint workers reach it at. `data`:
    /// whether the node offers the data plane (`data.rs`).
    Register {
        role: NodeRole,
        endpoint: String,
        data: bool,
    },
    /// The scheduler's answer: the node's rank and the servers' endpoints by rank;
    /// `data`: every node offered the data plane, so each now opens it.
    Assign {
        rank: u32,
        num_workers: u32,
        servers: Vec<String>,
        data: bool,
    },
    /// A node's data-plane control endpoint (empty: it could not bind one).
    DataEndpoint { endpoint: String },
    /// Every node's data-plane control endpoint, by data-plane rank (servers, then
    /// workers).
    DataPeers { endpoints: Vec<String> },
    /// Whether a node opened its data-plane connections.
    DataOpened { ok: bool },
    /// The scheduler's verdict once every node said: values travel on the data plane
    /// (every node opened it) or on ZeroMQ.
    DataChosen { link: bool },
    /// A node's control thread is alive.
    Heartbeat { role: NodeRole, rank: u32 },
    /// The scheduler is alive.
    Ack,
    /// A node waits at a barrier.
    Barrier { group: Group },
    /// Every member of the group reached the barrier.
    Release { group: Group },
    /// A worker has finished.
    Done,
    /// The job is over; servers stop.
    Shutdown,
    /// The job failed; the reason names the node.
    Abort { reason: String },
    /// Server `dead` is gone; server `by` serves its keys from its replica.
    Failover { dead: u32, by: u32 },
    /// A node heard the job's end ([`Control::Shutdown`] or [`Control::Abort`]): the
    /// scheduler waits for this before it returns, since a process that exits right
    /// after sending loses what ZeroMQ had not yet written.
    Ended { role: NodeRole, rank: u32 },
}

/// What a [`REPLICA`] message carries besides the values: the keys (as [`KvMeta`])
/// and, per key, which request of each worker the value includes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReplicaMeta {
    pub(crate) kv: KvMeta,
    pub(crate) included: Vec<Vec<(u32, u64)>>,
}

/// Reads the metadata frame of a [`REPLICA`] message.
pub(crate) fn read_replica_meta(msg: &Msg, from: &str) -> Result<(ReplicaMeta, u64), PsError> {
    let frame = msg
        .frames()
        .first()
        .ok_or_else(|| PsError::protocol(from, "replica message without metadata"))?;
    let meta: ReplicaMeta =
        payload::frame_to_value(frame, META_LIMIT).map_err(|e| PsError::protocol(from, e))?;
    if meta.included.len() != meta.kv.keys.len() {
        return Err(PsError::protocol(
            from,
            "replica metadata lists of different lengths",
        ));
    }
    let count = meta.kv.check(from)?;
    Ok((meta, count))
}

/// A [`REPLICA`] message: `meta` in frame 0, then the values.
pub(crate) fn replica_msg(
    src: Addr,
    dst: Addr,
    id: u64,
    meta: &ReplicaMeta,
    values: Vec<Bytes>,
) -> Result<Msg, PsError> {
    let frame =
        payload::frame_from_value(meta).map_err(|e| PsError::BadArguments(e.to_string()))?;
    let mut msg = Msg::new(src, dst, REPLICA).with_seq(id).with_frame(frame);
    msg.frames_mut().extend(values);
    Ok(msg)
}

/// A node's address in message headers: its role and rank.
pub(crate) fn addr(role: NodeRole, rank: u32) -> Addr {
    match role {
        NodeRole::Worker => Addr::worker(0, rank),
        NodeRole::Server => Addr::server(0, rank),
    }
}

/// The scheduler's address in message headers.
pub(crate) const SCHEDULER: Addr = Addr::stub(u32::MAX);

/// A control message from `src` to `dst`.
pub(crate) fn control(src: Addr, dst: Addr, note: &Control) -> Msg {
    let frame = payload::frame_from_value(note).unwrap_or_default();
    Msg::new(src, dst, CONTROL).with_frame(frame)
}

/// The control note in `msg`.
pub(crate) fn read_control(msg: &Msg, from: &str) -> Result<Control, PsError> {
    if msg.header.kind != CONTROL {
        return Err(PsError::protocol(
            from,
            format!("expected a control note, got {:?}", msg.header.kind),
        ));
    }
    let frame = msg
        .frames()
        .first()
        .ok_or_else(|| PsError::protocol(from, "control note without a frame"))?;
    payload::frame_to_value(frame, META_LIMIT).map_err(|e| PsError::protocol(from, e))
}

/// The keys of a request or reply, and where each key's values lie.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KvMeta {
    /// The keys, in the order of the values.
    pub(crate) keys: Vec<u64>,
    /// Values per key in this message (the piece's length).
    pub(crate) lens: Vec<u64>,
    /// Where each piece starts in the key's whole value.
    pub(crate) offsets: Vec<u64>,
    /// Each key's whole length.
    pub(crate) totals: Vec<u64>,
    /// Pull only: refuse keys this server does not hold (the worker knows the
    /// layout); otherwise answer with the pieces it has.
    pub(crate) must_have: bool,
    /// Requests only: the sender's element type (`f32`, `i32`, ...). Types of the
    /// same width would otherwise pass for each other, bit patterns and all.
    pub(crate) elem: String,
}

/// A server's answer to a [`HOLD`] of one push.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum HoldAnswer {
    /// Some of the push is in this server's values already: it cannot be withdrawn,
    /// so every server must apply it.
    Applied,
    /// Nothing of the push is applied here, and nothing will be until the worker lets
    /// go; `round` describes a round it waits in (none if the push is not here).
    Held { round: Option<RoundState> },
}

/// Where a key's sync round stands: who pushed, who did not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoundState {
    pub(crate) key: u64,
    pub(crate) pushed: Vec<u32>,
    pub(crate) missing: Vec<u32>,
}

impl HoldAnswer {
    /// A [`HOLD_ANSWER`] message from `src` to `dst` about request `id`.
    pub(crate) fn msg(&self, src: Addr, dst: Addr, id: u64) -> Msg {
        let frame = payload::frame_from_value(self).unwrap_or_default();
        Msg::new(src, dst, HOLD_ANSWER)
            .with_seq(id)
            .with_frame(frame)
    }

    /// The answer in a [`HOLD_ANSWER`] message from `from`.
    pub(crate) fn read(msg: &Msg, from: &str) -> Result<HoldAnswer, PsError> {
        let frame = msg
            .frames()
            .first()
            .ok_or_else(|| PsError::protocol(from, "hold answer without a frame"))?;
        payload::frame_to_value(frame, META_LIMIT).map_err(|e| PsError::protocol(from, e))
    }
}

/// Why a server refused a request: the frame of a [`REFUSE`] message, so that the
/// worker reports the same typed [`PsError`] the server found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// A push carried another length for a key than its first push fixed.
    LengthChanged { key: u64, stored: u64, pushed: u64 },
    /// A push carried another length for a key than a first push still under way.
    LengthHeld {
        key: u64,
        held: u64,
        pushed: u64,
        worker: u32,
    },
    /// The request's element type is not the server's.
    TypeMismatch { stored: String, sent: String },
    /// A pull asked for a key nobody pushed.
    NeverPushed { key: u64 },
    /// Anything else, as text.
    Other(String),
}

impl Refusal {
    /// The refusal that carries `error` to the worker.
    pub(crate) fn from_error(error: &PsError) -> Refusal {
        match error {
            PsError::LengthChanged {
                key,
                stored,
                pushed,
                ..
            } => Refusal::LengthChanged {
                key: *key,
                stored: *stored,
                pushed: *pushed,
            },
            PsError::LengthHeld {
                key,
                held,
                pushed,
                worker,
                ..
            } => Refusal::LengthHeld {
                key: *key,
                held: *held,
                pushed: *pushed,
                worker: *worker,
            },
            PsError::TypeMismatch { stored, sent, .. } => Refusal::TypeMismatch {
                stored: stored.clone(),
                sent: sent.clone(),
            },
            PsError::NeverPushed { key, .. } => Refusal::NeverPushed { key: *key },
            other => Refusal::Other(other.to_string()),
        }
    }

    /// The error this refusal from `server` stands for.
    pub(crate) fn into_error(self, server: &str) -> PsError {
        let server = server.to_string();
        match self {
            Refusal::LengthChanged {
                key,
                stored,
                pushed,
            } => PsError::LengthChanged {
                key,
                stored,
                pushed,
                server,
            },
            Refusal::LengthHeld {
                key,
                held,
                pushed,
                worker,
            } => PsError::LengthHeld {
                key,
                held,
                pushed,
                worker,
                server,
            },
            Refusal::TypeMismatch { stored, sent } => PsError::TypeMismatch {
                server,
                stored,
                sent,
            },
            Refusal::NeverPushed { key } => PsError::NeverPushed { key, server },
            Refusal::Other(reason) => PsError::Remote {
                node: server,
                reason,
            },
        }
    }

    /// A [`REFUSE`] message from `src` to `dst` answering request `id`.
    pub(crate) fn msg(&self, src: Addr, dst: Addr, id: u64) -> Msg {
        let frame = payload::frame_from_value(self).unwrap_or_default();
        Msg::new(src, dst, REFUSE).with_seq(id).with_frame(frame)
    }

    /// The refusal in a [`REFUSE`] message; one that does not parse is kept as text.
    pub(crate) fn read(msg: &Msg) -> Refusal {
        let Some(frame) = msg.frames().first() else {
            return Refusal::Other("refused without a reason".into());
        };
        payload::frame_to_value(frame, META_LIMIT)
            .unwrap_or_else(|_| Refusal::Other(String::from_utf8_lossy(frame).into_owned()))
    }
}

impl KvMeta {
    /// Checks that the lists agree and returns the number of values they describe.
    pub(crate) fn check(&self, from: &str) -> Result<u64, PsError> {
        let n = self.keys.len();
        if self.lens.len() != n || self.offsets.len() != n || self.totals.len() != n {
            return Err(PsError::protocol(
                from,
                "metadata lists of different lengths",
            ));
        }
        let mut sum = 0u64;
        for i in 0..n {
            let end = self.offsets[i].checked_add(self.lens[i]);
            if end.is_none_or(|end| end > self.totals[i]) {
                return Err(PsError::protocol(
                    from,
                    format!("key {}: piece past the value's end", self.keys[i]),
                ));
            }
            sum = sum
                .checked_add(self.lens[i])
                .ok_or_else(|| PsError::protocol(from, "value count overflows"))?;
        }
        Ok(sum)
    }
}

/// A key-value message: `meta` in frame 0, then `values` as given.
pub(crate) fn kv_msg(
    src: Addr,
    dst: Addr,
    kind: Kind,
    id: u64,
    meta: &KvMeta,
    values: Vec<Bytes>,
) -> Result<Msg, PsError> {
    let frame =
        payload::frame_from_value(meta).map_err(|e| PsError::BadArguments(e.to_string()))?;
    let mut msg = Msg::new(src, dst, kind).with_seq(id).with_frame(frame);
    msg.frames_mut().extend(values);
    Ok(msg)
}

/// The metadata of a key-value message, checked, and the total number of values.
pub(crate) fn read_meta(msg: &Msg, from: &str) -> Result<(KvMeta, u64), PsError> {
    let frame = msg
        .frames()
        .first()
        .ok_or_else(|| PsError::protocol(from, "key-value message without metadata"))?;
    let meta: KvMeta =
        payload::frame_to_value(frame, META_LIMIT).map_err(|e| PsError::protocol(from, e))?;
    let count = meta.check(from)?;
    Ok((meta, count))
}

/// The values of a key-value message as one vector (one copy), checked against the
/// count the metadata declares.
pub(crate) fn read_values<T: Value>(msg: &Msg, count: u64, from: &str) -> Result<Vec<T>, PsError> {
    read_values_into(msg, count, from, |len| vec![T::default(); len])
}

/// [`read_values`] into the buffer `take(count)` returns (every value of it is
/// written), such as one from a server's pool.
pub(crate) fn read_values_into<T: Value>(
    msg: &Msg,
    count: u64,
    from: &str,
    take: impl FnOnce(usize) -> Vec<T>,
) -> Result<Vec<T>, PsError> {
    let frames = msg.frames().get(1..).unwrap_or_default();
    let bytes: usize = frames.iter().map(Bytes::len).sum();
    let size = std::mem::size_of::<T>();
    if bytes as u64 != count.saturating_mul(size as u64) {
        return Err(PsError::protocol(
            from,
            format!("{bytes} value bytes for {count} values of {size} bytes"),
        ));
    }
    let mut out = take(count as usize);
    let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    let mut at = 0;
    for frame in frames {
        switchyard_msg::copy::copy_bytes(&mut dst[at..at + frame.len()], frame);
        at += frame.len();
    }
    Ok(out)
}

/// Collects byte ranges of one buffer into frames: adjacent ranges become one
/// slice of the buffer (no copy); past [`MAX_RUNS`] slices the rest are copied into
/// one frame so that the message stays under the decoder's frame limit.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    frames: Vec<Bytes>,
    open: Option<(usize, usize)>,
}

impl Runs {
    /// Adds `start..end` of `buffer`.
    pub(crate) fn add(&mut self, buffer: &Bytes, start: usize, end: usize) {
        if start == end {
            return;
        }
        match self.open {
            Some((s, e)) if e == start => self.open = Some((s, end)),
            Some((s, e)) => {
                self.frames.push(buffer.slice(s..e));
                self.open = Some((start, end));
            }
            None => self.open = Some((start, end)),
        }
    }

    /// The frames, in order.
    pub(crate) fn finish(mut self, buffer: &Bytes) -> Vec<Bytes> {
        if let Some((s, e)) = self.open.take() {
            self.frames.push(buffer.slice(s..e));
        }
        if self.frames.len() > MAX_RUNS {
            let tail: Vec<u8> = self.frames[MAX_RUNS - 1..].concat();
            self.frames.truncate(MAX_RUNS - 1);
            self.frames.push(Bytes::from(tail));
        }
        self.frames
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn runs_join_adjacent_slices_and_cap_the_frame_count() {
        let buffer = Bytes::from((0..=255u8).cycle().take(4096).collect::<Vec<u8>>());
        let mut runs = Runs::default();
        runs.add(&buffer, 0, 4);
        runs.add(&buffer, 4, 8);
        runs.add(&buffer, 16, 20);
        let frames = runs.finish(&buffer);
        assert_eq!(frames.len(), 2);
        assert_eq!(&frames[0][..], &buffer[0..8]);
        assert_eq!(frames[0].as_ptr(), buffer.as_ptr(), "a slice, not a copy");

        let mut runs = Runs::default();
        for i in 0..1000 {
            runs.add(&buffer, i * 4, i * 4 + 2);
        }
        let frames = runs.finish(&buffer);
        assert_eq!(frames.len(), MAX_RUNS);
        let joined: Vec<u8> = frames.concat();
        let expected: Vec<u8> = (0..1000)
            .flat_map(|i| buffer[i * 4..i * 4 + 2].to_vec())
            .collect();
        assert_eq!(joined, expected);
    }

    #[test]
    fn meta_check_refuses_pieces_past_the_end() {
        let meta = KvMeta {
            keys: vec![1],
            lens: vec![5],
            offsets: vec![3],
            totals: vec![6],
            must_have: true,
            ..KvMeta::default()
        };
        assert!(meta.check("test").is_err());
        let meta = KvMeta {
            keys: vec![1, 2],
            lens: vec![5, 1],
            offsets: vec![1, 0],
            totals: vec![6, 1],
            must_have: true,
            ..KvMeta::default()
        };
        assert_eq!(meta.check("test").unwrap(), 6);
    }

    #[test]
    fn control_round_trips() {
        let note = Control::Assign {
            rank: 2,
            num_workers: 4,
            servers: vec!["tcp://a:1".into()],
            data: true,
        };
        let msg = control(SCHEDULER, addr(NodeRole::Worker, 2), &note);
        assert_eq!(read_control(&msg, "test").unwrap(), note);
    }
}
