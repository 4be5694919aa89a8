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
//! done mark and close takes 0.1-10 ms, in order on each link.
//!
//! Checked whenever an attempt completes: the attempts its predecessors' links lead to
//! close the ring through it, and every endpoint it holds is that ring's. Checked for
//! every attempt whose successor's link closed without the done mark while it ran: it
//! failed within the network's delay and a poll of the watch, not at its limit.
//!
//! `SEED=n cargo test -p switchyard --lib ring_sim` replays one seed and prints its
//! trace; `SIM_SEEDS=n` runs that many seeds instead of the default budget. The two
//! proof tests run the variants without the check of the last step and without the
//! watch, and require the campaign to find what each catches.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{Entry, Next, RingSteps};
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

/// Seeds a plain `cargo test` runs.
const BUDGET: u64 = 10_000;
/// The exchange's limit (microseconds): a quarter of the reform tests' timeout.
const LIMIT: u64 = 2_000_000;
/// How often the watch looks at the other links (microseconds).
const POLL: u64 = 2_000;
/// Each hop of the network takes between these (microseconds).
const MIN_DELAY: u64 = 100;
const MAX_DELAY: u64 = 10_000;

/// SplitMix64: small, seedable, and ours.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
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

/// What goes along a link.
#[derive(Clone, Debug)]
enum Msg {
    Frame(Entry),
    Done,
    Closed,
}

#[derive(Debug)]
enum Event {
    Start(usize),
    Die(usize),
    /// A silent attempt gives up its links (its join failed).
    Quit(usize),
    Deadline(usize),
    /// The watch's look after a watched link closed.
    Noticed(usize),
    Deliver {
        to: usize,
        from: usize,
        msg: Msg,
    },
}

#[derive(Debug)]
enum State {
    Idle,
    Running(RingSteps),
    Completed,
    /// Failed or died, at this time.
    Ended(u64),
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
    left_at: Option<u64>,
}

struct Sim {
    n: usize,
    variant: Variant,
    rng: Rng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    payloads: Vec<Option<Event>>,
    /// The last delivery time on each directed link, to keep links in order.
    last: std::collections::BTreeMap<(usize, usize), u64>,
    attempts: Vec<Attempt>,
    trace: Vec<String>,
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

impl Sim {
    fn new(seed: u64, variant: Variant) -> Sim {
        let mut rng = Rng(seed);
        let n = rng.range(3, 7) as usize;
        let mut attempts = Vec::new();
        let mut of_rank = vec![Vec::new(); n];
        for (rank, list) in of_rank.iter_mut().enumerate() {
            for _ in 0..rng.range(1, 4) {
                list.push(attempts.len());
                let id = rng.next();
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
            shuffle(&mut rng, &mut from);
            shuffle(&mut rng, &mut to);
            let pairs = rng.range(0, from.len().min(to.len()) as u64 + 1) as usize;
            for (&a, &b) in from.iter().zip(&to).take(pairs) {
                attempts[a].next = Some(b);
                attempts[b].prev = Some(a);
            }
        }
        let mut sim = Sim {
            n,
            variant,
            rng,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            payloads: Vec::new(),
            last: std::collections::BTreeMap::new(),
            attempts,
            trace: Vec::new(),
            tally: Tally::default(),
        };
        for a in 0..sim.attempts.len() {
            let linked = sim.attempts[a].next.is_some() && sim.attempts[a].prev.is_some();
            if linked && sim.rng.chance(80) {
                let start = sim.rng.range(0, 200_000);
                sim.at(start, Event::Start(a));
                if sim.rng.chance(30) {
                    let death = sim.rng.range(0, 500_000);
                    sim.at(death, Event::Die(a));
                }
            } else {
                let quit = sim.rng.range(0, 3_000_000);
                sim.at(quit, Event::Quit(a));
            }
        }
        sim
    }

    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.payloads.push(Some(event));
        self.events
            .push(Reverse((time, self.seq, self.payloads.len() - 1)));
    }

    /// Sends `msg` from `from` to `to` along their link, after the previous one.
    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        let delay = self.rng.range(MIN_DELAY, MAX_DELAY);
        let last = self.last.get(&(from, to)).copied().unwrap_or(0);
        let time = (self.now + delay).max(last + 1);
        self.last.insert((from, to), time);
        self.at(time, Event::Deliver { to, from, msg });
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
        self.trace
            .push(format!("{:>8} {} ends: {why}", self.now, self.name(a)));
        self.attempts[a].state = State::Ended(self.now);
        for peer in self.links(a) {
            self.send(a, peer, Msg::Closed);
        }
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(Reverse((time, _, i))) = self.events.pop() {
            self.now = time;
            let event = self.payloads[i].take().unwrap();
            match event {
                Event::Start(a) => self.start(a)?,
                Event::Die(a) => self.end(a, "died"),
                Event::Quit(a) => self.end(a, "its join gave up"),
                Event::Deadline(a) => {
                    if matches!(self.attempts[a].state, State::Running(_)) {
                        self.tally.limit += 1;
                        self.end(a, "its limit ran out");
                    }
                }
                Event::Noticed(a) => {
                    if matches!(self.attempts[a].state, State::Running(_)) {
                        self.tally.watched += 1;
                    }
                    self.end(a, "a watched link closed");
                }
                Event::Deliver { to, from, msg } => self.deliver(to, from, msg)?,
            }
        }
        self.check_watch()
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
        self.trace
            .push(format!("{:>8} {} starts", self.now, self.name(a)));
        self.attempts[a].state = State::Running(steps);
        let deadline = self.now + LIMIT;
        self.at(deadline, Event::Deadline(a));
        let next = self.attempts[a].next.unwrap();
        self.send(a, next, Msg::Frame(first));
        self.consume(a)
    }

    fn deliver(&mut self, to: usize, from: usize, msg: Msg) -> Result<(), String> {
        let at = &mut self.attempts[to];
        let from_prev = at.prev == Some(from);
        let mut notice = false;
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
                    notice = self.variant != Variant::Unwatched;
                }
            }
        }
        if notice {
            let seen = self.now + self.rng.range(0, POLL);
            self.at(seen, Event::Noticed(to));
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
                    self.trace.push(format!(
                        "{:>8} {} completes: {all:?}",
                        self.now,
                        self.name(a)
                    ));
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
                        "{} ended {} us after a watched link closed",
                        self.name(a),
                        ended - left
                    ));
                }
            }
        }
        Ok(())
    }
}

fn shuffle(rng: &mut Rng, v: &mut [usize]) {
    for i in (1..v.len()).rev() {
        let j = rng.range(0, i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// Runs seed `seed`, adding to `tally`; the violation, with the seed's trace.
fn run_seed(seed: u64, variant: Variant, tally: &mut Tally) -> Result<(), String> {
    let mut sim = Sim::new(seed, variant);
    let outcome = sim.run();
    if std::env::var("SEED").is_ok() {
        eprintln!("{}", sim.trace.join("\n"));
    }
    tally.completed += sim.tally.completed;
    tally.not_back += sim.tally.not_back;
    tally.watched += sim.tally.watched;
    tally.limit += sim.tally.limit;
    outcome.map_err(|e| format!("{e}\n{}", sim.trace.join("\n")))
}

/// The seeds to run: `SEED` alone, or `SIM_SEEDS` (default [`BUDGET`]) from 0.
fn seeds() -> Vec<u64> {
    if let Some(seed) = std::env::var("SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let n = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(BUDGET);
    (0..n).collect()
}

#[test]
fn ring_sim_the_exchange_completes_only_on_a_closed_ring_and_fails_fast() {
    let mut tally = Tally::default();
    let seeds = seeds();
    for &seed in &seeds {
        if let Err(e) = run_seed(seed, Variant::Fixed, &mut tally) {
            panic!("SEED={seed} cargo test -p switchyard --lib ring_sim_the_exchange\n{e}");
        }
    }
    eprintln!("{} seeds: {tally:?}", seeds.len());
    // The campaign covers each way an exchange ends.
    if seeds.len() as u64 >= BUDGET {
        assert!(
            [tally.completed, tally.not_back, tally.watched, tally.limit]
                .iter()
                .all(|&n| n > 0),
            "{tally:?}"
        );
    }
}

/// The first seed at which `variant` breaks a rule, if any.
fn finds(variant: Variant) -> Option<(u64, String)> {
    let mut tally = Tally::default();
    (0..BUDGET).find_map(|seed| run_seed(seed, variant, &mut tally).err().map(|e| (seed, e)))
}

#[test]
fn ring_sim_finds_a_ring_that_does_not_close_without_the_check() {
    let (seed, e) = finds(Variant::Unchecked).expect("no seed completes on a broken ring");
    eprintln!(
        "without the check, seed {seed}: {}",
        e.lines().next().unwrap_or("")
    );
    assert!(e.contains("completed"), "seed {seed}: {e}");
}

#[test]
fn ring_sim_finds_a_wait_past_a_closed_link_without_the_watch() {
    let (seed, e) = finds(Variant::Unwatched).expect("no seed waits past a closed link");
    eprintln!(
        "without the watch, seed {seed}: {}",
        e.lines().next().unwrap_or("")
    );
    assert!(
        e.contains("after a watched link closed"),
        "seed {seed}: {e}"
    );
}
