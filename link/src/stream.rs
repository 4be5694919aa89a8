//! The mesh's data path: one plain TCP connection per pair of ranks, beside the
//! ZeroMQ [`SocketLink`] that keeps the control traffic (setup and abort notices).
//!
//! Why: through ZeroMQ every message crosses two extra threads (libzmq's I/O threads),
//! and each hand-off is a wake-up of about 30 us on the project machines; streams of
//! large frames also stop at about 3.6 GB/s. Here the calling thread writes frames
//! straight from their buffers with `writev` and reads them into one allocation per
//! frame, spinning briefly before it sleeps in `poll(2)`, and a peer that dies shows up
//! at once as a closed connection ([`LinkError::Lost`]) instead of at the deadline.
//!
//! All sockets are non-blocking. A rank that cannot write (its peer's buffers are full)
//! keeps reading from every peer while it waits, so that ranks writing to each other in
//! a cycle (the ring) can never all block.
//!
//! A peer that is alive but silent (stopped, or cut off without a reset) keeps its
//! connection open; with a heartbeat deadline (`liveness.rs`) a rank waiting for such
//! a peer gives up on it once it has missed its beats for the deadline, instead of
//! after the silence timeout.
//!
//! The wire format is in `framing.rs`, the connection set-up in `setup.rs`, the
//! non-blocking reads, writes and waits in `stream/io.rs`, the host board's publish and
//! wait (ranks that all share one host) in `stream/board.rs`.

#[cfg(test)]
mod bipartite_tests;
mod board;
mod io;
mod pipe;

pub(super) use pipe::Pipe;

use super::framing::Decoder;
use super::liveness::Liveness;
use super::pool::Pool;
use super::setup::{Connection, Opened, open_connections, open_connections_on};
use super::shm::Board;
use super::{Clock, Link, Notice, Pending, SocketLink, Tag, Topology};
use crate::Interrupt;
use crate::LinkError;
use bytes::Bytes;
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use switchyard_secret::JobSecret;

/// How the reason of a [`LinkError::Lost`] for a peer that missed its heartbeats
/// begins: robust mode tells these apart from closed connections (a silent process
/// is alive to the kernel and must be killed to be restarted).
pub const SILENT: &str = "no heartbeat for ";

/// How long a wait polls before it sleeps, unless told: longer than the wake-up it
/// saves over TCP (about 30 us here).
const SPIN: Duration = Duration::from_micros(50);
/// The same when every rank is on this host and has a core of its own: longer than
/// a wake-up through a Unix socket on these VMs (30-70 us), so that two ranks never
/// settle into sleeping in turns (see `CommOptions::spin`).
const LOCAL_SPIN: Duration = Duration::from_millis(1);
/// A yield to a peer on this rank's core that takes longer than this let other work
/// run first (a handover between two ranks takes a few microseconds).
const SLOW_YIELD: Duration = Duration::from_micros(50);
/// How long after a slow yield a wait for a peer on this rank's core sleeps at once
/// instead of yielding (`StreamLink::spin_pass`): long enough that the slices lost to
/// other work while finding out stay a small part of the time.
const SLOW_YIELD_MEMORY: Duration = Duration::from_millis(100);
/// How long waits for a peer on this rank's core spin as usual before they yield
/// (`StreamLink::spin_pass`): time for the scheduler to move one of the two to an idle
/// core, where there is one.
const BESIDE_GRACE: Duration = Duration::from_millis(5);
/// How often the grace comes back while the peer stays on this rank's core.
const BESIDE_REPROBE: Duration = Duration::from_secs(1);
/// How often at most a rank moves off a processor it shares with a peer
/// (`StreamLink::step_aside`): a move costs two system calls and a migration.
const STEP_ASIDE_EVERY: Duration = Duration::from_millis(1);

/// Queued bytes per peer above which `send` waits for the queue to drain.
const QUEUE_LIMIT: usize = 16 << 20;
/// Longest sleep in `poll` before the control link is checked for abort notices.
const CONTROL_CHECK: Duration = Duration::from_millis(20);

/// A message being written: its parts and how far the writing got.
struct Outbound {
    parts: Vec<Bytes>,
    part: usize,
    offset: usize,
}

/// One peer's connection.
struct Peer {
    pipe: Pipe,
    /// The peer's data address, for errors.
    addr: String,
    inbound: Decoder,
    outbound: VecDeque<Outbound>,
    queued: usize,
    /// Why the connection ended, once it has. A peer that finished its last call
    /// and left is no error until this rank needs it.
    closed: Option<String>,
    /// When a byte last arrived from the peer, and when it last took one of ours:
    /// the silence clock restarts on either, so a large frame that is still
    /// arriving is progress.
    heard: Instant,
    drained: Instant,
}

/// Whether the ranks of a world whose connections are `connections` fit this host's
/// cores without sharing one: known only when every peer is on this host (shared
/// memory), since ranks of other hosts cannot tell how many ranks this host runs.
fn fits_cores(connections: &[Option<Connection>]) -> bool {
    let all_local = connections
        .iter()
        .flatten()
        .all(|c| matches!(c.pipe, Pipe::Shm(_)));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    all_local && connections.len() <= cores
}

impl Peer {
    /// The peer's endpoint as errors name it: `tcp://` or `shm://` and its address.
    fn endpoint(&self) -> String {
        format!("{}://{}", self.pipe.scheme(), self.addr)
    }

    /// The error for this peer's pipe failing with `e`; `rank` is the peer's.
    fn io_error(&self, rank: usize, e: std::io::Error) -> LinkError {
        LinkError::Lost {
            rank,
            endpoint: self.endpoint(),
            reason: e.to_string(),
        }
    }
}

/// A [`Link`] whose messages travel on plain TCP connections, one per pair of ranks,
/// set up and supervised through a ZeroMQ [`SocketLink`].
pub struct StreamLink {
    control: SocketLink,
    rank: usize,
    size: usize,
    peers: Vec<Option<Peer>>,
    pending: Pending,
    spin: Duration,
    pool: Pool,
    /// The heartbeat, when this link has a deadline for silent peers. It beats while
    /// `drop` flushes the last messages, and is declared after the connections on
    /// purpose: fields drop in order, so the peers see this rank's connections close
    /// (a departure) before its beats stop, never the other way round (a stop).
    liveness: Option<Liveness>,
    /// Raised by the caller to end a wait ([`Interrupt`]).
    interrupt: Option<Interrupt>,
    /// Whether this host may have more ranks than cores, so that a spinning rank
    /// must yield its core (see `wait`): true unless every rank is known to share
    /// this host (all pipes are shared memory) and they fit its cores.
    oversubscribed: bool,
    /// Until when waits for a peer on this rank's core sleep at once: set by a slow
    /// yield (`StreamLink::spin_pass`).
    slow_yields_until: Cell<Option<Instant>>,
    /// Since when the peers waited for have been on this rank's core
    /// (`StreamLink::spin_pass`).
    beside_since: Cell<Option<Instant>>,
    /// When this rank last moved off a processor it shared with a peer.
    stepped_aside_at: Cell<Option<Instant>>,
    /// The host board of this rank's host (`shm/board.rs`), when at least two
    /// ranks share it.
    board: Option<Board>,
    /// The ranks that share `board`, in rank order: board slot `i` is rank
    /// `board_ranks[i]`'s.
    board_ranks: Vec<usize>,
    /// [`Link::host_groups`]: the ranks grouped by host, when they span several.
    hosts: Vec<Vec<usize>>,
    /// The rank [`StreamLink::recv_any`] looks at first, so that ranks take turns.
    turn: usize,
}

impl std::fmt::Debug for StreamLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLink")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

impl StreamLink {
    /// Opens a TCP connection to every other rank of `control`'s world: listens on
    /// `host` (any free port), swaps addresses over `control`, then the lower rank of
    /// each pair connects. Waits at most `timeout`. No heartbeat: a silent peer is
    /// noticed by the silence timeout only.
    #[cfg(any(test, feature = "testing"))]
    pub fn connect(
        control: SocketLink,
        host: &str,
        timeout: Duration,
        max_frame_bytes: usize,
        spin: Duration,
    ) -> Result<StreamLink, LinkError> {
        StreamLink::open(
            control,
            host,
            timeout,
            max_frame_bytes,
            Some(spin),
            None,
            None,
        )
    }

    /// Opens a TCP connection to every other rank of `control`'s world: listens on
    /// `host` (any free port), swaps addresses over `control`, then the lower rank of
    /// each pair connects, within `timeout`; with a heartbeat deadline when `heartbeat`
    /// is set (`CommOptions::heartbeat`): a UDP socket on `host` beside the data listener,
    /// beating to every peer that has a heartbeat too, and a rank waiting for one of
    /// those that missed its beats for longer than the deadline fails with
    /// [`LinkError::Lost`] naming it. Peers without a heartbeat are not watched.
    ///
    /// With a `host_id` (`CommOptions::shared_memory`), the ranks that announce the
    /// same identity talk through shared memory instead of TCP (`shm/`); the rest,
    /// and every rank when `host_id` is `None`, over TCP. `spin` is how long a wait
    /// polls before it sleeps; `None` chooses (`CommOptions::spin`).
    pub fn open(
        mut control: SocketLink,
        host: &str,
        timeout: Duration,
        max_frame_bytes: usize,
        spin: Option<Duration>,
        heartbeat: Option<Duration>,
        host_id: Option<&str>,
    ) -> Result<StreamLink, LinkError> {
        // This link flushes its own connections when dropped.
        control.set_close_handshake(false);
        let opened = open_connections(
            &mut control,
            host,
            timeout,
            heartbeat,
            host_id,
            Topology::Mesh,
        )?;
        Ok(StreamLink::from_opened(
            control,
            opened,
            max_frame_bytes,
            spin,
        ))
    }

    /// Opens the connections of a parameter server's world: each rank below `split`
    /// (a server) with each rank from `split` up (a worker), none within a side
    /// ([`Topology::Bipartite`]). As [`StreamLink::open`] otherwise, on a `listener`
    /// the caller bound, with the job secret `secret` (`None`: connections are not
    /// authenticated), no heartbeat (the parameter server's scheduler watches its
    /// nodes) and no host board.
    pub fn open_bipartite(
        mut control: SocketLink,
        listener: TcpListener,
        secret: Option<&JobSecret>,
        split: usize,
        timeout: Duration,
        max_frame_bytes: usize,
        host_id: Option<&str>,
    ) -> Result<StreamLink, LinkError> {
        control.set_close_handshake(false);
        let opened = open_connections_on(
            &mut control,
            listener,
            timeout,
            secret,
            None,
            host_id,
            Topology::Bipartite { split },
        )?;
        Ok(StreamLink::from_opened(
            control,
            opened,
            max_frame_bytes,
            None,
        ))
    }

    /// The link over the connections set-up `opened`.
    fn from_opened(
        control: SocketLink,
        opened: Opened,
        max_frame_bytes: usize,
        spin: Option<Duration>,
    ) -> StreamLink {
        let (rank, size) = (control.rank(), control.world_size());
        let Opened {
            connections,
            liveness,
            board,
            hosts,
        } = opened;
        let (board, board_ranks) = match board {
            Some((board, ranks)) => (Some(board), ranks),
            None => (None, Vec::new()),
        };
        let oversubscribed = !fits_cores(&connections);
        let spin = spin.unwrap_or(if oversubscribed { SPIN } else { LOCAL_SPIN });
        let peers = connections
            .into_iter()
            .map(|connection| {
                connection.map(|Connection { pipe, addr }| Peer {
                    pipe,
                    addr,
                    inbound: Decoder::new(max_frame_bytes),
                    outbound: VecDeque::new(),
                    queued: 0,
                    closed: None,
                    heard: Instant::now(),
                    drained: Instant::now(),
                })
            })
            .collect();
        StreamLink {
            control,
            rank,
            size,
            peers,
            pending: Pending::default(),
            spin,
            pool: Pool::default(),
            liveness,
            interrupt: None,
            oversubscribed,
            slow_yields_until: Cell::new(None),
            beside_since: Cell::new(None),
            stepped_aside_at: Cell::new(None),
            board,
            board_ranks,
            hosts,
            turn: 0,
        }
    }

    /// The next message tagged `tag` from any rank, waiting until `deadline`:
    /// `Ok(None)` then. Ranks take turns, so that one busy sender does not hide the
    /// others; messages of one rank come in the order it sent them. A connection
    /// that closes, or whose bytes are not the link's wire format, ends without an
    /// error here (the others go on): [`StreamLink::closed`] says which and why.
    /// Waiting writes this rank's queued output, as every wait of the link does.
    pub fn recv_any(
        &mut self,
        tag: Tag,
        deadline: Instant,
    ) -> Result<Option<(usize, Vec<Bytes>)>, LinkError> {
        let spin_until = Instant::now() + self.spin;
        loop {
            self.interrupted()?;
            if let Some((from, frames)) = self.pending.pop_any(tag, self.turn, self.size) {
                self.turn = (from + 1) % self.size.max(1);
                return Ok(Some((from, frames)));
            }
            if self.progress_each() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if now < spin_until && self.spin_pass(None) {
                continue;
            }
            self.sleep(deadline);
        }
    }

    /// Queues `frames` for `to` and writes what its connection takes now, without
    /// waiting for room: the rest goes out in this link's later waits
    /// ([`StreamLink::recv_any`], or any send or receive).
    pub fn send_nowait(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
    ) -> Result<(), LinkError> {
        self.interrupted()?;
        self.queue(to, tag, frames)
    }

    /// Writes what the connections take of this rank's queued output and reads what
    /// has arrived (kept for later receives), without waiting: for a caller that waits
    /// on something else (a barrier over another socket) while its output must still
    /// reach its peers. Returns whether anything moved.
    pub fn advance(&mut self) -> bool {
        self.progress_each()
    }

    /// Why the connection to `rank` ended (closed by the peer, failed, or carrying a
    /// malformed stream), once it has; `None` while it is open, and for a rank this
    /// link has no connection to.
    pub fn closed(&self, rank: usize) -> Option<&str> {
        self.peers.get(rank)?.as_ref()?.closed.as_deref()
    }

    /// Sets how long a wait polls before it sleeps in `poll(2)` (chosen at set-up when
    /// not given: see [`StreamLink::open`]); zero sleeps at once.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Ends this link's sends, receives and waits with [`LinkError::Interrupted`]
    /// once `interrupt` is raised: it is looked at before every message and on every
    /// pass of a wait, busy or idle.
    pub fn watch_interrupt(&mut self, interrupt: Option<Interrupt>) {
        self.interrupt = interrupt;
    }

    /// [`LinkError::Interrupted`] once the interrupt is raised. One atomic load: cheap
    /// enough for every message and every pass of a wait, so that a call whose data
    /// keeps moving (every wait finds progress at once, or the messages arrived
    /// before they were asked for) is interrupted as soon as an idle one.
    pub(super) fn interrupted(&self) -> Result<(), LinkError> {
        match &self.interrupt {
            Some(flag) if flag.is_raised() => Err(LinkError::Interrupted { rank: self.rank }),
            _ => Ok(()),
        }
    }

    /// The error for waiting on `peer` when it has missed its heartbeats for longer
    /// than the deadline; `None` while it beats (or is not watched). A byte from it on
    /// its data connection counts as a beat.
    fn silent(&self, peer: usize) -> Option<LinkError> {
        let beats = self.liveness.as_ref()?.beats();
        let conn = self.peers.get(peer)?.as_ref()?;
        let silence = beats.silent(peer, conn.heard, Instant::now())?;
        Some(LinkError::Lost {
            rank: peer,
            endpoint: conn.endpoint(),
            reason: format!(
                "{SILENT}{} ms (deadline {} ms): the process is stopped or its network is cut",
                silence.as_millis(),
                beats.deadline().as_millis()
            ),
        })
    }

    /// How long a wait for `peer` that would last until `until` may sleep before
    /// `peer`'s heartbeat must be looked at again: until it would be overdue (the
    /// wait would otherwise sleep through it), and at most [`CONTROL_CHECK`] at a
    /// time so that a late verdict (this rank's own heartbeat thread was not running)
    /// is looked at again soon.
    fn watch_until(&self, peer: usize, until: Instant) -> Instant {
        let Some(beats) = self.liveness.as_ref().map(Liveness::beats) else {
            return until;
        };
        let Some(Some(conn)) = self.peers.get(peer) else {
            return until;
        };
        let Some(due) = beats.due(peer, conn.heard) else {
            return until;
        };
        let now = Instant::now();
        let mut wake = now + CONTROL_CHECK;
        if due > now {
            wake = wake.min(due);
        }
        until.min(wake)
    }

    /// Queues a message for `to` and, while its queue is over the limit, waits for
    /// room until `until(drained)`, where `drained` is when `to` last took bytes: a
    /// peer that keeps reading is never timed out.
    fn send_until(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        until: impl Fn(Instant) -> Instant,
    ) -> Result<(), LinkError> {
        self.interrupted()?;
        self.queue(to, tag, frames)?;
        self.drain_until(to, QUEUE_LIMIT, until)
    }

    /// Waits until at most `limit` bytes are queued for `to`, as long as `to` keeps
    /// taking bytes: gives up at `until(drained)`, where `drained` is when `to` last
    /// took some, or at once when `to` missed its heartbeats.
    fn drain_until(
        &mut self,
        to: usize,
        limit: usize,
        until: impl Fn(Instant) -> Instant,
    ) -> Result<(), LinkError> {
        // The clock is read only when there is something to wait for: a call's last
        // flush usually finds every queue empty, and is made on every peer.
        let mut first_wait = None;
        while self.peer(to)?.queued > limit {
            let started = *first_wait.get_or_insert_with(Instant::now);
            if let Some(refused) = self.pending.refusal().or_else(|| self.board_refusal()) {
                return Err(refused);
            }
            // A stopped peer takes no bytes either: waiting for room is waiting on it.
            if let Some(silent) = self.silent(to) {
                return Err(silent);
            }
            let drained = self.peer(to)?.drained.max(started);
            let until = until(drained);
            let now = Instant::now();
            if now >= until {
                return Err(LinkError::Timeout {
                    rank: to,
                    waited: now - drained,
                });
            }
            self.wait(self.watch_until(to, until))?;
        }
        Ok(())
    }

    /// Receives the message tagged `tag` from `from`, waiting until `until(heard)`,
    /// where `heard` is when a byte last arrived from `from`: a frame still arriving
    /// is progress.
    fn recv_until(
        &mut self,
        from: usize,
        tag: Tag,
        until: impl Fn(Instant) -> Instant,
    ) -> Result<Vec<Bytes>, LinkError> {
        let started = Instant::now();
        loop {
            self.interrupted()?;
            if let Some(refused) = self.pending.refusal() {
                return Err(refused);
            }
            if let Some(frames) = self.pending.pop(from, tag) {
                return Ok(frames);
            }
            if let Some(refused) = self.board_refusal() {
                return Err(refused);
            }
            let peer = self.peer(from)?;
            if let Some(reason) = &peer.closed {
                return Err(LinkError::Lost {
                    rank: from,
                    endpoint: peer.endpoint(),
                    reason: reason.clone(),
                });
            }
            let heard = peer.heard.max(started);
            if let Some(silent) = self.silent(from) {
                // An abort notice explains more than the silence it caused.
                self.control.check_aborts()?;
                return Err(silent);
            }
            let until = until(heard);
            let now = Instant::now();
            if now >= until {
                self.control.check_aborts()?;
                return Err(LinkError::Timeout {
                    rank: from,
                    waited: now - heard,
                });
            }
            self.wait(self.watch_until(from, until))?;
        }
    }
}

impl Link for StreamLink {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        self.send_until(to, tag, frames, |_| deadline)
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        self.recv_until(from, tag, |_| deadline)
    }

    fn abort(&mut self, call: u64, reason: &str) {
        self.control.abort(call, reason);
    }

    fn send_within(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        clock: Clock,
    ) -> Result<(), LinkError> {
        self.send_until(to, tag, frames, |drained| clock.until(drained))
    }

    fn recv_within(
        &mut self,
        from: usize,
        tag: Tag,
        clock: Clock,
    ) -> Result<Vec<Bytes>, LinkError> {
        self.recv_until(from, tag, |heard| clock.until(heard))
    }

    fn flush_within(&mut self, clock: Clock) -> Result<(), LinkError> {
        for to in 0..self.size {
            if self.peers[to].is_some() {
                self.drain_until(to, 0, |drained| clock.until(drained))?;
            }
        }
        // An interrupt raised after the call's last message still fails the call,
        // so that the peers are told rather than meet this rank's silence in the
        // next one.
        self.interrupted()
    }

    fn abort_blaming(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        self.control.abort_blaming(call, reason, blames);
    }

    fn notices(&mut self, until: Instant) -> Option<Vec<Notice>> {
        self.control.notices(until)
    }

    fn alive(&mut self, rank: usize, within: Duration) -> Option<bool> {
        self.control.alive(rank, within)
    }

    fn expect(&mut self, call: u64, stamp: &[u8]) {
        self.pending.expect(call, stamp);
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        self.pool.take(len)
    }

    fn recycle(&mut self, frame: Bytes) {
        self.pool.give(frame);
    }

    fn board_bytes(&self) -> usize {
        if self.board_ranks.len() == self.size {
            self.board_slot_bytes()
        } else {
            0
        }
    }

    fn host_board_bytes(&self) -> usize {
        self.board_slot_bytes()
    }

    fn host_groups(&self) -> &[Vec<usize>] {
        &self.hosts
    }

    fn board_publish(
        &mut self,
        meta: &[u8],
        parts: &[&[u8]],
        clock: Clock,
    ) -> Result<(), LinkError> {
        self.publish_on_board(meta, parts, clock)
    }

    fn board_take(
        &mut self,
        from: usize,
        stamp: &[u8],
        clock: Clock,
        take: &mut dyn FnMut(&[u8]),
    ) -> Result<(), LinkError> {
        self.take_from_board(from, stamp, clock, take)
    }
}

impl Drop for StreamLink {
    /// Writes out what is still queued (at most 5 s), so that a rank's last messages
    /// reach its peers even when it leaves right after its last call. After a failed
    /// call there is nothing worth waiting for: a stopped peer would hold the exit.
    /// Nor is output for a peer that missed its heartbeats.
    fn drop(&mut self) {
        if self.control.sent_abort() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let owed = |link: &StreamLink| {
            link.peers.iter().enumerate().any(|(rank, peer)| {
                peer.as_ref().is_some_and(|p| !p.outbound.is_empty()) && link.silent(rank).is_none()
            })
        };
        while owed(self) && Instant::now() < deadline {
            // In slices, so that a peer falling silent meanwhile is let go.
            match self.wait(deadline.min(Instant::now() + CONTROL_CHECK)) {
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
}
