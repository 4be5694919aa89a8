//! The mpi backend's sockets: a dealer talking to one rank's router, and this rank's
//! router. They post and receive their own messages when MPI allows it (`here`) and
//! queue commands for the progress thread otherwise ([`super::engine`]).

use super::comms::Comms;
use super::credits::{Credits, MpiInbound, MpiRoute};
use super::engine::{Command, Engine, ROUTER_TAG};
use super::here::{self, Turn};
use super::shared::Open;
use super::wire;
use crate::backend::{
    BackendDealer, BackendSocket, Deadline, Delivery, Fetched, InboxRouter, send_error,
};
use crate::poller::Watch;
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{Receiver, unbounded};
use std::sync::Arc;
use std::time::Instant;
use switchyard_msg::{Limits, Msg};

/// Where a send goes: the destination rank and socket tag, and the sender's own tag.
struct Hop {
    rank: i32,
    tag: i32,
    source_tag: i32,
}

/// Encodes, takes a credit (waiting until `deadline`), and posts on this thread or
/// queues for the progress thread; or hands `msg` back with why not.
fn queue_send(
    engine: &Engine,
    msg: Msg,
    hop: Hop,
    credits: &Arc<Credits>,
    deadline: Deadline,
) -> Result<(), (Msg, SendErrorKind)> {
    let encoded = match wire::encode(&msg, hop.source_tag) {
        Ok(encoded) => encoded,
        Err(reason) => return Err((msg, SendErrorKind::Backend(reason))),
    };
    if !credits.acquire(deadline) {
        return Err((msg, deadline.no_room()));
    }
    if let Some(comms) = &engine.here {
        let route = (hop.rank, hop.tag, hop.source_tag);
        return here::send(engine, comms, route, encoded, credits.clone())
            .map_err(|reason| (msg, SendErrorKind::Backend(reason)));
    }
    let command = Command::Send {
        dest: hop.rank,
        tag: hop.tag,
        source_tag: hop.source_tag,
        encoded,
        credits: credits.clone(),
    };
    engine
        .submit(command)
        .map_err(|reason| (msg, SendErrorKind::Backend(reason)))
}

fn target_rank(engine: &Engine, rank: u32, endpoint: &str) -> Result<i32, TransportError> {
    if rank >= engine.world.size {
        return Err(TransportError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason: format!(
                "rank {rank} is outside this MPI job of {} ranks",
                engine.world.size
            ),
        });
    }
    Ok(rank as i32)
}

/// A dealer talking to one rank's router over MPI.
pub(crate) struct MpiDealer {
    engine: &'static Engine,
    endpoint: String,
    identity: PeerId,
    options: SocketOptions,
    router: i32,
    tag: i32,
    credits: Arc<Credits>,
    inbox: Receiver<Msg>,
    /// Shared with the progress thread: who receives for this dealer.
    turn: Arc<Turn>,
}

impl std::fmt::Debug for MpiDealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiDealer")
            .field("endpoint", &self.endpoint)
            .field("identity", &self.identity)
            .field("tag", &self.tag)
            .finish()
    }
}

impl MpiDealer {
    pub(crate) fn connect(rank: u32, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("mpi://{rank}");
        let engine = Engine::get()?;
        let router = target_rank(engine, rank, &endpoint)?;
        let backend = |reason: String| TransportError::Backend {
            backend: "mpi",
            endpoint: endpoint.clone(),
            reason,
        };
        let tag = engine.allocate_tag().map_err(backend)?;
        let identity = options
            .identity
            .clone()
            .unwrap_or_else(crate::backend::fresh_identity);
        let (inbox_tx, inbox) = unbounded();
        let (connected_tx, connected) = crossbeam_channel::bounded(1);
        let turn = Turn::new();
        let started = Instant::now();
        engine
            .submit(Command::OpenDealer {
                tag,
                router,
                identity: identity.clone(),
                inbox: inbox_tx,
                hwm: options.hwm,
                limits: options.limits,
                connected: connected_tx,
                turn: turn.clone(),
            })
            .map_err(backend)?;
        engine.note_linger(options.linger);
        let dealer = MpiDealer {
            engine,
            endpoint: endpoint.clone(),
            identity,
            credits: Credits::new(options.hwm),
            router,
            tag,
            inbox,
            turn,
            options,
        };
        if connected
            .recv_timeout(dealer.options.connect_timeout)
            .is_err()
        {
            if let Some(reason) = engine.failure() {
                return Err(backend(reason));
            }
            // Dropping the dealer says goodbye, so a router bound later forgets it.
            return Err(TransportError::Unreachable {
                endpoint,
                waited: started.elapsed(),
            });
        }
        Ok(dealer)
    }

    fn closed(&self) -> RecvError {
        match self.engine.failure() {
            Some(reason) => RecvError::Backend {
                endpoint: self.endpoint.clone(),
                reason,
            },
            None => RecvError::Disconnected {
                endpoint: self.endpoint.clone(),
            },
        }
    }

    /// Receives on this thread within the spin window: from the inbox, where the
    /// progress thread may have put messages, then from MPI.
    fn receive_here(&self, comms: &Comms, deadline: Deadline) -> Result<Option<Msg>, RecvError> {
        let backend = |reason| RecvError::Backend {
            endpoint: self.endpoint.clone(),
            reason,
        };
        let waiting = self.turn.wait_here();
        // Held for the whole spin: the progress thread keeps out (it sees `waiting`
        // too), and MPI stays open.
        let turn = self.turn.take();
        let open = self.engine.shared.enter().map_err(backend)?;
        let fetch = || {
            if let Ok(msg) = self.inbox.try_recv() {
                return Ok(Some(msg));
            }
            loop {
                let limits = &self.options.limits;
                let received = here::receive(&open, comms, Some(self.router), self.tag, limits)
                    .map_err(backend)?;
                let Some((source, decoded)) = received else {
                    return Ok(None);
                };
                match decoded {
                    Ok((_, msg)) => return Ok(Some(msg)),
                    Err(reason) => self.engine.shared.drop_malformed(source, &reason),
                }
            }
        };
        let found = spin_within(deadline, fetch);
        drop((open, turn, waiting));
        let found = found?;
        if found.is_none() {
            // The progress thread receives for this dealer from now on.
            self.engine.wake();
        }
        Ok(found)
    }
}

/// Runs `fetch` once for a try, or polls it within the spin window.
fn spin_within<T>(
    deadline: Deadline,
    mut fetch: impl FnMut() -> Result<Option<T>, RecvError>,
) -> Result<Option<T>, RecvError> {
    match deadline {
        Deadline::Now => fetch(),
        Deadline::At(at) => here::spin(Some(at), fetch),
        Deadline::Forever => here::spin(None, fetch),
    }
}

impl BackendSocket for MpiDealer {
    fn options(&self) -> &SocketOptions {
        &self.options
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn watch(&self) -> Watch<'_> {
        Watch::channel(&self.inbox)
    }
}

impl BackendDealer for MpiDealer {
    fn identity(&self) -> &PeerId {
        &self.identity
    }

    fn send(&mut self, msg: Msg, deadline: Deadline) -> Result<(), SendError> {
        let hop = Hop {
            rank: self.router,
            tag: ROUTER_TAG,
            source_tag: self.tag,
        };
        queue_send(self.engine, msg, hop, &self.credits, deadline)
            .map_err(|(msg, kind)| send_error(msg, kind, &self.endpoint))
    }

    fn recv(&mut self, deadline: Deadline) -> Result<Msg, RecvError> {
        if let Some(comms) = &self.engine.here {
            if let Some(msg) = self.receive_here(comms, deadline)? {
                return Ok(msg);
            }
        }
        match deadline.recv(&self.inbox, &self.endpoint) {
            Err(RecvError::Disconnected { .. }) => Err(self.closed()),
            // A dead progress thread never fills the inbox again: say why, not "timeout".
            Err(RecvError::Timeout) => {
                Err(self
                    .engine
                    .failure()
                    .map_or(RecvError::Timeout, |reason| RecvError::Backend {
                        endpoint: self.endpoint.clone(),
                        reason,
                    }))
            }
            other => other,
        }
    }
}

impl Drop for MpiDealer {
    fn drop(&mut self) {
        let _ = self.engine.submit(Command::CloseDealer {
            tag: self.tag,
            router: self.router,
        });
    }
}

/// This rank's router.
pub(crate) type MpiRouter = InboxRouter<MpiDelivery>;

/// How this rank's router reaches its dealers, with each dealer's own credits, and
/// receives on its own thread when MPI allows. It holds the rank's router slot, and
/// frees it when dropped.
pub(crate) struct MpiDelivery {
    engine: &'static Engine,
    generation: u64,
    limits: Limits,
    /// Shared with the progress thread: who receives for this router.
    turn: Arc<Turn>,
}

impl std::fmt::Debug for MpiDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiDelivery")
            .field("generation", &self.generation)
            .finish()
    }
}

impl MpiRouter {
    pub(crate) fn bind(rank: u32, options: SocketOptions) -> Result<Self, TransportError> {
        let endpoint = format!("mpi://{rank}");
        let engine = Engine::get()?;
        target_rank(engine, rank, &endpoint)?;
        if rank != engine.world.rank {
            return Err(TransportError::InvalidEndpoint {
                endpoint,
                reason: format!(
                    "this process is rank {}; a router binds its own rank's endpoint",
                    engine.world.rank
                ),
            });
        }
        let Some(generation) = engine.claim_router() else {
            return Err(TransportError::AddrInUse {
                endpoint,
                reason: "this rank already has an mpi router".into(),
            });
        };
        let (events, inbound) = unbounded();
        let turn = Turn::new();
        if let Err(reason) = engine.submit(Command::BindRouter {
            generation,
            events,
            hwm: options.hwm,
            limits: options.limits,
            turn: turn.clone(),
        }) {
            engine.release_router(generation);
            return Err(TransportError::Backend {
                backend: "mpi",
                endpoint,
                reason,
            });
        }
        engine.note_linger(options.linger);
        let delivery = MpiDelivery {
            engine,
            generation,
            limits: options.limits,
            turn,
        };
        Ok(InboxRouter::new(endpoint, options, inbound, delivery))
    }
}

impl MpiDelivery {
    fn backend_error(&self, reason: String) -> RecvError {
        RecvError::Backend {
            endpoint: format!("mpi://{}", self.engine.world.rank),
            reason,
        }
    }

    /// One look at the router's tag, with the turn held: events first, then MPI.
    fn fetch_once(
        &self,
        open: &Open<'_>,
        comms: &Comms,
        events: &Receiver<MpiInbound>,
    ) -> Result<Option<Fetched>, RecvError> {
        if !events.is_empty() {
            return Ok(Some(Fetched::Queued));
        }
        loop {
            let received = here::receive(open, comms, None, ROUTER_TAG, &self.limits)
                .map_err(|reason| self.backend_error(reason))?;
            let Some((source, decoded)) = received else {
                return Ok(None);
            };
            let (dealer, msg) = match decoded {
                Ok(decoded) => decoded,
                Err(reason) => {
                    self.engine.shared.drop_malformed(source, &reason);
                    continue;
                }
            };
            match self.engine.shared.dealer_named(source, dealer) {
                Some(peer) => return Ok(Some(Fetched::Data(peer, msg))),
                None => self.engine.shared.drop_malformed(
                    source,
                    &format_args!("data from dealer tag {dealer}, which never said hello"),
                ),
            }
        }
    }
}

impl Delivery for MpiDelivery {
    type Route = MpiRoute;

    const MAY_FETCH: bool = true;

    fn fetch(
        &self,
        events: &Receiver<MpiInbound>,
        deadline: Deadline,
    ) -> Result<Fetched, RecvError> {
        let Some(comms) = self.engine.here.as_ref().filter(|_| self.turn.served()) else {
            return Ok(Fetched::Nothing);
        };
        let waiting = self.turn.wait_here();
        // Held for the whole spin: the progress thread keeps out (it sees `waiting`
        // too), and MPI stays open.
        let turn = self.turn.take();
        let open = self
            .engine
            .shared
            .enter()
            .map_err(|reason| self.backend_error(reason))?;
        let found = spin_within(deadline, || self.fetch_once(&open, comms, events));
        drop((open, turn, waiting));
        let found = found?;
        Ok(found.unwrap_or_else(|| {
            // The progress thread receives for this router from now on.
            self.engine.wake();
            Fetched::Nothing
        }))
    }

    fn deliver(
        &self,
        route: &MpiRoute,
        msg: Msg,
        deadline: Deadline,
    ) -> Result<(), (Msg, SendErrorKind)> {
        let hop = Hop {
            rank: route.rank,
            tag: route.tag,
            source_tag: ROUTER_TAG,
        };
        queue_send(self.engine, msg, hop, &route.credits, deadline)
    }

    fn failure(&self) -> Option<String> {
        self.engine.failure()
    }

    /// Malformed messages this process's progress thread dropped (all mpi sockets).
    fn dropped_malformed(&self) -> u64 {
        self.engine.shared.malformed()
    }
}

impl Drop for MpiDelivery {
    fn drop(&mut self) {
        self.engine.release_router(self.generation);
    }
}
