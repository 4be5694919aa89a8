//! A server: holds its share of the keys and answers workers' requests.

use super::data::{Back, DataLink};
use super::node::{self, Node};
use super::replica::{self, ReplicaLink};
use super::routing::{Incoming, Routed, Routing, Shape};
use super::store::{Answer, Reply};
use super::update::{Mode, Update};
use super::wire::{self, Group, NodeRole};
use super::{PsConfig, PsError, Value};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;
use switchyard_transports::{Pollable, Poller, RecvError, Router, RouterSocket, Socket};

/// How long a server with a data plane waits on it before it looks at its ZeroMQ
/// sockets again (the control messages' delay at most).
pub(crate) const DATA_SLICE: Duration = Duration::from_millis(1);

/// While values keep coming on the data plane, how often a node looks at its ZeroMQ
/// sockets (the scheduler's notes, control messages, the replica's acknowledgements):
/// each look is a system call or more, and a round of small values takes less.
pub(crate) const CONTROL_EVERY: Duration = Duration::from_micros(200);

/// A server of a parameter-server job, registered and ready to [`run`](KvServer::run).
///
/// # Examples
///
/// A whole job in one process: scheduler, one server, one worker, as threads.
///
/// ```
/// use switchyard_ps::{KvServer, KvWorker, Mode, PsConfig, Scheduler, Update};
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let config = PsConfig::new(1, 1);
/// let scheduler = Scheduler::bind("local://ps-server-doc", &config)?;
/// let endpoint = scheduler.endpoint().to_string();
/// let sched = std::thread::spawn(move || scheduler.run());
/// let (e, c) = (endpoint.clone(), config.clone());
/// let server = std::thread::spawn(move || {
///     KvServer::<f32>::join(&e, &c, Mode::Sync, Update::Sum)?.run()
/// });
/// let mut worker = KvWorker::<f32>::join(&endpoint, &config)?;
/// worker.push(&[1, 2], &[2, 1], vec![1.0, 2.0, 3.0])?;
/// let summed = worker.push_pull(&[1, 2], &[2, 1], vec![1.0, 1.0, 1.0])?;
/// assert_eq!(summed.values(), [2.0, 3.0, 4.0]);
/// assert_eq!(worker.pull(&[2])?.get(0), Some(&[4.0][..]));
/// worker.finish()?;
/// server.join().expect("server thread")?;
/// sched.join().expect("scheduler thread")?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct KvServer<T: Value> {
    node: Node,
    router: RouterSocket,
    /// The data plane, when the job opened one: values come and go there.
    data: Option<DataLink>,
    mode: Mode,
    update: Update<T>,
    early: VecDeque<(Back, Msg)>,
    poller: Poller,
    _values: PhantomData<T>,
}

/// What a server did, returned by [`KvServer::run`] when the job ends well.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerReport {
    /// The server's rank.
    pub rank: u32,
    /// Rounds completed (sync) or pushes applied (async), over all keys.
    pub rounds: u64,
    /// Requests answered.
    pub requests: u64,
}

impl<T: Value> KvServer<T> {
    /// Binds the server's socket and registers with the scheduler at `scheduler`.
    pub fn join(
        scheduler: &str,
        config: &PsConfig,
        mode: Mode,
        update: Update<T>,
    ) -> Result<Self, PsError> {
        let endpoint = node::server_bind_endpoint(scheduler, config.host.as_deref())?;
        let router = RouterSocket::bind(&endpoint, config.socket.clone())
            .map_err(|e| PsError::transport(format!("server binding {endpoint}"), e))?;
        let mut node = Node::join(
            scheduler,
            NodeRole::Server,
            router.endpoint().to_string(),
            config,
        )?;
        let data = node.data.take();
        Ok(KvServer {
            node,
            router,
            data,
            mode,
            update,
            early: VecDeque::new(),
            poller: Poller::new(),
            _values: PhantomData,
        })
    }

    /// The server's rank (0-based, among servers).
    pub fn rank(&self) -> usize {
        self.node.rank as usize
    }

    /// Whether this server's values travel on the data plane.
    #[cfg(test)]
    pub(crate) fn on_data_plane(&self) -> bool {
        self.data.is_some()
    }

    /// The endpoint workers reach this server at.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Waits until every node of `group` (servers or all) has reached the barrier.
    /// Requests that arrive meanwhile are kept for [`KvServer::run`].
    pub fn barrier(&mut self, group: Group) -> Result<(), PsError> {
        let (router, early, data) = (&mut self.router, &mut self.early, &mut self.data);
        self.node.barrier(group, || {
            while let Ok((peer, msg)) = router.try_recv_from() {
                early.push_back((Back::Zmq(peer), msg));
            }
            while let Some(plane) = data.as_mut() {
                match plane.recv(Instant::now()) {
                    Ok(Some((from, msg))) => early.push_back((Back::Link(from), msg)),
                    _ => break,
                }
            }
        })
    }

    /// Serves until the scheduler ends the job: `Ok` when it shut the job down, the
    /// error when it aborted it or fell silent.
    pub fn run(self) -> Result<ServerReport, PsError> {
        self.run_until(&AtomicBool::new(false))
    }

    /// [`KvServer::run`], returning at once, without a word to anyone, when `kill`
    /// is set: a server dying mid-job, for the failover tests (`replication_tests`).
    ///
    /// The `routing` module makes the decisions; this loop receives, sends and keeps
    /// the replica line.
    pub(crate) fn run_until(mut self, kill: &AtomicBool) -> Result<ServerReport, PsError> {
        let rank = self.node.rank;
        let name = format!("server {rank} at {}", self.router.endpoint());
        let servers = self.node.servers.len() as u32;
        let replicate = self.node.config.replicate && servers > 1;
        let shape = Shape {
            rank,
            servers,
            workers: self.node.num_workers as usize,
            replicate,
        };
        let mut routing = Routing::new(shape, name.clone(), self.mode, self.update.clone());
        let mut link = replicate.then(|| {
            let target = (rank + 1) % servers;
            let endpoint = self.node.servers[target as usize].clone();
            ReplicaLink::start(target, &endpoint, self.node.config.socket.clone())
        });
        let mut looked = Instant::now();
        loop {
            if kill.load(Ordering::Relaxed) {
                return Err(PsError::Aborted {
                    reason: format!("{name} killed"),
                });
            }
            let control = self.data.is_none() || looked.elapsed() >= CONTROL_EVERY;
            if control {
                looked = Instant::now();
            }
            let state = if control { self.node.check() } else { Ok(()) };
            match state {
                Ok(()) => {}
                Err(PsError::Finished) => return Ok(routing.report()),
                Err(e) => return Err(e),
            }
            let failovers = if control {
                self.node.take_failovers()
            } else {
                Vec::new()
            };
            for (dead, by) in failovers {
                let routed = routing.failover(dead, by)?;
                self.send(&name, &mut link, routed)?;
                if link.as_ref().is_some_and(|l| l.target == dead) {
                    // Our replica is gone: nothing will acknowledge what it held.
                    for reply in link
                        .take()
                        .map(ReplicaLink::release_all)
                        .unwrap_or_default()
                    {
                        self.answer(&name, reply);
                    }
                }
            }
            if let Some(l) = link.as_mut().filter(|_| control) {
                for reply in l.pump()? {
                    self.answer(&name, reply);
                }
            }
            let got = match self.early.pop_front() {
                Some(got) => Ok(got),
                None => self.receive(link.as_ref(), control),
            };
            let (peer, msg) = match got {
                Ok(got) => got,
                Err(RecvError::Timeout | RecvError::Empty) => continue,
                Err(e) => return Err(PsError::protocol(&name, e)),
            };
            if msg.header.kind == wire::REPLICA {
                let primary = msg.header.src.id;
                match routing.keep_replica(primary, &msg) {
                    Ok(()) => {
                        let ack = replica::ack(self.node.addr(), &msg);
                        let Back::Zmq(peer) = &peer else {
                            continue;
                        };
                        if let Err(e) = self.router.send_to(peer, ack) {
                            tracing::warn!(
                                "ps {name}: acknowledgement to server {primary} lost: {}",
                                e.kind
                            );
                        }
                    }
                    Err(e) => tracing::warn!("ps {name}: {e}"),
                }
                continue;
            }
            let from_link = matches!(peer, Back::Link(_));
            let incoming = Incoming::decode(peer, &msg, routing.pool());
            if let (true, Some(data)) = (from_link, self.data.as_mut()) {
                // The values are in the store's own buffer now.
                msg.into_parts().1.into_iter().for_each(|f| data.recycle(f));
            }
            let routed = routing.route(incoming);
            self.send(&name, &mut link, routed)?;
            // The frames whose values a round summed in place, back to the data
            // plane's receive buffers.
            for frame in routing.pool().take_spent() {
                if let Some(data) = self.data.as_mut() {
                    data.recycle(frame);
                }
            }
        }
    }

    /// Sends what the routing decided: the replies at once, or, when this server's
    /// own values changed and it replicates, through the replica line, which releases
    /// the replies once the replica has the values.
    fn send(
        &mut self,
        name: &str,
        link: &mut Option<ReplicaLink>,
        routed: Routed<T>,
    ) -> Result<(), PsError> {
        match link.as_mut() {
            Some(l) if !routed.changed.is_empty() => {
                l.replicate(self.node.addr(), routed.changed, routed.replies)
            }
            _ => {
                for reply in routed.replies {
                    self.answer(name, reply);
                }
                Ok(())
            }
        }
    }

    /// The next message from a worker or a replicating server, waiting one slice at
    /// most, while also watching the replica line for acknowledgements. With a data
    /// plane: a control message waiting on ZeroMQ (looked for when `control`), else
    /// the next value message, waiting [`DATA_SLICE`] at most.
    fn receive(
        &mut self,
        link: Option<&ReplicaLink>,
        control: bool,
    ) -> Result<(Back, Msg), RecvError> {
        if let Some(data) = self.data.as_mut() {
            if control {
                if let Ok((peer, msg)) = self.router.try_recv_from() {
                    return Ok((Back::Zmq(peer), msg));
                }
            }
            return match data.recv(Instant::now() + DATA_SLICE) {
                Ok(Some((from, msg))) => Ok((Back::Link(from), msg)),
                Ok(None) => Err(RecvError::Timeout),
                Err(e) => Err(RecvError::Backend {
                    endpoint: "the data plane".into(),
                    reason: e.to_string(),
                }),
            };
        }
        let Some(dealer) = link.and_then(ReplicaLink::dealer) else {
            return self
                .router
                .recv_from_timeout(node::SLICE)
                .map(|(peer, msg)| (Back::Zmq(peer), msg));
        };
        let ready = self
            .poller
            .poll(
                &[&self.router as &dyn Pollable, dealer as &dyn Pollable],
                node::SLICE,
            )
            .map_err(|e| RecvError::Backend {
                endpoint: self.router.endpoint().to_string(),
                reason: e.to_string(),
            })?;
        match ready {
            Some(0) => self
                .router
                .try_recv_from()
                .map(|(peer, msg)| (Back::Zmq(peer), msg)),
            _ => Err(RecvError::Empty),
        }
    }

    fn answer(&mut self, name: &str, reply: Reply<Back>) {
        // The reply names the server whose keys it is about, which is not this one
        // for keys served after a failover: the worker counts answers by it.
        let me = wire::addr(NodeRole::Server, reply.primary);
        let to = wire::addr(NodeRole::Worker, 0);
        let msg = match reply.body {
            Ok(Answer::Values(meta, frames)) => {
                wire::kv_msg(me, to, wire::REPLY, reply.id, &meta, frames)
            }
            Ok(Answer::Hold(answer)) => Ok(answer.msg(me, to, reply.id)),
            Err(refusal) => Ok(refusal.msg(me, to, reply.id)),
        };
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!("ps {name}: {e}");
                return;
            }
        };
        match (&reply.peer, self.data.as_mut()) {
            (Back::Link(rank), Some(data)) => {
                if let Err(e) = data.send(*rank, msg) {
                    tracing::warn!("ps {name}: reply to {} lost: {e}", reply.peer);
                }
            }
            (Back::Link(_), None) => {
                tracing::warn!("ps {name}: reply to {} lost: no data plane", reply.peer)
            }
            (Back::Zmq(peer), _) => {
                if let Err(e) = self.router.send_to(peer, msg) {
                    tracing::warn!("ps {name}: reply to {} lost: {}", reply.peer, e.kind);
                }
            }
        }
    }
}
