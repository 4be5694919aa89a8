//! A server: holds its share of the keys and answers workers' requests.

use super::node::{self, Node};
use super::store::{Mode, Op, Reply, Request, Store, Update};
use super::wire::{self, Group, NodeRole};
use super::{PsConfig, PsError, Value};
use std::collections::VecDeque;
use std::marker::PhantomData;
use switchyard_msg::Msg;
use switchyard_transports::{PeerId, RecvError, Router, RouterSocket, Socket};

/// A server of a parameter-server job, registered and ready to [`run`](KvServer::run).
///
/// # Examples
///
/// A whole job in one process: scheduler, one server, one worker, as threads.
///
/// ```
/// use switchyard::ps::{KvServer, KvWorker, Mode, PsConfig, Scheduler, Update};
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
    mode: Mode,
    update: Update<T>,
    early: VecDeque<(PeerId, Msg)>,
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
        let node = Node::join(
            scheduler,
            NodeRole::Server,
            router.endpoint().to_string(),
            config,
        )?;
        Ok(KvServer {
            node,
            router,
            mode,
            update,
            early: VecDeque::new(),
            _values: PhantomData,
        })
    }

    /// The server's rank (0-based, among servers).
    pub fn rank(&self) -> u32 {
        self.node.rank
    }

    /// The endpoint workers reach this server at.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Waits until every node of `group` (servers or all) has reached the barrier.
    /// Requests that arrive meanwhile are kept for [`KvServer::run`].
    pub fn barrier(&mut self, group: Group) -> Result<(), PsError> {
        let (router, early) = (&mut self.router, &mut self.early);
        self.node.barrier(group, || {
            while let Ok(got) = router.try_recv_from() {
                early.push_back(got);
            }
        })
    }

    /// Serves until the scheduler ends the job: `Ok` when it shut the job down, the
    /// error when it aborted it or fell silent.
    pub fn run(mut self) -> Result<ServerReport, PsError> {
        let name = format!("server {} at {}", self.node.rank, self.router.endpoint());
        let mut store = Store::<T, PeerId>::new(
            name.clone(),
            self.mode,
            self.node.num_workers as usize,
            self.update.clone(),
        );
        let mut requests = 0u64;
        loop {
            match self.node.check() {
                Ok(()) => {}
                Err(PsError::Finished) => {
                    return Ok(ServerReport {
                        rank: self.node.rank,
                        rounds: store.rounds(),
                        requests,
                    });
                }
                Err(e) => return Err(e),
            }
            let got = match self.early.pop_front() {
                Some(got) => Ok(got),
                None => self.router.recv_from_timeout(node::SLICE),
            };
            let (peer, msg) = match got {
                Ok(got) => got,
                Err(RecvError::Timeout | RecvError::Empty) => continue,
                Err(e) => return Err(PsError::protocol(&name, e)),
            };
            requests += 1;
            let replies = match decode::<T>(&msg, &peer) {
                Ok(req) => store.handle(peer, req),
                Err(e) => {
                    tracing::warn!("ps {name}: {e}");
                    vec![Reply {
                        peer,
                        id: msg.header.seq,
                        body: Err(e.to_string()),
                    }]
                }
            };
            for reply in replies {
                self.answer(&name, reply);
            }
        }
    }

    fn answer(&mut self, name: &str, reply: Reply<PeerId>) {
        let me = self.node.addr();
        let to = wire::addr(NodeRole::Worker, 0);
        let msg = match reply.body {
            Ok((meta, frames)) => wire::kv_msg(me, to, wire::REPLY, reply.id, &meta, frames),
            Err(reason) => Ok(Msg::new(me, to, wire::REFUSE)
                .with_seq(reply.id)
                .with_frame(reason.into_bytes())),
        };
        match msg {
            Ok(msg) => {
                if let Err(e) = self.router.send_to(&reply.peer, msg) {
                    tracing::warn!("ps {name}: reply to {} lost: {}", reply.peer, e.kind);
                }
            }
            Err(e) => tracing::warn!("ps {name}: {e}"),
        }
    }
}

fn decode<T: Value>(msg: &Msg, peer: &PeerId) -> Result<Request<T>, PsError> {
    let from = format!("worker {} ({peer})", msg.header.src.id);
    let op = match msg.header.kind {
        k if k == wire::PUSH => Op::Push,
        k if k == wire::PUSH_PULL => Op::PushPull,
        k if k == wire::PULL => Op::Pull,
        k if k == wire::INIT => Op::Init,
        other => return Err(PsError::protocol(from, format!("unexpected {other:?}"))),
    };
    let (meta, count) = wire::read_meta(msg, &from)?;
    let values = if op == Op::Pull {
        Vec::new()
    } else {
        wire::read_values::<T>(msg, count, &from)?
    };
    Ok(Request {
        worker: msg.header.src.id,
        id: msg.header.seq,
        op,
        meta,
        values,
    })
}
