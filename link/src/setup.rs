//! Opening a [`StreamLink`](super::StreamLink)'s connections: one TCP connection per
//! pair of ranks, addresses swapped over the control link, the lower rank of each
//! pair connecting and introducing itself with a hello.
//!
//! With a job secret (`SWITCHYARD_JOB_SECRET` or `SWITCHYARD_JOB_SECRET_FILE`, see
//! [`switchyard_secret`]) each connection runs the secret's challenge-response (purpose
//! [`AUTH_PURPOSE`], the connector claiming its rank) before the hello, and the hello
//! must name the authenticated rank. A connection that fails is logged with its address
//! and the reason and closed; accepting goes on until the deadline.
//!
//! With a heartbeat deadline each rank also binds a UDP socket on its data listener's
//! IP and announces its port, deadline and tag in the same setup message (a second
//! frame, see [`Announce`]); the heartbeat starts as soon as the addresses are known,
//! before the connections are made, so that a rank is beating while a slower peer
//! still connects.
//!
//! The decisions (whom to read, connect to and wait for, which accepted connection to
//! keep, when the set-up is complete or failed, whom a failure blames) are a machine
//! without sockets or clocks, [`MeshSteps`] in `setup/steps.rs`; this file is its shell,
//! doing what each step says. A deterministic simulation drives the same machine
//! (`setup/sim_tests.rs`, described in `docs/testing.md`).

use super::blame;
use super::framing::{HELLO_LEN, encode_hello};
use super::liveness::{Announce, Beats, Liveness, interval_for};
use super::shm::{Board, hand_over, share_board};
use super::stream::Pipe;
use super::{Link, SocketLink, Tag, Topology};
use crate::LinkError;
use bytes::Bytes;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use switchyard_net::handshakes::{self, Handshakes, accept_all};
use switchyard_secret::{AuthFailure, JobSecret};

#[cfg(test)]
mod sim_tests;
mod steps;

use steps::{Blame, Hello, MeshSteps, Step, Unreached};

/// The job secret's purpose label for the data links' connections.
pub(super) const AUTH_PURPOSE: &str = "stream";

/// Setup messages on the control link use call 0, which no collective uses.
const SETUP_TAG: Tag = Tag { call: 0, step: 1 };
/// The set-up's name in the reasons this rank gives its peers, as the facade names the
/// call it fails (`Call::Setup`), so that a notice reads like the error it explains.
const SETUP: &str = "communicator setup";

/// An open connection to one peer, ready for non-blocking use.
#[derive(Debug)]
pub(super) struct Connection {
    /// The byte stream: TCP (non-blocking, Nagle's delay off), or shared memory with
    /// a peer on this host.
    pub(super) pipe: Pipe,
    /// The peer's listening address, for errors.
    pub(super) addr: String,
}

/// What setting up a [`StreamLink`](super::StreamLink) opened.
#[derive(Debug)]
pub(super) struct Opened {
    /// Entry `r` is rank `r`'s connection (`None` for this rank).
    pub(super) connections: Vec<Option<Connection>>,
    /// The running heartbeat, when this rank has a deadline and some peer beats too.
    pub(super) liveness: Option<Liveness>,
    /// The host board of this rank's host, with the ranks that share it in board
    /// order, when at least two ranks are on this host.
    pub(super) board: Option<(Board, Vec<usize>)>,
    /// The world's ranks grouped by host ([`Link::host_groups`]), when they span
    /// several hosts and the ranks announced where they are; empty otherwise.
    ///
    /// [`Link::host_groups`]: crate::Link::host_groups
    pub(super) hosts: Vec<Vec<usize>>,
}

/// The error for a TCP connection to `rank` at `addr` that failed.
pub(super) fn io_error(rank: usize, addr: &str, e: std::io::Error) -> LinkError {
    LinkError::Lost {
        rank,
        endpoint: format!("tcp://{addr}"),
        reason: e.to_string(),
    }
}

/// Opens a TCP connection to every other rank of `control`'s world: listens on
/// `host` (any free port), swaps addresses over `control`, then the lower rank of
/// each pair connects. Waits at most `timeout`. Uses the job secret of this process's
/// environment, if any. With a `heartbeat` deadline, starts the heartbeat too. With a
/// `host_id`, ranks that announce the same one talk through shared memory instead
/// (see [`hand_over`]).
pub(super) fn open_connections(
    control: &mut SocketLink,
    host: &str,
    timeout: Duration,
    heartbeat: Option<Duration>,
    host_id: Option<&str>,
    topology: Topology,
) -> Result<Opened, LinkError> {
    let rank = control.rank();
    let setup = |reason: String| LinkError::Transport { rank, reason };
    let secret = JobSecret::from_env().map_err(|e| setup(e.to_string()))?;
    let listener =
        TcpListener::bind((host, 0)).map_err(|e| setup(format!("listen on {host}: {e}")))?;
    open_connections_on(
        control,
        listener,
        timeout,
        secret.as_ref(),
        heartbeat,
        host_id,
        topology,
    )
}

/// [`open_connections`] on a bound `listener`, with the job secret given (`None`: no
/// authentication).
///
/// Each rank's setup message has three frames: its data listener's address, its
/// heartbeat [`Announce`] (port 0 when it has no heartbeat), and its host identity
/// (empty: no shared memory). A pair of ranks that announce the same identity swap
/// their TCP connection for shared memory once it is open and authenticated.
///
/// A rank that fails tells every peer why on `control` (an abort notice for call 0,
/// blaming the peer its wait failed on, see `blame.rs`) while its listener and
/// connections are still open, and reports the failure as the notices explain it: a
/// peer that then sees them close finds the notice, and blames the rank this one
/// blamed (a dead one) instead of this one, which only gave up.
pub(super) fn open_connections_on(
    control: &mut SocketLink,
    listener: TcpListener,
    timeout: Duration,
    secret: Option<&JobSecret>,
    heartbeat: Option<Duration>,
    host_id: Option<&str>,
    topology: Topology,
) -> Result<Opened, LinkError> {
    let mut streams = Vec::new();
    let (rank, size) = (control.rank(), control.world_size());
    let mut steps = MeshSteps::new(rank, size, topology, timeout, Instant::now());
    let opened = connect_all(
        control,
        &mut steps,
        &listener,
        &mut streams,
        secret,
        heartbeat,
        host_id,
    );
    opened.map_err(|e| {
        let blame = steps.blame(&e);
        let e = gave_up(control, e, blame, timeout);
        // Only now: the peers had the notice before these close.
        drop((listener, streams));
        e
    })
}

/// Tells the peers on `control` that this rank's set-up failed with `e`, and returns
/// the error to report, as their notices explain it (see [`blame::explain`]): this
/// rank's own, or the abort of the rank the blame leads to, which says so when it
/// gave up waiting for this rank.
fn gave_up(control: &mut SocketLink, e: LinkError, blame: Blame, timeout: Duration) -> LinkError {
    let me = control.rank();
    let reason = format!("rank {me}: {SETUP}: {e}");
    let Blame::Peer { rank: blamed, seen } = blame else {
        control.abort_blaming(SETUP_TAG.call, &reason, None);
        control.flush_aborts();
        return e;
    };
    if blame.notice_first() {
        control.abort_blaming(SETUP_TAG.call, &reason, Some(blamed));
    }
    let limit = steps::explain_limit(Instant::now(), timeout);
    let explained = blame::explain(control, blamed, seen, limit);
    if !blame.notice_first() {
        control.abort_blaming(SETUP_TAG.call, &reason, Some(blamed));
    }
    control.flush_aborts();
    explained.into_link_error(me, e)
}

/// The body of [`open_connections_on`], keeping the TCP connections in `streams`
/// (entry `r`: rank `r`'s) so that they outlive a failure until the peers were told.
/// The decisions are [`MeshSteps`]'; this does what each step says.
fn connect_all(
    control: &mut SocketLink,
    steps: &mut MeshSteps,
    listener: &TcpListener,
    streams: &mut Vec<Option<TcpStream>>,
    secret: Option<&JobSecret>,
    heartbeat: Option<Duration>,
    host_id: Option<&str>,
) -> Result<Opened, LinkError> {
    let (rank, size, topology) = (control.rank(), control.world_size(), steps.topology());
    let deadline = steps.deadline();
    let setup = |reason: String| LinkError::Transport { rank, reason };
    let local = listener.local_addr().map_err(|e| setup(e.to_string()))?;
    let mine = local.to_string();
    // On the data listener's IP: the interface the ranks already reach each other on.
    let (mut udp, announce) = match heartbeat.filter(|d| !d.is_zero()) {
        Some(beat_deadline) => {
            let socket = UdpSocket::bind((local.ip(), 0))
                .map_err(|e| setup(format!("heartbeat socket on {}: {e}", local.ip())))?;
            let port = socket
                .local_addr()
                .map_err(|e| setup(e.to_string()))?
                .port();
            let announce = Announce {
                port,
                deadline: beat_deadline,
                // Not a secret (anyone on the path sees it): it only keeps stray and
                // old-generation datagrams apart from this mesh's.
                tag: switchyard_net::tag::random_tag(),
            };
            (Some(socket), announce)
        }
        None => (None, Announce::OFF),
    };
    let announced = Bytes::copy_from_slice(&announce.encode());
    let host_id = host_id.unwrap_or_default();
    let mut announces = vec![Announce::OFF; size];
    let mut same_host = vec![false; size];
    let mut host_ids = vec![Bytes::new(); size];
    host_ids[rank] = Bytes::copy_from_slice(host_id.as_bytes());
    let (mut liveness, mut hosts) = (None, Vec::new());
    streams.clear();
    streams.resize_with(size, || None);
    listener
        .set_nonblocking(true)
        .map_err(|e| setup(e.to_string()))?;
    // Each connection's proof and hello on a thread of its own, within HELLO_LIMIT:
    // a stranger that connects and says nothing holds up no rank.
    let mut handshakes = Handshakes::new(handshakes::DEFAULT_LIMIT);
    let mut step = steps.start();
    loop {
        step = match step {
            Step::Announce(peers) => {
                for peer in peers {
                    let frames = vec![
                        Bytes::from(mine.clone()),
                        announced.clone(),
                        Bytes::copy_from_slice(host_id.as_bytes()),
                    ];
                    control.send(peer, SETUP_TAG, frames, deadline)?;
                }
                steps.announced()
            }
            Step::Read(peer) => {
                let frames = control.recv(peer, SETUP_TAG, deadline)?;
                let addr = frames
                    .first()
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .unwrap_or_default();
                announces[peer] = Announce::decode(frames.get(1).map(|f| &f[..]));
                same_host[peer] = !host_id.is_empty()
                    && topology.connects(rank, peer)
                    && frames.get(2).is_some_and(|f| f == host_id.as_bytes());
                host_ids[peer] = frames.get(2).cloned().unwrap_or_default();
                steps.heard_from(peer, addr)
            }
            Step::Heard => {
                hosts = host_groups(&host_ids);
                let addrs = addresses(steps, size);
                liveness = match udp.take() {
                    Some(socket) => start_heartbeat(rank, socket, announce, &announces, &addrs)
                        .map_err(|e| setup(format!("heartbeat: {e}")))?,
                    None => None,
                };
                steps.proceed(Instant::now())
            }
            Step::Connect { peer, addr, wait } => {
                let made = connect_to(addr, wait, secret, (rank, size), deadline)
                    .map(|stream| streams[peer] = Some(stream));
                steps.connected(peer, made, Instant::now())
            }
            Step::LookForAborts => {
                control.check_aborts()?;
                steps.looked(Instant::now())
            }
            Step::Accept { until } => {
                accept_all(listener, &mut handshakes, {
                    let secret = secret.cloned();
                    move |stream, _| {
                        let by = steps::hello_by(deadline, Instant::now());
                        read_hello(stream, size, by, secret.as_ref())
                    }
                });
                // The listener is polled: a connection waiting is accepted within 1 ms.
                let wait = until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(1));
                if let Some(done) = handshakes.next(wait) {
                    let from = done.peer;
                    let (claimed, stream) = match done.result {
                        Ok((peer, stream)) => (Ok(peer), Some(stream)),
                        Err(reason) => (Err(reason), None),
                    };
                    match steps.hello(claimed) {
                        Hello::Take(peer) => streams[peer] = stream,
                        Hello::Unexpected(peer) => {
                            tracing::warn!(%from, peer, "stream link: unexpected hello; closed")
                        }
                        Hello::Bad(reason) => {
                            tracing::warn!(%from, %reason, "stream link: bad hello; closed")
                        }
                    }
                }
                steps.poll(Instant::now())
            }
            Step::Linked => break,
            Step::Failed(e) => return Err(e),
        };
    }
    let addrs = addresses(steps, size);
    let mut pipes = hand_over(rank, streams, &addrs, &same_host, deadline)?;
    // A board's slots are every rank of the host, and only a mesh connects them all.
    let board = match topology {
        Topology::Mesh => share_board(rank, &pipes, &addrs, deadline)?,
        _ => None,
    };
    let mut connections = Vec::with_capacity(size);
    for (peer, stream) in std::mem::take(streams).into_iter().enumerate() {
        let addr = addrs[peer].clone();
        if let Some(pipe) = pipes[peer].take() {
            // The TCP connection carried the hand-over; it closes here.
            connections.push(Some(Connection {
                pipe: Pipe::Shm(Box::new(pipe)),
                addr,
            }));
            continue;
        }
        let Some(stream) = stream else {
            connections.push(None);
            continue;
        };
        stream
            .set_nodelay(true)
            .map_err(|e| io_error(peer, &addr, e))?;
        stream
            .set_nonblocking(true)
            .map_err(|e| io_error(peer, &addr, e))?;
        connections.push(Some(Connection {
            pipe: Pipe::Tcp(stream),
            addr,
        }));
    }
    Ok(Opened {
        connections,
        liveness,
        board,
        hosts,
    })
}

/// Every rank's data address as announced (this rank's own: empty).
fn addresses(steps: &MeshSteps, size: usize) -> Vec<String> {
    (0..size).map(|p| steps.addr(p).to_string()).collect()
}

/// Connects to a peer's data listener at `addr` (waiting at most `wait`), proves the
/// job secret when there is one, and says hello as rank `rank` of `size`; all by
/// `deadline`. The error says why, for the peer's [`LinkError::Lost`], and whether
/// time ran out.
fn connect_to(
    addr: SocketAddr,
    wait: Duration,
    secret: Option<&JobSecret>,
    (rank, size): (usize, usize),
    deadline: Instant,
) -> Result<TcpStream, Unreached> {
    let io = |e: std::io::Error| Unreached {
        timed_out: matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
        reason: e.to_string(),
    };
    let mut stream = TcpStream::connect_timeout(&addr, wait).map_err(io)?;
    if let Some(secret) = secret {
        switchyard_secret::connect(&mut stream, secret, AUTH_PURPOSE, rank as u32, deadline)
            .map_err(|e| Unreached {
                timed_out: matches!(e.reason, AuthFailure::Timeout(_)),
                reason: e.to_string(),
            })?;
    }
    stream.write_all(&encode_hello(rank, size)).map_err(io)?;
    Ok(stream)
}

/// The ranks grouped by the host identity each announced (`host_ids[r]`, empty for a
/// rank that announced none, which is then a host of its own), each group in rank
/// order and the groups in order of their first rank; empty when there is only one
/// group. Every rank computes this from the same announcements, so every rank of a
/// world gets the same groups.
pub(super) fn host_groups(host_ids: &[Bytes]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (rank, id) in host_ids.iter().enumerate() {
        let same = (!id.is_empty())
            .then(|| groups.iter_mut().find(|g| host_ids[g[0]] == *id))
            .flatten();
        match same {
            Some(group) => group.push(rank),
            None => groups.push(vec![rank]),
        }
    }
    if groups.len() < 2 {
        groups.clear();
    }
    groups
}

/// Starts this rank's heartbeat on `socket`, announced as `mine`, watching the peers
/// whose announcements (`announces`) say they beat too, at the IP of their data
/// address (`addrs`). Peers without a heartbeat are neither sent beats nor watched:
/// a rank cannot be blamed for beats it never promised. Every rank beats at the
/// interval of the shortest deadline announced, so that no rank's deadline is shorter
/// than eight of its peers' intervals. `None` when no peer beats.
fn start_heartbeat(
    rank: usize,
    socket: UdpSocket,
    mine: Announce,
    announces: &[Announce],
    addrs: &[String],
) -> std::io::Result<Option<Liveness>> {
    let mut tags = vec![None; announces.len()];
    let mut targets = Vec::new();
    let mut shortest = mine.deadline;
    for (peer, announce) in announces.iter().enumerate() {
        let Ok(addr) = addrs[peer].parse::<SocketAddr>() else {
            continue;
        };
        if peer == rank || !announce.is_on() {
            continue;
        }
        tags[peer] = Some(announce.tag);
        targets.push(SocketAddr::new(addr.ip(), announce.port));
        shortest = shortest.min(announce.deadline);
    }
    if targets.is_empty() {
        return Ok(None);
    }
    let interval = interval_for(shortest);
    let beats = Beats::new(Instant::now(), tags, mine.deadline, interval);
    Liveness::start(rank, socket, beats, interval, targets, mine.tag).map(Some)
}

/// Reads and checks a connecting rank's hello (blocking, bounded by `deadline`), after
/// the job secret's handshake when there is a secret.
fn read_hello(
    mut stream: TcpStream,
    size: usize,
    deadline: Instant,
    secret: Option<&JobSecret>,
) -> Result<(usize, TcpStream), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let claimed = match secret {
        Some(secret) => Some(
            switchyard_secret::accept(&mut stream, secret, AUTH_PURPOSE, deadline)
                .map_err(|e| e.reason.to_string())?,
        ),
        None => None,
    };
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .clamp(Duration::from_millis(1), Duration::from_secs(5));
    stream
        .set_read_timeout(Some(wait))
        .map_err(|e| e.to_string())?;
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).map_err(|e| e.to_string())?;
    let peer = steps::check_hello(&hello, size, claimed)?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((peer, stream))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::BoundLink;
    use switchyard_transports::SocketOptions;

    const TIMEOUT: Duration = Duration::from_secs(10);

    fn key(text: &str) -> JobSecret {
        JobSecret::new(text.as_bytes().to_vec(), "test").unwrap()
    }

    type Outcome = (SocketLink, Result<Opened, LinkError>);

    /// Opens the data connections of `listeners.len()` ranks on threads, rank `r` with
    /// `secrets[r]`, over ZeroMQ control links on loopback.
    fn open_all(
        listeners: Vec<TcpListener>,
        secrets: Vec<Option<JobSecret>>,
        timeout: Duration,
    ) -> Vec<Outcome> {
        let none = vec![None; listeners.len()];
        open_all_beating(listeners, secrets, timeout, none)
    }

    /// [`open_all`], rank `r` with heartbeat deadline `heartbeats[r]`.
    fn open_all_beating(
        listeners: Vec<TcpListener>,
        secrets: Vec<Option<JobSecret>>,
        timeout: Duration,
        heartbeats: Vec<Option<Duration>>,
    ) -> Vec<Outcome> {
        let size = listeners.len();
        let bound: Vec<BoundLink> = (0..size)
            .map(|r| {
                BoundLink::bind(r, size, "tcp://127.0.0.1:0", SocketOptions::default()).unwrap()
            })
            .collect();
        let endpoints: Vec<String> = bound.iter().map(|b| b.endpoint().to_string()).collect();
        let threads: Vec<_> = bound
            .into_iter()
            .zip(listeners)
            .zip(secrets)
            .zip(heartbeats)
            .map(|(((link, listener), secret), heartbeat)| {
                let endpoints = endpoints.clone();
                std::thread::spawn(move || {
                    let mut control = link.connect(&endpoints, TIMEOUT).unwrap();
                    control.set_close_handshake(false);
                    let opened = open_connections_on(
                        &mut control,
                        listener,
                        timeout,
                        secret.as_ref(),
                        heartbeat,
                        None,
                        Topology::Mesh,
                    );
                    (control, opened)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        (l, addr)
    }

    /// Strangers reach the last rank's data port first, one without the secret that
    /// claims rank 0 in its hello, one with a wrong secret: both are refused, and every
    /// rank still gets a working connection to every other, to the right peer.
    /// Connections that say nothing, opened on every data listener before the ranks
    /// start, delay none of them (one such connection failed setup with the secret
    /// on, issue 20 item 13).
    #[test]
    fn idle_connections_on_the_listeners_delay_no_rank() {
        for secret in [None, Some(key("0123456789abcdef0123456789abcdef"))] {
            let listeners: Vec<(TcpListener, String)> = (0..3).map(|_| listener()).collect();
            let idle: Vec<TcpStream> = listeners
                .iter()
                .flat_map(|(_, addr)| (0..4).map(move |_| TcpStream::connect(addr).unwrap()))
                .collect();
            let (listeners, _): (Vec<_>, Vec<_>) = listeners.into_iter().unzip();
            let started = Instant::now();
            let outcomes = open_all(listeners, vec![secret.clone(); 3], TIMEOUT);
            let took = started.elapsed();
            for (rank, (_, opened)) in outcomes.into_iter().enumerate() {
                assert!(opened.is_ok(), "rank {rank}: {:?}", opened.err());
            }
            assert!(
                took < Duration::from_secs(3),
                "secret {}: setup took {took:?} behind idle connections",
                secret.is_some()
            );
            drop(idle);
        }
    }

    #[test]
    fn with_a_job_secret_strangers_are_refused_and_the_ranks_connect() {
        let good = key("0123456789abcdef0123456789abcdef");
        let listeners: Vec<(TcpListener, String)> = (0..3).map(|_| listener()).collect();
        let target = listeners[2].1.clone();
        // Connected here, before any rank starts: the backlog holds them first.
        let mut first = TcpStream::connect(&target).unwrap();
        let mut second = TcpStream::connect(&target).unwrap();
        let no_secret = std::thread::spawn(move || {
            first.write_all(&encode_hello(0, 3)).unwrap();
            first.set_read_timeout(Some(TIMEOUT)).unwrap();
            let mut opening = [0u8; 8];
            first.read_exact(&mut opening).unwrap();
            opening
        });
        let wrong_secret = std::thread::spawn(move || {
            let wrong = key("fedcba9876543210fedcba9876543210");
            switchyard_secret::connect(
                &mut second,
                &wrong,
                AUTH_PURPOSE,
                0,
                Instant::now() + TIMEOUT,
            )
        });
        let (listeners, _): (Vec<_>, Vec<_>) = listeners.into_iter().unzip();
        let mut outcomes = open_all(listeners, vec![Some(good.clone()); 3], TIMEOUT);
        assert_eq!(no_secret.join().unwrap(), switchyard_secret::MAGIC);
        assert!(wrong_secret.join().unwrap().is_err());

        let mut connections: Vec<Vec<Option<Connection>>> = outcomes
            .iter_mut()
            .map(|(_, opened)| {
                let empty = Opened {
                    connections: Vec::new(),
                    liveness: None,
                    board: None,
                    hosts: Vec::new(),
                };
                std::mem::replace(opened, Ok(empty)).unwrap().connections
            })
            .collect();
        for (rank, conns) in connections.iter().enumerate() {
            for (peer, conn) in conns.iter().enumerate() {
                assert_eq!(conn.is_some(), peer != rank, "rank {rank} peer {peer}");
            }
        }
        // Rank 0's connection to rank 2 reaches rank 2's connection from rank 0.
        let tcp = |connection: Option<Connection>| match connection.unwrap().pipe {
            Pipe::Tcp(stream) => stream,
            Pipe::Shm(_) => panic!("no host identity was announced: TCP expected"),
        };
        let mut from_zero = tcp(connections[0][2].take());
        let mut at_two = tcp(connections[2][0].take());
        from_zero.set_nonblocking(false).unwrap();
        at_two.set_nonblocking(false).unwrap();
        at_two.set_read_timeout(Some(TIMEOUT)).unwrap();
        from_zero.write_all(b"z").unwrap();
        let mut byte = [0u8; 1];
        at_two.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"z");
    }

    /// A rank without the secret cannot connect to one that has it: the accepting rank
    /// errors at its deadline instead of taking the connection.
    #[test]
    fn a_rank_without_the_secret_is_not_taken() {
        let good = key("0123456789abcdef0123456789abcdef");
        let (listeners, _): (Vec<_>, Vec<_>) = (0..2).map(|_| listener()).unzip();
        let outcomes = open_all(
            listeners,
            vec![None, Some(good)],
            Duration::from_millis(800),
        );
        let err = outcomes[1].1.as_ref().map(|_| ()).unwrap_err();
        assert!(matches!(err, LinkError::Timeout { rank: 0, .. }), "{err:?}");
    }

    /// Ranks 0 and 1 beat (with different deadlines), rank 2 does not: 0 and 1 hear
    /// each other, nobody watches rank 2, and rank 2 runs no heartbeat at all.
    #[test]
    fn the_heartbeat_is_announced_in_the_setup_message_and_started() {
        let (listeners, _): (Vec<_>, Vec<_>) = (0..3).map(|_| listener()).unzip();
        let beating = vec![
            Some(Duration::from_millis(800)),
            Some(Duration::from_millis(400)),
            None,
        ];
        let outcomes = open_all_beating(listeners, vec![None, None, None], TIMEOUT, beating);
        let opened: Vec<&Opened> = outcomes.iter().map(|(_, o)| o.as_ref().unwrap()).collect();
        assert!(opened[2].liveness.is_none());
        let zero = opened[0].liveness.as_ref().unwrap().beats();
        let one = opened[1].liveness.as_ref().unwrap().beats();
        assert!(zero.watches(1) && !zero.watches(2) && !zero.watches(0));
        assert!(one.watches(0) && !one.watches(2));
        assert_eq!(zero.deadline(), Duration::from_millis(800));
        // Both beat at the shorter deadline's interval (50 ms): well past both deadlines
        // since setup, neither is silent to the other.
        std::thread::sleep(Duration::from_millis(1200));
        let start = Instant::now() - Duration::from_secs(10);
        assert_eq!(zero.silent(1, start, Instant::now()), None);
        assert_eq!(one.silent(0, start, Instant::now()), None);
        assert_eq!(zero.malformed() + zero.stray(), 0);
    }

    /// Rank 1 dies after announcing its address (its data listener refuses): rank 0,
    /// connecting up to it, fails first, and ranks 2 and 3, whose hellos from ranks 0
    /// and 1 never come, must name rank 1 through rank 0's notice, soon, not rank 0
    /// (alive, it only gave up) at their deadline, as they did.
    #[test]
    fn a_rank_that_gave_up_is_not_blamed_for_the_dead_rank() {
        let (size, victim) = (4, 1);
        let timeout = Duration::from_secs(4);
        let bound: Vec<BoundLink> = (0..size)
            .map(|r| {
                BoundLink::bind(r, size, "tcp://127.0.0.1:0", SocketOptions::default()).unwrap()
            })
            .collect();
        let endpoints: Vec<String> = bound.iter().map(|b| b.endpoint().to_string()).collect();
        // An address where nobody listens any more: the dead rank's.
        let dead = listener().1;
        let threads: Vec<_> = bound
            .into_iter()
            .enumerate()
            .map(|(rank, link)| {
                let (endpoints, dead) = (endpoints.clone(), dead.clone());
                std::thread::spawn(move || {
                    let mut control = link.connect(&endpoints, TIMEOUT).unwrap();
                    control.set_close_handshake(false);
                    let started = Instant::now();
                    if rank == victim {
                        for peer in (0..size).filter(|&p| p != rank) {
                            let frames = vec![Bytes::from(dead.clone()), Bytes::new()];
                            control
                                .send(peer, SETUP_TAG, frames, started + TIMEOUT)
                                .unwrap();
                        }
                        // Its control link stays open until the others are done: what
                        // they must tell is who failed first, and why.
                        std::thread::sleep(timeout + Duration::from_secs(1));
                        return (String::new(), Duration::ZERO);
                    }
                    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                    let opened = open_connections_on(
                        &mut control,
                        listener,
                        timeout,
                        None,
                        None,
                        None,
                        Topology::Mesh,
                    );
                    let error = opened.map(|_| ()).unwrap_err();
                    (format!("{SETUP}: {error}"), started.elapsed())
                })
            })
            .collect();
        let outcomes: Vec<(String, Duration)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        for (rank, (error, took)) in outcomes.iter().enumerate() {
            if rank == victim {
                continue;
            }
            assert!(error.contains("lost rank 1 "), "rank {rank}: {error}");
            for bystander in [0, 2, 3] {
                assert!(
                    !error.contains(&format!("lost rank {bystander} "))
                        && !error.contains(&format!("for rank {bystander}")),
                    "rank {rank}: {error}"
                );
            }
            assert!(*took < timeout, "rank {rank} after {took:?}: {error}");
        }
    }

    /// Rank 2 comes to the set-up long after the others' timeout (as a rank stopped
    /// that long does, and then resumed): ranks 0 and 1 give up on it, and rank 2
    /// must say that they gave up waiting for it, not blame them.
    #[test]
    fn a_rank_late_to_the_set_up_says_its_peers_gave_up_on_it() {
        let (size, late) = (3, 2);
        let timeout = Duration::from_secs(2);
        let bound: Vec<BoundLink> = (0..size)
            .map(|r| {
                BoundLink::bind(r, size, "tcp://127.0.0.1:0", SocketOptions::default()).unwrap()
            })
            .collect();
        let endpoints: Vec<String> = bound.iter().map(|b| b.endpoint().to_string()).collect();
        let threads: Vec<_> = bound
            .into_iter()
            .enumerate()
            .map(|(rank, link)| {
                let endpoints = endpoints.clone();
                std::thread::spawn(move || {
                    let mut control = link.connect(&endpoints, TIMEOUT).unwrap();
                    control.set_close_handshake(false);
                    if rank == late {
                        std::thread::sleep(timeout * 2);
                    }
                    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                    let opened = open_connections_on(
                        &mut control,
                        listener,
                        timeout,
                        None,
                        None,
                        None,
                        Topology::Mesh,
                    );
                    let error = opened.map(|_| ()).unwrap_err();
                    format!("{SETUP}: {error}")
                })
            })
            .collect();
        let errors: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let error = &errors[late];
        assert!(
            error.contains("gave up waiting for this rank (rank 2)"),
            "rank 2: {error}\nothers: {errors:?}"
        );
        for rank in [0, 1] {
            assert!(
                errors[rank].contains("for rank 2"),
                "rank {rank}: {}",
                errors[rank]
            );
        }
    }

    /// Ranks with the same identity share a group, in rank order; a rank that
    /// announced none is a host of its own; one group is no grouping at all.
    #[test]
    fn host_groups_follow_the_announced_identities() {
        let ids = |ids: &[&str]| -> Vec<Bytes> {
            ids.iter()
                .map(|id| Bytes::copy_from_slice(id.as_bytes()))
                .collect()
        };
        assert_eq!(
            host_groups(&ids(&["a", "b", "a", "b", "c"])),
            [vec![0, 2], vec![1, 3], vec![4]]
        );
        assert_eq!(
            host_groups(&ids(&["a", "", "", "a"])),
            [vec![0, 3], vec![1], vec![2]]
        );
        assert!(host_groups(&ids(&["a", "a", "a"])).is_empty());
        assert!(host_groups(&ids(&[""])).is_empty());
    }
}
