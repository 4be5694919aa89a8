//! A deterministic simulation of the mesh set-up: every rank's real machine
//! ([`MeshSteps`]) and the real blame decisions ([`Blame`], [`blame::follow`]),
//! driven by a model of the shell around them over a simulated network and clock that
//! one seed decides.
//!
//! Each seed makes a world of 2-5 ranks (one seed in five a bipartite one), with or
//! without a job secret, a timeout of 1, 2 or 4 s, ranks starting within 200 ms of
//! each other. Every message takes 0.1-5 ms, in order per connection and direction
//! (the control link's pipes, each TCP connection's two directions); of the messages
//! due together the seed picks which goes first. Strangers come to the ranks' data
//! listeners: silent or half a hello (stalled), another job's hello or no proof of the
//! secret, a hello claiming a rank that accepts rather than connects, and replays of a
//! rank's hello (with a secret at any time, without one after the original came: the
//! secret is what tells a replay from the rank, see below). Faults, at most one kind
//! per seed: a rank crashes (its connections reset, its listener refuses, its control
//! link goes silent), a rank stops (SIGSTOP) for up to twice the timeout (the kernel
//! still completes connections to it and buffers what comes; when it runs again its
//! clock may have jumped past its deadline: its accept loop looks at the notices and
//! its clock before it takes the handshakes that ended meanwhile, a read takes what
//! came), a rank comes one to one and a half timeouts late, or connections between
//! ranks reset while they open.
//!
//! The model of the shell mirrors `setup.rs`: each [`Step`] done as the shell does it
//! (setup messages on the control link, the connect with the secret's two round trips
//! or none, the handshakes of accepted connections running concurrently, each within
//! [`steps::hello_by`]); the failure path mirrors `gave_up` and [`blame::explain`]
//! (the notice before or after following the chain, the 20 ms slices, the one probe
//! of the blamed rank, then up to 300 ms for the receipts of its notice). A rank
//! answers probes and acknowledges notices while it reads its control link: waiting
//! for a setup message, accepting, giving up, waiting for receipts, or done; not
//! while it connects, is stopped or is dead. A change to that order in `setup.rs` or
//! `blame.rs` must be made here too. Not simulated: the sockets and threads
//! themselves, the heartbeat, the shared-memory hand-over, a host that vanishes
//! without its connections resetting, and, without a job secret, a stranger that
//! claims a rank before that rank's own hello arrives (no check can tell it from the
//! rank: that is what the secret is for).
//!
//! The invariants, checked on every seed:
//!
//! - a rank that completes holds one connection to every peer it connects to, each
//!   made with that peer (no stranger's), the same connection the peer holds when the
//!   peer completed too;
//! - a healthy rank that fails (not crashed, stopped or late, and no end of a
//!   connection that reset) does not blame, for a silence or a closed connection, a
//!   rank whose connection it held; does not report that the peers gave up waiting
//!   for it when it waited its whole timeout itself; and names a healthy rank only
//!   when the notices it had do not lead to a faulty one. Excused: a chain of notices
//!   that passes through a faulty rank's own notice (a rank stopped past its deadline
//!   takes the stop for a wait and blames the peer it waited for; a rank aborted by a
//!   relayed notice before the original blames the relay): the ranks that follow it
//!   may be led astray, and it is the blame protocol's limit, not the set-up's;
//! - every rank ends within its timeout plus the notices' wait (the timeout again and
//!   two probes) of its start, plus the time it was stopped;
//! - without faults every rank completes within 1 s of the last start, whatever the
//!   strangers do.
//!
//! `SEED=n cargo test -p switchyard-link --lib sim` replays one seed and prints its
//! trace; `SIM_SEEDS=n` runs that many seeds instead of the default budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::steps::{self, Blame, Break, Hello, MeshSteps, Step, Unreached};
use crate::blame::{self, Explained, PROBE_WAIT, Seen};
use crate::{LinkError, Notice, Topology};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};
use switchyard_sim::{self as sim, Campaign, Faults, Network, Rng, Trace};

/// Seeds a plain `cargo test` runs.
const BUDGET: u64 = 4000;
/// How long a failed rank reads notices between looks at the chain (`blame.rs`).
const SLICE: Duration = Duration::from_millis(20);
/// Without faults, every rank completes this soon after the last one starts.
const PROMPT: Duration = Duration::from_secs(1);
/// How long a failed rank waits for its notices' receipts (`socket/notices.rs`).
const ABORT_FLUSH: Duration = Duration::from_millis(300);
/// A stranger's timer kind from which on it replays rank `kind - REPLAY`'s hello.
const REPLAY: u8 = 10;

/// The shell's decisions under test: as they are, or one broken by hand.
fn test_name(broken: Option<Break>) -> &'static str {
    match broken {
        None => "sim_the_mesh_set_up_links_every_pair_once_or_blames_a_faulty_rank",
        Some(Break::TakeDuplicates) => "sim_finds_a_replayed_hello_taken_when_duplicates_are",
        Some(Break::BlameAnyBelow) => "sim_finds_a_healthy_rank_blamed_when_absence_is_not_checked",
        Some(Break::TimeoutAsGone) => {
            "sim_finds_a_rank_blaming_itself_when_a_timed_out_connect_is_gone"
        }
    }
}

/// Who opened a data connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Rank(usize),
    Stranger(Kind),
}

/// What a stranger does once connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Says nothing, or half a hello, and stalls.
    Silent,
    /// Another job's hello (another world size), or no proof of the secret.
    WrongJob,
    /// A hello claiming a rank at or above the listener's.
    Above(usize),
    /// A copy of this rank's hello (and, with a secret, of its old proof).
    Replay(usize),
}

/// A data connection, from `from` to rank `to`'s listener.
#[derive(Debug)]
struct Conn {
    from: Who,
    to: usize,
    /// Accepted by the kernel; refused (no listener).
    synack: bool,
    refused: bool,
    /// The secret's opening came to the connector; its reply to the acceptor; the
    /// acceptor sent its verdict; the verdict came to the connector.
    opening: bool,
    reply: bool,
    verdict_sent: bool,
    verdict: bool,
    /// What the hello that came says (the rank, or why it is no hello of this job).
    hello: Option<Result<usize, String>>,
    /// Closed or reset (the resets are on their way).
    closed: bool,
    /// The reset came to the connector; to the acceptor.
    gone_connector: bool,
    gone_acceptor: bool,
    /// Reset by the seed's fault, not by a process that ended.
    faulty: bool,
}

/// Which way a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ch {
    Control(usize, usize),
    /// Connector to acceptor.
    Up(usize),
    /// Acceptor to connector.
    Down(usize),
}

#[derive(Clone, Debug)]
enum Msg {
    Setup,
    Notice(Notice),
    Ack,
    Probe,
    Answer,
    Syn,
    SynAck,
    Refused,
    Opening,
    Reply,
    Verdict,
    Hello(Result<usize, String>),
    Reset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Syn,
    Opening,
    Verdict,
}

#[derive(Debug)]
enum Op {
    Idle,
    Reading(usize),
    Connecting {
        peer: usize,
        conn: usize,
        stage: Stage,
        by: Duration,
    },
    Accepting,
    GivingUp(GivingUp),
    /// Failed, and waiting (until then at most) for the peers to acknowledge its
    /// notice, reading its control link meanwhile (`flush_aborts`).
    Flushing(Duration),
    Done,
}

/// The model of `gave_up` and [`blame::explain`] in progress.
#[derive(Debug)]
struct GivingUp {
    error: LinkError,
    blamed: usize,
    seen: Seen,
    first: bool,
    limit: Duration,
    slice_end: Duration,
    /// The probe's end, while it waits for the answer.
    probing: Option<Duration>,
    probed: bool,
    answered: bool,
}

#[derive(Debug, PartialEq, Eq)]
enum Life {
    Running,
    Stopped,
    Crashed,
}

struct Proc {
    steps: MeshSteps,
    op: Op,
    life: Life,
    start: Duration,
    /// How long it was stopped, all told.
    stopped: Duration,
    setup_in: Vec<bool>,
    /// Notices that came, with when.
    notices: Vec<(Duration, Notice)>,
    /// Peers whose probes it has not answered yet; whose notices it has not
    /// acknowledged yet (both wait until it reads its control link).
    probes: Vec<usize>,
    unacked: Vec<usize>,
    /// Peers that acknowledged its notice.
    acked: Vec<bool>,
    /// Listener: connections the kernel took, not yet accepted; whether it is open.
    backlog: VecDeque<usize>,
    listening: bool,
    /// Handshakes running: the connection and its deadline.
    running: Vec<(usize, Duration)>,
    links: Vec<Option<usize>>,
    /// The next look it asked for.
    wake: Option<Duration>,
    outcome: Option<(Duration, Result<(), LinkError>)>,
    /// The rank its failure names, and the report.
    culprit: Option<usize>,
    /// When its wait failed (before the notices were followed), and on whom.
    failed_at: Duration,
    blamed: Option<(usize, Seen)>,
    /// Which peers it held a connection to when its wait failed.
    held: Vec<bool>,
}

struct Sim {
    n: usize,
    topology: Topology,
    secret: bool,
    timeout: Duration,
    rng: Rng,
    faults: Faults,
    base: Instant,
    now: Duration,
    timers: BinaryHeap<Reverse<(Duration, u64, Timer)>>,
    set: u64,
    net: Network<Ch, Duration, Msg>,
    procs: Vec<Proc>,
    conns: Vec<Conn>,
    /// Ranks that crashed, stopped or came late.
    faulty: Vec<bool>,
    /// The seed resets connections between ranks while they open.
    resets: bool,
    trace: Trace,
    tally: Tally,
}

/// How the ranks of a campaign ended and what their listeners closed, to show what it
/// covers.
#[derive(Debug, Default)]
struct Tally {
    completed: u64,
    timeout: u64,
    lost: u64,
    aborted: u64,
    unexpected: u64,
    bad: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.completed += other.completed;
        self.timeout += other.timeout;
        self.lost += other.lost;
        self.aborted += other.aborted;
        self.unexpected += other.unexpected;
        self.bad += other.bad;
    }

    fn all(&self) -> [u64; 6] {
        [
            self.completed,
            self.timeout,
            self.lost,
            self.aborted,
            self.unexpected,
            self.bad,
        ]
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Start(usize),
    Wake(usize),
    Crash(usize),
    Stop(usize, Duration),
    Resume(usize),
    Stranger(usize, u8),
    Reset(usize),
}

impl Sim {
    fn new(seed: u64, broken: Option<Break>) -> Sim {
        let mut rng = Rng::new(seed);
        let n = 2 + rng.index(4);
        let topology = if n > 2 && rng.chance(20) {
            Topology::Bipartite {
                split: 1 + rng.index(n - 1),
            }
        } else {
            Topology::Mesh
        };
        let secret = rng.chance(50);
        let timeout = Duration::from_secs(rng.pick(&[1, 2, 4]));
        let base = Instant::now();
        let mut sim = Sim {
            n,
            topology,
            secret,
            timeout,
            rng,
            // Messages due are delivered when due: the delays alone make timers race
            // deliveries.
            faults: Faults {
                hold: 0,
                ..Faults::delays(Duration::from_micros(100), Duration::from_millis(5))
            },
            base,
            now: Duration::ZERO,
            timers: BinaryHeap::new(),
            set: 0,
            net: Network::default(),
            procs: Vec::new(),
            conns: Vec::new(),
            faulty: vec![false; n],
            resets: false,
            trace: Trace::default(),
            tally: Tally::default(),
        };
        sim.note(format!(
            "{n} ranks, {topology:?}, secret {secret}, timeout {timeout:?}, {broken:?}"
        ));
        let mut starts: Vec<Duration> = (0..n)
            .map(|_| sim.rng.up_to(Duration::from_millis(200)))
            .collect();
        match sim.rng.below(100) {
            0..15 => {
                let r = sim.rng.index(n);
                let at = starts[r]
                    + Duration::from_micros(1)
                    + sim.rng.up_to(Duration::from_millis(400));
                sim.at(at, Timer::Crash(r));
                sim.note(format!("rank {r} will crash at {at:?}"));
            }
            15..30 => {
                let r = sim.rng.index(n);
                let at = starts[r]
                    + Duration::from_micros(1)
                    + sim.rng.up_to(Duration::from_millis(400));
                let long = sim.rng.up_to(timeout * 2);
                sim.at(at, Timer::Stop(r, long));
                sim.note(format!("rank {r} will stop at {at:?} for {long:?}"));
            }
            30..38 => {
                let r = sim.rng.index(n);
                starts[r] += timeout + sim.rng.up_to(timeout / 2);
                sim.faulty[r] = true;
                sim.note(format!("rank {r} comes late"));
            }
            38..48 => {
                sim.resets = true;
                sim.note("connections between ranks may reset".to_string());
            }
            _ => {}
        }
        for (r, &start) in starts.iter().enumerate() {
            let steps = MeshSteps::new(r, n, topology, timeout, base + start).broken(broken);
            sim.procs.push(Proc {
                steps,
                op: Op::Idle,
                life: Life::Running,
                start,
                stopped: Duration::ZERO,
                setup_in: vec![false; n],
                notices: Vec::new(),
                probes: Vec::new(),
                unacked: Vec::new(),
                acked: vec![false; n],
                backlog: VecDeque::new(),
                listening: true,
                running: Vec::new(),
                links: vec![None; n],
                wake: None,
                outcome: None,
                culprit: None,
                failed_at: Duration::ZERO,
                blamed: None,
                held: vec![false; n],
            });
            sim.at(start, Timer::Start(r));
        }
        for r in 0..n {
            for _ in 0..sim.rng.below(3) {
                let at = sim.rng.up_to(Duration::from_millis(300));
                let kind = sim.rng.below(4) as u8;
                sim.at(at, Timer::Stranger(r, kind));
            }
        }
        sim
    }

    fn note(&mut self, line: String) {
        self.trace.note(self.now, line);
    }

    fn at(&mut self, time: Duration, timer: Timer) {
        self.set += 1;
        self.timers.push(Reverse((time, self.set, timer)));
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.base)
    }

    fn send(&mut self, ch: Ch, msg: Msg) {
        let due = self.now + self.faults.delay(&mut self.rng);
        self.net.send(ch, due, msg);
    }

    fn wake(&mut self, r: usize, at: Duration) {
        let p = &mut self.procs[r];
        if p.wake.is_none_or(|w| at < w || w <= self.now) {
            p.wake = Some(at);
            self.at(at, Timer::Wake(r));
        }
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            if let sim::Step::Deliver(ch, msg) =
                self.net.step(&mut self.rng, &self.faults, self.now)
            {
                self.deliver(ch, msg)?;
                continue;
            }
            let timer = self.timers.peek().map(|Reverse((time, _, _))| *time);
            let message = self.net.next_due_after(self.now);
            match timer {
                Some(time) if message.is_none_or(|m| time <= m) => {
                    let Reverse((_, _, timer)) = self.timers.pop().unwrap();
                    self.now = self.now.max(time);
                    self.fire(timer)?;
                }
                _ => match message {
                    Some(due) => self.now = due,
                    None => return self.check_end(),
                },
            }
        }
    }

    fn fire(&mut self, timer: Timer) -> Result<(), String> {
        match timer {
            Timer::Start(r) => {
                if self.procs[r].life != Life::Running {
                    return Ok(());
                }
                self.note(format!("rank {r} starts"));
                let step = self.procs[r].steps.start();
                self.follow(r, step)?;
            }
            Timer::Wake(r) => {
                if self.procs[r].wake == Some(self.now) {
                    self.procs[r].wake = None;
                }
                self.drive(r)?;
            }
            Timer::Crash(r) => self.crash(r),
            Timer::Stop(r, long) => {
                if self.procs[r].life == Life::Running && self.procs[r].outcome.is_none() {
                    self.note(format!("rank {r} stops for {long:?}"));
                    self.procs[r].life = Life::Stopped;
                    self.faulty[r] = true;
                    self.procs[r].stopped += long;
                    self.at(self.now + long, Timer::Resume(r));
                }
            }
            Timer::Resume(r) => {
                self.note(format!("rank {r} runs again"));
                self.procs[r].life = Life::Running;
                self.drive(r)?;
            }
            Timer::Stranger(r, kind) => {
                let kind = match kind {
                    0 => Kind::Silent,
                    1 => Kind::WrongJob,
                    3 if self.secret && r > 0 => Kind::Replay(self.rng.index(r)),
                    k if k >= REPLAY => Kind::Replay(usize::from(k - REPLAY)),
                    _ => Kind::Above(r + self.rng.index(self.n - r)),
                };
                self.stranger(r, kind);
            }
            Timer::Reset(c) => self.reset(c, true),
        }
        Ok(())
    }

    fn stranger(&mut self, to: usize, kind: Kind) {
        self.note(format!("a stranger ({kind:?}) connects to rank {to}"));
        let c = self.open(Who::Stranger(kind), to);
        let hello = match kind {
            Kind::Silent => return,
            _ if self.secret => Err("no proof of the job secret".to_string()),
            Kind::WrongJob => Err("hello of another world".to_string()),
            Kind::Above(q) | Kind::Replay(q) => Ok(q),
        };
        self.send(Ch::Up(c), Msg::Hello(hello));
    }

    /// A new connection to `to`'s listener.
    fn open(&mut self, from: Who, to: usize) -> usize {
        self.conns.push(Conn {
            from,
            to,
            synack: false,
            refused: false,
            opening: false,
            reply: false,
            verdict_sent: false,
            verdict: false,
            hello: None,
            closed: false,
            gone_connector: false,
            gone_acceptor: false,
            faulty: false,
        });
        let c = self.conns.len() - 1;
        self.send(Ch::Up(c), Msg::Syn);
        c
    }

    /// Connection `c` resets, both ways.
    fn reset(&mut self, c: usize, fault: bool) {
        let conn = &mut self.conns[c];
        if conn.closed || conn.refused {
            return;
        }
        conn.closed = true;
        conn.faulty = fault;
        if fault {
            let line = format!(
                "connection {c} ({:?} to rank {}) resets",
                conn.from, conn.to
            );
            self.note(line);
        }
        self.send(Ch::Up(c), Msg::Reset);
        self.send(Ch::Down(c), Msg::Reset);
    }

    fn crash(&mut self, r: usize) {
        if self.procs[r].outcome.is_some() {
            return;
        }
        self.note(format!("rank {r} crashes"));
        self.faulty[r] = true;
        let p = &mut self.procs[r];
        p.life = Life::Crashed;
        p.op = Op::Done;
        self.close_all(r);
    }

    /// `r`'s listener and connections close (it crashed, or its set-up ended in an
    /// error, or it completed: then the listener only).
    fn close_all(&mut self, r: usize) {
        self.procs[r].listening = false;
        let backlog: Vec<usize> = self.procs[r].backlog.drain(..).collect();
        let running: Vec<usize> = self.procs[r].running.drain(..).map(|(c, _)| c).collect();
        for c in backlog.into_iter().chain(running) {
            self.reset(c, false);
        }
        if self.procs[r]
            .outcome
            .as_ref()
            .is_some_and(|(_, o)| o.is_ok())
        {
            return;
        }
        let mine: Vec<usize> = (0..self.conns.len())
            .filter(|&c| self.conns[c].to == r || self.conns[c].from == Who::Rank(r))
            .collect();
        for c in mine {
            self.reset(c, false);
        }
    }

    fn deliver(&mut self, ch: Ch, msg: Msg) -> Result<(), String> {
        match ch {
            Ch::Control(from, to) => {
                let p = &mut self.procs[to];
                if p.life == Life::Crashed {
                    return Ok(());
                }
                match msg {
                    Msg::Setup => p.setup_in[from] = true,
                    Msg::Notice(notice) => {
                        p.notices.push((self.now, notice));
                        p.unacked.push(from);
                    }
                    Msg::Ack => p.acked[from] = true,
                    Msg::Probe => p.probes.push(from),
                    Msg::Answer => {
                        if let Op::GivingUp(g) = &mut p.op {
                            if g.probing.is_some() && g.blamed == from {
                                g.answered = true;
                            }
                        }
                    }
                    _ => unreachable!("data on the control link"),
                }
                self.drive(to)
            }
            Ch::Up(c) => {
                let to = self.conns[c].to;
                if self.conns[c].gone_acceptor {
                    // Bytes after a reset go nowhere.
                    return Ok(());
                }
                match msg {
                    Msg::Syn => {
                        if self.procs[to].listening {
                            self.procs[to].backlog.push_back(c);
                            self.send(Ch::Down(c), Msg::SynAck);
                            if self.resets
                                && matches!(self.conns[c].from, Who::Rank(_))
                                && self.rng.chance(20)
                            {
                                let at = self.now + self.rng.up_to(Duration::from_millis(15));
                                self.at(at, Timer::Reset(c));
                            }
                        } else {
                            self.conns[c].refused = true;
                            self.send(Ch::Down(c), Msg::Refused);
                        }
                    }
                    Msg::Reply => self.conns[c].reply = true,
                    Msg::Hello(hello) => self.conns[c].hello = Some(hello),
                    Msg::Reset => self.conns[c].gone_acceptor = true,
                    _ => unreachable!("{msg:?} up"),
                }
                self.drive(to)
            }
            Ch::Down(c) => {
                if self.conns[c].gone_connector {
                    return Ok(());
                }
                match msg {
                    Msg::SynAck => self.conns[c].synack = true,
                    Msg::Refused => self.conns[c].refused = true,
                    Msg::Opening => self.conns[c].opening = true,
                    Msg::Verdict => self.conns[c].verdict = true,
                    Msg::Reset => self.conns[c].gone_connector = true,
                    _ => unreachable!("{msg:?} down"),
                }
                match self.conns[c].from {
                    Who::Rank(r) => self.drive(r),
                    Who::Stranger(_) => Ok(()),
                }
            }
        }
    }

    /// Does the shell's next step for `step`.
    fn follow(&mut self, r: usize, mut step: Step) -> Result<(), String> {
        loop {
            let now = self.instant();
            step = match step {
                Step::Announce(peers) => {
                    for q in peers {
                        self.send(Ch::Control(r, q), Msg::Setup);
                    }
                    self.procs[r].steps.announced()
                }
                Step::Read(q) => {
                    self.procs[r].op = Op::Reading(q);
                    return self.drive(r);
                }
                Step::Heard => self.procs[r].steps.proceed(now),
                Step::Connect { peer, wait, .. } => {
                    let conn = self.open(Who::Rank(r), peer);
                    let by = self.now + wait;
                    self.procs[r].op = Op::Connecting {
                        peer,
                        conn,
                        stage: Stage::Syn,
                        by,
                    };
                    return self.drive(r);
                }
                Step::LookForAborts | Step::Accept { .. } => {
                    self.procs[r].op = Op::Accepting;
                    return self.drive(r);
                }
                Step::Linked => {
                    self.note(format!("rank {r} completes"));
                    self.procs[r].op = Op::Done;
                    self.procs[r].outcome = Some((self.now, Ok(())));
                    self.tally.completed += 1;
                    self.close_all(r);
                    return self.check_links(r);
                }
                Step::Failed(e) => return self.fail(r, e),
            };
        }
    }

    /// Whether `r` reads its control link now (and so answers probes).
    fn reading(&self, r: usize) -> bool {
        let p = &self.procs[r];
        p.life == Life::Running
            && match &p.op {
                Op::Reading(_) | Op::Accepting | Op::GivingUp(_) | Op::Flushing(_) => true,
                Op::Done => p.outcome.as_ref().is_some_and(|(_, o)| o.is_ok()),
                Op::Idle | Op::Connecting { .. } => false,
            }
    }

    /// The first notice that came to `r` (a receive on the control link fails with it).
    fn aborted(&self, r: usize) -> Option<LinkError> {
        self.procs[r]
            .notices
            .first()
            .map(|(_, n)| LinkError::Aborted {
                rank: n.rank,
                reason: n.reason.clone(),
            })
    }

    /// Runs `r` as far as it goes now.
    fn drive(&mut self, r: usize) -> Result<(), String> {
        if self.procs[r].life != Life::Running {
            return Ok(());
        }
        if self.reading(r) {
            for q in std::mem::take(&mut self.procs[r].probes) {
                self.send(Ch::Control(r, q), Msg::Answer);
            }
            for q in std::mem::take(&mut self.procs[r].unacked) {
                self.send(Ch::Control(r, q), Msg::Ack);
            }
        }
        let deadline = self.since(self.procs[r].steps.deadline());
        let now = self.instant();
        match &self.procs[r].op {
            Op::Idle | Op::Done => Ok(()),
            &Op::Flushing(until) => {
                let all = (0..self.n).all(|q| q == r || self.procs[r].acked[q]);
                if all || self.now >= until {
                    self.procs[r].op = Op::Done;
                } else {
                    self.wake(r, until);
                }
                Ok(())
            }
            &Op::Reading(q) => {
                if let Some(e) = self.aborted(r) {
                    return self.fail(r, e);
                }
                if self.procs[r].setup_in[q] {
                    let step = self.procs[r].steps.heard_from(q, addr(q));
                    return self.follow(r, step);
                }
                if self.now >= deadline {
                    let e = LinkError::Timeout {
                        rank: q,
                        waited: self.timeout,
                    };
                    return self.fail(r, e);
                }
                self.wake(r, deadline);
                Ok(())
            }
            &Op::Connecting {
                peer,
                conn: c,
                stage,
                by,
            } => {
                let conn = &self.conns[c];
                let failed = if conn.refused {
                    Some("connection refused")
                } else if conn.gone_connector {
                    Some("connection reset by peer")
                } else {
                    None
                };
                let unreached = |reason: &str, timed_out| Unreached {
                    reason: reason.to_string(),
                    timed_out,
                };
                let mut next = stage;
                let mut done = false;
                match stage {
                    Stage::Syn if conn.synack && failed.is_none() => {
                        if self.secret {
                            next = Stage::Opening;
                        } else {
                            done = true;
                        }
                    }
                    Stage::Opening if conn.opening && failed.is_none() => {
                        self.send(Ch::Up(c), Msg::Reply);
                        next = Stage::Verdict;
                    }
                    Stage::Verdict if conn.verdict && failed.is_none() => done = true,
                    _ => {}
                }
                let result = if done {
                    self.send(Ch::Up(c), Msg::Hello(Ok(r)));
                    self.procs[r].links[peer] = Some(c);
                    Some(Ok(()))
                } else if let Some(why) = failed {
                    Some(Err(unreached(why, false)))
                } else {
                    let limit = if next == Stage::Syn { by } else { deadline };
                    if self.now >= limit {
                        Some(Err(unreached("timed out", true)))
                    } else {
                        None
                    }
                };
                match result {
                    Some(result) => {
                        let step = self.procs[r].steps.connected(peer, result, now);
                        self.follow(r, step)
                    }
                    None => {
                        if let Op::Connecting { stage, .. } = &mut self.procs[r].op {
                            *stage = next;
                        }
                        if next != stage {
                            return self.drive(r);
                        }
                        let limit = if next == Stage::Syn { by } else { deadline };
                        self.wake(r, limit);
                        Ok(())
                    }
                }
            }
            Op::Accepting => self.accept(r),
            Op::GivingUp(_) => self.give_up(r),
        }
    }

    /// The accept loop: the machine's look, the listener, the handshakes.
    fn accept(&mut self, r: usize) -> Result<(), String> {
        loop {
            let now = self.instant();
            let until = match self.procs[r].steps.poll(now) {
                Step::LookForAborts => {
                    if let Some(e) = self.aborted(r) {
                        return self.fail(r, e);
                    }
                    let step = self.procs[r].steps.looked(now);
                    if let Step::Accept { until } = step {
                        until
                    } else {
                        return self.follow(r, step);
                    }
                }
                Step::Accept { until } => until,
                step => return self.follow(r, step),
            };
            let deadline = self.procs[r].steps.deadline();
            while let Some(c) = self.procs[r].backlog.pop_front() {
                let by = self.since(steps::hello_by(deadline, now));
                self.procs[r].running.push((c, by));
                if self.secret {
                    self.send(Ch::Down(c), Msg::Opening);
                }
            }
            // The handshakes run on: a reply proved gets its verdict.
            let running = self.procs[r].running.clone();
            for &(c, _) in &running {
                let conn = &self.conns[c];
                let proved = conn.reply && !conn.verdict_sent && !conn.gone_acceptor;
                if self.secret && proved && matches!(conn.from, Who::Rank(_)) {
                    self.conns[c].verdict_sent = true;
                    self.send(Ch::Down(c), Msg::Verdict);
                }
            }
            let ended = running.iter().find_map(|&(c, by)| {
                let conn = &self.conns[c];
                if conn.gone_acceptor {
                    Some((c, Err("connection reset".to_string())))
                } else if let Some(hello) = &conn.hello {
                    Some((c, hello.clone()))
                } else if self.now >= by {
                    Some((c, Err("timed out".to_string())))
                } else {
                    None
                }
            });
            let Some((c, claimed)) = ended else {
                let next = running
                    .iter()
                    .map(|&(_, by)| by)
                    .fold(self.since(until), Duration::min);
                self.wake(r, next.max(self.now));
                return Ok(());
            };
            self.procs[r].running.retain(|&(d, _)| d != c);
            let from = self.conns[c].from;
            match self.procs[r].steps.hello(claimed) {
                Hello::Take(peer) => {
                    self.note(format!("rank {r} takes connection {c} as rank {peer}'s"));
                    self.procs[r].links[peer] = Some(c);
                    // Someone on the path saw the hello: a replay may follow. Without a
                    // secret, only after the rank's own was taken (see the top).
                    if !self.secret && self.rng.chance(30) {
                        let at = self.now + self.rng.up_to(Duration::from_millis(30));
                        self.at(at, Timer::Stranger(r, REPLAY + peer as u8));
                    }
                }
                Hello::Unexpected(peer) => {
                    self.tally.unexpected += 1;
                    self.note(format!(
                        "rank {r} closes {from:?}: unexpected hello of rank {peer}"
                    ));
                    self.reset(c, false);
                }
                Hello::Bad(why) => {
                    self.tally.bad += 1;
                    self.note(format!("rank {r} closes {from:?}: {why}"));
                    self.reset(c, false);
                }
            }
        }
    }

    /// `r`'s set-up failed with `e`: `gave_up`'s first half.
    fn fail(&mut self, r: usize, e: LinkError) -> Result<(), String> {
        self.note(format!("rank {r} fails: {e}"));
        self.procs[r].failed_at = self.now;
        self.procs[r].held = self.procs[r].links.iter().map(Option::is_some).collect();
        let me = r;
        let reason = format!("rank {me}: {e}");
        match self.procs[r].steps.blame(&e) {
            Blame::Own => {
                self.notify(r, &reason, None);
                self.finish(r, e, Some(me))
            }
            blame @ Blame::Peer { rank, seen } => {
                self.procs[r].blamed = Some((rank, seen));
                let first = blame.notice_first();
                if first {
                    self.notify(r, &reason, Some(rank));
                }
                let limit = self.since(steps::explain_limit(self.instant(), self.timeout));
                let slice_end = (self.now + SLICE).min(limit);
                self.procs[r].op = Op::GivingUp(GivingUp {
                    error: e,
                    blamed: rank,
                    seen,
                    first,
                    limit,
                    slice_end,
                    probing: None,
                    probed: false,
                    answered: false,
                });
                self.wake(r, slice_end);
                Ok(())
            }
        }
    }

    fn notify(&mut self, r: usize, reason: &str, blames: Option<usize>) {
        let notice = Notice {
            rank: r,
            reason: reason.to_string(),
            blames,
        };
        for q in (0..self.n).filter(|&q| q != r) {
            self.send(Ch::Control(r, q), Msg::Notice(notice.clone()));
        }
    }

    /// The model of [`blame::explain`], one look at a time.
    fn give_up(&mut self, r: usize) -> Result<(), String> {
        let now = self.now;
        let notices: Vec<Notice> = self.procs[r]
            .notices
            .iter()
            .map(|(_, n)| n.clone())
            .collect();
        let Op::GivingUp(g) = &mut self.procs[r].op else {
            return Ok(());
        };
        if let Some(until) = g.probing {
            if !g.answered && now < until {
                self.wake(r, until);
                return Ok(());
            }
            g.probing = None;
            if !g.answered {
                return self.explained(r, Explained::Nothing);
            }
            g.slice_end = (now + SLICE).min(g.limit);
            let at = g.slice_end;
            self.wake(r, at);
            return Ok(());
        }
        if now < g.slice_end {
            let at = g.slice_end;
            self.wake(r, at);
            return Ok(());
        }
        let explained = match blame::follow(r, g.blamed, &notices) {
            (Some(n), Some(end)) if end == r => match g.seen {
                Seen::Silent => Explained::Nothing,
                Seen::Gone | Seen::Aborted => Explained::OnThisRank(n),
            },
            (Some(n), _) => Explained::By(n),
            (None, None) => Explained::Nothing,
            (None, Some(_)) if now >= g.limit => Explained::Nothing,
            (None, Some(_)) => {
                if !g.probed {
                    g.probed = true;
                    if g.seen == Seen::Gone {
                        return self.explained(r, Explained::Nothing);
                    }
                    g.probing = Some(now + PROBE_WAIT);
                    g.answered = false;
                    let (blamed, until) = (g.blamed, now + PROBE_WAIT);
                    self.send(Ch::Control(r, blamed), Msg::Probe);
                    self.wake(r, until);
                    return Ok(());
                }
                g.slice_end = (now + SLICE).min(g.limit);
                let at = g.slice_end;
                self.wake(r, at);
                return Ok(());
            }
        };
        self.explained(r, explained)
    }

    /// `gave_up`'s second half: the notice if not sent yet, and the report.
    fn explained(&mut self, r: usize, explained: Explained) -> Result<(), String> {
        let Op::GivingUp(g) = std::mem::replace(&mut self.procs[r].op, Op::Done) else {
            return Ok(());
        };
        let reason = format!("rank {r}: {}", g.error);
        if !g.first {
            self.notify(r, &reason, Some(g.blamed));
        }
        let culprit = match &explained {
            Explained::Nothing => Some(g.blamed),
            Explained::By(n) => Some(n.blames.unwrap_or(n.rank)),
            Explained::OnThisRank(_) => Some(r),
        };
        let e = explained.into_link_error(r, g.error);
        self.finish(r, e, culprit)
    }

    fn finish(&mut self, r: usize, e: LinkError, culprit: Option<usize>) -> Result<(), String> {
        self.note(format!("rank {r} reports {e} (culprit {culprit:?})"));
        match e {
            LinkError::Timeout { .. } => self.tally.timeout += 1,
            LinkError::Lost { .. } => self.tally.lost += 1,
            _ => self.tally.aborted += 1,
        }
        self.procs[r].op = Op::Flushing(self.now + ABORT_FLUSH);
        self.procs[r].culprit = culprit;
        self.procs[r].outcome = Some((self.now, Err(e)));
        self.close_all(r);
        self.drive(r)
    }

    /// A completed rank holds one connection to each peer it connects to, made with
    /// that peer, the same its peer holds if that one completed.
    fn check_links(&self, r: usize) -> Result<(), String> {
        for q in (0..self.n).filter(|&q| q != r) {
            let want = self.topology.connects(r, q);
            let held = self.procs[r].links[q];
            match held {
                None if want => return Err(format!("rank {r} completed without rank {q}")),
                Some(_) if !want => return Err(format!("rank {r} holds a link to rank {q}")),
                None => continue,
                Some(c) => {
                    let conn = &self.conns[c];
                    let ends = match conn.from {
                        Who::Rank(a) => [a, conn.to],
                        Who::Stranger(kind) => {
                            return Err(format!(
                                "rank {r} completed holding a stranger's connection \
                                 ({kind:?}) for rank {q}"
                            ));
                        }
                    };
                    if !(ends == [r, q] || ends == [q, r]) {
                        return Err(format!("rank {r}'s link to rank {q} joins {ends:?}"));
                    }
                }
            }
        }
        for q in (0..self.n).filter(|&q| q != r) {
            let done = self.procs[q]
                .outcome
                .as_ref()
                .is_some_and(|(_, o)| o.is_ok());
            if done && self.procs[q].links[r] != self.procs[r].links[q] {
                return Err(format!(
                    "ranks {r} and {q} completed holding different connections to each other"
                ));
            }
        }
        Ok(())
    }

    /// Whether `q` is an end of a connection that the seed reset.
    fn on_a_reset(&self, q: usize) -> bool {
        self.conns
            .iter()
            .any(|c| c.faulty && (c.to == q || c.from == Who::Rank(q)))
    }

    /// A healthy rank that fails names a faulty rank, or a healthy one it could not
    /// know better about.
    fn check_blame(&self, r: usize) -> Result<(), String> {
        let p = &self.procs[r];
        let (Some(q), Some((at, _))) = (p.culprit, &p.outcome) else {
            return Ok(());
        };
        if self.faulty[r] || self.faulty[q] || self.on_a_reset(q) {
            return Ok(());
        }
        let deadline = self.since(p.steps.deadline());
        if q == r && p.failed_at >= deadline {
            return Err(format!(
                "healthy rank {r} waited its whole timeout, yet reports that the peers \
                 gave up waiting for it"
            ));
        }
        // A wait that failed on a rank whose connection had come is a wrong verdict.
        if let Some((b, Seen::Silent | Seen::Gone)) = p.blamed.filter(|&(b, _)| p.held[b]) {
            return Err(format!(
                "rank {r} blames rank {b}, whose connection it held"
            ));
        }
        let known: Vec<&Notice> = p
            .notices
            .iter()
            .filter(|(came, _)| came <= at)
            .map(|(_, n)| n)
            .collect();
        // The chain of notices it followed, from the rank its wait failed on.
        let (mut x, mut seen) = (p.blamed.map_or(q, |(b, _)| b), vec![r]);
        loop {
            let notice = known.iter().find(|n| n.rank == x);
            if self.faulty[x] || self.on_a_reset(x) {
                if notice.is_some() {
                    // A faulty rank's own report misleads (see the top).
                    return Ok(());
                }
                return Err(format!(
                    "rank {r} names healthy rank {q}, but the notices it had lead to \
                     faulty rank {x}"
                ));
            }
            if seen.contains(&x) {
                break;
            }
            seen.push(x);
            match notice.and_then(|n| n.blames) {
                Some(next) => x = next,
                None => break,
            }
        }
        if q == r {
            return Err(format!(
                "healthy rank {r} reports that the peers gave up waiting for it"
            ));
        }
        Ok(())
    }

    /// At the end: every rank ended, by its bound; without faults, all completed.
    fn check_end(&self) -> Result<(), String> {
        let clean = !self.faulty.iter().any(|&f| f) && !self.conns.iter().any(|c| c.faulty);
        let last = self.procs.iter().map(|p| p.start).max().unwrap_or_default();
        for (r, p) in self.procs.iter().enumerate() {
            if p.life == Life::Crashed {
                continue;
            }
            let Some((at, outcome)) = &p.outcome else {
                return Err(format!("rank {r} never ended"));
            };
            let bound = p.start + p.stopped + self.timeout * 2 + PROBE_WAIT * 2 + SLICE * 2;
            if *at > bound {
                return Err(format!(
                    "rank {r} ended at {at:?}, past its bound {bound:?}"
                ));
            }
            self.check_blame(r)?;
            if clean {
                if let Err(e) = outcome {
                    return Err(format!("rank {r} failed without a fault: {e}"));
                }
                if *at > last + PROMPT {
                    return Err(format!("rank {r} completed only at {at:?}"));
                }
            }
        }
        Ok(())
    }
}

/// Rank `q`'s data address, as it announces it.
fn addr(q: usize) -> String {
    format!("127.0.0.1:{}", 7000 + q)
}

fn campaign(broken: Option<Break>) -> Campaign {
    Campaign::new("switchyard-link", test_name(broken), BUDGET)
}

/// One seed's run, its ends added to `tally`.
fn run(seed: u64, broken: Option<Break>, tally: &mut Tally) -> sim::Outcome {
    let mut sim = Sim::new(seed, broken);
    let result = sim.run();
    tally.add(&sim.tally);
    sim::Outcome::new(result, sim.trace)
}

#[test]
fn sim_the_mesh_set_up_links_every_pair_once_or_blames_a_faulty_rank() {
    let mut tally = Tally::default();
    let seeds = campaign(None)
        .run(|seed| run(seed, None, &mut tally))
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{seeds} seeds: {tally:?}");
    // The budget covers each way a rank ends and each way a listener closes.
    if seeds >= BUDGET {
        assert!(tally.all().iter().all(|&n| n > 0), "{tally:?}");
    }
}

/// The report of the first seed of the budget on which `broken` breaks an invariant;
/// `None` when `SEED` replays one (its trace printed).
fn first_failure(broken: Break) -> Option<String> {
    campaign(Some(broken))
        .first_failure(|seed| run(seed, Some(broken), &mut Tally::default()))
        .map(|f| f.to_string())
}

#[test]
fn sim_finds_a_replayed_hello_taken_when_duplicates_are() {
    if let Some(failure) = first_failure(Break::TakeDuplicates) {
        assert!(failure.contains("stranger's connection"), "{failure}");
    }
}

#[test]
fn sim_finds_a_healthy_rank_blamed_when_absence_is_not_checked() {
    if let Some(failure) = first_failure(Break::BlameAnyBelow) {
        assert!(failure.contains("whose connection it held"), "{failure}");
    }
}

#[test]
fn sim_finds_a_rank_blaming_itself_when_a_timed_out_connect_is_gone() {
    if let Some(failure) = first_failure(Break::TimeoutAsGone) {
        assert!(failure.contains("gave up waiting for it"), "{failure}");
    }
}
