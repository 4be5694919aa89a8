//! A deterministic simulation of the unique-id bootstrap: the root's real machine
//! ([`Root`]) and every rank's ([`Member`]), driven by a model of the threads around
//! them over a simulated network and clock that one seed decides.
//!
//! Each seed makes a job of 1-5 ranks, starting within 300 ms of each other (now and
//! then one up to 3 s late), the root bound when the id was made or by rank 0 when it
//! starts (`UniqueId::at`). Strangers come to the root and to the ranks' ring
//! listeners: silent, half a hello that stalls, a whole check-in or ring hello of
//! another job, another world size or a rank outside the world, a rank's hello
//! claiming another rank, floods of silent and stalled connections, and replays of a
//! rank's check-in or ring hello after the original arrived; some close their
//! connections later. In some seeds one rank crashes (its connections close, its
//! listeners refuse) or stops for a while (SIGSTOP: the kernel still accepts its
//! connections, it reads nothing), at a moment the seed picks.
//!
//! The model of the threads mirrors `serve_root`, `ring_exchange`, `connect` and the
//! ring acceptor (`ring.rs`): the root and each ring listener read every connection's
//! hello concurrently, within [`CHECK_IN_READ`] of its accept, at most `LIMIT` at once
//! (the oldest evicted, as [`Handshakes`](switchyard_net::handshakes::Handshakes)
//! does); the root looks every [`WATCH_EVERY`] whether a waiting rank's connection
//! closed; a rank retries its connection to a root that is not listening every
//! [`RETRY`], takes a refused connection to its successor as the successor having
//! left, probes its predecessor's listener every 2 × [`WATCH_EVERY`] until its hello
//! comes, and closes everything when its exchange ends. The sockets and threads are
//! not run; nor the job secret, nor a host that vanishes (every connection to a dead
//! process is refused or reset at once).
//!
//! Checked at every step: every wait ends by its timeout (a rank's exchange returns
//! within its timeout of its start, plus the time it was stopped and the loops' 50 ms
//! of polling). Checked when a rank ends: a rank that returns a world returns the
//! job's, every rank's endpoint in rank order (no stranger's ring address, no entry
//! out of place); a rank that fails names an error, and an [`IdError::Left`] names a
//! rank that crashed or gave up before, never one that formed the job or gave up only
//! later. At the end: with no
//! crash and no stop, every rank formed the job within 1 s of the last rank's start,
//! strangers or not; when a rank crashes after the root took its check-in, every
//! rank the root heard from ends within 1 s of the crash or of its own check-in,
//! whichever is later: not at its timeout, nor when a missing rank comes (the root
//! tells every rank waiting, and every rank that checks in within [`LINGER`]; rank 0,
//! which serves the root, returns up to that linger later).
//!
//! `SEED=n cargo test -p switchyard-bootstrap --lib sim` replays one seed and prints
//! its trace; `SIM_SEEDS=n` runs that many seeds instead of the default budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::member::{Member, MemberAction, MemberEvent};
use super::root::{Answer, Conn, Root, RootAction, RootEvent};
use super::{CHECK_IN_READ, IdError, LINGER, RETRY, WATCH_EVERY};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use switchyard_sim::{self as sim, Campaign, Faults, Network, Rng, Step, Trace};

/// Seeds a plain `cargo test` runs.
const BUDGET: u64 = 3000;
/// The job's tag.
const TAG: u64 = 0x5eed;
/// Handshakes read at once, by the root and by each ring listener (the real
/// `DEFAULT_LIMIT` is 256; a small one lets floods reach it).
const LIMIT: usize = 8;
/// How late the loops may see a timer: the real ones look every [`RETRY`].
const SLACK: Duration = Duration::from_millis(50);

/// Messages take 1-5 ms; one time in ten the clock runs although one is due; a
/// stranger replays one rank's hello in five (after it arrived) and closes one
/// connection in three at a moment of its choice; one seed in seven crashes a rank,
/// one in ten of the others stops one.
fn faults() -> Faults {
    Faults {
        duplicate: 20,
        drop: 30,
        crash: 15,
        pause: (10, Duration::from_secs(12)),
        ..Faults::delays(Duration::from_millis(1), Duration::from_millis(5))
    }
}

/// Where a connection goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listener {
    Root,
    Ring(u32),
}

/// Who opened a connection, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opener {
    /// A rank's check-in.
    CheckIn(u32),
    /// A rank's link to its successor.
    Successor(u32),
    /// A rank's probe of its predecessor's listener.
    Probe(u32),
    /// A stranger.
    Stranger(Kind),
}

/// What a stranger does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Silent,
    /// Sends the start of a hello and stalls.
    Partial,
    /// A whole hello of another job.
    WrongTag,
    /// A check-in with another world size, or a ring hello claiming another rank.
    WrongRank,
    /// A check-in of a rank outside the world.
    BadRank,
    /// One of a flood (silent or stalled).
    Flood,
    /// A copy of a rank's hello, sent after the original arrived.
    Replay,
}

#[derive(Clone, Debug)]
enum Msg {
    Connect,
    /// A connection the kernel completed while the process was stopped: accepted now.
    Accept,
    Connected,
    Refused,
    CheckIn {
        tag: u64,
        rank: u32,
        world: u32,
        ring: String,
    },
    Partial,
    Answer {
        status: u32,
        texts: Vec<String>,
    },
    Hello {
        tag: u64,
        rank: u32,
    },
    Entry(String),
    Fin,
}

struct Connection {
    to: Listener,
    opener: Opener,
    /// Who opened it (a rank, or `None` for a stranger).
    pid: Option<u32>,
    /// What a stranger sends once connected, and when it closes.
    plan: Option<(Msg, Option<Duration>)>,
    /// Each end closed (sends nothing more).
    opener_closed: bool,
    listener_closed: bool,
    /// The listener's side accepted it (its connect arrived while listening).
    accepted: bool,
    /// Each end saw the other's close (its end of stream or reset arrived).
    fin_at_listener: bool,
    fin_at_opener: bool,
}

/// A handshake read in progress: the connection and when its read gives up.
type Pending = (usize, Duration);

/// Where a rank's exchange is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    NotStarted,
    /// Connecting to the root: the connection, or the time of the next try.
    Connecting(Option<usize>, Duration),
    /// Checked in on this connection; waiting for the answer.
    Answering(usize),
    /// Connecting to the successor; then waiting for the acceptor.
    Linking(usize, bool),
    /// Sent its entry; waiting for the predecessor's.
    Exchanging,
    Ended,
}

struct RankModel {
    start: Duration,
    until: Duration,
    member: Member,
    phase: Phase,
    /// The ring listener accepts (from the start until the exchange ends).
    ring_open: bool,
    pending: VecDeque<Pending>,
    /// The acceptor's outcome: the predecessor's connection, or why not.
    accepted: Option<Result<usize, IdError>>,
    /// The predecessor's listener, once the root named it, and the last probe.
    predecessor: Option<u32>,
    probed: Duration,
    succ: Option<usize>,
    entries: VecDeque<String>,
    /// The ring part's end (rank 0 then waits for its root).
    ring_result: Option<Result<Vec<String>, IdError>>,
    result: Option<Result<Vec<String>, IdError>>,
    /// When the ring part ended (its listener and connections closed).
    ring_ended: Option<Duration>,
    ended_at: Option<Duration>,
    crashed: Option<Duration>,
    paused: Option<(Duration, Duration)>,
    /// Deliveries that came while stopped.
    inbox: VecDeque<((usize, bool), Msg)>,
}

struct RootModel {
    open: bool,
    /// What came before rank 0 started serving the listener bound with the id.
    backlog: Vec<((usize, bool), Msg)>,
    root: Option<Root>,
    pending: VecDeque<Pending>,
    watched: Duration,
    result: Option<Result<(), IdError>>,
    /// The connections the machine may still answer.
    held: BTreeSet<usize>,
    /// Ranks whose check-in the machine took (for the departure bound).
    /// When the machine took each rank's own check-in (for the departure bound).
    taken: BTreeMap<u32, Duration>,
}

struct Sim {
    rng: Rng,
    faults: Faults,
    t0: Instant,
    now: Duration,
    n: u32,
    timeout: Duration,
    ranks: Vec<RankModel>,
    root: RootModel,
    conns: Vec<Connection>,
    net: Network<(usize, bool), Duration, Msg>,
    /// Strangers to come: when, where, what (a replay: its message).
    planned: Vec<(Duration, Listener, Kind, Option<Msg>)>,
    /// Strangers' connections to close, and when.
    closes: Vec<(Duration, usize)>,
    /// The crash or stop to come: rank, when, for how long (`None`: a crash).
    fault: Option<(u32, Duration, Option<Duration>)>,
    broken: Option<String>,
    trace: Trace,
}

fn ring_addr(rank: u32) -> String {
    format!("10.0.{rank}.1:4000")
}

/// The rank whose ring listener is at `addr`, if any of the `n`.
fn ring_rank(addr: SocketAddr, n: u32) -> Option<u32> {
    (0..n).find(|&r| ring_addr(r) == addr.to_string())
}

fn endpoint(rank: u32) -> String {
    format!("tcp://10.0.{rank}.1:5000")
}

fn root_addr() -> SocketAddr {
    "10.0.0.1:29500".parse().unwrap()
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let faults = faults();
        let n = 1 + rng.below(5) as u32;
        let timeout = Duration::from_secs([5, 10, 20][rng.below(3) as usize]);
        let late = rng.chance(20).then(|| rng.below(u64::from(n)) as u32);
        let ranks = (0..n)
            .map(|r| {
                let start = if late == Some(r) {
                    rng.up_to(Duration::from_secs(3))
                } else {
                    rng.up_to(Duration::from_millis(300))
                };
                RankModel {
                    start,
                    until: start + timeout,
                    member: Member::new(TAG, (r, n), root_addr(), &endpoint(r)).unwrap(),
                    phase: Phase::NotStarted,
                    ring_open: false,
                    pending: VecDeque::new(),
                    accepted: None,
                    predecessor: None,
                    probed: start,
                    succ: None,
                    entries: VecDeque::new(),
                    ring_result: None,
                    result: None,
                    ring_ended: None,
                    ended_at: None,
                    crashed: None,
                    paused: None,
                    inbox: VecDeque::new(),
                }
            })
            .collect();
        let bound_early = rng.chance(50);
        let mut sim = Sim {
            rng,
            faults,
            t0: Instant::now(),
            now: Duration::ZERO,
            n,
            timeout,
            ranks,
            root: RootModel {
                open: bound_early,
                backlog: Vec::new(),
                root: None,
                pending: VecDeque::new(),
                watched: Duration::ZERO,
                result: None,
                held: BTreeSet::new(),
                taken: BTreeMap::new(),
            },
            conns: Vec::new(),
            net: Network::default(),
            planned: Vec::new(),
            closes: Vec::new(),
            fault: None,
            broken: None,
            trace: Trace::default(),
        };
        sim.plan_strangers();
        let victim = sim.rng.below(u64::from(n)) as u32;
        // Any moment of its exchange: a few milliseconds after its start, or later.
        let at = sim.ranks[victim as usize].start + sim.rng.up_to(Duration::from_millis(400));
        if sim.faults.crashes(&mut sim.rng) {
            sim.fault = Some((victim, at, None));
        } else if let Some(stop) = sim.faults.pause(&mut sim.rng) {
            sim.fault = Some((victim, at, Some(stop)));
        }
        let starts: Vec<String> = sim.ranks.iter().map(|r| format!("{:?}", r.start)).collect();
        sim.note(format!(
            "{n} ranks starting at {starts:?}, timeout {timeout:?}, root bound {}, \
             {} strangers, fault {:?}",
            if bound_early {
                "with the id"
            } else {
                "by rank 0"
            },
            sim.planned.len(),
            sim.fault
        ));
        sim
    }

    fn plan_strangers(&mut self) {
        let kinds = [
            Kind::Silent,
            Kind::Partial,
            Kind::WrongTag,
            Kind::WrongRank,
            Kind::BadRank,
        ];
        // While the job forms: until shortly after the last rank starts.
        let window = self.ranks.iter().map(|r| r.start).max().unwrap_or_default()
            + Duration::from_millis(100);
        for _ in 0..self.rng.below(6) {
            let kind = self.rng.pick(&kinds);
            let to = self.target();
            let at = self.rng.up_to(window);
            self.planned.push((at, to, kind, None));
        }
        if self.rng.chance(25) {
            let to = self.target();
            let mut at = self.rng.up_to(window);
            for _ in 0..self.rng.below(3 * LIMIT as u64) {
                self.planned.push((at, to, Kind::Flood, None));
                at += self
                    .rng
                    .between(Duration::from_millis(25), Duration::from_millis(60));
            }
        }
    }

    fn target(&mut self) -> Listener {
        if self.rng.chance(50) {
            Listener::Root
        } else {
            Listener::Ring(self.rng.below(u64::from(self.n)) as u32)
        }
    }

    fn note(&mut self, line: String) {
        self.trace.note(self.now, line);
    }

    fn fail(&mut self, why: String) {
        self.note(format!("BROKEN: {why}"));
        self.broken.get_or_insert(why);
    }

    fn instant(&self) -> Instant {
        self.t0 + self.now
    }

    fn who(&self, c: usize) -> String {
        let conn = &self.conns[c];
        format!("conn {c} ({:?} to {:?})", conn.opener, conn.to)
    }

    // ---- the network ----

    fn open(&mut self, opener: Opener, pid: Option<u32>, to: Listener) -> usize {
        let c = self.conns.len();
        self.conns.push(Connection {
            to,
            opener,
            pid,
            plan: None,
            opener_closed: false,
            listener_closed: false,
            accepted: false,
            fin_at_listener: false,
            fin_at_opener: false,
        });
        self.send(c, true, Msg::Connect);
        c
    }

    fn send(&mut self, c: usize, up: bool, msg: Msg) {
        let conn = &self.conns[c];
        if conn.opener_closed || conn.listener_closed {
            return;
        }
        let at = self.now + self.faults.delay(&mut self.rng);
        self.net.send((c, up), at, msg);
    }

    /// Closes connection `c` at the listener's end (`up` false) or the opener's.
    fn close(&mut self, c: usize, by_opener: bool) {
        let conn = &self.conns[c];
        if conn.opener_closed || conn.listener_closed {
            return;
        }
        self.send(c, by_opener, Msg::Fin);
        let conn = &mut self.conns[c];
        if by_opener {
            conn.opener_closed = true;
        } else {
            conn.listener_closed = true;
        }
    }

    /// The rank whose process gets what travels on `c` in direction `up`.
    fn receiver(&self, c: usize, up: bool) -> Option<u32> {
        let conn = &self.conns[c];
        if up {
            match conn.to {
                Listener::Root => Some(0),
                Listener::Ring(r) => Some(r),
            }
        } else {
            conn.pid
        }
    }

    fn stopped(&self, rank: Option<u32>) -> bool {
        rank.is_some_and(|r| {
            self.ranks[r as usize]
                .paused
                .is_some_and(|(from, to)| from <= self.now && self.now < to)
        })
    }

    fn dead(&self, rank: Option<u32>) -> bool {
        rank.is_some_and(|r| self.ranks[r as usize].crashed.is_some())
    }

    fn deliver(&mut self, (c, up): (usize, bool), msg: Msg) {
        let to = self.receiver(c, up);
        if self.dead(to) {
            if matches!(msg, Msg::Connect) {
                self.send(c, false, Msg::Refused);
            } else if !matches!(msg, Msg::Fin) {
                // A reset: the sender sees its connection closed.
                self.send(c, !up, Msg::Fin);
            }
            return;
        }
        if self.stopped(to) {
            let mut msg = msg;
            if up && matches!(msg, Msg::Connect) {
                if !self.listening(self.conns[c].to) {
                    return self.send(c, false, Msg::Refused);
                }
                // The kernel completes the connection; the accept waits.
                self.send(c, false, Msg::Connected);
                self.conns[c].accepted = true;
                msg = Msg::Accept;
            }
            self.ranks[to.unwrap() as usize]
                .inbox
                .push_back(((c, up), msg));
            return;
        }
        self.handle((c, up), msg);
    }

    fn listening(&self, to: Listener) -> bool {
        match to {
            Listener::Root => self.root.open,
            Listener::Ring(r) => self.ranks[r as usize].ring_open,
        }
    }

    fn handle(&mut self, (c, up): (usize, bool), msg: Msg) {
        if up {
            self.at_listener(c, msg);
        } else {
            self.at_opener(c, msg);
        }
    }

    // ---- listeners: the root and the ring acceptors ----

    fn at_listener(&mut self, c: usize, msg: Msg) {
        let to = self.conns[c].to;
        if to == Listener::Root && self.root.open && self.root.root.is_none() {
            if let Msg::Connect = msg {
                self.send(c, false, Msg::Connected);
                self.conns[c].accepted = true;
                self.root.backlog.push(((c, true), Msg::Accept));
            } else {
                self.root.backlog.push(((c, true), msg));
            }
            return;
        }
        if let Msg::Connect | Msg::Accept = msg {
            if !self.listening(to) {
                return self.send(c, false, Msg::Refused);
            }
            if let Msg::Connect = msg {
                self.send(c, false, Msg::Connected);
            }
            self.conns[c].accepted = true;
            let deadline = self.now + CHECK_IN_READ;
            let evicted = match to {
                Listener::Root => {
                    let deadline = deadline.min(self.ranks[0].until);
                    self.root.pending.push_back((c, deadline));
                    (self.root.pending.len() > LIMIT).then(|| self.root.pending.pop_front())
                }
                Listener::Ring(r) => {
                    let rank = &mut self.ranks[r as usize];
                    rank.pending.push_back((c, deadline.min(rank.until)));
                    (rank.pending.len() > LIMIT).then(|| rank.pending.pop_front())
                }
            };
            if let Some(Some((old, _))) = evicted {
                self.note(format!("{} evicted: too many handshakes", self.who(old)));
                self.close(old, false);
            }
            return;
        }
        if let Msg::Fin = msg {
            self.conns[c].fin_at_listener = true;
        }
        if self.conns[c].listener_closed {
            return;
        }
        match to {
            Listener::Root => self.at_root(c, msg),
            Listener::Ring(r) => self.at_ring(r, c, msg),
        }
    }

    fn at_root(&mut self, c: usize, msg: Msg) {
        let Some(i) = self.root.pending.iter().position(|&(p, _)| p == c) else {
            return;
        };
        match msg {
            Msg::CheckIn {
                tag,
                rank,
                world,
                ring,
            } => {
                self.root.pending.remove(i);
                self.note(format!(
                    "root takes the check-in of rank {rank} (world {world}, tag {tag:x}) on {}",
                    self.who(c)
                ));
                let Some(root) = &mut self.root.root else {
                    return;
                };
                let event = RootEvent::CheckIn {
                    conn: c as Conn,
                    peer: format!("conn {c}"),
                    tag,
                    rank,
                    world,
                    ring: ring.clone(),
                };
                let now = self.t0 + self.now;
                let actions = root.handle(event, now);
                let waiting: BTreeSet<usize> = root.waiting().map(|w| w as usize).collect();
                let own = matches!(self.conns[c].opener, Opener::CheckIn(r) if r == rank);
                if own && tag == TAG && world == self.n {
                    self.root.taken.entry(rank).or_insert(self.now);
                    if self.faults.duplicates(&mut self.rng) {
                        let at = self.now + self.rng.up_to(Duration::from_secs(1));
                        let replay = Msg::CheckIn {
                            tag,
                            rank,
                            world,
                            ring,
                        };
                        self.planned
                            .push((at, Listener::Root, Kind::Replay, Some(replay)));
                    }
                }
                if waiting.contains(&c) {
                    self.root.held.insert(c);
                }
                self.root_actions(actions);
            }
            Msg::Fin => {
                self.root.pending.remove(i);
                self.note(format!(
                    "root drops {}: closed before its check-in",
                    self.who(c)
                ));
                self.close(c, false);
            }
            // Half a hello: the read waits for the rest, until its deadline.
            Msg::Partial => {}
            _ => {
                self.root.pending.remove(i);
                self.note(format!("root drops {}: not a check-in", self.who(c)));
                self.close(c, false);
            }
        }
    }

    fn root_actions(&mut self, actions: Vec<RootAction>) {
        for RootAction { conn, answer } in actions {
            let c = conn as usize;
            self.root.held.remove(&c);
            match answer {
                Some(Answer {
                    rank,
                    status,
                    texts,
                }) => {
                    let who = self.who(c);
                    self.note(format!(
                        "root answers rank {rank} on {who}: status {status} {texts:?}"
                    ));
                    self.send(c, false, Msg::Answer { status, texts });
                }
                None => self.note(format!("root closes {}", self.who(c))),
            }
            self.close(c, false);
        }
    }

    fn at_ring(&mut self, r: u32, c: usize, msg: Msg) {
        let rank = &mut self.ranks[r as usize];
        if let Some(Ok(pred)) = rank.accepted {
            if pred == c {
                if let Msg::Entry(text) = msg {
                    rank.entries.push_back(text);
                }
                return;
            }
        }
        let Some(i) = rank.pending.iter().position(|&(p, _)| p == c) else {
            return;
        };
        match msg {
            Msg::Hello { tag, rank: from } => {
                rank.pending.remove(i);
                if rank.accepted.is_none() && rank.member.predecessor_hello().accepts(tag, from) {
                    rank.accepted = Some(Ok(c));
                    self.note(format!(
                        "rank {r} takes the ring hello of rank {from} on {}",
                        self.who(c)
                    ));
                    if matches!(self.conns[c].opener, Opener::Successor(_))
                        && self.faults.duplicates(&mut self.rng)
                    {
                        let at = self.now + self.rng.up_to(Duration::from_secs(1));
                        let replay = Msg::Hello { tag, rank: from };
                        self.planned
                            .push((at, Listener::Ring(r), Kind::Replay, Some(replay)));
                    }
                } else {
                    self.note(format!(
                        "rank {r} closes {}: hello of rank {from}, tag {tag:x}",
                        self.who(c)
                    ));
                    self.close(c, false);
                }
            }
            Msg::Fin => {
                rank.pending.remove(i);
                self.close(c, false);
            }
            Msg::Partial => {}
            _ => {
                rank.pending.remove(i);
                self.note(format!("rank {r} drops {}: not a ring hello", self.who(c)));
                self.close(c, false);
            }
        }
    }

    // ---- openers: the ranks' connections and the strangers ----

    fn at_opener(&mut self, c: usize, msg: Msg) {
        if self.conns[c].opener_closed {
            return;
        }
        if let Msg::Fin = msg {
            self.conns[c].fin_at_opener = true;
        }
        match self.conns[c].opener {
            Opener::CheckIn(r) => self.checking_in(r, c, msg),
            Opener::Successor(r) => self.linking(r, c, msg),
            Opener::Probe(_) => {
                if let Msg::Connected = msg {
                    self.close(c, true);
                }
            }
            Opener::Stranger(_) => match msg {
                Msg::Connected => {
                    if let Some((first, close_after)) = self.conns[c].plan.take() {
                        if !matches!(first, Msg::Connect) {
                            self.send(c, true, first);
                        }
                        if let Some(after) = close_after {
                            self.closes.push((self.now + after, c));
                        }
                    }
                }
                Msg::Answer { .. } => self.close(c, true),
                _ => {}
            },
        }
    }

    fn checking_in(&mut self, r: u32, c: usize, msg: Msg) {
        let (Phase::Connecting(Some(conn), _) | Phase::Answering(conn)) =
            self.ranks[r as usize].phase
        else {
            return;
        };
        if conn != c {
            return;
        }
        match msg {
            Msg::Connected => {
                let checkin = Msg::CheckIn {
                    tag: TAG,
                    rank: r,
                    world: self.n,
                    ring: ring_addr(r),
                };
                self.send(c, true, checkin);
                self.ranks[r as usize].phase = Phase::Answering(c);
            }
            Msg::Refused => {
                let rank = &self.ranks[r as usize];
                if self.now + RETRY >= rank.until {
                    self.end_ring(
                        r,
                        Err(IdError::Unreachable {
                            addr: root_addr(),
                            waited: self.now - rank.start,
                            reason: "refused".into(),
                        }),
                    );
                } else {
                    self.ranks[r as usize].phase = Phase::Connecting(None, self.now + RETRY);
                }
            }
            Msg::Answer { status, texts } => {
                self.note(format!("rank {r} gets status {status} {texts:?}"));
                let action = self.ranks[r as usize]
                    .member
                    .handle(MemberEvent::Answer { status, texts });
                self.close(c, true);
                match action {
                    MemberAction::Link {
                        successor,
                        predecessor,
                    } => {
                        let n = self.n;
                        let (Some(next), Some(prev)) =
                            (ring_rank(successor, n), ring_rank(predecessor, n))
                        else {
                            return self.fail(format!(
                                "rank {r} was told ring addresses {successor} and {predecessor}, \
                                 not the ranks'"
                            ));
                        };
                        let rank = &mut self.ranks[r as usize];
                        rank.predecessor = Some(prev);
                        let s = self.open(Opener::Successor(r), Some(r), Listener::Ring(next));
                        let rank = &mut self.ranks[r as usize];
                        rank.succ = Some(s);
                        rank.phase = Phase::Linking(s, false);
                    }
                    MemberAction::Done(result) => self.end_ring(r, result),
                    MemberAction::Send(_) => self.fail(format!("rank {r}: a send before linking")),
                }
            }
            Msg::Fin => self.end_ring(
                r,
                Err(IdError::Protocol {
                    peer: "root".into(),
                    reason: "closed the connection before answering".into(),
                }),
            ),
            _ => {}
        }
    }

    fn linking(&mut self, r: u32, c: usize, msg: Msg) {
        let Phase::Linking(s, false) = self.ranks[r as usize].phase else {
            return;
        };
        if s != c {
            return;
        }
        let next = self.ranks[r as usize].member.successor();
        match msg {
            Msg::Connected => {
                self.send(c, true, Msg::Hello { tag: TAG, rank: r });
                self.ranks[r as usize].phase = Phase::Linking(s, true);
            }
            Msg::Refused => self.end_ring(
                r,
                Err(IdError::Left {
                    rank: next,
                    reason: "its ring listener refused the connection".into(),
                }),
            ),
            _ => {}
        }
    }

    // ---- time: starts, timers, the loops' looks ----

    fn tick(&mut self) {
        for r in 0..self.n {
            if self.dead(Some(r)) || self.stopped(Some(r)) {
                continue;
            }
            if !self.ranks[r as usize].inbox.is_empty() {
                // Just resumed: the listeners' loops look at their clocks (timeouts,
                // probes, the root's watch) before they take the handshakes that
                // ended meanwhile, as `serve_root` and the ring acceptor do; a
                // handshake's own read takes the bytes that came in time.
                if self.ranks[r as usize].ring_result.is_none() {
                    self.acceptor_loop(r);
                }
                if r == 0 && self.root.root.is_some() && self.root.result.is_none() {
                    self.root_loop();
                }
            }
            self.resume(r);
            self.tick_rank(r);
        }
        if self.root.root.is_some()
            && self.root.result.is_none()
            && !self.dead(Some(0))
            && !self.stopped(Some(0))
        {
            self.tick_root();
        }
        // Strangers, and the crash or stop.
        let due: Vec<_> = self
            .planned
            .iter()
            .filter(|p| p.0 <= self.now)
            .cloned()
            .collect();
        self.planned.retain(|p| p.0 > self.now);
        for (_, to, kind, msg) in due {
            self.stranger(to, kind, msg);
        }
        let closes: Vec<usize> = self
            .closes
            .iter()
            .filter(|p| p.0 <= self.now)
            .map(|p| p.1)
            .collect();
        self.closes.retain(|p| p.0 > self.now);
        for c in closes {
            self.note(format!("{} closes", self.who(c)));
            self.close(c, true);
        }
        if let Some((victim, at, stop)) = self.fault {
            if at <= self.now && self.ranks[victim as usize].phase != Phase::NotStarted {
                self.fault = None;
                match stop {
                    None => self.crash(victim),
                    Some(d) => {
                        self.note(format!("rank {victim} stops for {d:?}"));
                        self.ranks[victim as usize].paused = Some((self.now, self.now + d));
                    }
                }
            } else if at <= self.now && self.ranks[victim as usize].result.is_some() {
                self.fault = None;
            }
        }
    }

    /// A stopped rank that runs again takes in what came meanwhile.
    fn resume(&mut self, r: u32) {
        while let Some((channel, msg)) = self.ranks[r as usize].inbox.pop_front() {
            self.handle(channel, msg);
        }
    }

    fn tick_rank(&mut self, r: u32) {
        let now = self.now;
        let rank = &self.ranks[r as usize];
        if rank.phase == Phase::NotStarted {
            if rank.start <= now {
                self.note(format!("rank {r} starts"));
                let rank = &mut self.ranks[r as usize];
                rank.ring_open = true;
                rank.probed = now;
                if r == 0 {
                    self.root.open = true;
                    let until = self.t0 + self.ranks[0].until;
                    self.root.root = Some(Root::new(TAG, self.n, self.t0 + now, until));
                    self.root.watched = now;
                    for (channel, msg) in std::mem::take(&mut self.root.backlog) {
                        self.handle(channel, msg);
                    }
                }
                let c = self.open(Opener::CheckIn(r), Some(r), Listener::Root);
                self.ranks[r as usize].phase = Phase::Connecting(Some(c), now);
            }
            return;
        }
        if rank.ring_result.is_none() {
            self.tick_acceptor(r);
        }
        let rank = &self.ranks[r as usize];
        let timed_out = now >= rank.until;
        match rank.phase {
            Phase::Connecting(None, at) if at <= now => {
                let c = self.open(Opener::CheckIn(r), Some(r), Listener::Root);
                self.ranks[r as usize].phase = Phase::Connecting(Some(c), now);
            }
            Phase::Connecting(..) | Phase::Answering(_) if timed_out => {
                let e = IdError::Protocol {
                    peer: "root".into(),
                    reason: "timed out".into(),
                };
                self.end_ring(r, Err(e));
            }
            Phase::Linking(_, true) => match &rank.accepted {
                Some(Ok(_)) => {
                    let action = self.ranks[r as usize].member.handle(MemberEvent::Linked);
                    self.note(format!("rank {r} linked"));
                    self.ranks[r as usize].phase = Phase::Exchanging;
                    self.act(r, action);
                }
                Some(Err(_)) => {
                    let Some(Err(e)) = self.ranks[r as usize].accepted.take() else {
                        return;
                    };
                    self.end_ring(r, Err(e));
                }
                None => {}
            },
            Phase::Linking(_, false) if timed_out => {
                let e = IdError::Protocol {
                    peer: "successor".into(),
                    reason: "timed out".into(),
                };
                self.end_ring(r, Err(e));
            }
            Phase::Exchanging => {
                let rank = &mut self.ranks[r as usize];
                if let Some(entry) = rank.entries.pop_front() {
                    let action = rank.member.handle(MemberEvent::Entry(entry));
                    self.act(r, action);
                } else if let Some(Ok(pred)) = rank.accepted {
                    let prev = rank.member.predecessor();
                    if self.conns[pred].fin_at_listener {
                        self.end_ring(
                            r,
                            Err(IdError::Left {
                                rank: prev,
                                reason: "the ring link closed".into(),
                            }),
                        );
                    } else if timed_out {
                        let e = IdError::Protocol {
                            peer: "predecessor".into(),
                            reason: "timed out".into(),
                        };
                        self.end_ring(r, Err(e));
                    }
                }
            }
            _ => {}
        }
        if r == 0 {
            self.end_rank_zero();
        }
    }

    fn act(&mut self, r: u32, action: MemberAction) {
        match action {
            MemberAction::Send(entry) => {
                let s = self.ranks[r as usize].succ.unwrap();
                if self.conns[s].fin_at_opener {
                    let next = self.ranks[r as usize].member.successor();
                    return self.end_ring(
                        r,
                        Err(IdError::Left {
                            rank: next,
                            reason: "the ring link closed".into(),
                        }),
                    );
                }
                self.send(s, true, Msg::Entry(entry));
            }
            MemberAction::Done(result) => self.end_ring(r, result),
            MemberAction::Link { .. } => self.fail(format!("rank {r}: a link out of turn")),
        }
    }

    /// The acceptor: its handshakes' read deadlines, then its loop.
    fn tick_acceptor(&mut self, r: u32) {
        let now = self.now;
        let rank = &mut self.ranks[r as usize];
        let expired: Vec<usize> = rank
            .pending
            .iter()
            .filter(|&&(_, by)| by <= now)
            .map(|&(c, _)| c)
            .collect();
        rank.pending.retain(|&(_, by)| by > now);
        for c in expired {
            self.note(format!("rank {r}: {} read timed out", self.who(c)));
            self.close(c, false);
        }
        self.acceptor_loop(r);
    }

    /// The acceptor's loop: its timeout, and the probe of the predecessor.
    fn acceptor_loop(&mut self, r: u32) {
        let now = self.now;
        let rank = &mut self.ranks[r as usize];
        if rank.accepted.is_some() {
            return;
        }
        if now >= rank.until {
            rank.accepted = Some(Err(IdError::Protocol {
                peer: "ring predecessor".into(),
                reason: "never connected before the timeout".into(),
            }));
            return;
        }
        if let Some(prev) = rank.predecessor {
            if now >= rank.probed + WATCH_EVERY * 2 {
                rank.probed = now;
                // The probe blocks the acceptor's loop until it connects or is
                // refused: one round trip, in which nothing else happens there.
                if self.listening(Listener::Ring(prev)) && !self.dead(Some(prev)) {
                    self.open(Opener::Probe(r), Some(r), Listener::Ring(prev));
                } else {
                    self.note(format!("rank {r}: probe of rank {prev}'s listener refused"));
                    self.ranks[r as usize].accepted = Some(Err(IdError::Left {
                        rank: prev,
                        reason: "its ring listener refused the connection".into(),
                    }));
                }
            }
        }
    }

    /// The root: its handshakes' read deadlines, then its loop.
    fn tick_root(&mut self) {
        let now = self.now;
        let expired: Vec<usize> = self
            .root
            .pending
            .iter()
            .filter(|&&(_, by)| by <= now)
            .map(|&(c, _)| c)
            .collect();
        self.root.pending.retain(|&(_, by)| by > now);
        for c in expired {
            self.note(format!("root: {} read timed out", self.who(c)));
            self.close(c, false);
        }
        self.root_loop();
    }

    /// The root's loop: whether it is done, and its watch for departed ranks.
    fn root_loop(&mut self) {
        let now = self.now;
        let instant = self.instant();
        let Some(root) = &mut self.root.root else {
            return;
        };
        if let Some(end) = root.poll(instant) {
            self.note(format!("the root ends: {end:?}"));
            self.root.result = Some(end);
            self.root.open = false;
            for c in std::mem::take(&mut self.root.held) {
                self.close(c, false);
            }
            for (c, _) in std::mem::take(&mut self.root.pending) {
                self.close(c, false);
            }
            self.end_rank_zero();
            return;
        }
        if now >= self.root.watched + WATCH_EVERY {
            self.root.watched = now;
            let gone = root
                .waiting()
                .find(|&w| self.conns[w as usize].fin_at_listener);
            if let Some(conn) = gone {
                let actions = root.handle(RootEvent::Closed(conn), instant);
                self.note(format!("root sees {} closed", self.who(conn as usize)));
                self.root_actions(actions);
            }
        }
    }

    fn stranger(&mut self, to: Listener, kind: Kind, msg: Option<Msg>) {
        let first = match (kind, to) {
            (Kind::Replay, _) => msg.unwrap(),
            (Kind::Silent, _) => Msg::Connect,
            (Kind::Partial, _) => Msg::Partial,
            (Kind::Flood, _) => {
                if self.rng.chance(50) {
                    Msg::Partial
                } else {
                    Msg::Connect
                }
            }
            (Kind::WrongTag, Listener::Root) => Msg::CheckIn {
                tag: TAG + 1,
                rank: 0,
                world: self.n,
                ring: "10.9.9.9:1".into(),
            },
            (Kind::WrongTag, Listener::Ring(r)) => Msg::Hello {
                tag: TAG + 1,
                rank: self.ranks[r as usize].member.predecessor(),
            },
            (Kind::WrongRank, Listener::Root) => Msg::CheckIn {
                tag: TAG,
                rank: 0,
                world: self.n + 1,
                ring: "10.9.9.9:1".into(),
            },
            (Kind::WrongRank, Listener::Ring(r)) => {
                let prev = self.ranks[r as usize].member.predecessor();
                let other = (prev + 1 + self.rng.below(u64::from(self.n)) as u32) % (self.n + 1);
                if other == prev {
                    return;
                }
                Msg::Hello {
                    tag: TAG,
                    rank: other,
                }
            }
            (Kind::BadRank, _) => Msg::CheckIn {
                tag: TAG,
                rank: self.n,
                world: self.n,
                ring: "10.9.9.9:1".into(),
            },
        };
        let close_after = self
            .faults
            .drops(&mut self.rng)
            .then(|| self.rng.up_to(Duration::from_secs(8)));
        let c = self.open(Opener::Stranger(kind), None, to);
        self.note(format!("{} connects to send {first:?}", self.who(c)));
        self.conns[c].plan = Some((first, close_after));
    }

    // ---- ends ----

    /// Rank `r`'s ring part ends: its listener stops, its connections close.
    fn end_ring(&mut self, r: u32, result: Result<Vec<String>, IdError>) {
        let rank = &mut self.ranks[r as usize];
        if rank.ring_result.is_some() {
            return;
        }
        rank.ring_open = false;
        rank.phase = Phase::Ended;
        rank.ring_ended = Some(self.now);
        let mut close: Vec<(usize, bool)> =
            rank.pending.drain(..).map(|(c, _)| (c, false)).collect();
        if let Some(Ok(p)) = rank.accepted {
            close.push((p, false));
        }
        self.note(format!("rank {r}'s exchange ends: {result:?}"));
        self.ranks[r as usize].ring_result = Some(result);
        for c in 0..self.conns.len() {
            if self.conns[c].pid == Some(r) {
                close.push((c, true));
            }
        }
        for (c, by_opener) in close {
            self.close(c, by_opener);
        }
        if r == 0 {
            self.end_rank_zero();
        } else {
            self.finish(r);
        }
    }

    /// Rank 0 returns once its ring part and its root both ended: the root's error
    /// first, as `exchange_with` reports it.
    fn end_rank_zero(&mut self) {
        let zero = &self.ranks[0];
        if zero.crashed.is_some() || zero.result.is_some() || zero.ring_result.is_none() {
            return;
        }
        let Some(served) = &self.root.result else {
            return;
        };
        let ring = self.ranks[0].ring_result.take().unwrap();
        let result = match (ring, served) {
            (Err(e @ IdError::Unreachable { .. }), _) => Err(e),
            (_, Err(e)) => Err(copy(e)),
            (ring, Ok(())) => ring,
        };
        self.ranks[0].ring_result = Some(Ok(Vec::new()));
        self.ranks[0].result = Some(result);
        self.finish(0);
    }

    /// Checks a rank's end.
    fn finish(&mut self, r: u32) {
        let rank = &mut self.ranks[r as usize];
        if rank.result.is_none() {
            rank.result = rank.ring_result.take();
        }
        rank.ended_at = Some(self.now);
        let want: Vec<String> = (0..self.n).map(endpoint).collect();
        let result = format!("{:?}", self.ranks[r as usize].result);
        self.note(format!("rank {r} returns {result}"));
        match &self.ranks[r as usize].result {
            Some(Ok(world)) if *world != want => {
                self.fail(format!(
                    "rank {r} returned the world {world:?}, not the job's {want:?}"
                ));
            }
            _ => {}
        }
    }

    fn crash(&mut self, r: u32) {
        self.note(format!("rank {r} crashes"));
        let rank = &mut self.ranks[r as usize];
        rank.crashed = Some(self.now);
        rank.ring_open = false;
        rank.phase = Phase::Ended;
        rank.inbox.clear();
        for c in 0..self.conns.len() {
            let conn = &self.conns[c];
            if conn.pid == Some(r) {
                self.close(c, true);
            } else if conn.accepted
                && (conn.to == Listener::Ring(r) || (r == 0 && conn.to == Listener::Root))
            {
                // Connections still on their way are refused when they arrive.
                self.close(c, false);
            }
        }
        if r == 0 {
            self.root.open = false;
            self.root.result = Some(Ok(()));
            self.root.held.clear();
            self.root.pending.clear();
        }
    }

    // ---- the invariants ----

    /// Every wait ends by its timeout.
    fn check_timeouts(&mut self) {
        for r in 0..self.n {
            let rank = &self.ranks[r as usize];
            if rank.result.is_some() || rank.crashed.is_some() || rank.phase == Phase::NotStarted {
                continue;
            }
            let stopped = rank.paused.map_or(Duration::ZERO, |(from, to)| to - from);
            if self.now > rank.until + stopped + SLACK {
                let why = format!(
                    "rank {r} still waits {:?} after its start, past its timeout of {:?} \
                     (stopped {stopped:?}), in {:?}",
                    self.now - rank.start,
                    self.timeout,
                    rank.phase
                );
                self.fail(why);
            }
        }
    }

    /// On the ends: errors are named truthfully, quiet jobs form, departures are
    /// seen at once.
    fn check_end(&mut self) -> Result<(), String> {
        // When each rank crashed or gave up, if it did.
        let gave_up: Vec<Option<Duration>> = self
            .ranks
            .iter()
            .map(|rank| match (&rank.result, rank.crashed) {
                (_, Some(at)) => Some(at),
                (Some(Err(_)), _) => rank.ring_ended,
                _ => None,
            })
            .collect();
        for r in 0..self.n {
            let rank = &self.ranks[r as usize];
            // A rank stopped longer than a hello's read deadline: its neighbour dropped
            // its hello as a stalled stranger's and closed the link, which it cannot
            // tell from a departure (a limit of the design, docs/testing.md).
            let stalled = rank
                .paused
                .is_some_and(|(from, to)| to - from >= CHECK_IN_READ);
            if let Some(Err(IdError::Left { rank: gone, .. })) = &rank.result {
                let left = gave_up.get(*gone as usize).copied().flatten();
                if !stalled && left.is_none_or(|at| Some(at) > rank.ended_at) {
                    return Err(format!(
                        "rank {r} reports at {:?} that rank {gone} left, but rank {gone} did \
                         not crash or give up before that ({:?})",
                        rank.ended_at, self.ranks[*gone as usize].result
                    ));
                }
            }
        }
        let crashed = (0..self.n).find(|&r| self.ranks[r as usize].crashed.is_some());
        let paused = (0..self.n).any(|r| self.ranks[r as usize].paused.is_some());
        if crashed.is_none() && !paused {
            let last = self.ranks.iter().map(|r| r.start).max().unwrap_or_default();
            for r in 0..self.n {
                let rank = &self.ranks[r as usize];
                match (&rank.result, rank.ended_at) {
                    (Some(Ok(_)), Some(at)) if at <= last + Duration::from_secs(1) => {}
                    (result, at) => {
                        return Err(format!(
                            "with no crash and no stop, rank {r} returned {result:?} at {at:?}, \
                             not the job's world within 1 s of the last start ({last:?})"
                        ));
                    }
                }
            }
        }
        if let Some(c) = crashed {
            let at = self.ranks[c as usize].crashed.unwrap();
            if self.root.taken.contains_key(&c) && !paused {
                // The ranks the root heard from (one that comes later finds no root
                // when rank 0 crashed, or none after the linger, and waits for its
                // timeout): each ends within 1 s of the crash or of its check-in,
                // whichever is later, not when a missing rank would have come.
                let heard: Vec<(u32, Duration)> = self
                    .root
                    .taken
                    .iter()
                    .filter(|&(&r, _)| r != c)
                    .map(|(&r, &t)| (r, t))
                    .collect();
                for (r, checked_in) in heard {
                    // Rank 0 returns when its root does: up to the linger later.
                    let linger = if r == 0 { LINGER } else { Duration::ZERO };
                    let bound = at.max(checked_in) + linger + Duration::from_secs(1);
                    let rank = &self.ranks[r as usize];
                    if rank.ended_at.is_some_and(|t| t > bound) {
                        return Err(format!(
                            "rank {c} crashed at {at:?} after the root took its check-in, but \
                             rank {r}, whose check-in the root took at {checked_in:?}, ended \
                             only at {:?}, past {bound:?}: {:?}",
                            rank.ended_at.unwrap(),
                            rank.result
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.ranks
            .iter()
            .all(|r| r.result.is_some() || r.crashed.is_some())
    }

    fn run(&mut self) -> Result<(), String> {
        let bound = self.timeout * 3 + Duration::from_secs(30);
        loop {
            self.tick();
            self.check_timeouts();
            if let Some(broken) = self.broken.take() {
                return Err(broken);
            }
            if self.done() {
                return self.check_end();
            }
            if self.now > bound {
                return Err(format!("the simulation ran past {bound:?}"));
            }
            match self.net.step(&mut self.rng, &self.faults, self.now) {
                Step::Deliver(channel, msg) => self.deliver(channel, msg),
                Step::Advance { .. } => self.advance(),
            }
        }
    }

    /// Moves the clock by up to 20 ms (the loops look every [`RETRY`]), never past a
    /// message, a start, a stranger or the fault.
    fn advance(&mut self) {
        let now = self.now;
        let next = self
            .net
            .next_due_after(now)
            .into_iter()
            .chain(self.ranks.iter().map(|r| r.start))
            .chain(self.ranks.iter().filter_map(|r| r.paused.map(|(_, to)| to)))
            .chain(self.planned.iter().map(|p| p.0))
            .chain(self.fault.map(|(_, at, _)| at))
            .filter(|&t| t > now)
            .min();
        let jump = self.rng.between(Duration::from_micros(1), RETRY);
        self.now = next.map_or(now + jump, |t| t.min(now + jump));
    }
}

/// An error as another rank sees it (the root's, which rank 0 reports).
fn copy(e: &IdError) -> IdError {
    match e {
        IdError::Left { rank, reason } => IdError::Left {
            rank: *rank,
            reason: reason.clone(),
        },
        IdError::Missing {
            waited,
            missing,
            refused,
        } => IdError::Missing {
            waited: *waited,
            missing: missing.clone(),
            refused: refused.clone(),
        },
        e => IdError::Address(e.to_string()),
    }
}

fn run(seed: u64) -> sim::Outcome {
    let mut sim = Sim::new(seed);
    let result = sim.run();
    sim::Outcome::new(result, sim.trace)
}

#[test]
fn sim_the_unique_id_bootstrap_keeps_its_invariants() {
    Campaign::new(
        "switchyard-bootstrap",
        "sim_the_unique_id_bootstrap_keeps_its_invariants",
        BUDGET,
    )
    .check(run);
}
