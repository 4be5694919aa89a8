//! The classic rabit protocol, worker side.
//!
//! [`ClassicClient::start`] opens the peer listener first, sends the `start` hello,
//! waits (long: the tracker answers only when the whole batch has arrived) for the
//! assignment, runs the link negotiation rounds, connecting to the peers the tracker
//! names and reporting failures, reports its listening port, and finally accepts
//! exactly the `num_accept` links of the last round. Every link starts with the peer
//! handshake: both sides send their rank, then read the other's.
//! [`ClassicClient::recover`] does the same with the `recover` command, for a worker
//! that keeps its rank and forms new links after a peer failed.
//!
//! # Examples
//!
//! ```no_run
//! use switchyard_tracker::client::{classic::ClassicClient, ClientConfig};
//! # fn main() -> Result<(), switchyard_tracker::client::ClientError> {
//! let client = ClassicClient::new("127.0.0.1", 9091, Some("worker-0".into()), ClientConfig::default())?;
//! let joined = client.start(None, None)?;
//! println!("rank {} of {}, links to {:?}", joined.rank, joined.world, joined.links.keys());
//! joined.session.print("hello from a switchyard worker")?;
//! joined.session.shutdown()?;
//! # Ok(())
//! # }
//! ```

mod assignment;
mod negotiate;
mod watch;

use super::error::At;
use super::{ClientConfig, ClientError, net};
use crate::wire::{self, Deadline, WireError};
use assignment::Assignment;
use negotiate::{Accepting, Dialled, Fields, Negotiation, Offer, Step};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Instant;
pub use watch::{DONE, WatchedLinks};

/// The task id sent when a worker has none (the reference's sentinel).
const NO_TASK: &str = "NULL";

/// A worker's handle on a classic tracker: where it is, this worker's task id, and how
/// patient to be. Cheap to clone; every command opens its own connection.
#[derive(Clone, Debug)]
pub struct ClassicClient {
    addr: SocketAddr,
    task_id: Option<String>,
    config: ClientConfig,
}

/// What the tracker assigned, and the connected links.
#[derive(Debug)]
pub struct Joined {
    /// This worker's rank.
    pub rank: u32,
    /// Number of workers.
    pub world: u32,
    /// Tree parent (`None` for the root).
    pub parent: Option<u32>,
    /// Tree neighbours (parent and children), ascending.
    pub tree: Vec<u32>,
    /// Ring predecessor (`None` in a world of one).
    pub ring_prev: Option<u32>,
    /// Ring successor (`None` in a world of one).
    pub ring_next: Option<u32>,
    /// One connected stream per linked rank (tree and ring neighbours), handshake done.
    pub links: BTreeMap<u32, TcpStream>,
    /// This host's address on the tracker connection: the address the tracker tells
    /// peers, so the one to listen on for anything else peers must reach.
    pub local_ip: IpAddr,
    /// For `print` and `shutdown`.
    pub session: ClassicSession,
}

/// A joined worker's later commands (`print`, `shutdown`), each on a new connection.
#[derive(Clone, Debug)]
pub struct ClassicSession {
    client: ClassicClient,
    rank: u32,
    world: u32,
}

impl ClassicClient {
    /// A client for the tracker at `host:port`. `task_id` identifies this worker
    /// across restarts (`DMLC_TASK_ID`; `None` sends `NULL`).
    pub fn new(
        host: &str,
        port: u16,
        task_id: Option<String>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        Ok(ClassicClient {
            addr: net::resolve(host, port)?,
            task_id: task_id.filter(|t| !t.is_empty()),
            config,
        })
    }

    /// The tracker's address.
    pub fn tracker(&self) -> SocketAddr {
        self.addr
    }

    /// Joins the job: `rank` asks for a given rank (`None`: the tracker picks),
    /// `world` a world size (`None`: the tracker's).
    pub fn start(&self, rank: Option<u32>, world: Option<u32>) -> Result<Joined, ClientError> {
        self.join("start", rank, world)
    }

    /// Rejoins the job as `rank` with rabit's `recover` command, to form a new set of
    /// links after a peer failed: the worker already holds `rank` (the tracker refuses
    /// a rank that never joined), reports no good links (every link is made afresh, so
    /// the links of an earlier generation may all be closed), and gets the same
    /// assignment back. The peers it links to are those that rejoined before it, with
    /// `recover` or, for a restarted process, `start` and its task id.
    pub fn recover(&self, rank: u32, world: Option<u32>) -> Result<Joined, ClientError> {
        self.join("recover", Some(rank), world)
    }

    /// `start` and `recover`: they differ only in the command sent, and `recover`
    /// always names the rank.
    fn join(
        &self,
        command: &'static str,
        rank: Option<u32>,
        world: Option<u32>,
    ) -> Result<Joined, ClientError> {
        let listener = net::listen_like(&self.addr)?;
        let port = listener
            .local_addr()
            .map_err(|source| ClientError::PeerIo {
                what: "reading the listening port",
                source,
            })?
            .port();
        let stream = self.command(
            rank.map_or(-1, |r| r as i32),
            world.map_or(-1, |w| w as i32),
            command,
        )?;
        let local_ip = stream
            .local_addr()
            .map_err(|source| ClientError::PeerIo {
                what: "reading the tracker connection's local address",
                source,
            })?
            .ip();
        let assignment = negotiate::assignment(self.addr, rank, self.read_assignment(&stream)?)?;
        let negotiation = self.negotiate(&stream, &assignment)?;
        let mut report = Vec::with_capacity(4);
        wire::put_i32(&mut report, i32::from(port));
        wire::write_all_within(&stream, &report, self.config.io_timeout, "listening port")
            .map_err(|e| At(self.addr).wire(command, e))?;
        drop(stream);
        let mut links = negotiation.links;
        let accepting = negotiation
            .state
            .accepting(self.config.accept_timeout, Instant::now());
        self.accept_links(&listener, accepting, &assignment, &mut links)?
            .finish()?;
        Ok(Joined {
            rank: assignment.rank,
            world: assignment.world,
            parent: assignment.parent,
            tree: assignment.tree,
            ring_prev: assignment.prev,
            ring_next: assignment.next,
            links,
            local_ip,
            session: ClassicSession {
                client: self.clone(),
                rank: assignment.rank,
                world: assignment.world,
            },
        })
    }

    /// A session for a worker that already has `rank` of `world` (to `print` or
    /// `shutdown` without having joined through this client).
    pub fn session(&self, rank: u32, world: u32) -> ClassicSession {
        ClassicSession {
            client: self.clone(),
            rank,
            world,
        }
    }

    /// Connects, exchanges the magic and sends the hello with `command`.
    fn command(
        &self,
        rank: i32,
        world: i32,
        command: &'static str,
    ) -> Result<TcpStream, ClientError> {
        let stream = net::connect_tracker(self.addr, &self.config)?;
        net::magic(&stream, self.config.io_timeout).map_err(|e| At(self.addr).wire(command, e))?;
        let mut hello = Vec::new();
        wire::put_i32(&mut hello, rank);
        wire::put_i32(&mut hello, world);
        wire::put_str(&mut hello, self.task_id.as_deref().unwrap_or(NO_TASK));
        wire::put_str(&mut hello, command);
        wire::write_all_within(&stream, &hello, self.config.io_timeout, "hello")
            .map_err(|e| At(self.addr).wire(command, e))?;
        Ok(stream)
    }

    /// docs/rabit-protocol.md, *The assignment message*, as read (the refusal checked
    /// on the first field, after which the tracker sends nothing).
    fn read_assignment(&self, stream: &TcpStream) -> Result<Fields, ClientError> {
        let e = |err| At(self.addr).wire("waiting for the assignment", err);
        // The first field comes when the whole batch is in: the long wait.
        let rank = Deadline::new(stream, self.config.batch_timeout)
            .i32("assigned rank")
            .map_err(e)?;
        if let Some(refusal) = negotiate::refused(self.addr, rank) {
            return Err(refusal);
        }
        let mut r = Deadline::new(stream, self.config.io_timeout);
        let parent = r.i32("parent").map_err(e)?;
        let world = r.i32("world size").map_err(e)?;
        let k = r
            .length("tree neighbour count", self.config.limits.max_list)
            .map_err(e)?;
        let mut tree = Vec::with_capacity(k);
        for _ in 0..k {
            tree.push(r.i32("tree neighbour").map_err(e)?);
        }
        let prev = r.i32("ring prev").map_err(e)?;
        let next = r.i32("ring next").map_err(e)?;
        Ok(Fields {
            rank,
            parent,
            world,
            tree,
            prev,
            next,
        })
    }

    /// docs/rabit-protocol.md, *Link negotiation*: performs the steps of a
    /// [`Negotiation`] until it says to accept.
    fn negotiate(&self, stream: &TcpStream, a: &Assignment) -> Result<Negotiated, ClientError> {
        let e = |err| At(self.addr).wire("link negotiation", err);
        let limit = self.config.io_timeout;
        let mut state = Negotiation::new(self.addr, a);
        let mut links: BTreeMap<u32, TcpStream> = BTreeMap::new();
        loop {
            match state.next()? {
                Step::SendLinked(ranks) => {
                    let mut good = Vec::with_capacity(4 * (ranks.len() + 1));
                    wire::put_i32(&mut good, ranks.len() as i32);
                    for r in ranks {
                        wire::put_i32(&mut good, r as i32);
                    }
                    wire::write_all_within(stream, &good, limit, "good links").map_err(e)?;
                }
                Step::ReadOffer { cap } => {
                    let mut r = Deadline::new(stream, limit);
                    let num_conn = r.length("num_conn", cap).map_err(e)?;
                    let accept = r.length("num_accept", cap).map_err(e)?;
                    let mut connect = Vec::with_capacity(num_conn);
                    for _ in 0..num_conn {
                        let host = r.str("peer host", self.config.limits.max_str).map_err(e)?;
                        let port = r.i32("peer port").map_err(e)?;
                        let rank = r.i32("peer rank").map_err(e)?;
                        connect.push((host, port, rank));
                    }
                    state.on_offer(Offer { connect, accept })?;
                }
                Step::Dial { host, port, rank } => {
                    let (outcome, stream) = self.link_to(&host, port, rank, a.rank);
                    if state.on_dialled(outcome)? {
                        links.extend(stream.map(|s| (rank, s)));
                    }
                }
                Step::SendFailed(failed) => {
                    // A link made in this negotiation whose peer left: do not report
                    // it (nor, after the last round, a port that would draw peers into
                    // a set of links that cannot form).
                    if self.config.watch_links {
                        if let Some(rank) = closed_link(&links, a.prev) {
                            return Err(ClientError::LinkClosed {
                                rank,
                                during: "while negotiating",
                            });
                        }
                    }
                    let mut report = Vec::with_capacity(4);
                    wire::put_i32(&mut report, failed);
                    wire::write_all_within(stream, &report, limit, "failed connects").map_err(e)?;
                }
                Step::Accept(_) => return Ok(Negotiated { links, state }),
            }
        }
    }

    /// Connects to `rank` at `host:port` and runs the handshake: what happened, and
    /// the connection if the peer answered.
    fn link_to(&self, host: &str, port: u16, rank: u32, me: u32) -> (Dialled, Option<TcpStream>) {
        let Ok(addr) = net::resolve(host, port) else {
            return (Dialled::Unreachable, None);
        };
        let Ok(stream) = net::connect_peer(addr, &self.config) else {
            tracing::debug!(%addr, rank, "peer connect failed; reporting it to the tracker");
            return (Dialled::Unreachable, None);
        };
        match handshake(&stream, me, &self.config) {
            Ok(got) => (
                Dialled::Answered {
                    peer: addr,
                    rank: got,
                },
                Some(stream),
            ),
            Err(err) => {
                tracing::debug!(%addr, rank, error = %err, "peer handshake failed; reporting it");
                (Dialled::Unreachable, None)
            }
        }
    }

    /// Accepts the peers [`Accepting`] waits for, each kept under the rank it says
    /// it is.
    fn accept_links(
        &self,
        listener: &TcpListener,
        mut state: Accepting,
        a: &Assignment,
        links: &mut BTreeMap<u32, TcpStream>,
    ) -> Result<Accepting, ClientError> {
        let (me, watch) = (a.rank, self.config.watch_links);
        let left = |links: &BTreeMap<u32, TcpStream>| {
            watch
                .then(|| closed_link(links, a.prev))
                .flatten()
                .map(|rank| ClientError::LinkClosed {
                    rank,
                    during: "while accepting peers",
                })
        };
        while state.wants_more() {
            let accepted = net::accept_until(listener, state.deadline(), || left(links).is_some())
                .map_err(|source| ClientError::PeerIo {
                    what: "accepting a peer",
                    source,
                })?;
            // Checked again before the handshake: a peer whose handshake this worker
            // answers counts the link as made, and must not be drawn into a set of
            // links that has already lost one.
            if let Some(e) = left(links) {
                return Err(e);
            }
            let Some((stream, peer)) = accepted else {
                return Err(state.on_timeout(Instant::now()));
            };
            let rank =
                handshake(&stream, me, &self.config).map_err(|source| ClientError::Peer {
                    peer: peer.to_string(),
                    rank: None,
                    source,
                })?;
            links.insert(state.on_accepted(peer, rank)?, stream);
        }
        Ok(state)
    }
}

/// A finished negotiation: the links it made, and its state for the accepting.
struct Negotiated {
    links: BTreeMap<u32, TcpStream>,
    state: Negotiation,
}

impl ClassicSession {
    /// This worker's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of workers.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Sends `text` to the tracker's log (`print`).
    pub fn print(&self, text: &str) -> Result<(), ClientError> {
        let c = &self.client;
        let stream = c.command(self.rank as i32, self.world as i32, "print")?;
        let mut body = Vec::new();
        wire::put_str(&mut body, text);
        wire::write_all_within(&stream, &body, c.config.io_timeout, "print text")
            .map_err(|e| At(c.addr).wire("print", e))
    }

    /// Reports rank `rank`'s start `attempt` as silent
    /// ([`SILENT_COMMAND`](crate::SILENT_COMMAND)): a switchyard launcher
    /// kills that process so that it is restarted. Meant for the robust engine; a
    /// tracker of rabit's refuses the command.
    pub fn report_silent(&self, rank: u32, attempt: u32, reason: &str) -> Result<(), ClientError> {
        let c = &self.client;
        let command = crate::common::SILENT_COMMAND;
        let stream = c.command(self.rank as i32, self.world as i32, command)?;
        let mut body = Vec::new();
        wire::put_i32(&mut body, i32::try_from(rank).unwrap_or(i32::MAX));
        wire::put_i32(&mut body, i32::try_from(attempt).unwrap_or(i32::MAX));
        wire::put_str(&mut body, reason);
        wire::write_all_within(&stream, &body, c.config.io_timeout, "silent report")
            .map_err(|e| At(c.addr).wire(command, e))
    }

    /// Tells the tracker this worker is done (`shutdown`). Send it once, after every
    /// link is closed or no longer needed.
    pub fn shutdown(&self) -> Result<(), ClientError> {
        self.client
            .command(self.rank as i32, self.world as i32, "shutdown")
            .map(drop)
    }
}

/// The first of `links` (by rank) whose peer left this set of links, if any: it closed
/// or reset the link, or sent something on a link other than the one from `sender`
/// (the ring predecessor, whose mesh endpoint exchange may begin before this join is
/// over). Its other peers send nothing before this join is over but the mark that
/// their own endpoint exchange is over ([`DONE`]), which they cannot reach on a ring
/// that includes this join: such a peer finished with an earlier attempt of this rank.
fn closed_link(links: &BTreeMap<u32, TcpStream>, sender: Option<u32>) -> Option<u32> {
    links
        .iter()
        .find(|(rank, stream)| has_left(stream, sender != Some(**rank)))
        .map(|(rank, _)| *rank)
}

/// Whether the peer on `stream` closed or reset it, or (with `silent`) sent anything.
fn has_left(stream: &TcpStream, silent: bool) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let left = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => silent,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    };
    stream.set_nonblocking(false).is_err() || left
}

/// docs/rabit-protocol.md, *The peer handshake*: send our rank, read the peer's.
fn handshake(stream: &TcpStream, me: u32, config: &ClientConfig) -> Result<i32, WireError> {
    let mut buf = Vec::with_capacity(4);
    wire::put_i32(&mut buf, me as i32);
    wire::write_all_within(stream, &buf, config.io_timeout, "peer handshake")?;
    Deadline::new(stream, config.io_timeout).i32("peer rank")
}
