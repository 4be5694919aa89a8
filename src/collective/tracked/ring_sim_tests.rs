//! A deterministic simulation of the endpoint exchange over rings whose links join
//! attempts of different ages, as the tracker leaves them while ranks fail and retry:
//! the real steps ([`RingSteps`]) driven by a model of the I/O shell (`ring.rs`) and
//! its watch over a simulated network and clock that one seed decides.
//!
//! Each seed makes 3-6 ranks with 1-3 attempts each, and links each attempt to at
//! most one attempt of its ring successor and one of its predecessor (a random
//! matching per edge of the ring, so that rings of mixed attempts, rings that do not
//! close and chains that end at an attempt still joining all occur). An attempt linked
//! both ways runs the exchange from a random time, or stays silent (still joining,
//! holding its links) until a random time, past the exchange's limit for some; one
//! linked one way is silent. A running attempt may die at a random time. Every frame,
//! done mark and close takes 0.1-10 ms, in order on each link; of the messages due at
//! the same moment, the seed picks which goes first.
//!
//! Checked whenever an attempt completes: the attempts its predecessors' links lead to
//! close the ring through it, and every endpoint it holds is that ring's. Checked for
//! every attempt whose successor's link closed without the done mark while it ran: it
//! failed within the network's delay and a poll of the watch, not at its limit.
//!
//! The generator, the in-order network and the campaign runner are the simulator's
//! ([`switchyard_sim`]): `SEED=n` replays one seed and prints its trace (in the proof
//! tests, under their broken variant); `SIM_SEEDS=n` runs that many seeds instead of
//! the default budget; a failing seed prints the line that replays it. The two proof
//! tests run the variants without the check of the last step and without the watch,
//! and require the campaign to find what each catches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{Entry, Next, RingSteps};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;
use switchyard_sim::{self as sim, Campaign, Faults, Network, Rng, Step, Trace};

/// Seeds a plain `cargo test` runs.
const BUDGET: u64 = 10_000;
/// The exchange's limit: a quarter of the reform tests' timeout.
const LIMIT: Duration = Duration::from_secs(2);
/// How often the watch looks at the other links.
const POLL: Duration = Duration::from_millis(2);

/// Each hop of the network takes 0.1-10 ms; a message due is delivered when it is due
/// (the delays alone make timers race deliveries).
fn faults() -> Faults {
    Faults {
        hold: 0,
        ..Faults::delays(Duration::from_micros(100), Duration::from_millis(10))
    }
}

/// The shell's decisions under test: as they are, or one of them left out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    /// The exchange as it is.
    Fixed,
    /// The last step's entry is not checked (and the ring goes round once more for
    /// nothing): a rank can complete with endpoints of attempts that are not its ring.
    Unchecked,
    /// The other links are not watched: a rank whose successor left waits for its
    /// predecessor until its limit.
    Unwatched,
}

impl Variant {
    /// The test that runs it.
    fn test(self) -> &'static str {
        match self {
            Variant::Fixed => {
                "ring_sim_the_exchange_completes_only_on_a_closed_ring_and_fails_fast"
            }
            Variant::Unchecked => "ring_sim_finds_a_ring_that_does_not_close_without_the_check",
            Variant::Unwatched => "ring_sim_finds_a_wait_past_a_closed_link_without_the_watch",
        }
    }
}

/// What goes along a link.
#[derive(Clone, Debug)]
enum Msg {
    Frame(Entry),
    Done,
    Closed,
}

/// What happens to an attempt at a time of its own (messages go through the
/// network).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Start(usize),
    Die(usize),
    /// A silent attempt gives up its links (its join failed).
    Quit(usize),
    Deadline(usize),
    /// The watch's look after a watched link closed.
    Noticed(usize),
}

#[derive(Debug)]
enum State {
    Idle,
    Running(RingSteps),
    Completed,
    /// Failed or died, at this time.
    Ended(Duration),
}

struct Attempt {
    rank: usize,
    id: u64,
    endpoint: String,
    next: Option<usize>,
    prev: Option<usize>,
    state: State,
    /// Frames from the predecessor not consumed yet (they wait in the socket).
    inbox: VecDeque<Entry>,
    prev_closed: bool,
    /// Whether its successor's link closed without the done mark.
    next_closed: bool,
    /// Peers that said their exchange is over.
    done: BTreeSet<usize>,
    /// When its successor's link closed without the done mark while it ran.
    left_at: Option<Duration>,
}

struct Sim {
    n: usize,
    variant: Variant,
    rng: Rng,
    faults: Faults,
    now: Duration,
    /// The timers to come, by time, then in the order they were set.
    timers: BinaryHeap<Reverse<(Duration, u64, Timer)>>,
    set: u64,
    /// Messages in flight on each link `(from, to)`.
    net: Network<(usize, usize), Duration, Msg>,
    attempts: Vec<Attempt>,
    trace: Trace,
    tally: Tally,
}

/// How the attempts of a campaign ended, to show what it covers.
#[derive(Debug, Default)]
struct Tally {
    completed: u64,
    not_back: u64,
    watched: u64,
    limit: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.completed += other.completed;
        self.not_back += other.not_back;
        self.watched += other.watched;
        self.limit += other.limit;
    }
}

impl Sim {
    fn new(seed: u64, variant: Variant) -> Sim {
        let mut rng = Rng::new(seed);
        let n = 3 + rng.index(4);
        let mut attempts = Vec::new();
        let mut of_rank = vec![Vec::new(); n];
        for (rank, list) in of_rank.iter_mut().enumerate() {
            for _ in 0..1 + rng.below(3) {
                list.push(attempts.len());
                let id = rng.next_u64();
                attempts.push(Attempt {
                    rank,
                    id,
                    endpoint: format!("r{rank}a{}", attempts.len()),
                    next: None,
                    prev: None,
                    state: State::Idle,
                    inbox: VecDeque::new(),
                    prev_closed: false,
                    next_closed: false,
                    done: BTreeSet::new(),
                    left_at: None,
                });
            }
        }
        // A random matching on each edge of the ring.
        for r in 0..n {
            let mut from = of_rank[r].clone();
            let mut to = of_rank[(r + 1) % n].clone();
            rng.shuffle(&mut from);
            rng.shuffle(&mut to);
            let pairs = rng.index(from.len().min(to.len()) + 1);
            for (&a, &b) in from.iter().zip(&to).take(pairs) {
                attempts[a].next = Some(b);
                attempts[b].prev = Some(a);
            }
        }
        let mut sim = Sim {
            n,
            variant,
            rng,
            faults: faults(),
            now: Duration::ZERO,
            timers: BinaryHeap::new(),
            set: 0,
            net: Network::default(),
            attempts,
            trace: Trace::default(),
            tally: Tally::default(),
        };
        sim.note(format!("{n} ranks, {variant:?}"));
        for a in 0..sim.attempts.len() {
            let (next, prev) = (sim.attempts[a].next, sim.attempts[a].prev);
            let linked = |b: Option<usize>| b.map_or("none".to_string(), |b| sim.name(b));
            let links = format!("linked to {}, from {}", linked(next), linked(prev));
            let plan = if next.is_some() && prev.is_some() && sim.rng.chance(80) {
                let start = sim.rng.up_to(Duration::from_millis(200));
                sim.at(start, Timer::Start(a));
                let mut plan = format!("starts at {start:?}");
                if sim.rng.chance(30) {
                    let death = sim.rng.up_to(Duration::from_millis(500));
                    sim.at(death, Timer::Die(a));
                    plan += &format!(", dies at {death:?}");
                }
                plan
            } else {
                let quit = sim.rng.up_to(Duration::from_secs(3));
                sim.at(quit, Timer::Quit(a));
                format!("silent, its join gives up at {quit:?}")
            };
            sim.note(format!("{} {links}; {plan}", sim.name(a)));
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

    /// Sends `msg` from `from` to `to` along their link, after the previous one.
    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        let due = self.now + self.faults.delay(&mut self.rng);
        self.net.send((from, to), due, msg);
    }

    fn links(&self, a: usize) -> Vec<usize> {
        let at = &self.attempts[a];
        let mut all: Vec<usize> = at.next.into_iter().chain(at.prev).collect();
        all.dedup();
        all
    }

    fn name(&self, a: usize) -> String {
        format!(
            "{}(rank {})",
            self.attempts[a].endpoint, self.attempts[a].rank
        )
    }

    /// `a` fails (or dies, or a silent one quits): its links close, no done mark.
    fn end(&mut self, a: usize, why: &str) {
        if matches!(self.attempts[a].state, State::Completed | State::Ended(_)) {
            return;
        }
        self.note(format!("{} ends: {why}", self.name(a)));
        self.attempts[a].state = State::Ended(self.now);
        for peer in self.links(a) {
            self.send(a, peer, Msg::Closed);
        }
    }

    /// Runs the seed to its end: every message due is delivered (the seed picking
    /// among those due together), then the next timer fires or the clock moves to the
    /// next message.
    fn run(&mut self) -> Result<(), String> {
        loop {
            if let Step::Deliver((from, to), msg) =
                self.net.step(&mut self.rng, &self.faults, self.now)
            {
                self.deliver(to, from, msg)?;
                continue;
            }
            let timer = self.timers.peek().map(|Reverse((time, _, _))| *time);
            let message = self.net.next_due_after(self.now);
            match timer {
                Some(time) if message.is_none_or(|m| time <= m) => {
                    let Reverse((_, _, timer)) = self.timers.pop().unwrap();
                    self.now = time;
                    self.fire(timer)?;
                }
                _ => match message {
                    Some(due) => self.now = due,
                    None => return self.check_watch(),
                },
            }
        }
    }

    fn fire(&mut self, timer: Timer) -> Result<(), String> {
        match timer {
            Timer::Start(a) => self.start(a)?,
            Timer::Die(a) => self.end(a, "died"),
            Timer::Quit(a) => self.end(a, "its join gave up"),
            Timer::Deadline(a) => {
                if matches!(self.attempts[a].state, State::Running(_)) {
                    self.tally.limit += 1;
                    self.end(a, "its limit ran out");
                }
            }
            Timer::Noticed(a) => {
                if matches!(self.attempts[a].state, State::Running(_)) {
                    self.tally.watched += 1;
                }
                self.end(a, "a watched link closed");
            }
        }
        Ok(())
    }

    fn start(&mut self, a: usize) -> Result<(), String> {
        if !matches!(self.attempts[a].state, State::Idle) {
            return Ok(());
        }
        let at = &self.attempts[a];
        if at.prev_closed || at.next_closed {
            // The join's own watch.
            self.end(a, "a link closed during its join");
            return Ok(());
        }
        let (mut steps, first) = RingSteps::new(at.rank, self.n, at.id, &at.endpoint);
        if self.variant == Variant::Unchecked {
            steps = steps.unchecked();
        }
        self.note(format!("{} starts", self.name(a)));
        self.attempts[a].state = State::Running(steps);
        self.at(self.now + LIMIT, Timer::Deadline(a));
        let next = self.attempts[a].next.unwrap();
        self.send(a, next, Msg::Frame(first));
        self.consume(a)
    }

    fn deliver(&mut self, to: usize, from: usize, msg: Msg) -> Result<(), String> {
        let at = &mut self.attempts[to];
        let from_prev = at.prev == Some(from);
        let mut left = false;
        match msg {
            // Frames are read from the predecessor's link only, and wait there.
            Msg::Frame(entry) if from_prev => at.inbox.push_back(entry),
            Msg::Frame(_) => return Err(format!("a frame on a watched link of {to}")),
            Msg::Closed if from_prev => at.prev_closed = true,
            // The predecessor's done mark is never read: it follows its last frame.
            Msg::Done if from_prev => {}
            Msg::Done => {
                at.done.insert(from);
            }
            Msg::Closed if at.done.contains(&from) => {}
            Msg::Closed => {
                at.next_closed = true;
                if matches!(at.state, State::Running(_)) {
                    at.left_at.get_or_insert(self.now);
                    left = true;
                }
            }
        }
        if left {
            let line = format!("{} sees {} leave", self.name(to), self.name(from));
            self.note(line);
        }
        if left && self.variant != Variant::Unwatched {
            let seen = self.now + self.rng.up_to(POLL);
            self.at(seen, Timer::Noticed(to));
        }
        self.consume(to)
    }

    /// A running attempt takes the frames waiting for it, in order.
    fn consume(&mut self, a: usize) -> Result<(), String> {
        loop {
            let at = &mut self.attempts[a];
            let State::Running(steps) = &mut at.state else {
                return Ok(());
            };
            let Some(entry) = at.inbox.pop_front() else {
                if at.prev_closed {
                    self.end(a, "its predecessor closed");
                }
                return Ok(());
            };
            match steps.on_frame(entry) {
                Ok(Next::Send(out)) => {
                    let next = at.next.unwrap();
                    self.send(a, next, Msg::Frame(out));
                }
                Ok(Next::Over(all)) => {
                    self.note(format!("{} completes: {all:?}", self.name(a)));
                    self.check_ring(a, &all)?;
                    self.attempts[a].state = State::Completed;
                    self.tally.completed += 1;
                    for peer in self.links(a) {
                        self.send(a, peer, Msg::Done);
                        self.send(a, peer, Msg::Closed);
                    }
                    return Ok(());
                }
                Err(not_back) => {
                    self.tally.not_back += 1;
                    let why = format!("{:?} came back instead of its own entry", not_back.got.1);
                    self.end(a, &why);
                    return Ok(());
                }
            }
        }
    }

    /// The ring `a` completed on closes through it, and `all` is that ring's.
    fn check_ring(&self, a: usize, all: &[String]) -> Result<(), String> {
        let mut b = a;
        for _ in 0..self.n {
            b = self.attempts[b]
                .prev
                .ok_or_else(|| format!("{} completed behind an unlinked attempt", self.name(a)))?;
            let at = &self.attempts[b];
            if all[at.rank] != at.endpoint && b != a {
                return Err(format!(
                    "{} completed holding {:?} for rank {}, but its ring has {}",
                    self.name(a),
                    all[at.rank],
                    at.rank,
                    self.name(b)
                ));
            }
        }
        if b != a {
            return Err(format!(
                "{} completed, but the ring behind it does not close through it (it \
                 reaches {})",
                self.name(a),
                self.name(b)
            ));
        }
        Ok(())
    }

    /// Every attempt whose successor left while it ran failed within the network's
    /// delay and a poll, not at its limit.
    fn check_watch(&self) -> Result<(), String> {
        for (a, at) in self.attempts.iter().enumerate() {
            if let (Some(left), State::Ended(ended)) = (at.left_at, &at.state) {
                if *ended > left + POLL {
                    return Err(format!(
                        "{} ended {:?} after a watched link closed",
                        self.name(a),
                        *ended - left
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The campaign of `variant`'s test.
fn campaign(variant: Variant) -> Campaign {
    Campaign::new("switchyard", variant.test(), BUDGET)
}

/// One seed's run under `variant`, its attempts' ends added to `tally`.
fn run(seed: u64, variant: Variant, tally: &mut Tally) -> sim::Outcome {
    let mut sim = Sim::new(seed, variant);
    let result = sim.run();
    tally.add(&sim.tally);
    sim::Outcome::new(result, sim.trace)
}

#[test]
fn ring_sim_the_exchange_completes_only_on_a_closed_ring_and_fails_fast() {
    let mut tally = Tally::default();
    let seeds = campaign(Variant::Fixed)
        .run(|seed| run(seed, Variant::Fixed, &mut tally))
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{seeds} seeds: {tally:?}");
    // The campaign covers each way an exchange ends.
    if seeds >= BUDGET {
        assert!(
            [tally.completed, tally.not_back, tally.watched, tally.limit]
                .iter()
                .all(|&n| n > 0),
            "{tally:?}"
        );
    }
}

/// The report of the first seed of the budget on which `variant` breaks an invariant
/// (its number printed); `None` when `SEED` replays one (its trace printed).
fn first_failure(variant: Variant) -> Option<String> {
    campaign(variant)
        .first_failure(|seed| run(seed, variant, &mut Tally::default()))
        .map(|f| f.to_string())
}

#[test]
fn ring_sim_finds_a_ring_that_does_not_close_without_the_check() {
    if let Some(failure) = first_failure(Variant::Unchecked) {
        assert!(failure.contains("completed"), "{failure}");
    }
}

#[test]
fn ring_sim_finds_a_wait_past_a_closed_link_without_the_watch() {
    if let Some(failure) = first_failure(Variant::Unwatched) {
        assert!(failure.contains("after a watched link closed"), "{failure}");
    }
}
