//! A deterministic simulation of the tracker server: the real sans-IO pieces the
//! threaded server feeds (the classic and JSON machines under the one-protocol rule,
//! [`Machines`]; the print/shutdown order, [`Sequence`]; the connection cap, [`Cap`]),
//! driven by a model of the connection threads over a simulated network and clock that
//! one seed decides.
//!
//! Each seed makes a job of 1-4 workers of one protocol (classic or JSON) on 1-4
//! hosts: each connects, says `start` (negotiating its links, or waiting for its peer
//! frame), then prints a few lines and shuts down, each command on a connection of its
//! own, its bytes cut at random points and each piece delayed. Strangers come too, on
//! the workers' hosts or another: silent ones, ones that send part of a hello and
//! stall, a whole classic `print` hello without its text, a `start` of the other
//! protocol, floods past a small connection cap, replays of a worker's `print`,
//! `shutdown` or JSON `start`, and a whole job of the other protocol once the workers'
//! protocol has given ranks. Some close their connections after a while. The clock
//! jumps by what the seed picks, at times past the grace and the read timeout.
//!
//! What the model of the threads does with each connection mirrors `accept.rs`,
//! `classic_conn.rs` and `json_conn.rs`: the cap's `admit` and the sequence's `enter`
//! at accept, the magic answered, the command parsed from the bytes that arrived,
//! `heard` once the whole command is in, the wait for the turn (at most the read
//! timeout), `settle` and `started` once a `start` is taken in, the wait for the batch,
//! the link negotiation, the read timeout on every read, and `settle` and `leave` when
//! the connection's thread ends. The threads themselves and the sockets are not run.
//!
//! Checked at every step: no worker's connection is dropped or refused (its `start`
//! refused for mixing protocols, say, or closed by the cap before its command came); no
//! worker is refused by the cap while a stranger that has not started a rank holds a
//! slot; a worker's `print` or `shutdown` whose command is in is held back by a
//! stranger's incomplete command at most the grace from that stranger's accept (plus
//! the real wait's 50 ms recheck); the protocol the workers do not speak gives no rank.
//! Checked at the end: every worker got a rank, the job completed (every rank shut
//! down) within 60 s of simulated time, each worker's prints were logged in the order it
//! sent them and before its shutdown, its shutdown was counted (the tracker's record)
//! for the rank the tracker gave it, and the job's protocol is the workers'.
//!
//! The generator, the in-order network and the campaign runner are the simulator's
//! ([`switchyard_sim`]): `SEED=n` replays one seed and prints its trace (in the proof
//! tests, under their broken variant); `SIM_SEEDS=n` runs that many seeds instead of
//! the default budget; a failing seed prints the line that replays it. [`Variant`]
//! holds three decisions that fixes replaced, reverted, so that the tests show the
//! simulation finds each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::cap::{Admit, Cap};
use super::machines::Machines;
use super::sequence::{GREETING_GRACE, Sequence};
use crate::classic::{self, Classic, Command, Negotiation, task_id};
use crate::common::{ConnId, SortBy};
use crate::json::{self, Json};
use crate::record::Record;
use crate::wire::{Limits, MAGIC, put_i32, put_json, put_str};
use serde_json::{Value, json};
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use switchyard_sim::{self as sim, Campaign, Faults, Network, Rng, Step, Trace};

/// Seeds a plain `cargo test` runs.
const BUDGET: u64 = 1500;
/// The job must be over within this much simulated time.
const BOUND: Duration = Duration::from_secs(60);
/// How often the real wait for a turn looks again whether a grace ran out (the
/// simulated one looks at every step).
const RECHECK: Duration = Duration::from_millis(50);
/// Each hop of the network takes 2-10 ms; one time in ten the clock runs although a
/// message is due.
fn faults() -> Faults {
    Faults::delays(Duration::from_millis(2), Duration::from_millis(10))
}
/// How long a JSON worker waits for the tracker to close its `print` connection.
const PRINT_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The server's decisions under test: as fixed, or one of them reverted.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    /// The server as it is.
    Fixed,
    /// Before 65ec50c: a connection held its host's later ones for good once the first
    /// eight bytes of its hello arrived (`heard` there, not once the command is in).
    HeardAtHead,
    /// Before 560b46f: a `start` still waiting for its batch decided the job's
    /// protocol ([`Machines::by_claim`]).
    ProtocolByClaim,
    /// Before 434340e: a connection left the cap's evictable set once the first eight
    /// bytes of its hello arrived (`started` there, not once a machine took a `start`).
    EvictByClaim,
}

impl Variant {
    /// The test that runs it.
    fn test(self) -> &'static str {
        match self {
            Variant::Fixed => "sim_the_tracker_keeps_its_invariants",
            Variant::HeardAtHead => "sim_finds_a_hold_counted_from_the_first_eight_bytes",
            Variant::ProtocolByClaim => "sim_finds_a_protocol_decided_by_a_waiting_start",
            Variant::EvictByClaim => "sim_finds_eviction_by_claim",
        }
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cmd::Start => write!(f, "start"),
            Cmd::Print(text) => write!(f, "print {}", short(text)),
            Cmd::Shutdown => write!(f, "shutdown"),
        }
    }
}

/// A print's text for the trace: a long one cut short.
fn short(text: &str) -> String {
    match text.char_indices().nth(12) {
        Some((i, _)) if text.len() > 16 => format!("{:?}... ({} bytes)", &text[..i], text.len()),
        _ => format!("{text:?}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Proto {
    Classic,
    Json,
}

/// A worker's command.
#[derive(Clone, Debug, PartialEq)]
enum Cmd {
    Start,
    Print(String),
    Shutdown,
}

/// What a stranger does.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Connects and sends nothing.
    Silent,
    /// Sends the start of a hello and stalls.
    Partial,
    /// Sends a whole classic `print` hello without the text, and stalls.
    PrintHello,
    /// A whole `start` of the protocol the workers do not speak.
    OtherStart,
    /// A whole `start` of the protocol the workers do not speak, one of a whole job's
    /// (n of them) that comes after the workers' protocol gave ranks.
    LateStart,
    /// One of a flood (silent or partial).
    Flood,
    /// A worker's command sent again.
    Replay,
}

#[derive(Clone, Debug)]
enum Owner {
    Worker(usize, Cmd),
    Stranger(Kind),
}

/// A decision for a connection waiting after its `start`.
#[derive(Debug)]
enum Go {
    Turn(u32),
    Peer(u32),
    Refused(&'static str),
}

/// A command whose turn a connection waits for.
#[derive(Clone, Debug)]
enum Carry {
    ClassicPrint(String),
    ClassicShutdown(i32),
    JsonPrint(String),
    JsonShutdown(i64),
}

#[derive(Clone, Copy, Debug)]
enum NegStep {
    Good,
    Errors(usize),
    Port,
}

/// Where a connection's thread is.
#[derive(Debug)]
enum Stage {
    /// Not accepted yet.
    Connecting,
    /// Reading the magic, hello and command.
    Hello,
    /// Waiting for its turn (`Shared::await_turn`).
    Turn { carry: Carry, since: Duration },
    /// A classic `shutdown` waiting for its rank's negotiation to end.
    Held { rank: i32, until: Duration },
    /// A `start` taken in, waiting for its batch.
    Waiting { json: bool },
    /// Classic link negotiation.
    Negotiating {
        neg: Box<Negotiation>,
        rank: u32,
        step: NegStep,
    },
    /// Its thread ended.
    Ended,
}

/// A connection, both ends.
struct Conn {
    owner: Owner,
    host: String,
    /// How many bytes (magic included) make its whole command; `None`: never whole.
    command_len: Option<usize>,
    /// What it sends after the magic answer.
    rest: Vec<u8>,
    id: Option<ConnId>,
    accepted_at: Duration,
    buf: Vec<u8>,
    pos: usize,
    magic_answered: bool,
    head_seen: bool,
    stage: Stage,
    deadline: Duration,
    /// When its whole command had arrived (what the world knows, not the server).
    complete_at: Option<Duration>,
    /// Holds a place in the cap (admitted, thread not ended).
    open: bool,
    /// No longer holds back its host's later connections.
    settled: bool,
    /// A machine took its `start` in.
    taken_in: bool,
    /// The server closed its socket (the cap evicted it, or its thread ended).
    closed: bool,
    inbox: VecDeque<Go>,
    /// When the client closes it.
    fin_at: Option<Duration>,
    fin_sent: bool,
}

struct Worker {
    host: String,
    proto: Proto,
    task: Option<String>,
    rank: Option<u32>,
    script: VecDeque<Cmd>,
    prints: Vec<String>,
    /// Idle and ready from this time to open its next connection.
    ready_at: Option<Duration>,
    /// A JSON `print` waiting for its close, until.
    waiting: Option<(usize, Duration)>,
    port: u16,
    /// The rank the tracker gave it: its turn's (classic), or its place in the batch
    /// (JSON, which the worker learns as its successor's rank minus one).
    given: Option<u32>,
}

/// A stranger to come.
struct Planned {
    at: Duration,
    host: String,
    kind: Kind,
    bytes: Vec<u8>,
    complete: bool,
    fin_after: Option<Duration>,
}

#[derive(Debug)]
enum Msg {
    Connect,
    Bytes(Vec<u8>),
    Fin,
    MagicAnswer,
    Assignment(u32),
    Round { connect: usize, accept: u32 },
    RankRefused,
    WorldSize,
    Peer(u32),
    Closed,
}

/// A direction of connection `key`: towards the tracker (`true`) or the client.
type Channel = (usize, bool);

/// What the tracker logged.
#[derive(Debug)]
enum Logged {
    Print(usize, String),
    Shutdown(usize, u32),
}

struct Sim {
    rng: Rng,
    faults: Faults,
    variant: Variant,
    t0: Instant,
    now: Duration,
    n: u32,
    proto: Proto,
    read_timeout: Duration,
    limits: Limits,
    machines: Machines,
    sequence: Sequence,
    cap: Cap<usize>,
    next_id: ConnId,
    conns: Vec<Conn>,
    active: BTreeSet<usize>,
    workers: Vec<Worker>,
    planned: Vec<Planned>,
    replays: bool,
    /// A job of the other protocol comes this long after the workers' protocol gave
    /// its first rank.
    late: Option<Duration>,
    net: Network<Channel, Duration, Msg>,
    log: Vec<Logged>,
    done: bool,
    broken: Option<String>,
    trace: Trace,
}

/// Classic hello bytes after the magic.
fn classic_hello(rank: i32, world: i32, task: Option<&str>, command: &str) -> Vec<u8> {
    let mut b = Vec::new();
    put_i32(&mut b, rank);
    put_i32(&mut b, world);
    put_str(&mut b, task.unwrap_or("NULL"));
    put_str(&mut b, command);
    b
}

/// JSON hello and command frames.
fn json_hello(rank: i64, task: &str, world: i64, cmd: &Value) -> Vec<u8> {
    let mut b = Vec::new();
    put_json(
        &mut b,
        &json!({"rank": rank, "task_id": task, "world_size": world}),
    );
    put_json(&mut b, cmd);
    b
}

fn magic() -> Vec<u8> {
    MAGIC.to_le_bytes().to_vec()
}

/// Why parsing stopped.
enum Stop {
    /// More bytes are needed.
    Need,
    /// The connection broke the protocol.
    Bad(String),
}

/// Reads what has arrived, as the server's `Deadline` reads a stream.
struct Rd<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        if self.b.len() - self.p < n {
            return Err(Stop::Need);
        }
        let s = &self.b[self.p..self.p + n];
        self.p += n;
        Ok(s)
    }

    fn i32(&mut self) -> Result<i32, Stop> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn len(&mut self, what: &str, cap: usize) -> Result<usize, Stop> {
        let len = self.i32()?;
        usize::try_from(len)
            .ok()
            .filter(|&l| l <= cap)
            .ok_or_else(|| Stop::Bad(format!("{what} length {len}")))
    }

    fn str(&mut self, what: &str, cap: usize) -> Result<String, Stop> {
        let len = self.len(what, cap)?;
        String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| Stop::Bad(format!("{what}: not UTF-8")))
    }
}

/// A whole command.
enum Parsed {
    Classic(classic::Hello, Option<String>),
    Json(json::Hello, Value),
}

/// The magic, the hello and the command (and a classic `print`'s text), as
/// `accept::session` and the protocols' sessions read them; with the bytes used.
fn parse_command(buf: &[u8], limits: &Limits) -> Result<(Parsed, usize), Stop> {
    let mut r = Rd { b: buf, p: 0 };
    if r.i32()? != MAGIC {
        return Err(Stop::Bad("bad magic".into()));
    }
    let head = r.take(8)?;
    let first = i32::from_le_bytes(head[..4].try_into().unwrap());
    let second: [u8; 4] = head[4..].try_into().unwrap();
    if second[..2] == *b"{\"" {
        let len = usize::try_from(first)
            .ok()
            .filter(|&l| l >= 4 && l <= limits.max_frame)
            .ok_or_else(|| Stop::Bad(format!("hello frame length {first}")))?;
        let mut body = second.to_vec();
        body.extend(r.take(len - 4)?);
        let hello: json::Hello =
            serde_json::from_slice(&body).map_err(|e| Stop::Bad(format!("hello frame: {e}")))?;
        let clen = r.len("command frame", limits.max_frame)?;
        let cmd: Value = serde_json::from_slice(r.take(clen)?)
            .map_err(|e| Stop::Bad(format!("command frame: {e}")))?;
        Ok((Parsed::Json(hello, cmd), r.p))
    } else {
        let task = task_id(r.str("task id", limits.max_str)?);
        let text = r.str("command", limits.max_str)?;
        let command =
            Command::parse(&text).ok_or_else(|| Stop::Bad(format!("unknown command {text:?}")))?;
        let body = match command {
            Command::Print => Some(r.str("print text", limits.max_str)?),
            Command::Silent => return Err(Stop::Bad("silent reports are not simulated".into())),
            _ => None,
        };
        let hello = classic::Hello {
            rank: first,
            world: i32::from_le_bytes(second),
            task_id: task,
            command,
        };
        Ok((Parsed::Classic(hello, body), r.p))
    }
}

impl Sim {
    fn new(seed: u64, variant: Variant) -> Sim {
        let mut rng = Rng::new(seed);
        let n = 1 + rng.below(4) as u32;
        let proto = if rng.chance(50) {
            Proto::Classic
        } else {
            Proto::Json
        };
        let hosts = 1 + rng.below(u64::from(n)) as usize;
        let read_timeout = Duration::from_secs([3, 5, 10, 30][rng.below(4) as usize]);
        let others = if n >= 2 && rng.chance(40) {
            1 + rng.below(u64::from(n - 1)) as usize
        } else {
            0
        };
        let flood = rng.chance(35);
        let cap = n as usize + others + 3 + rng.below(6) as usize;
        let by_claim = variant == Variant::ProtocolByClaim;
        let mut sim = Sim {
            variant,
            t0: Instant::now(),
            now: Duration::ZERO,
            n,
            proto,
            read_timeout,
            limits: Limits::default(),
            machines: Machines {
                classic: Classic::new(n, SortBy::Host),
                json: Json::new(n, SortBy::Host),
                journal: None,
                by_claim,
            },
            sequence: Sequence::default(),
            cap: Cap::new(cap),
            next_id: 1,
            conns: Vec::new(),
            active: BTreeSet::new(),
            workers: Vec::new(),
            planned: Vec::new(),
            replays: rng.chance(30),
            late: None,
            net: Network::default(),
            log: Vec::new(),
            done: false,
            broken: None,
            trace: Trace::default(),
            rng,
            faults: faults(),
        };
        let host = |i: usize| format!("10.0.0.{}", i + 1);
        for w in 0..n as usize {
            let prints = sim.rng.below(5) as usize;
            let task = (!sim.rng.chance(30)).then(|| format!("task-{w}"));
            // Now and then a long one, which comes in more pieces.
            let texts: Vec<String> = (0..prints)
                .map(|i| {
                    let long = if sim.rng.chance(30) { 4000 } else { 0 };
                    format!("w{w} line {i}{}", "x".repeat(long))
                })
                .collect();
            let mut script: VecDeque<Cmd> = VecDeque::from([Cmd::Start]);
            script.extend(texts.iter().cloned().map(Cmd::Print));
            script.push_back(Cmd::Shutdown);
            let start = sim.rng.up_to(Duration::from_millis(300));
            sim.workers.push(Worker {
                host: host(w % hosts),
                proto,
                task,
                rank: None,
                script,
                prints: texts,
                ready_at: Some(start),
                waiting: None,
                port: 9000 + w as u16,
                given: None,
            });
        }
        let worker_host = |rng: &mut Rng| {
            if rng.chance(75) {
                host(rng.below(hosts as u64) as usize)
            } else {
                "10.9.9.9".to_string()
            }
        };
        let strangers = sim.rng.below(5);
        for _ in 0..strangers {
            let kind = [Kind::Silent, Kind::Partial, Kind::Partial, Kind::PrintHello]
                [sim.rng.below(4) as usize];
            let at = sim.rng.up_to(Duration::from_secs(3));
            let h = worker_host(&mut sim.rng);
            sim.plan(kind, at, h);
        }
        for _ in 0..others {
            let at = sim.rng.up_to(Duration::from_millis(500));
            let h = worker_host(&mut sim.rng);
            sim.plan(Kind::OtherStart, at, h);
        }
        if flood {
            let count = cap / 2 + sim.rng.below(2 * cap as u64) as usize;
            let mut at = sim.rng.up_to(Duration::from_secs(2));
            for _ in 0..count {
                let h = worker_host(&mut sim.rng);
                sim.plan(Kind::Flood, at, h);
                // A flood slower than a worker's round trip: a faster one can close a
                // worker's connection before its hello arrives (see docs/testing.md).
                at += Duration::from_millis(25 + sim.rng.below(35));
            }
        }
        sim.late = sim
            .rng
            .chance(25)
            .then(|| sim.rng.up_to(Duration::from_secs(3)));
        sim.trace(format!(
            "{n} {proto:?} workers on {hosts} hosts, read timeout {read_timeout:?}, cap {cap}, \
             {strangers} strangers, {others} other-protocol starts, flood {flood}, replays {}, \
             late other-protocol job {:?}, {variant:?}",
            sim.replays, sim.late
        ));
        sim
    }

    /// A partial hello: the start of some whole command, cut before its end.
    fn partial(&mut self) -> Vec<u8> {
        let mut whole = magic();
        whole.extend(match self.rng.below(5) {
            0 => {
                let mut b = classic_hello(0, 2, Some("t"), "print");
                put_str(&mut b, "some text");
                b
            }
            1 => classic_hello(-1, -1, None, "start"),
            2 => classic_hello(1, 2, Some("task-1"), "shutdown"),
            3 => json_hello(0, "t", 2, &json!({"cmd": 4, "msg": "some text"})),
            _ => json_hello(0, "", -1, &json!({"cmd": 1, "port": 7000, "error_port": 0})),
        });
        // Past the first eight bytes of the hello, more often than not.
        let cut = if self.rng.chance(60) {
            12 + self.rng.below(whole.len() as u64 - 12) as usize
        } else {
            self.rng.below(whole.len() as u64) as usize
        };
        whole.truncate(cut);
        whole
    }

    fn plan(&mut self, kind: Kind, at: Duration, host: String) {
        let (bytes, complete) = match kind {
            Kind::Silent => (Vec::new(), false),
            Kind::Partial => (self.partial(), false),
            Kind::Flood => {
                if self.rng.chance(30) {
                    (Vec::new(), false)
                } else if self.rng.chance(50) {
                    let mut b = magic();
                    b.extend(classic_hello(0, 2, None, "print"));
                    (b, false)
                } else {
                    (self.partial(), false)
                }
            }
            Kind::PrintHello => {
                let mut b = magic();
                b.extend(classic_hello(-1, -1, None, "print"));
                (b, false)
            }
            Kind::OtherStart | Kind::LateStart => {
                let mut b = magic();
                b.extend(match self.proto {
                    Proto::Json => classic_hello(-1, -1, None, "start"),
                    Proto::Classic => {
                        json_hello(0, "", -1, &json!({"cmd": 1, "port": 7000, "error_port": 0}))
                    }
                });
                (b, true)
            }
            Kind::Replay => unreachable!("replays are planned with their bytes"),
        };
        let fin_after = self
            .rng
            .chance(40)
            .then(|| self.rng.up_to(Duration::from_secs(8)));
        self.planned.push(Planned {
            at,
            host,
            kind,
            bytes,
            complete,
            fin_after,
        });
    }

    fn trace(&mut self, line: String) {
        self.trace.note(self.now, line);
    }

    fn fail(&mut self, why: String) {
        self.trace(format!("BROKEN: {why}"));
        self.broken.get_or_insert(why);
    }

    fn instant(&self, at: Duration) -> Instant {
        self.t0 + at
    }

    fn who(&self, key: usize) -> String {
        let c = &self.conns[key];
        let id = c.id.map_or("-".to_string(), |i| i.to_string());
        match &c.owner {
            Owner::Worker(w, cmd) => format!("conn {key} (id {id}, worker {w} {cmd})"),
            Owner::Stranger(kind) => {
                format!("conn {key} (id {id}, {kind:?} stranger on {})", c.host)
            }
        }
    }

    fn send(&mut self, key: usize, up: bool, msg: Msg) {
        let at = self.now + self.faults.delay(&mut self.rng);
        self.net.send((key, up), at, msg);
    }

    /// Sends `bytes` towards the tracker cut into pieces at random points (more of
    /// them the longer it is, as TCP segments a long write).
    fn send_bytes(&mut self, key: usize, mut bytes: Vec<u8>) {
        while !bytes.is_empty() {
            let take = if bytes.len() <= 1000 && self.rng.chance(50) {
                bytes.len()
            } else {
                1 + self.rng.below(bytes.len().min(1000) as u64) as usize
            };
            let rest = bytes.split_off(take);
            self.send(key, true, Msg::Bytes(bytes));
            bytes = rest;
        }
    }

    fn connect(
        &mut self,
        owner: Owner,
        host: String,
        first: Vec<u8>,
        rest: Vec<u8>,
        complete: bool,
    ) -> usize {
        let key = self.conns.len();
        let command_len = complete.then(|| first.len() + rest.len());
        self.conns.push(Conn {
            owner,
            host,
            command_len,
            rest,
            id: None,
            accepted_at: Duration::ZERO,
            buf: Vec::new(),
            pos: 0,
            magic_answered: false,
            head_seen: false,
            stage: Stage::Connecting,
            deadline: Duration::MAX,
            complete_at: None,
            open: false,
            settled: false,
            taken_in: false,
            closed: false,
            inbox: VecDeque::new(),
            fin_at: None,
            fin_sent: false,
        });
        let sends = match (&self.conns[key].owner, command_len) {
            (Owner::Stranger(_), None) => format!(
                ", to send {} bytes and stall",
                first.len() + self.conns[key].rest.len()
            ),
            _ => String::new(),
        };
        self.trace(format!("{} connects{sends}", self.who(key)));
        self.send(key, true, Msg::Connect);
        if !first.is_empty() {
            self.send_bytes(key, first);
        }
        key
    }

    /// Worker `w` opens a connection for its next command.
    fn next_command(&mut self, w: usize) {
        let Some(cmd) = self.workers[w].script.pop_front() else {
            return;
        };
        self.workers[w].ready_at = None;
        let wk = &self.workers[w];
        let world = i64::from(self.n);
        let rank = wk.rank.map_or(-1, i64::from);
        let task = wk.task.clone();
        let rest = match (wk.proto, &cmd) {
            (Proto::Classic, Cmd::Start) => classic_hello(-1, -1, task.as_deref(), "start"),
            (Proto::Classic, Cmd::Print(text)) => {
                let mut b = classic_hello(rank as i32, world as i32, task.as_deref(), "print");
                put_str(&mut b, text);
                b
            }
            (Proto::Classic, Cmd::Shutdown) => {
                classic_hello(rank as i32, world as i32, task.as_deref(), "shutdown")
            }
            (Proto::Json, Cmd::Start) => json_hello(
                0,
                task.as_deref().unwrap_or(""),
                -1,
                &json!({"cmd": 1, "port": wk.port, "error_port": wk.port + 100}),
            ),
            (Proto::Json, Cmd::Print(text)) => json_hello(
                rank,
                task.as_deref().unwrap_or(""),
                world,
                &json!({"cmd": 4, "msg": text}),
            ),
            (Proto::Json, Cmd::Shutdown) => json_hello(
                rank,
                task.as_deref().unwrap_or(""),
                world,
                &json!({"cmd": 2}),
            ),
        };
        let host = wk.host.clone();
        self.connect(Owner::Worker(w, cmd), host, magic(), rest, true);
    }

    /// After a command: the worker thinks, then opens the next.
    fn move_on(&mut self, w: usize) {
        let think = match self.rng.below(10) {
            0..=3 => Duration::ZERO,
            4..=7 => self.rng.up_to(Duration::from_millis(200)),
            _ => self.rng.up_to(Duration::from_secs(2)),
        };
        self.workers[w].waiting = None;
        self.workers[w].ready_at = Some(self.now + think);
    }

    /// Idle workers whose thinking is over, strangers whose time came, and clients
    /// closing connections.
    fn clients(&mut self) {
        for w in 0..self.workers.len() {
            if let Some((_, until)) = self.workers[w].waiting {
                if self.now >= until {
                    self.move_on(w);
                }
            }
            if self.workers[w].ready_at.is_some_and(|at| at <= self.now) {
                self.next_command(w);
            }
        }
        while let Some(i) = self.planned.iter().position(|p| p.at <= self.now) {
            let p = self.planned.remove(i);
            let split = p.bytes.len().min(4);
            let mut first = p.bytes;
            let rest = first.split_off(split);
            let key = self.connect(Owner::Stranger(p.kind), p.host, first, rest, p.complete);
            self.conns[key].fin_at = p.fin_after.map(|d| self.now + d);
        }
        for key in 0..self.conns.len() {
            let c = &self.conns[key];
            if !c.fin_sent && c.fin_at.is_some_and(|at| at <= self.now) {
                self.conns[key].fin_sent = true;
                self.trace(format!("{} closes its end", self.who(key)));
                self.send(key, true, Msg::Fin);
            }
        }
    }

    // ---- the server's side ----

    fn accept(&mut self, key: usize) {
        let id = self.next_id;
        self.next_id += 1;
        self.conns[key].id = Some(id);
        match self.cap.admit(id, Some(key)) {
            Admit::Room => {}
            Admit::Evict(old) => {
                self.trace(format!(
                    "cap: {} closed to make room for {}",
                    self.who(old),
                    self.who(key)
                ));
                self.evict(old);
            }
            Admit::Full => {
                self.trace(format!("cap: {} refused, the cap is full", self.who(key)));
                if let Owner::Worker(w, cmd) = &self.conns[key].owner {
                    let (w, cmd) = (*w, cmd.clone());
                    let holders: Vec<String> = (0..self.conns.len())
                        .filter(|&k| {
                            let c = &self.conns[k];
                            c.open && matches!(c.owner, Owner::Stranger(_)) && !c.taken_in
                        })
                        .map(|k| self.who(k))
                        .collect();
                    if holders.is_empty() {
                        self.fail(format!(
                            "worker {w}'s {cmd} connection was refused by the cap ({} connections, \
                             all workers' or started): the simulation's cap is below what its job needs",
                            self.cap.max()
                        ));
                    } else {
                        self.fail(format!(
                            "worker {w}'s {cmd} connection was refused by the cap while strangers \
                             that started no rank held slots: {holders:?}"
                        ));
                    }
                }
                self.conns[key].closed = true;
                self.conns[key].stage = Stage::Ended;
                self.send(key, false, Msg::Closed);
                return;
            }
        }
        let at = self.instant(self.now);
        let c = &mut self.conns[key];
        self.sequence.enter(id, &c.host, at);
        c.open = true;
        c.accepted_at = self.now;
        c.stage = Stage::Hello;
        c.deadline = self.now + self.read_timeout;
        self.active.insert(key);
        self.trace(format!("accepted {}", self.who(key)));
    }

    /// The cap closes `key`'s socket: a thread reading from it ends; one waiting for its
    /// turn or its rank goes on (it reads nothing more).
    fn evict(&mut self, key: usize) {
        if let Owner::Worker(w, cmd) = &self.conns[key].owner {
            if self.conns[key].complete_at.is_none() {
                let (w, cmd) = (*w, cmd.clone());
                self.fail(format!(
                    "worker {w}'s {cmd} connection was closed by the cap before its command arrived"
                ));
            }
        }
        self.conns[key].closed = true;
        self.send(key, false, Msg::Closed);
        match self.conns[key].stage {
            Stage::Hello => self.end(key, Some("closed by the cap".into())),
            Stage::Waiting { .. } | Stage::Negotiating { .. } => {
                self.vanish(key, "closed by the cap")
            }
            _ => {}
        }
    }

    /// `key`'s thread ends (`why`: it was dropped, and why).
    fn end(&mut self, key: usize, why: Option<String>) {
        if matches!(self.conns[key].stage, Stage::Ended) {
            return;
        }
        let id = self.conns[key].id.expect("accepted");
        self.sequence.settle(id);
        self.cap.leave(id);
        let c = &mut self.conns[key];
        c.stage = Stage::Ended;
        c.settled = true;
        c.open = false;
        self.active.remove(&key);
        if !self.conns[key].closed {
            self.conns[key].closed = true;
            self.send(key, false, Msg::Closed);
        }
        match why {
            Some(why) => {
                self.trace(format!("dropped {}: {why}", self.who(key)));
                if let Owner::Worker(w, cmd) = &self.conns[key].owner {
                    let (w, cmd) = (*w, cmd.clone());
                    self.fail(format!("worker {w}'s {cmd} connection was dropped: {why}"));
                }
            }
            None => self.trace(format!("{} ends", self.who(key))),
        }
    }

    /// A connection waiting after its `start` closed (or was closed): as
    /// `classic_conn::start` and `json_conn::start` handle it.
    fn vanish(&mut self, key: usize, why: &str) {
        let id = self.conns[key].id.expect("accepted");
        match std::mem::replace(&mut self.conns[key].stage, Stage::Hello) {
            Stage::Waiting { json: false } => {
                if !self.machines.classic.vanish(id) {
                    if let Some(rank) = self.machines.classic.holds(id) {
                        let mut actions = Vec::new();
                        self.machines.classic.abandon(id, rank, &mut actions);
                        self.classic_actions(actions);
                    }
                }
            }
            Stage::Waiting { json: true } => {
                self.machines.json.vanish(id);
            }
            Stage::Negotiating { rank, .. } => {
                let mut actions = Vec::new();
                self.machines.classic.abandon(id, rank, &mut actions);
                self.classic_actions(actions);
            }
            other => self.conns[key].stage = other,
        }
        self.end(key, Some(why.to_string()));
    }

    fn classic_actions(&mut self, actions: Vec<classic::Action>) {
        for a in actions {
            match a {
                classic::Action::Turn { conn, rank } => {
                    if let Some(w) = self.worker_of(conn) {
                        self.workers[w].given = Some(rank);
                    }
                    self.post(conn, Go::Turn(rank));
                }
                classic::Action::Record(r) => self.note(&r),
            }
        }
    }

    fn json_actions(&mut self, actions: Vec<json::Action>) {
        for a in actions {
            match a {
                json::Action::PeerFrame { conn, rank, .. } => self.post(conn, Go::Peer(rank)),
                json::Action::SignalError { .. } => {}
                json::Action::Record(r) => self.note(&r),
            }
        }
    }

    /// The worker whose `start` connection `id` is.
    fn worker_of(&self, id: ConnId) -> Option<usize> {
        let conn = self.conns.iter().find(|c| c.id == Some(id))?;
        match conn.owner {
            Owner::Worker(w, Cmd::Start) => Some(w),
            _ => None,
        }
    }

    fn post(&mut self, id: ConnId, go: Go) {
        if let Some(key) = self.conns.iter().position(|c| c.id == Some(id)) {
            self.conns[key].inbox.push_back(go);
        }
    }

    fn note(&mut self, record: &Record) {
        match record {
            Record::Assigned { rank, host, .. } => {
                self.trace(format!("rank {rank} assigned ({host})"))
            }
            Record::JsonBatch { members } => {
                self.trace(format!("JSON batch of {} formed", members.len()));
                // Each worker listens on a port of its own.
                for (rank, member) in members.iter().enumerate() {
                    let worker = self.workers.iter_mut().find(|w| {
                        w.proto == Proto::Json && w.port == member.port && w.given.is_none()
                    });
                    if let Some(worker) = worker {
                        worker.given = Some(rank as u32);
                    }
                }
            }
            Record::Linked { rank, .. } => self.trace(format!("rank {rank} linked")),
            _ => {}
        }
        let m = &self.machines;
        if !self.done && (m.classic.is_done() || m.json.is_done()) {
            self.done = true;
            self.trace("the job is over".into());
        }
    }

    /// Advances every connection's thread as far as it can go now.
    fn poll(&mut self) {
        loop {
            let mut moved = false;
            for key in self.active.clone() {
                moved |= self.step(key);
            }
            if !moved {
                return;
            }
        }
    }

    /// One move of `key`'s thread; whether it moved.
    fn step(&mut self, key: usize) -> bool {
        let now = self.now;
        let id = self.conns[key].id.expect("accepted");
        let timed_out = now >= self.conns[key].deadline;
        match &self.conns[key].stage {
            Stage::Hello => self.hello(key, id, timed_out),
            Stage::Turn { carry, since } => {
                let host = self.conns[key].host.clone();
                let at = self.instant(now);
                if now < *since + self.read_timeout && self.sequence.blocked(id, &host, at) {
                    return false;
                }
                let carry = carry.clone();
                self.carry(key, carry);
                true
            }
            Stage::Held { rank, until } => {
                let held = u32::try_from(*rank).is_ok_and(|r| self.machines.classic.is_held(r));
                if held && now < *until {
                    return false;
                }
                let rank = *rank;
                match self.machines.classic.shutdown(rank) {
                    Ok(actions) => {
                        let records = actions.iter().filter_map(|a| match a {
                            classic::Action::Record(r) => Some(r),
                            classic::Action::Turn { .. } => None,
                        });
                        self.counted(key, records);
                        self.classic_actions(actions);
                        self.end(key, None);
                    }
                    Err(why) => self.end(key, Some(format!("refused: {why}"))),
                }
                true
            }
            Stage::Waiting { json } => {
                let json = *json;
                let Some(go) = self.conns[key].inbox.pop_front() else {
                    return false;
                };
                self.decided(key, id, json, go);
                true
            }
            Stage::Negotiating { .. } => self.negotiate(key, id, timed_out),
            Stage::Connecting | Stage::Ended => false,
        }
    }

    /// Reading the magic, the hello and the command (`accept::session`).
    fn hello(&mut self, key: usize, id: ConnId, timed_out: bool) -> bool {
        let c = &mut self.conns[key];
        if !c.magic_answered && c.buf.len() >= 4 {
            if c.buf[..4] != magic()[..] {
                self.end(key, Some("bad magic".into()));
                return true;
            }
            c.magic_answered = true;
            self.send(key, false, Msg::MagicAnswer);
            return true;
        }
        if !c.head_seen && c.buf.len() >= 12 {
            // The first eight bytes of the hello: what the reverted decisions went by.
            c.head_seen = true;
            match self.variant {
                Variant::HeardAtHead => self.sequence.heard(id),
                Variant::EvictByClaim => self.cap.started(id),
                _ => {}
            }
            return true;
        }
        match parse_command(&c.buf, &self.limits) {
            Err(Stop::Need) if timed_out => {
                self.end(key, Some("timed out reading its hello".into()));
                true
            }
            Err(Stop::Need) => false,
            Err(Stop::Bad(why)) => {
                self.end(key, Some(why));
                true
            }
            Ok((parsed, used)) => {
                c.pos = used;
                self.command(key, id, parsed);
                true
            }
        }
    }

    /// A whole command arrived (`classic_conn::session`, `json_conn::session`).
    fn command(&mut self, key: usize, id: ConnId, parsed: Parsed) {
        let now = self.now;
        let carry = match parsed {
            Parsed::Classic(hello, text) => match hello.command {
                Command::Print => Carry::ClassicPrint(text.unwrap_or_default()),
                Command::Shutdown => Carry::ClassicShutdown(hello.rank),
                _ => return self.classic_start(key, id, &hello),
            },
            Parsed::Json(hello, cmd) => match cmd.get("cmd").and_then(Value::as_i64) {
                Some(1) => return self.json_start(key, id, &hello, &cmd),
                Some(2) => Carry::JsonShutdown(hello.rank),
                Some(4) => match cmd.get("msg").and_then(Value::as_str) {
                    Some(msg) => Carry::JsonPrint(msg.to_string()),
                    None => return self.end(key, Some("print without a msg".into())),
                },
                _ => return self.end(key, Some(format!("command frame {cmd}"))),
            },
        };
        // `Shared::await_turn`: only now does it hold back its host's later ones.
        self.sequence.heard(id);
        self.trace(format!("{} heard its whole command", self.who(key)));
        self.conns[key].stage = Stage::Turn { carry, since: now };
    }

    fn classic_start(&mut self, key: usize, id: ConnId, hello: &classic::Hello) {
        let host = self.conns[key].host.clone();
        let decided = self.machines.classic_start(id, &host, hello).map(|taken| {
            for conn in taken.refused {
                self.post(conn, Go::Refused(super::machines::MIXED_JSON));
            }
            self.classic_actions(taken.actions);
        });
        self.taken(key, id, decided.is_ok());
        match decided {
            Ok(()) => self.conns[key].stage = Stage::Waiting { json: false },
            Err(why) => {
                self.send(key, false, Msg::RankRefused);
                self.end(key, Some(format!("refused: {why}")));
            }
        }
    }

    fn json_start(&mut self, key: usize, id: ConnId, hello: &json::Hello, cmd: &Value) {
        let (Some(port), Some(error_port)) = (
            cmd.get("port").and_then(Value::as_i64),
            cmd.get("error_port").and_then(Value::as_i64),
        ) else {
            return self.end(key, Some(format!("start without ports: {cmd}")));
        };
        let host = self.conns[key].host.clone();
        let taken = self
            .machines
            .json_start(id, &host, hello, port, error_port)
            .map(|taken| {
                for conn in taken.refused {
                    self.post(conn, Go::Refused(super::machines::MIXED_CLASSIC));
                }
                self.json_actions(taken.actions);
            });
        self.taken(key, id, taken.is_ok());
        match taken {
            Ok(()) => {
                self.send(key, false, Msg::WorldSize);
                self.conns[key].stage = Stage::Waiting { json: true };
            }
            Err(why) => self.end(key, Some(format!("refused: {why}"))),
        }
    }

    /// A `start` was taken in (or refused): it holds back nobody, and if taken in it is
    /// a worker's for the cap.
    fn taken(&mut self, key: usize, id: ConnId, ok: bool) {
        self.sequence.settle(id);
        self.conns[key].settled = true;
        if ok {
            self.cap.started(id);
            self.conns[key].taken_in = true;
        }
    }

    /// A decision for a `start` waiting for its batch.
    fn decided(&mut self, key: usize, id: ConnId, json: bool, go: Go) {
        match go {
            Go::Turn(rank) => match self.machines.classic.begin(id, rank) {
                Ok((assignment, neg)) => {
                    self.send(key, false, Msg::Assignment(assignment.rank));
                    self.conns[key].stage = Stage::Negotiating {
                        neg: Box::new(neg),
                        rank,
                        step: NegStep::Good,
                    };
                    self.conns[key].deadline = self.now + self.read_timeout;
                }
                Err(why) => self.abandon(key, id, rank, why),
            },
            Go::Peer(rank) => {
                self.send(key, false, Msg::Peer(rank));
                self.end(key, None);
            }
            Go::Refused(why) => {
                if !json {
                    self.send(key, false, Msg::RankRefused);
                }
                self.end(key, Some(format!("refused: {why}")));
            }
        }
    }

    /// A negotiation that ended early gives its turn back (`Turn`'s drop).
    fn abandon(&mut self, key: usize, id: ConnId, rank: u32, why: String) {
        let mut actions = Vec::new();
        self.machines.classic.abandon(id, rank, &mut actions);
        self.classic_actions(actions);
        self.end(key, Some(why));
    }

    /// Classic link negotiation (`classic_conn::Turn::negotiate`).
    fn negotiate(&mut self, key: usize, id: ConnId, timed_out: bool) -> bool {
        let Stage::Negotiating { neg, rank, step } =
            std::mem::replace(&mut self.conns[key].stage, Stage::Hello)
        else {
            unreachable!("negotiating");
        };
        let mut neg = *neg;
        let c = &self.conns[key];
        let mut r = Rd {
            b: &c.buf,
            p: c.pos,
        };
        let read = match step {
            NegStep::Good => r
                .len("good link count", self.limits.max_list)
                .and_then(|count| {
                    (0..count)
                        .map(|_| r.i32())
                        .collect::<Result<Vec<i32>, Stop>>()
                }),
            NegStep::Errors(_) | NegStep::Port => r.i32().map(|v| vec![v]),
        };
        let used = r.p;
        let values = match read {
            Err(Stop::Need) if timed_out => {
                self.abandon(key, id, rank, "timed out negotiating".into());
                return true;
            }
            Err(Stop::Need) => {
                self.conns[key].stage = Stage::Negotiating {
                    neg: Box::new(neg),
                    rank,
                    step,
                };
                return false;
            }
            Err(Stop::Bad(why)) => {
                self.abandon(key, id, rank, why);
                return true;
            }
            Ok(values) => values,
        };
        self.conns[key].pos = used;
        self.conns[key].deadline = self.now + self.read_timeout;
        let next = match step {
            NegStep::Good => match self.machines.classic.round(&mut neg, &values) {
                Ok(round) => {
                    let connect = round.connect.len();
                    self.send(
                        key,
                        false,
                        Msg::Round {
                            connect,
                            accept: round.accept,
                        },
                    );
                    NegStep::Errors(connect)
                }
                Err(why) => {
                    self.abandon(key, id, rank, why);
                    return true;
                }
            },
            NegStep::Errors(connect) => match values[0] {
                0 => NegStep::Port,
                e if e < 0 || e as usize > connect => {
                    self.abandon(key, id, rank, format!("{e} failed connects of {connect}"));
                    return true;
                }
                _ => NegStep::Good,
            },
            NegStep::Port => {
                match self.machines.classic.finish(neg, values[0]) {
                    Ok(actions) => {
                        self.classic_actions(actions);
                        self.end(key, None);
                    }
                    Err(why) => self.abandon(key, id, rank, why),
                }
                return true;
            }
        };
        self.conns[key].stage = Stage::Negotiating {
            neg: Box::new(neg),
            rank,
            step: next,
        };
        true
    }

    /// Logs the shutdown `key` carried out as the tracker counted it: for the rank of
    /// its record (not the hello's, which the tracker may count otherwise).
    fn counted<'a>(&mut self, key: usize, records: impl Iterator<Item = &'a Record>) {
        for record in records {
            if let Record::ShutDown { rank, .. } = record {
                self.log.push(Logged::Shutdown(key, *rank));
                self.trace(format!("{}: rank {rank} shut down", self.who(key)));
            }
        }
    }

    /// A `print` or `shutdown` whose turn came (or whose wait ran out).
    fn carry(&mut self, key: usize, carry: Carry) {
        match carry {
            Carry::ClassicPrint(text) | Carry::JsonPrint(text) => {
                self.trace(format!("{} logs {}", self.who(key), short(&text)));
                self.log.push(Logged::Print(key, text));
                self.end(key, None);
            }
            Carry::ClassicShutdown(rank) => {
                self.conns[key].stage = Stage::Held {
                    rank,
                    until: self.now + self.read_timeout,
                };
            }
            Carry::JsonShutdown(rank) => match self.machines.json.shutdown(rank) {
                Ok(actions) => {
                    let records = actions.iter().filter_map(|a| match a {
                        json::Action::Record(r) => Some(r),
                        _ => None,
                    });
                    self.counted(key, records);
                    self.json_actions(actions);
                    self.end(key, None);
                }
                Err(why) => self.end(key, Some(format!("refused: {why}"))),
            },
        }
    }

    // ---- the network and the clients ----

    fn deliver(&mut self, (key, up): Channel, msg: Msg) {
        if up {
            self.at_tracker(key, msg);
        } else {
            self.at_client(key, msg);
        }
    }

    fn at_tracker(&mut self, key: usize, msg: Msg) {
        match msg {
            Msg::Connect => self.accept(key),
            Msg::Bytes(bytes) => {
                let c = &mut self.conns[key];
                if c.closed {
                    return;
                }
                c.buf.extend(bytes);
                if c.complete_at.is_none() && c.command_len.is_some_and(|l| c.buf.len() >= l) {
                    c.complete_at = Some(self.now);
                }
            }
            Msg::Fin => {
                if self.conns[key].closed {
                    return;
                }
                match self.conns[key].stage {
                    Stage::Hello => self.end(key, Some("closed by its peer".into())),
                    Stage::Waiting { .. } | Stage::Negotiating { .. } => {
                        self.vanish(key, "closed while waiting");
                    }
                    _ => {}
                }
            }
            _ => unreachable!("only clients send these"),
        }
    }

    fn at_client(&mut self, key: usize, msg: Msg) {
        let owner = self.conns[key].owner.clone();
        let Owner::Worker(w, cmd) = owner else {
            if let Msg::MagicAnswer = msg {
                let rest = std::mem::take(&mut self.conns[key].rest);
                self.send_bytes(key, rest);
            }
            return;
        };
        let proto = self.workers[w].proto;
        match msg {
            Msg::MagicAnswer => {
                let rest = std::mem::take(&mut self.conns[key].rest);
                self.send_bytes(key, rest.clone());
                match (&cmd, proto) {
                    (Cmd::Start, _) => {}
                    (Cmd::Print(_), Proto::Json) => {
                        self.workers[w].waiting = Some((key, self.now + PRINT_CLOSE_WAIT));
                    }
                    _ => self.move_on(w),
                }
                if self.replays && cmd != Cmd::Start && self.rng.chance(30) {
                    self.replay(w, &cmd, rest);
                }
            }
            Msg::Assignment(rank) => {
                self.workers[w].rank = Some(rank);
                // No links yet.
                self.send_bytes(key, 0i32.to_le_bytes().to_vec());
            }
            Msg::Round { connect, accept } => {
                // It reaches every peer it is told to, then reports its port.
                self.trace(format!(
                    "worker {w} links: connects to {connect}, accepts {accept}"
                ));
                let mut b = Vec::new();
                put_i32(&mut b, 0);
                put_i32(&mut b, i32::from(self.workers[w].port));
                self.send_bytes(key, b);
                self.move_on(w);
            }
            Msg::Peer(successor) => {
                self.workers[w].rank = Some((successor + self.n - 1) % self.n);
                self.move_on(w);
                if self.replays && self.rng.chance(30) {
                    let port = self.workers[w].port;
                    let rest = json_hello(
                        0,
                        self.workers[w].task.as_deref().unwrap_or(""),
                        -1,
                        &json!({"cmd": 1, "port": port, "error_port": port + 100}),
                    );
                    self.replay(w, &Cmd::Start, rest);
                }
            }
            Msg::Closed => {
                if self.workers[w].waiting.is_some_and(|(k, _)| k == key) {
                    self.move_on(w);
                }
            }
            Msg::RankRefused | Msg::WorldSize => {}
            _ => unreachable!("only the tracker sends these"),
        }
    }

    /// A stranger sends worker `w`'s command again, later: a shutdown from the
    /// worker's host (from another, it could be counted before the worker's own, which
    /// the protocol cannot tell apart without a job secret), a print from anywhere.
    fn replay(&mut self, w: usize, cmd: &Cmd, rest: Vec<u8>) {
        let host = if *cmd == Cmd::Shutdown || self.rng.chance(50) {
            self.workers[w].host.clone()
        } else {
            "10.9.9.9".to_string()
        };
        let mut bytes = magic();
        bytes.extend(rest);
        let at = self.now + self.rng.up_to(Duration::from_secs(1));
        self.planned.push(Planned {
            at,
            host,
            kind: Kind::Replay,
            bytes,
            complete: true,
            fin_after: None,
        });
    }

    // ---- the invariants ----

    /// A worker's `print` or `shutdown` whose command is in waits for its turn only
    /// while an earlier connection from its host holds it back with a whole command
    /// (or is a worker's, its bytes on the way), or a stranger's incomplete one is
    /// within the grace of its accept.
    fn check_holds(&mut self) {
        for key in self.active.clone() {
            let c = &self.conns[key];
            let (Owner::Worker(w, cmd), Stage::Turn { since, .. }) = (&c.owner, &c.stage) else {
                continue;
            };
            let (id, mut bound) = (c.id.expect("accepted"), *since);
            let mut strangers = Vec::new();
            let mut legit = false;
            for (k, o) in self.conns.iter().enumerate() {
                if o.id.is_none_or(|i| i >= id) || o.host != c.host || o.settled || !o.open {
                    continue;
                }
                if matches!(o.owner, Owner::Worker(..)) || o.complete_at.is_some() {
                    legit = true;
                    break;
                }
                bound = bound.max(o.accepted_at + GREETING_GRACE);
                strangers.push(k);
            }
            if !legit && self.now > bound + RECHECK {
                let held = self.now - bound;
                let names: Vec<String> = strangers.iter().map(|&k| self.who(k)).collect();
                let why = format!(
                    "worker {w}'s {cmd} was held back by strangers {names:?}, {held:?} past \
                     their grace ({GREETING_GRACE:?} from accept)"
                );
                self.fail(why);
                return;
            }
        }
    }

    /// Whether the classic and the JSON machine have given ranks.
    fn ranked(&self) -> (bool, bool) {
        (self.machines.classic.ranked(), self.machines.json.ranked())
    }

    /// The protocol the workers do not speak never gives a rank: not to strangers'
    /// `start`s before the workers' batch, nor to a whole job of them after it.
    fn check_protocol(&mut self) {
        let (classic, json) = self.ranked();
        let other = match self.proto {
            Proto::Classic => json,
            Proto::Json => classic,
        };
        if other && self.broken.is_none() {
            self.fail(format!(
                "the job's protocol is not its workers' ({:?}): classic ranked {classic}, \
                 JSON ranked {json}",
                self.proto
            ));
        }
    }

    /// Once the workers' protocol has given a rank, a seed with a late job of the
    /// other protocol plans it: n `start`s, from hosts of their own, within 300 ms.
    fn late_job(&mut self) {
        let (classic, json) = self.ranked();
        let ranked = match self.proto {
            Proto::Classic => classic,
            Proto::Json => json,
        };
        let Some(after) = self.late.filter(|_| ranked) else {
            return;
        };
        self.late = None;
        let at = self.now + after;
        for i in 0..self.n {
            let start = at + self.rng.up_to(Duration::from_millis(300));
            self.plan(Kind::LateStart, start, format!("10.0.1.{}", i + 1));
        }
    }

    /// The end state: ranks, prints in order before each shutdown, the protocol.
    fn check_end(&mut self) -> Result<(), String> {
        for (w, worker) in self.workers.iter().enumerate() {
            if worker.rank.is_none() {
                return Err(format!("worker {w} never got a rank"));
            }
            let mine = |k: usize| matches!(self.conns[k].owner, Owner::Worker(o, _) if o == w);
            let mut printed = Vec::new();
            let mut shut = None;
            for (i, entry) in self.log.iter().enumerate() {
                match entry {
                    Logged::Print(k, text) if mine(*k) => {
                        if shut.is_some() {
                            return Err(format!(
                                "worker {w}'s print {} was logged after its shutdown",
                                short(text)
                            ));
                        }
                        printed.push(text.clone());
                    }
                    Logged::Shutdown(k, rank) if mine(*k) => {
                        if Some(*rank) != worker.given {
                            let given = worker.given.map_or("none".into(), |r| r.to_string());
                            return Err(format!(
                                "worker {w}'s shutdown was counted for rank {rank}, but the \
                                 tracker gave it rank {given}"
                            ));
                        }
                        shut = Some(i);
                    }
                    _ => {}
                }
            }
            if printed != worker.prints {
                return Err(format!(
                    "worker {w}'s prints were logged as {:?}, sent as {:?}",
                    printed.iter().map(|t| short(t)).collect::<Vec<_>>(),
                    worker.prints.iter().map(|t| short(t)).collect::<Vec<_>>()
                ));
            }
            if shut.is_none() {
                return Err(format!("worker {w}'s own shutdown was not counted"));
            }
        }
        let (classic, json) = self.ranked();
        let right = match self.proto {
            Proto::Classic => classic && !json,
            Proto::Json => json && !classic,
        };
        if !right {
            return Err(format!(
                "the job's protocol is not its workers' ({:?}): classic ranked {classic}, JSON ranked {json}",
                self.proto
            ));
        }
        Ok(())
    }

    /// Runs the job to its end; `Err` names the broken invariant.
    fn run(&mut self) -> Result<(), String> {
        loop {
            self.clients();
            self.poll();
            self.check_holds();
            self.check_protocol();
            self.late_job();
            if let Some(broken) = self.broken.take() {
                return Err(broken);
            }
            if self.done {
                return self.check_end();
            }
            if self.now > BOUND {
                let ranks: Vec<Option<u32>> = self.workers.iter().map(|w| w.rank).collect();
                return Err(format!(
                    "the job was not over within {BOUND:?} (workers' ranks {ranks:?}, shut down: \
                     classic {:?}, JSON {:?})",
                    self.machines.classic.shut_down(),
                    self.machines.json.shut_down()
                ));
            }
            // Deliver a message that is due (any of them, in order per connection and
            // direction), or let the clock run.
            match self.net.step(&mut self.rng, &self.faults, self.now) {
                Step::Deliver(channel, msg) => self.deliver(channel, msg),
                Step::Advance { idle } => self.advance(idle),
            }
        }
    }

    /// Moves the clock: a short step, or now and then (when nothing is due) a long
    /// one, past graces and read timeouts; never past a message or a client's move.
    fn advance(&mut self, idle: bool) {
        let jump = if idle && self.rng.chance(5) {
            Duration::from_millis(200) + self.rng.up_to(Duration::from_millis(1800))
        } else {
            self.rng
                .between(Duration::from_micros(1), Duration::from_micros(20_001))
        };
        let now = self.now;
        let next = self
            .net
            .iter()
            .map(|(_, at, _)| *at)
            .chain(self.workers.iter().filter_map(|w| w.ready_at))
            .chain(
                self.workers
                    .iter()
                    .filter_map(|w| w.waiting.map(|(_, t)| t)),
            )
            .chain(self.planned.iter().map(|p| p.at))
            .chain(
                self.conns
                    .iter()
                    .filter(|c| !c.fin_sent)
                    .filter_map(|c| c.fin_at),
            )
            .filter(|&t| t > now)
            .min();
        self.now = match next {
            Some(t) => (now + jump).min(t),
            None => now + jump,
        };
    }
}

/// The campaign of `variant`'s test.
fn campaign(variant: Variant) -> Campaign {
    Campaign::new("switchyard-tracker", variant.test(), BUDGET)
}

/// One seed's run under `variant`.
fn run(seed: u64, variant: Variant) -> sim::Outcome {
    let mut sim = Sim::new(seed, variant);
    let result = sim.run();
    sim::Outcome::new(result, sim.trace)
}

#[test]
fn sim_the_tracker_keeps_its_invariants() {
    campaign(Variant::Fixed).check(|seed| run(seed, Variant::Fixed));
}

/// The report of the first seed of the budget on which `variant` breaks an invariant
/// (its number printed); `None` when `SEED` replays one (its trace printed).
fn first_failure(variant: Variant) -> Option<String> {
    campaign(variant)
        .first_failure(|seed| run(seed, variant))
        .map(|f| f.to_string())
}

/// 65ec50c reverted: a stranger that sent eight bytes of a hello and stalled holds its
/// host's prints and shutdowns until its read timeout.
#[test]
fn sim_finds_a_hold_counted_from_the_first_eight_bytes() {
    if let Some(failure) = first_failure(Variant::HeardAtHead) {
        assert!(failure.contains("held back by strangers"), "{failure}");
    }
}

/// 560b46f reverted: a stranger's waiting `start` of the other protocol locks the
/// workers out.
#[test]
fn sim_finds_a_protocol_decided_by_a_waiting_start() {
    if let Some(failure) = first_failure(Variant::ProtocolByClaim) {
        assert!(failure.contains("cannot join this job"), "{failure}");
    }
}

/// 434340e reverted: stalled hellos count as workers, fill the cap, and a worker is
/// refused.
#[test]
fn sim_finds_eviction_by_claim() {
    if let Some(failure) = first_failure(Variant::EvictByClaim) {
        assert!(
            failure.contains("refused by the cap while strangers"),
            "{failure}"
        );
    }
}
