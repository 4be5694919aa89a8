//! The JSON protocol of XGBoost ≥ 2.1, worker side.
//!
//! [`JsonClient::start`] listens on a peer port and an error port, sends the `start`
//! hello and command, reads `{"world_size"}` at once and, when the whole batch has
//! arrived, the frame naming its ring successor; its own rank is the successor's minus
//! one. It then connects to the successor, accepts its predecessor, and runs the ring
//! bootstrap (docs/xgboost-protocol.md, *The ring bootstrap*: the allgather of 64-byte
//! host slots and `i32` ports), so the ring links begin exactly as XGBoost's do. Links
//! beyond the ring (*Links beyond the ring* there) are not made: a job of switchyard
//! workers builds what else it needs over the ring.
//!
//! The error listener runs on a thread of its own: a tracker (or anyone) that sends
//! `1` or `-1` there marks the session failed ([`JsonSession::error_signalled`]),
//! and `0` stops the thread, which is what [`JsonSession::shutdown`] (or dropping the
//! last handle) sends.
//!
//! # Examples
//!
//! ```no_run
//! use switchyard_tracker::client::{json::JsonClient, ClientConfig};
//! # fn main() -> Result<(), switchyard_tracker::client::ClientError> {
//! let client = JsonClient::new("127.0.0.1", 9091, Some("w0".into()), ClientConfig::default())?;
//! let joined = client.start()?;
//! println!("rank {} of {}", joined.rank, joined.world);
//! joined.session.print("hello")?;
//! joined.session.shutdown()?;
//! # Ok(())
//! # }
//! ```

mod error_port;
mod ring;

use super::error::At;
use super::{ClientConfig, ClientError, net};
use crate::wire::{self, Deadline, WireError};
use error_port::ErrorWatch;
use ring::RingBootstrap;
use serde::Deserialize;
use serde_json::json;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest wait for the tracker to close a `print` connection.
const PRINT_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Command codes (docs/xgboost-protocol.md, *One tracker connection*).
const CMD_START: i32 = 1;
const CMD_SHUTDOWN: i32 = 2;
const CMD_ERROR: i32 = 3;
const CMD_PRINT: i32 = 4;

/// A worker's handle on a JSON-protocol tracker. Cheap to clone; every command opens
/// its own connection.
#[derive(Clone, Debug)]
pub struct JsonClient {
    addr: SocketAddr,
    task_id: String,
    config: ClientConfig,
}

/// A joined worker: its rank and its two ring links.
#[derive(Debug)]
pub struct Joined {
    /// This worker's rank (its successor's rank minus one).
    pub rank: u32,
    /// Number of workers.
    pub world: u32,
    /// The link this worker opened to rank `rank + 1` (its own listener in a world of
    /// one).
    pub successor: TcpStream,
    /// The link rank `rank − 1` opened to this worker.
    pub predecessor: TcpStream,
    /// This host's address on the tracker connection (what the tracker tells peers).
    pub local_ip: IpAddr,
    /// For `print` and `shutdown`.
    pub session: JsonSession,
}

/// A joined worker's later commands, and its error listener.
#[derive(Clone, Debug)]
pub struct JsonSession {
    client: JsonClient,
    rank: u32,
    world: u32,
    errors: Arc<ErrorWatch>,
}

#[derive(Deserialize)]
struct WorldFrame {
    world_size: i64,
}

#[derive(Deserialize)]
struct PeerFrame {
    host: String,
    port: i64,
    rank: i64,
}

impl JsonClient {
    /// A client for the tracker at `host:port`; `task_id` orders ranks (`None` sends
    /// `""`).
    pub fn new(
        host: &str,
        port: u16,
        task_id: Option<String>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        Ok(JsonClient {
            addr: net::resolve(host, port)?,
            task_id: task_id.unwrap_or_default(),
            config,
        })
    }

    /// Joins the job (see the [module docs](self)).
    pub fn start(&self) -> Result<Joined, ClientError> {
        let peers = net::listen_like(&self.addr)?;
        let errors = ErrorWatch::start(net::listen_like(&self.addr)?)?;
        let port = local_port(&peers)?;
        let stream = self.command(
            0,
            -1,
            &json!({"cmd": CMD_START, "error_port": errors.port, "port": port}),
            "start",
        )?;
        let local_ip = stream
            .local_addr()
            .map_err(|source| ClientError::PeerIo {
                what: "reading the tracker connection's local address",
                source,
            })?
            .ip();
        let e = |err| At(self.addr).wire("start", err);
        let limits = self.config.limits;
        let world: WorldFrame = Deadline::new(&stream, self.config.io_timeout)
            .json("world size frame", limits.max_frame)
            .map_err(e)?;
        let world = ring::world(self.addr, world.world_size)?;
        let peer: PeerFrame = Deadline::new(&stream, self.config.batch_timeout)
            .json("peer frame", limits.max_frame)
            .map_err(e)?;
        drop(stream);
        let place = ring::place(self.addr, world, peer.host, peer.port, peer.rank)?;
        let rank = place.rank;
        let next_addr = net::resolve(&place.next_host, place.next_port)?;
        let successor = self.connect_successor(next_addr)?;
        let proving =
            net::prove_in_background(&successor).map_err(|source| ClientError::PeerIo {
                what: "proving the job secret to the ring successor",
                source,
            })?;
        let predecessor = self.accept_predecessor(&peers)?;
        proving
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the proving thread panicked")))
            .map_err(|source| ClientError::PeerIo {
                what: "proving the job secret to the ring successor",
                source,
            })?;
        self.ring_bootstrap(
            RingBootstrap::new(&place, world, port),
            &successor,
            &predecessor,
        )?;
        Ok(Joined {
            rank,
            world,
            successor,
            predecessor,
            local_ip,
            session: JsonSession {
                client: self.clone(),
                rank,
                world,
                errors: Arc::new(errors),
            },
        })
    }

    /// Connects, exchanges the magic, sends the hello and the command frame.
    fn command(
        &self,
        rank: i64,
        world: i64,
        command: &serde_json::Value,
        step: &'static str,
    ) -> Result<TcpStream, ClientError> {
        let stream = net::connect_tracker(self.addr, &self.config)?;
        net::magic(&stream, self.config.io_timeout).map_err(|e| At(self.addr).wire(step, e))?;
        let mut out = Vec::new();
        wire::put_json(
            &mut out,
            &json!({"rank": rank, "task_id": self.task_id, "world_size": world}),
        );
        wire::put_json(&mut out, command);
        wire::write_all_within(&stream, &out, self.config.io_timeout, "hello and command")
            .map_err(|e| At(self.addr).wire(step, e))?;
        Ok(stream)
    }

    /// The successor listens since before its `start`: a refused connect means it is
    /// gone or not yet up, so retry on the tracker's schedule.
    fn connect_successor(&self, addr: SocketAddr) -> Result<TcpStream, ClientError> {
        let mut retries = self.config.retries();
        loop {
            match net::connect_peer_unproven(addr, &self.config) {
                Ok(s) => return Ok(s),
                Err(source) => match retries.on_failure() {
                    None => {
                        return Err(ClientError::PeerIo {
                            what: "connecting to the ring successor",
                            source,
                        });
                    }
                    Some(sleep) => std::thread::sleep(sleep),
                },
            }
        }
    }

    fn accept_predecessor(&self, listener: &TcpListener) -> Result<TcpStream, ClientError> {
        let started = Instant::now();
        match net::accept_until(listener, started + self.config.accept_timeout, || false) {
            Ok(Some((stream, _))) => Ok(stream),
            Ok(None) => Err(ClientError::AcceptTimeout {
                got: 0,
                expected: 1,
                waited: started.elapsed(),
            }),
            Err(source) => Err(ClientError::PeerIo {
                what: "accepting the ring predecessor",
                source,
            }),
        }
    }

    /// docs/xgboost-protocol.md, *The ring bootstrap*: moves the slots `ring` names
    /// between the two ring links, then has it check the result.
    fn ring_bootstrap(
        &self,
        mut ring: RingBootstrap,
        successor: &TcpStream,
        predecessor: &TcpStream,
    ) -> Result<(), ClientError> {
        let predecessor_rank = ring.predecessor();
        let peer_err = |source: WireError| ClientError::Peer {
            peer: "ring bootstrap".into(),
            rank: Some(predecessor_rank),
            source,
        };
        let limit = self.config.io_timeout;
        while let Some(x) = ring.next() {
            wire::write_all_within(successor, &x.send, limit, x.what).map_err(peer_err)?;
            let mut slot = vec![0u8; x.len];
            Deadline::new(predecessor, limit)
                .read_exact(&mut slot, x.what)
                .map_err(peer_err)?;
            ring.on_received(&slot);
        }
        ring.finish(self.addr)
    }
}

impl JsonSession {
    /// This worker's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of workers.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Whether the error port received an error signal (`1`, or the `-1` XGBoost's
    /// tracker sends): another worker failed and this one should stop.
    pub fn error_signalled(&self) -> bool {
        self.errors.signalled()
    }

    /// Waits at most `limit` for an error signal; whether one came.
    pub fn wait_error_signal(&self, limit: Duration) -> bool {
        self.errors.wait(limit)
    }

    /// Sends `text` to the tracker's log (cmd 4).
    ///
    /// Returns once the tracker has closed the connection (at most 5 s, or
    /// `io_timeout` if shorter): XGBoost 3.x's tracker reads connections
    /// concurrently and stops at the last `shutdown`, so a `print` still unread then
    /// would be lost.
    pub fn print(&self, text: &str) -> Result<(), ClientError> {
        let stream = self.client.command(
            self.rank.into(),
            self.world.into(),
            &json!({"cmd": CMD_PRINT, "msg": text}),
            "print",
        )?;
        let limit = self.client.config.io_timeout.min(PRINT_CLOSE_WAIT);
        wait_closed(&stream, limit);
        Ok(())
    }

    /// Reports a failure to the tracker (cmd 3; docs/xgboost-protocol.md, *error*) with
    /// an error `code` and a message; a tracker that handles it (switchyard's does)
    /// tells every worker of the job through its error port, and the job ends as
    /// failed.
    pub fn signal_error(&self, code: i32, msg: &str) -> Result<(), ClientError> {
        self.client
            .command(
                self.rank.into(),
                self.world.into(),
                &json!({"cmd": CMD_ERROR, "code": code, "msg": msg}),
                "error",
            )
            .map(drop)
    }

    /// Tells the tracker this worker is done (cmd 2), then stops the error listener.
    pub fn shutdown(&self) -> Result<(), ClientError> {
        let sent = self
            .client
            .command(
                self.rank.into(),
                self.world.into(),
                &json!({"cmd": CMD_SHUTDOWN}),
                "shutdown",
            )
            .map(drop);
        self.errors.stop();
        sent
    }
}

/// Reads until the peer closes, `limit` passes, or the connection fails; what it
/// sends is ignored (trackers send nothing after the magic).
fn wait_closed(stream: &TcpStream, limit: Duration) {
    let mut r = Deadline::new(stream, limit);
    let mut byte = [0u8; 1];
    while r.read_exact(&mut byte, "close").is_ok() {}
}

pub(super) fn local_port(listener: &TcpListener) -> Result<u16, ClientError> {
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| ClientError::PeerIo {
            what: "reading the listening port",
            source,
        })
}
