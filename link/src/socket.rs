//! [`SocketLink`]: the [`Link`] over the Dealer/Router transports, its two-stage
//! construction ([`BoundLink`]), and the goodbye handshake that lets a rank leave
//! without taking its last messages with it.

use super::{Clock, Link, Notice, Pending, Tag};
use crate::LinkError;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Kind, Msg};
mod notices;

use switchyard_transports::{
    Dealer, DealerSocket, PeerId, RecvError, Router, RouterSocket, Socket, SocketOptions,
};

/// The step number reserved for abort notices.
const ABORT_STEP: u32 = u32::MAX;
/// The step number of the goodbye a [`SocketLink`] sends when it closes.
const BYE_STEP: u32 = u32::MAX - 1;
/// How long a closing [`SocketLink`] waits for its peers' goodbyes.
const BYE_WAIT: Duration = Duration::from_secs(2);
/// How long the wait for the other ranks to connect sleeps before it looks whether
/// connecting to them failed.
const AWAIT_SLICE: Duration = Duration::from_millis(50);
/// How often [`BoundLink::connect`] probes, while it waits, whether the other ranks'
/// endpoints still listen (with [`BoundLink::gone_if_refused`]); and how often a wait
/// for a peer's message probes whether that peer's endpoint still listens.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long a wait for a peer receives before it looks whether that peer is gone.
const GONE_LOOK: Duration = Duration::from_millis(50);
/// How long a wait goes on after its peer was found gone, for the abort notice that
/// peer may have sent before it left (which names the rank really at fault).
const GONE_GRACE: Duration = Duration::from_millis(100);
/// How long [`refused_check`]'s probe may take to connect.
const PROBE_CONNECT: Duration = Duration::from_millis(500);

/// A [`Link`] over the transports: a Router bound at this rank's endpoint receives
/// from everyone, and one Dealer per peer (identity `#RANK`) sends to that peer's
/// Router. Works over every backend (`local://`, `inproc://`, `tcp://`, `mpi://`).
///
/// A peer that dies is noticed within a few hundred milliseconds over `tcp://`, where
/// libzmq would reconnect to it in silence: a wait for its message probes its
/// endpoint every 250 ms (`PROBE_EVERY`), and a refused connection means nobody listens there
/// any more ([`LinkError::Lost`]). On the other backends, and for a peer that is
/// stopped rather than dead, the silence timeout ends the wait
/// ([`LinkError::Timeout`]).
#[derive(Debug)]
pub struct SocketLink {
    rank: usize,
    size: usize,
    router: RouterSocket,
    dealers: Vec<Option<DealerSocket>>,
    endpoints: Vec<String>,
    peer_ranks: HashMap<PeerId, usize>,
    pending: Pending,
    aborted: Option<(usize, String)>,
    /// Every abort notice received, in arrival order.
    notices: Vec<Notice>,
    /// Whether this rank sent abort notices, and which peers sent receipts.
    sent_abort: bool,
    acks: Vec<bool>,
    /// Which peers answered [`Link::alive`]'s question since it was last asked.
    answered: Vec<bool>,
    byes: Vec<bool>,
    /// When each peer was found gone (its endpoint refusing connections).
    gone_since: Vec<Option<Instant>>,
    /// When each peer's endpoint was last probed.
    probed: Vec<Option<Instant>>,
    close_handshake: bool,
}

/// A [`SocketLink`] whose Router is bound but whose Dealers are not connected yet:
/// hand [`BoundLink::endpoint`] to the other ranks, then [`BoundLink::connect`].
#[derive(Debug)]
pub struct BoundLink {
    rank: usize,
    size: usize,
    router: RouterSocket,
    options: SocketOptions,
    /// Every endpoint was bound before it was handed out, so a refused connection
    /// means that rank left (see [`BoundLink::gone_if_refused`]).
    refused_is_gone: bool,
}

impl BoundLink {
    /// Binds rank `rank`'s Router at `endpoint` (a tcp port 0 picks a free port).
    pub fn bind(
        rank: usize,
        size: usize,
        endpoint: &str,
        options: SocketOptions,
    ) -> Result<BoundLink, LinkError> {
        let router =
            RouterSocket::bind(endpoint, options.clone()).map_err(|e| LinkError::Transport {
                rank,
                reason: format!("bind {endpoint}: {e}"),
            })?;
        Ok(BoundLink {
            rank,
            size,
            router,
            options,
            refused_is_gone: false,
        })
    }

    /// Makes [`connect`](BoundLink::connect) take a refused tcp connection as the
    /// end of that rank (its mesh attempt ended, or it died) and fail at once, where
    /// by default it waits for the rank to bind; while it waits it probes the other
    /// ranks' endpoints now and then for the same reason. Only for endpoints that were
    /// bound before they were exchanged, as in robust mode's attempts to form a mesh
    /// and every mesh whose endpoints went through a rendezvous.
    pub fn gone_if_refused(&mut self) {
        self.refused_is_gone = true;
    }

    /// Where the other ranks reach this one.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Connects to every other rank's endpoint (`endpoints[r]` is rank `r`'s) and
    /// waits until every other rank has connected here, for at most `timeout`.
    pub fn connect(
        mut self,
        endpoints: &[String],
        timeout: Duration,
    ) -> Result<SocketLink, LinkError> {
        if endpoints.len() != self.size {
            return Err(LinkError::Transport {
                rank: self.rank,
                reason: format!(
                    "{} endpoints for a world of {} ranks",
                    endpoints.len(),
                    self.size
                ),
            });
        }
        let (rank, size) = (self.rank, self.size);
        let options = self
            .options
            .clone()
            .with_identity(PeerId::from_index(rank as u64));
        let mut options = options;
        options.connect_timeout = timeout;
        let targets = endpoints.to_vec();
        let deadline = Instant::now() + timeout;
        let refused_is_gone = self.refused_is_gone;
        let failed = Arc::new(AtomicBool::new(false));
        let failed_flag = Arc::clone(&failed);
        // Connecting waits for the peer router's READY, which it sends only while its
        // owner receives: connect from another thread while this one answers HELLOs.
        let connector = std::thread::spawn(move || {
            let mut dealers = Vec::with_capacity(size);
            for (peer, endpoint) in targets.iter().enumerate() {
                if peer == rank {
                    dealers.push(None);
                    continue;
                }
                match connect_until(peer, endpoint, &options, deadline, refused_is_gone) {
                    Ok(dealer) => dealers.push(Some(dealer)),
                    Err(e) => {
                        failed_flag.store(true, Ordering::SeqCst);
                        return Err(e);
                    }
                }
            }
            Ok::<_, LinkError>(dealers)
        });
        // Waits in slices, so that a connection that failed ends the wait at once
        // instead of at the timeout.
        let mut probed = Instant::now();
        let awaited = loop {
            let slice = deadline
                .saturating_duration_since(Instant::now())
                .min(AWAIT_SLICE);
            match self.router.await_peers(size - 1, slice) {
                Ok(n) => break Ok(n),
                Err(e) if failed.load(Ordering::SeqCst) || Instant::now() >= deadline => {
                    break Err(e);
                }
                Err(_) => {}
            }
            // A rank that dies after the exchange leaves libzmq reconnecting to it
            // silently (the connecting thread waits in vain): look whether its
            // endpoint still listens, and end at once if it does not. The connecting
            // thread is then left to end at its deadline.
            if refused_is_gone && probed.elapsed() >= PROBE_EVERY {
                probed = Instant::now();
                for (peer, endpoint) in endpoints.iter().enumerate() {
                    if peer != rank {
                        refused_check(peer, endpoint)?;
                    }
                }
            }
        };
        // The connecting thread may still wait for a rank that connected here and
        // left since: probe while it runs.
        while refused_is_gone && !connector.is_finished() {
            std::thread::sleep(AWAIT_SLICE);
            if probed.elapsed() >= PROBE_EVERY {
                probed = Instant::now();
                for (peer, endpoint) in endpoints.iter().enumerate() {
                    if peer != rank {
                        refused_check(peer, endpoint)?;
                    }
                }
            }
        }
        let dealers = connector.join().map_err(|_| LinkError::Transport {
            rank,
            reason: "the connecting thread panicked".into(),
        })??;
        awaited.map_err(|e| LinkError::Transport {
            rank,
            reason: format!("waiting for the other ranks to connect: {e}"),
        })?;
        Ok(SocketLink {
            rank,
            size,
            router: self.router,
            dealers,
            endpoints: endpoints.to_vec(),
            peer_ranks: HashMap::new(),
            pending: Pending::default(),
            aborted: None,
            notices: Vec::new(),
            sent_abort: false,
            acks: vec![false; size],
            answered: vec![false; size],
            byes: vec![false; size],
            gone_since: vec![None; size],
            probed: vec![None; size],
            close_handshake: true,
        })
    }
}

/// Connects a Dealer to `endpoint`, retrying until `deadline`: ranks start in any
/// order, so a peer's endpoint may not be bound yet (the `local` and `inproc`
/// backends refuse at once where tcp would retry by itself).
fn connect_until(
    peer: usize,
    endpoint: &str,
    options: &SocketOptions,
    deadline: Instant,
    refused_is_gone: bool,
) -> Result<DealerSocket, LinkError> {
    if refused_is_gone {
        refused_check(peer, endpoint)?;
    }
    let mut pause = Duration::from_millis(1);
    loop {
        let mut attempt = options.clone();
        attempt.connect_timeout = deadline.saturating_duration_since(Instant::now());
        match DealerSocket::connect(endpoint, attempt) {
            Ok(dealer) => return Ok(dealer),
            Err(e) if Instant::now() + pause >= deadline => {
                return Err(LinkError::Lost {
                    rank: peer,
                    endpoint: endpoint.to_string(),
                    reason: e.to_string(),
                });
            }
            Err(_) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

/// Fails if a plain TCP connection to tcp `endpoint` is refused: nobody listens
/// there any more. libzmq would retry a refused connection silently until the
/// timeout. The probe connection closes before any greeting, which a router ignores.
fn refused_check(peer: usize, endpoint: &str) -> Result<(), LinkError> {
    let Some(addr) = endpoint
        .strip_prefix("tcp://")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        // A wildcard address reaches this host, not the rank's.
        .filter(|a| !a.ip().is_unspecified())
    else {
        return Ok(());
    };
    match std::net::TcpStream::connect_timeout(&addr, PROBE_CONNECT) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(LinkError::Lost {
            rank: peer,
            endpoint: endpoint.to_string(),
            reason: "connection refused: that rank no longer listens there (it left this mesh)"
                .into(),
        }),
        _ => Ok(()),
    }
}

impl SocketLink {
    /// The rank behind a Router peer identity `#RANK`.
    fn rank_of(&mut self, peer: &PeerId) -> Option<usize> {
        if let Some(rank) = self.peer_ranks.get(peer) {
            return Some(*rank);
        }
        let text = std::str::from_utf8(peer.as_bytes()).ok()?;
        let rank: usize = text.strip_prefix('#')?.parse().ok()?;
        if rank >= self.size || rank == self.rank {
            return None;
        }
        self.peer_ranks.insert(peer.clone(), rank);
        Some(rank)
    }

    fn message(&self, to: usize, tag: Tag, frames: Vec<Bytes>) -> Msg {
        let header = switchyard_msg::Header::new(
            Addr::stub(self.rank as u32),
            Addr::stub(to as u32),
            Kind::Collective,
        );
        Msg::from_parts(header, frames)
            .with_seq(tag.call)
            .with_step(tag.step)
    }
}

impl SocketLink {
    /// Receives the message tagged `tag` from `from`, filing others as pending, and
    /// gives up at `until(heard)`, where `heard` is when `from` was last heard from
    /// (any message of its, whatever the tag, shows it is alive and sending).
    fn receive_tagged(
        &mut self,
        from: usize,
        tag: Tag,
        until: impl Fn(Instant) -> Instant,
    ) -> Result<Vec<Bytes>, LinkError> {
        let mut heard = Instant::now();
        loop {
            if let Some((rank, reason)) = &self.aborted {
                return Err(LinkError::Aborted {
                    rank: *rank,
                    reason: reason.clone(),
                });
            }
            if let Some(refused) = self.pending.refusal() {
                return Err(refused);
            }
            if let Some(frames) = self.pending.pop(from, tag) {
                return Ok(frames);
            }
            let received = self.receive_one(from, heard, until(heard))?;
            let Some((sender, header, frames, step)) = received else {
                continue;
            };
            if sender == from {
                heard = Instant::now();
            }
            let got = Tag {
                call: header.seq,
                step,
            };
            if sender == from && got == tag {
                return Ok(frames);
            }
            self.pending.push(sender, got, frames);
        }
    }

    /// Receives one message from the Router before `deadline`. Goodbyes and abort
    /// notices are recorded and give `None`, as do messages that are not collective
    /// traffic (dropped with a warning). `from` and `started` name the wait in errors.
    #[allow(clippy::type_complexity)]
    fn receive_one(
        &mut self,
        from: usize,
        started: Instant,
        deadline: Instant,
    ) -> Result<Option<(usize, switchyard_msg::Header, Vec<Bytes>, u32)>, LinkError> {
        let (peer, msg) = loop {
            let slice = deadline.min(Instant::now() + GONE_LOOK);
            match self.router.recv_from_deadline(Some(slice)) {
                Ok(received) => break received,
                Err(RecvError::Timeout) if Instant::now() < deadline => self.gone_check(from)?,
                Err(RecvError::Timeout) if self.gone_since[from].is_some() => {
                    return Err(self.gone_error(from));
                }
                Err(RecvError::Timeout) => {
                    return Err(LinkError::Timeout {
                        rank: from,
                        waited: started.elapsed(),
                    });
                }
                Err(e) => {
                    return Err(LinkError::Transport {
                        rank: from,
                        reason: e.to_string(),
                    });
                }
            }
        };
        let Some(sender) = self.rank_of(&peer) else {
            tracing::warn!(%peer, "collective link: message from an unknown peer dropped");
            return Ok(None);
        };
        let (header, frames) = msg.into_parts();
        let step = match header.kind {
            Kind::Collective => header.step,
            _ => {
                tracing::warn!(rank = sender, kind = ?header.kind,
                    "collective link: a message that is not collective traffic dropped");
                return Ok(None);
            }
        };
        if step == BYE_STEP {
            self.byes[sender] = true;
            return Ok(None);
        }
        if self.control_step(sender, header.seq, step, &frames) {
            return Ok(None);
        }
        Ok(Some((sender, header, frames, step)))
    }

    /// Probes `peer`'s endpoint (every [`PROBE_EVERY`] at most) and fails with
    /// [`LinkError::Lost`] once it has refused connections for [`GONE_GRACE`]: nobody
    /// listens there, so its process is gone. libzmq alone would reconnect in silence
    /// until the silence timeout.
    fn gone_check(&mut self, peer: usize) -> Result<(), LinkError> {
        if let Some(since) = self.gone_since[peer] {
            return match since.elapsed() >= GONE_GRACE {
                true => Err(self.gone_error(peer)),
                false => Ok(()),
            };
        }
        let now = Instant::now();
        if self.probed[peer].is_some_and(|at| now.duration_since(at) < PROBE_EVERY) {
            return Ok(());
        }
        self.probed[peer] = Some(now);
        if let Some(endpoint) = self.endpoints.get(peer) {
            if refused_check(peer, endpoint).is_err() {
                self.gone_since[peer] = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// The error of a wait for `peer`, which is gone.
    fn gone_error(&self, peer: usize) -> LinkError {
        LinkError::Lost {
            rank: peer,
            endpoint: self.endpoints.get(peer).cloned().unwrap_or_default(),
            reason: "its endpoint refuses connections: that rank's process is gone, or it \
                     closed its communicator"
                .into(),
        }
    }

    /// Whether dropping the link exchanges goodbyes (see the `Drop` impl). A link
    /// that carries only control traffic need not.
    pub(crate) fn set_close_handshake(&mut self, on: bool) {
        self.close_handshake = on;
    }

    /// Whether this link sent abort notices: the call failed, and data still queued
    /// for the peers is of no use to them.
    pub(crate) fn sent_abort(&self) -> bool {
        self.sent_abort
    }

    /// Reads whatever the Router holds without waiting, keeping data messages for
    /// later, and fails if some rank sent an abort notice.
    pub(crate) fn check_aborts(&mut self) -> Result<(), LinkError> {
        let past = Instant::now();
        // A tag no collective uses: every message read is filed as pending.
        let nothing = Tag {
            call: u64::MAX,
            step: 0,
        };
        match self.recv(self.rank, nothing, past) {
            Err(LinkError::Timeout { .. }) => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Ok(()),
        }
    }
}

impl Link for SocketLink {
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
        let msg = self.message(to, tag, frames);
        let endpoint = self.endpoints.get(to).cloned().unwrap_or_default();
        let Some(Some(dealer)) = self.dealers.get_mut(to) else {
            return Err(LinkError::Transport {
                rank: to,
                reason: format!("no link to rank {to}"),
            });
        };
        dealer
            .send_deadline(msg, deadline)
            .map_err(|e| match e.kind {
                switchyard_transports::SendErrorKind::Timeout => LinkError::Timeout {
                    rank: to,
                    waited: Duration::ZERO,
                },
                kind => LinkError::Lost {
                    rank: to,
                    endpoint,
                    reason: kind.to_string(),
                },
            })
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        self.receive_tagged(from, tag, |_| deadline)
    }

    fn recv_within(
        &mut self,
        from: usize,
        tag: Tag,
        clock: Clock,
    ) -> Result<Vec<Bytes>, LinkError> {
        self.receive_tagged(from, tag, |heard| clock.until(heard))
    }

    fn expect(&mut self, call: u64, stamp: &[u8]) {
        self.pending.expect(call, stamp);
    }

    fn abort(&mut self, call: u64, reason: &str) {
        self.abort_blaming(call, reason, None);
    }

    fn abort_blaming(&mut self, call: u64, reason: &str, blames: Option<usize>) {
        self.send_abort(call, reason, blames);
    }

    fn alive(&mut self, rank: usize, within: Duration) -> Option<bool> {
        Some(self.ask_alive(rank, within))
    }

    fn notices(&mut self, until: Instant) -> Option<Vec<Notice>> {
        Some(self.read_notices(until))
    }
}

impl Drop for SocketLink {
    /// Says goodbye to every peer and waits (at most 2 s) for theirs. libzmq sends
    /// from its own I/O thread, and a process that exits right after its last call
    /// would otherwise take its last messages with it. A peer's goodbye comes after
    /// its last call, which needed every message this rank sent it.
    fn drop(&mut self) {
        if self.sent_abort && self.size > 1 {
            self.flush_aborts();
        }
        if !self.close_handshake || self.size < 2 {
            return;
        }
        let deadline = Instant::now() + BYE_WAIT;
        let tag = Tag {
            call: u64::MAX,
            step: BYE_STEP,
        };
        for to in (0..self.size).filter(|&p| p != self.rank) {
            let msg = self.message(to, tag, Vec::new());
            if let Some(Some(dealer)) = self.dealers.get_mut(to) {
                let _ = dealer.send_deadline(msg, deadline);
            }
        }
        let started = Instant::now();
        while Instant::now() < deadline && (0..self.size).any(|p| p != self.rank && !self.byes[p]) {
            // Data still arriving for a call this rank gave up on is of no use now.
            if self.receive_one(self.rank, started, deadline).is_err() {
                break;
            }
        }
    }
}
