//! The mpi backend's sockets: a dealer talking to one rank's router, and this rank's
//! router. Both only queue commands for the progress thread ([`super::engine`]).

use super::engine::{self, Command, Credits, Engine, ROUTER_TAG};
use super::wire;
use crate::backend::inbox::RouterInbox;
use crate::{PeerId, RecvError, SendError, SendErrorKind, SocketOptions, TransportError};
use crossbeam_channel::{unbounded, Receiver};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_msg::Msg;

fn send_error(msg: Msg, kind: SendErrorKind, endpoint: &str) -> SendError {
    SendError {
        msg,
        kind,
        endpoint: endpoint.to_string(),
    }
}

/// Where a send goes: the destination rank and socket tag, and the sender's own tag.
struct Hop {
    rank: i32,
    tag: i32,
    source_tag: i32,
}

/// Encodes, takes a credit (waiting until `deadline`, or not at all), and queues.
fn queue_send(
    engine: &Engine,
    msg: Msg,
    hop: Hop,
    credits: &Arc<Credits>,
    deadline: Option<Instant>,
    endpoint: &str,
) -> Result<(), SendError> {
    let encoded = match wire::encode(&msg, hop.source_tag) {
        Ok(encoded) => encoded,
        Err(reason) => return Err(send_error(msg, SendErrorKind::Backend(reason), endpoint)),
    };
    if !credits.acquire(deadline) {
        let kind = if deadline.is_some() {
            SendErrorKind::Timeout
        } else {
            SendErrorKind::Full
        };
        return Err(send_error(msg, kind, endpoint));
    }
    let command = Command::Send {
        dest: hop.rank,
        tag: hop.tag,
        encoded,
        credits: credits.clone(),
    };
    engine
        .submit(command)
        .map_err(|reason| send_error(msg, SendErrorKind::Backend(reason), endpoint))
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

    pub(crate) fn identity(&self) -> &PeerId {
        &self.identity
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn send_deadline(
        &mut self,
        msg: Msg,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        queue_send(
            self.engine,
            msg,
            Hop {
                rank: self.router,
                tag: ROUTER_TAG,
                source_tag: self.tag,
            },
            &self.credits,
            deadline,
            &self.endpoint,
        )
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

    pub(crate) fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        let received = match deadline {
            Some(deadline) => self.inbox.recv_deadline(deadline).map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => RecvError::Timeout,
                crossbeam_channel::RecvTimeoutError::Disconnected => self.closed(),
            }),
            None => self.inbox.recv().map_err(|_| self.closed()),
        };
        // A dead progress thread never fills the inbox again: say why, not "timeout".
        match received {
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

    pub(crate) fn try_recv(&mut self) -> Result<Msg, RecvError> {
        self.inbox.try_recv().map_err(|_| RecvError::Empty)
    }

    pub(crate) fn receiver(&self) -> &Receiver<Msg> {
        &self.inbox
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.inbox.is_empty()
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
pub(crate) struct MpiRouter {
    engine: &'static Engine,
    generation: u64,
    options: SocketOptions,
    inbox: RouterInbox<engine::MpiRoute>,
}

impl std::fmt::Debug for MpiRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiRouter")
            .field("endpoint", &self.inbox.endpoint())
            .field("peers", &self.inbox.peers().len())
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
        if let Err(reason) = engine.submit(Command::BindRouter {
            generation,
            events,
            hwm: options.hwm,
            limits: options.limits,
        }) {
            engine.release_router(generation);
            return Err(TransportError::Backend {
                backend: "mpi",
                endpoint,
                reason,
            });
        }
        engine.note_linger(options.linger);
        Ok(MpiRouter {
            engine,
            generation,
            inbox: RouterInbox::new(endpoint, options.hwm, inbound),
            options,
        })
    }

    pub(crate) fn options(&self) -> &SocketOptions {
        &self.options
    }

    pub(crate) fn endpoint(&self) -> &str {
        self.inbox.endpoint()
    }

    pub(crate) fn await_peers(
        &mut self,
        expected: usize,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        self.inbox.await_peers(expected, timeout)
    }

    pub(crate) fn recv_from_deadline(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<(PeerId, Msg), RecvError> {
        match self.inbox.recv_from_deadline(deadline) {
            Err(RecvError::Timeout) => {
                Err(self
                    .engine
                    .failure()
                    .map_or(RecvError::Timeout, |reason| RecvError::Backend {
                        endpoint: self.inbox.endpoint().to_string(),
                        reason,
                    }))
            }
            other => other,
        }
    }

    pub(crate) fn try_recv_from(&mut self) -> Result<(PeerId, Msg), RecvError> {
        self.inbox.try_recv_from()
    }

    pub(crate) fn send_to_deadline(
        &mut self,
        peer: &PeerId,
        msg: Msg,
        deadline: Option<Instant>,
    ) -> Result<(), SendError> {
        let Some(route) = self.inbox.route(peer).cloned() else {
            return Err(send_error(
                msg,
                SendErrorKind::UnknownPeer(peer.clone()),
                self.inbox.endpoint(),
            ));
        };
        queue_send(
            self.engine,
            msg,
            Hop {
                rank: route.rank,
                tag: route.tag,
                source_tag: ROUTER_TAG,
            },
            &route.credits,
            deadline,
            self.inbox.endpoint(),
        )
    }

    pub(crate) fn peers(&self) -> Vec<PeerId> {
        self.inbox.peers()
    }

    /// Malformed messages this process's progress thread dropped (all mpi sockets).
    pub(crate) fn dropped_malformed(&self) -> u64 {
        self.engine.malformed.load(Ordering::Relaxed)
    }

    pub(crate) fn receiver(&self) -> &Receiver<engine::MpiInbound> {
        self.inbox.receiver()
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.inbox.has_pending()
    }
}

impl Drop for MpiRouter {
    fn drop(&mut self) {
        self.engine.release_router(self.generation);
    }
}
