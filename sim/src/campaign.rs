//! Running seeds: the budget, the replay of one, and the report of a failing one.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// What happened in one seed's run, line by line, each line stamped with the
/// simulated time it happened at.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_sim::Trace;
/// let mut trace = Trace::default();
/// trace.note(Duration::from_millis(3), "rank 1 checks in");
/// assert_eq!(trace.to_string(), "   3.000ms rank 1 checks in");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Trace {
    lines: Vec<String>,
}

impl Trace {
    /// Adds `line`, which happened at `at` of simulated time.
    pub fn note(&mut self, at: Duration, line: impl fmt::Display) {
        self.lines.push(format!("{at:>10.3?} {line}"));
    }

    /// The lines so far.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("\n"))
    }
}

/// How one seed's run ended: `Err` names the invariant that broke; the trace says
/// what led there.
#[derive(Debug)]
pub struct Outcome {
    /// `Ok`, or the broken invariant.
    pub result: Result<(), String>,
    /// The run's events.
    pub trace: Trace,
}

impl Outcome {
    /// An outcome from a run's result and trace.
    pub fn new(result: Result<(), String>, trace: Trace) -> Outcome {
        Outcome { result, trace }
    }
}

/// A seed that broke an invariant.
///
/// Shown (as a failing test shows it): the broken invariant, then exactly one line,
/// the command that replays the seed, then the trace.
#[derive(Debug)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The invariant that broke, and how.
    pub broken: String,
    /// The command that replays this seed alone.
    pub replay: String,
    /// What led there.
    pub trace: Trace,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} broke an invariant: {}", self.seed, self.broken)?;
        writeln!(f, "{}", self.replay)?;
        write!(f, "trace of seed {}:\n{}", self.seed, self.trace)
    }
}

/// Which seeds a campaign runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seeds {
    /// `SEED=n`: that seed alone, its trace printed even when it passes.
    Replay(u64),
    /// The budget (or `SIM_SEEDS`'s count), from 0.
    Range(Range<u64>),
}

/// A campaign: one simulation run over many seeds by one test.
///
/// - A plain `cargo test` runs the budget, seeds `0..budget`: fixed, so CI runs the
///   same seeds every time and a failure there replays at once.
/// - `SIM_SEEDS=n` runs seeds `0..n` instead: a long campaign (a night's, in a release
///   build).
/// - `SEED=n` runs seed `n` alone and prints its trace even when it passes.
///
/// A failing seed is reported as a [`Failure`]: what broke, the one line that
/// replays it (`SEED=n cargo test -p PACKAGE --lib TEST -- --nocapture`), its trace.
///
/// # Examples
///
/// ```
/// use switchyard_sim::{Campaign, Outcome, Trace};
/// let campaign = Campaign::new("switchyard-ps", "sim_demo", 10);
/// // A broken system: seed 3 breaks.
/// let run = |seed: u64| {
///     Outcome::new(if seed == 3 { Err("bad".into()) } else { Ok(()) }, Trace::default())
/// };
/// # if std::env::var_os("SEED").is_none() && std::env::var_os("SIM_SEEDS").is_none() {
/// let failure = campaign.run(run).unwrap_err();
/// assert_eq!(failure.seed, 3);
/// assert_eq!(
///     failure.replay,
///     "SEED=3 cargo test -p switchyard-ps --lib sim_demo -- --nocapture"
/// );
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Campaign {
    package: String,
    test: String,
    budget: u64,
    /// The test target's option in the replay line: `--lib`, or `--test NAME`.
    target: String,
}

impl Campaign {
    /// The campaign the test `test` of package `package` runs, `budget` seeds in a
    /// plain `cargo test`.
    pub fn new(package: impl Into<String>, test: impl Into<String>, budget: u64) -> Campaign {
        Campaign {
            package: package.into(),
            test: test.into(),
            budget,
            target: "--lib".into(),
        }
    }

    /// The same campaign for a test of the integration test target `target` (its
    /// replay line says `--test TARGET` instead of `--lib`).
    ///
    /// ```
    /// use switchyard_sim::Campaign;
    /// let campaign = Campaign::new("switchyard", "sim_calls", 10).in_test("it");
    /// assert_eq!(
    ///     campaign.replay_line(4),
    ///     "SEED=4 cargo test -p switchyard --test it sim_calls -- --nocapture"
    /// );
    /// ```
    pub fn in_test(mut self, target: impl AsRef<str>) -> Campaign {
        self.target = format!("--test {}", target.as_ref());
        self
    }

    /// The seeds to run, from `SEED` and `SIM_SEEDS`.
    ///
    /// # Panics
    ///
    /// When either variable is set but is not a whole number: a typo should not
    /// quietly run the default budget instead.
    pub fn seeds(&self) -> Seeds {
        if let Some(seed) = number("SEED") {
            return Seeds::Replay(seed);
        }
        Seeds::Range(0..number("SIM_SEEDS").unwrap_or(self.budget))
    }

    /// The command that replays `seed` of this campaign alone.
    pub fn replay_line(&self, seed: u64) -> String {
        format!(
            "SEED={seed} cargo test -p {} {} {} -- --nocapture",
            self.package, self.target, self.test
        )
    }

    fn failure(&self, seed: u64, broken: String, trace: Trace) -> Failure {
        Failure {
            seed,
            broken,
            replay: self.replay_line(seed),
            trace,
        }
    }

    /// Runs every seed of [`seeds`](Campaign::seeds) through `run`, stopping at the
    /// first that fails. Returns how many seeds passed.
    pub fn run(&self, mut run: impl FnMut(u64) -> Outcome) -> Result<u64, Failure> {
        match self.seeds() {
            Seeds::Replay(seed) => {
                let Outcome { result, trace } = run(seed);
                match result {
                    Ok(()) => {
                        eprintln!("seed {seed} passed; its trace:\n{trace}");
                        Ok(1)
                    }
                    Err(broken) => Err(self.failure(seed, broken, trace)),
                }
            }
            Seeds::Range(seeds) => {
                let count = seeds.end - seeds.start;
                for seed in seeds {
                    let Outcome { result, trace } = run(seed);
                    if let Err(broken) = result {
                        return Err(self.failure(seed, broken, trace));
                    }
                }
                Ok(count)
            }
        }
    }

    /// [`run`](Campaign::run) in a test: panics with the failing seed's report.
    ///
    /// # Panics
    ///
    /// When a seed breaks an invariant.
    pub fn check(&self, run: impl FnMut(u64) -> Outcome) {
        if let Err(failure) = self.run(run) {
            panic!("{failure}");
        }
    }

    /// For a test that shows the simulation finds a known bug: the first seed of the
    /// budget (or of `SIM_SEEDS`) on which `run`, a deliberately broken system, fails,
    /// and its report; the seed number is printed. With `SEED`, that seed alone is
    /// replayed and reported (printed), and `None` returned.
    ///
    /// # Panics
    ///
    /// When no seed of the budget fails: the simulation cannot see that bug.
    pub fn first_failure(&self, mut run: impl FnMut(u64) -> Outcome) -> Option<Failure> {
        match self.seeds() {
            Seeds::Replay(_) => {
                if let Err(failure) = self.run(run) {
                    eprintln!("{failure}");
                }
                None
            }
            Seeds::Range(seeds) => {
                let count = seeds.end;
                for seed in seeds {
                    let Outcome { result, trace } = run(seed);
                    if let Err(broken) = result {
                        eprintln!("{}: the first failing seed is {seed}", self.test);
                        return Some(self.failure(seed, broken, trace));
                    }
                }
                panic!(
                    "{}: no seed of {count} breaks an invariant; the simulation does not see \
                     this bug",
                    self.test
                )
            }
        }
    }
}

/// The whole number in the environment variable `name`, if set.
fn number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={text:?} is not a whole number"),
    }
}
