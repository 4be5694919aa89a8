//! The world the ranks live in: the planned deaths, a new world of the in-memory link
//! for each generation (the stand-in for the tracker's `recover`), and each process's
//! link to it.

use super::RUN_LIMIT;
use super::program::{Program, Reference, mix};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;
use switchyard::collective::CollectiveError;
use switchyard::collective::testing::{Link, LinkError, MemoryLink, MemorySchedule, Tag};

/// When a planned death strikes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum When {
    /// At a point of the program: before call `slot` of iteration `iter`, before its
    /// checkpoint (`slot` = calls) or right after it (`slot` = calls + 1).
    Point { iter: u64, slot: usize },
    /// Right after the rank's `k`th send or receive (from 1, counted over all its
    /// processes).
    Op { k: u64 },
    /// Right after the rank's `k`th send or receive once the first death struck.
    AfterFirst { k: u64 },
}

/// A planned death, and where it stands.
#[derive(Clone, Debug)]
pub(crate) struct Death {
    pub(crate) rank: usize,
    pub(crate) when: When,
    /// The rank's operations when the first death struck ([`When::AfterFirst`]).
    pub(crate) armed_at: Option<u64>,
    /// The link operation and world it struck in.
    pub(crate) struck: Option<(u64, u64)>,
}

/// One world of the in-memory link for each generation, formed once every rank has
/// asked.
struct Worlds {
    /// Worlds formed so far (the first is generation 1).
    generation: u64,
    /// The ranks whose process asked for the next world.
    asked: Vec<bool>,
    /// Each rank's link of the newest world, until it takes it.
    links: Vec<Option<MemoryLink>>,
    /// Ranks whose last process ended (finished the program, or broke an
    /// invariant): no world can form again.
    finished: Vec<bool>,
    /// The run is over (it took too long): every wait ends.
    closed: bool,
}

/// Everything the ranks of one run share.
pub(crate) struct Run {
    pub(crate) program: Program,
    pub(crate) reference: Arc<Reference>,
    worlds: Mutex<Worlds>,
    /// Signalled when a world forms or a rank ends.
    formed: Condvar,
    /// The counts of link operations.
    pub(crate) clock: Mutex<Clocks>,
    /// The planned deaths, as they strike.
    pub(crate) deaths: Mutex<Vec<Death>>,
    /// The trace's lines, each with its rank's clock and its rank
    /// (`usize::MAX`: the world's).
    pub(crate) events: Mutex<Vec<(u64, usize, String)>>,
    /// Each broken invariant, stamped with its rank's clock.
    pub(crate) broken: Mutex<Vec<(u64, usize, String)>>,
}

/// Sends and receives counted: the run's clock. Only one rank of a world runs at a
/// time and a world forms only once every rank has left the one before, so the counts
/// are the same on every replay of a seed, and stamp the trace's lines.
pub(crate) struct Clocks {
    /// Every rank's operations.
    ops: u64,
    /// Each rank's operations, over all its processes.
    pub(crate) per_rank: Vec<u64>,
    /// Each rank's clock: [`Clocks::ops`] at its last operation.
    stamp: Vec<u64>,
    /// Each rank's operations when its last process began `finalize`.
    pub(crate) before_finish: Vec<u64>,
}

/// One process of a rank.
pub(crate) struct Life {
    pub(crate) rank: usize,
    /// Its start number (`RobustOptions::attempt`).
    pub(crate) attempt: u64,
    /// Struck by a planned death.
    pub(crate) dead: AtomicBool,
    /// In `finalize`: no death strikes any more (a death after some ranks have left
    /// the job cannot be recovered, by rabit either, and is not simulated).
    pub(crate) finishing: AtomicBool,
}

impl Life {
    pub(crate) fn dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

impl Run {
    pub(crate) fn new(
        program: &Program,
        reference: Arc<Reference>,
        deaths: Vec<Death>,
    ) -> Arc<Run> {
        let n = program.size;
        Arc::new(Run {
            program: program.clone(),
            reference,
            worlds: Mutex::new(Worlds {
                generation: 0,
                asked: vec![false; n],
                links: (0..n).map(|_| None).collect(),
                finished: vec![false; n],
                closed: false,
            }),
            formed: Condvar::new(),
            clock: Mutex::new(Clocks {
                ops: 0,
                per_rank: vec![0; n],
                stamp: vec![0; n],
                before_finish: vec![0; n],
            }),
            deaths: Mutex::new(deaths),
            events: Mutex::new(Vec::new()),
            broken: Mutex::new(Vec::new()),
        })
    }

    /// `rank`'s clock: the run's operation count at its last operation.
    pub(crate) fn stamp(&self, rank: usize) -> u64 {
        self.clock.lock().unwrap().stamp[rank]
    }

    /// Adds a line to the trace, at `rank`'s clock.
    pub(crate) fn note(&self, rank: usize, line: String) {
        let at = self.stamp(rank);
        self.events.lock().unwrap().push((at, rank, line));
    }

    /// Worlds formed so far.
    pub(crate) fn generation(&self) -> u64 {
        self.worlds.lock().unwrap().generation
    }

    /// Counts a send or receive of `life` that just ended; true when the process dies
    /// here.
    pub(crate) fn operated(&self, life: &Life) -> bool {
        let rank = life.rank;
        let (mine, at) = {
            let mut clock = self.clock.lock().unwrap();
            clock.ops += 1;
            clock.per_rank[rank] += 1;
            let at = clock.ops;
            clock.stamp[rank] = at;
            (clock.per_rank[rank], at)
        };
        if life.finishing.load(Ordering::SeqCst) {
            return false;
        }
        let due = |d: &Death| {
            d.rank == rank
                && d.struck.is_none()
                && match d.when {
                    When::Op { k } => mine == k,
                    When::AfterFirst { k } => d.armed_at.is_some_and(|a| mine == a + k),
                    When::Point { .. } => false,
                }
        };
        self.strike(life, at, due)
    }

    /// True when `life` dies at program point (`iter`, `slot`).
    pub(crate) fn at_point(&self, life: &Life, iter: u64, slot: usize) -> bool {
        let at = self.stamp(life.rank);
        let due = |d: &Death| {
            d.rank == life.rank
                && d.struck.is_none()
                && matches!(d.when, When::Point { iter: i, slot: s } if i == iter && s == slot)
        };
        self.strike(life, at, due)
    }

    /// Strikes the first death `due` names, arming the second after the first.
    fn strike(&self, life: &Life, at: u64, due: impl Fn(&Death) -> bool) -> bool {
        let generation = self.generation();
        let mut deaths = self.deaths.lock().unwrap();
        let Some(i) = deaths.iter().position(due) else {
            return false;
        };
        deaths[i].struck = Some((at, generation));
        let when = deaths[i].when;
        if i == 0 {
            if let Some(second) = deaths.get_mut(1) {
                if matches!(second.when, When::AfterFirst { .. }) {
                    second.armed_at = Some(self.clock.lock().unwrap().per_rank[second.rank]);
                }
            }
        }
        drop(deaths);
        life.dead.store(true, Ordering::SeqCst);
        self.note(
            life.rank,
            format!(
                "rank {} (process {}) dies: {when:?}, in world {generation}",
                life.rank, life.attempt
            ),
        );
        true
    }

    /// `rank`'s link in the next world, once every rank's process has asked.
    fn join(&self, rank: usize) -> Result<MemoryLink, String> {
        let until = Instant::now() + RUN_LIMIT;
        let mut worlds = self.worlds.lock().unwrap();
        worlds.asked[rank] = true;
        if worlds.asked.iter().all(|&a| a) {
            worlds.generation += 1;
            let generation = worlds.generation;
            let schedule = mix(self.program.schedule ^ generation);
            let links = MemoryLink::world_with(self.program.size, MemorySchedule::Seeded(schedule));
            worlds.links = links.into_iter().map(Some).collect();
            worlds.asked.iter_mut().for_each(|a| *a = false);
            self.formed.notify_all();
            let at = {
                let clock = self.clock.lock().unwrap();
                clock.stamp.iter().copied().max().unwrap_or(0)
            };
            self.events
                .lock()
                .unwrap()
                .push((at, usize::MAX, format!("world {generation} forms")));
        }
        loop {
            if let Some(link) = worlds.links[rank].take() {
                return Ok(link);
            }
            if worlds.closed {
                return Err("the run is over".into());
            }
            if let Some(gone) = worlds.finished.iter().position(|&f| f) {
                worlds.asked[rank] = false;
                return Err(format!(
                    "rank {rank} asks for a new world, but rank {gone} has ended"
                ));
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("rank {rank}: no new world within {RUN_LIMIT:?}"));
            }
            worlds = self.formed.wait_timeout(worlds, left).unwrap().0;
        }
    }

    /// Whether some rank's last process has ended.
    pub(crate) fn someone_ended(&self) -> bool {
        self.worlds.lock().unwrap().finished.iter().any(|&f| f)
    }

    /// Marks `rank`'s last process as ended: a rank that asks for a new world from
    /// now on is told the job is over.
    pub(crate) fn finished(&self, rank: usize) {
        self.worlds.lock().unwrap().finished[rank] = true;
        self.formed.notify_all();
    }

    /// Ends every wait for a new world: the run took too long.
    pub(crate) fn close(&self) {
        self.worlds.lock().unwrap().closed = true;
        self.formed.notify_all();
    }
}

/// A rank's link to one world, as its process holds it: dies when the plan says so,
/// and leaves the world at once after its abort notice (a failed rank never uses a
/// broken mesh again: robust mode drops it and forms the next).
struct Mortal {
    inner: Option<MemoryLink>,
    rank: usize,
    size: usize,
    life: Arc<Life>,
    run: Arc<Run>,
}

impl Mortal {
    fn new(link: MemoryLink, life: &Arc<Life>, run: &Arc<Run>) -> Mortal {
        Mortal {
            rank: link.rank(),
            size: link.world_size(),
            inner: Some(link),
            life: Arc::clone(life),
            run: Arc::clone(run),
        }
    }

    fn gone(&self) -> LinkError {
        LinkError::Transport {
            rank: self.rank,
            reason: "this rank's process is dead".into(),
        }
    }

    /// The link to use, or `None` once the process is dead (its link left the world).
    fn live(&mut self) -> Option<&mut MemoryLink> {
        if self.life.dead() {
            self.inner = None;
        }
        self.inner.as_mut()
    }

    /// The outcome of an operation, unless the process dies right after it.
    fn after<T>(&mut self, outcome: Result<T, LinkError>) -> Result<T, LinkError> {
        if self.run.operated(&self.life) {
            self.inner = None;
            return Err(self.gone());
        }
        outcome
    }
}

impl Link for Mortal {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn send(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
        deadline: Instant,
    ) -> Result<(), LinkError> {
        let Some(link) = self.live() else {
            return Err(self.gone());
        };
        let outcome = link.send(to, tag, frames, deadline);
        self.after(outcome)
    }

    fn recv(&mut self, from: usize, tag: Tag, deadline: Instant) -> Result<Vec<Bytes>, LinkError> {
        let Some(link) = self.live() else {
            return Err(self.gone());
        };
        let outcome = link.recv(from, tag, deadline);
        self.after(outcome)
    }

    fn abort(&mut self, call: u64, reason: &str) {
        if let Some(link) = self.live() {
            link.abort(call, reason);
        }
        self.inner = None;
    }

    fn expect(&mut self, call: u64, stamp: &[u8]) {
        if let Some(link) = self.live() {
            link.expect(call, stamp);
        }
    }
}

/// `rank`'s link in `run`'s next world, as a process of `life` holds it.
pub(crate) fn next_link(
    run: &Arc<Run>,
    life: &Arc<Life>,
) -> Result<Box<dyn Link>, CollectiveError> {
    if life.dead() {
        return Err(CollectiveError::Setup {
            stage: "forming a new mesh".into(),
            source: "this rank's process is dead".into(),
        });
    }
    run.note(
        life.rank,
        format!(
            "rank {} (process {}) asks for a new world",
            life.rank, life.attempt
        ),
    );
    match run.join(life.rank) {
        Ok(link) => Ok(Box::new(Mortal::new(link, life, run))),
        Err(e) => Err(CollectiveError::Setup {
            stage: "forming a new mesh".into(),
            source: e.into(),
        }),
    }
}
