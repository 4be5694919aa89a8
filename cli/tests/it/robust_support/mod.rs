//! Running `examples/robust_worker` (and `examples/kmeans`) under `switchyard launch`
//! for the robust-mode tests: a launcher whose output is read as it comes (so that a
//! chatty job never blocks on a full pipe), the worker pids it announces (for the
//! SIGKILL soak), every wait bounded, and nothing left running when a test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use crate::support::{example, switchyard};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// A lock that a failed test (a panic while holding it) does not poison for the rest.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One job at a time: each starts up to ten processes on a small machine, and jobs
/// side by side would only make each other's timings (and the soak's aim) worse.
pub(crate) fn one_job_at_a_time() -> MutexGuard<'static, ()> {
    static JOBS: Mutex<()> = Mutex::new(());
    lock(&JOBS)
}

/// One rank's `RESULT` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// FNV-1a of its final model (global, then local).
    pub(crate) model: String,
    /// Calls of the lazy allreduce's `prepare` in its last process.
    pub(crate) prepare_calls: u64,
    /// Its last process's `DMLC_NUM_ATTEMPT`.
    pub(crate) attempt: u64,
    /// The version its last process's `load_checkpoint` returned (0: none).
    pub(crate) loaded: u64,
}

/// A finished launcher.
#[derive(Debug)]
pub(crate) struct Job {
    /// The launcher's status.
    pub(crate) status: ExitStatus,
    /// Its stdout: the ranks' lines, prefixed `[R] `.
    pub(crate) stdout: String,
    /// Its stderr: the ranks' stderr lines and its own progress lines.
    pub(crate) stderr: String,
    /// From start to exit.
    pub(crate) took: Duration,
    /// Every worker pid the launcher announced.
    pub(crate) worker_pids: Vec<u32>,
    /// The workers' program name, to tell them from processes that reused a pid.
    program: String,
}

impl Job {
    /// The `RESULT` line of every rank that printed one, by rank. A rank printing two
    /// (a process that printed and then died in `finalize`, and its restart) keeps
    /// the last.
    pub(crate) fn results(&self) -> BTreeMap<usize, Outcome> {
        let mut out = BTreeMap::new();
        for line in self.stdout.lines() {
            let Some(rest) = line.split("RESULT ").nth(1) else {
                continue;
            };
            let field = |name: &str| -> String {
                rest.split_whitespace()
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                    .to_string()
            };
            let number = |name: &str| -> u64 { field(name).parse().unwrap() };
            out.insert(
                number("rank") as usize,
                Outcome {
                    model: field("model"),
                    prepare_calls: number("prepare_calls"),
                    attempt: number("attempt"),
                    loaded: number("loaded"),
                },
            );
        }
        out
    }

    /// How many processes a mock kill ended (each prints one line before it exits).
    pub(crate) fn mock_exits(&self) -> usize {
        self.stderr.matches("switchyard mock: rank ").count()
    }

    /// The job's workers still running after it ended (there must be none).
    pub(crate) fn orphans(&self) -> Vec<u32> {
        self.worker_pids
            .iter()
            .copied()
            .filter(|&pid| is_process_of(pid, &self.program))
            .collect()
    }

    /// Both streams, for failure messages.
    pub(crate) fn dump(&self) -> String {
        format!(
            "status {} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.took, self.stdout, self.stderr
        )
    }
}

/// A running `switchyard launch`; stopped (and its workers with it) when dropped.
pub(crate) struct Launch {
    child: Option<Child>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// The current process of each rank: (pid, attempt), from the launcher's
    /// `rank R running (pid P, DMLC_NUM_ATTEMPT=A)` lines.
    pids: Arc<Mutex<BTreeMap<usize, (u32, u64)>>>,
    /// Every worker pid ever announced, to make sure none outlives a failed test.
    all_pids: Arc<Mutex<Vec<u32>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    started: Instant,
    /// The program's file name, to recognise its processes in /proc.
    program: String,
}

/// Variables every job gets. A collective that hangs would otherwise wait 300 s;
/// this turns an engine hang into an error well inside the tests' bounds (every call
/// of these jobs takes milliseconds, so 10 s is no false alarm on a busy machine).
const ENV: [(&str, &str); 1] = [("SWITCHYARD_COLLECTIVE_TIMEOUT", "10")];

impl Launch {
    /// Starts `switchyard launch -n N --max-restarts K --timeout T -- <example> args`.
    pub(crate) fn start(
        name: &str,
        n: usize,
        max_restarts: u32,
        args: &[String],
        timeout: Duration,
    ) -> Launch {
        let program = example(name);
        let mut cmd = switchyard();
        cmd.args(["launch", "-n", &n.to_string()])
            .args(["--max-restarts", &max_restarts.to_string()])
            // The launcher's own limit, so that it stops its workers itself.
            .args(["--timeout", &timeout.as_secs().max(1).to_string()])
            .args(["--rendezvous-timeout", "30"])
            .arg("--")
            .arg(&program)
            .args(args)
            .envs(ENV)
            .env_remove("SWITCHYARD_MOCK")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn switchyard launch");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let pids = Arc::new(Mutex::new(BTreeMap::new()));
        let all_pids = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        {
            let out = child.stdout.take().unwrap();
            let sink = stdout.clone();
            readers.push(std::thread::spawn(move || collect(out, &sink, |_| {})));
        }
        {
            let err = child.stderr.take().unwrap();
            let sink = stderr.clone();
            let (pids, all) = (pids.clone(), all_pids.clone());
            readers.push(std::thread::spawn(move || {
                collect(err, &sink, |line| {
                    if let Some((rank, pid, attempt)) = running_line(line) {
                        lock(&pids).insert(rank, (pid, attempt));
                        lock(&all).push(pid);
                    }
                })
            }));
        }
        Launch {
            child: Some(child),
            stdout,
            stderr,
            pids,
            all_pids,
            readers,
            started: Instant::now(),
            program: program.file_name().unwrap().to_string_lossy().into_owned(),
        }
    }

    /// The current (pid, attempt) of each rank the launcher has started.
    pub(crate) fn pids(&self) -> BTreeMap<usize, (u32, u64)> {
        lock(&self.pids).clone()
    }

    /// Whether `pid` is a live (not zombie) process of this job's program: a pid
    /// the system reused since is not one.
    pub(crate) fn is_worker(&self, pid: u32) -> bool {
        is_process_of(pid, &self.program)
    }

    /// The launcher's stderr so far.
    pub(crate) fn stderr_now(&self) -> String {
        lock(&self.stderr).clone()
    }

    /// Whether the launcher has exited.
    pub(crate) fn finished(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().unwrap().is_some())
    }

    /// Waits for the launcher to exit, at most `limit` from its start; panics (after
    /// stopping everything) past it.
    pub(crate) fn wait(mut self, limit: Duration) -> Job {
        let child = self.child.as_mut().unwrap();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if self.started.elapsed() > limit {
                let partial = format!(
                    "--- stdout\n{}\n--- stderr\n{}",
                    lock(&self.stdout),
                    lock(&self.stderr)
                );
                drop(self);
                panic!("the job still ran after {limit:?}\n{partial}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = self.started.elapsed();
        self.child = None;
        // The pipes close when the launcher and every worker are gone.
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Job {
            status,
            stdout: lock(&self.stdout).clone(),
            stderr: lock(&self.stderr).clone(),
            took,
            worker_pids: lock(&self.all_pids).clone(),
            program: self.program.clone(),
        }
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if child.try_wait().ok().flatten().is_none() {
                // SIGTERM first: the launcher then stops its workers (their own
                // process groups, which a SIGKILL of the launcher would orphan).
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = Instant::now() + Duration::from_secs(10);
                while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Whatever the launcher could not stop.
        for pid in lock(&self.all_pids).iter() {
            if self.is_worker(*pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// Copies `from` line by line into `sink`, calling `each` on every line.
fn collect(from: impl Read, sink: &Mutex<String>, mut each: impl FnMut(&str)) {
    for line in BufReader::new(from).lines().map_while(Result::ok) {
        each(&line);
        let mut s = lock(sink);
        s.push_str(&line);
        s.push('\n');
    }
}

/// `switchyard: rank 3 running (pid 1234, DMLC_NUM_ATTEMPT=0)` → (3, 1234, 0).
fn running_line(line: &str) -> Option<(usize, u32, u64)> {
    let rest = line.strip_prefix("switchyard: rank ")?;
    let (rank, rest) = rest.split_once(" running (pid ")?;
    let (pid, rest) = rest.split_once(", DMLC_NUM_ATTEMPT=")?;
    let attempt = rest.strip_suffix(')')?;
    Some((rank.parse().ok()?, pid.parse().ok()?, attempt.parse().ok()?))
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z')),
    }
}

/// Whether `pid` is a live process running `program` (`/proc/PID/comm` holds its
/// first 15 bytes).
fn is_process_of(pid: u32, program: &str) -> bool {
    alive(pid)
        && std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| !c.trim().is_empty() && program.starts_with(c.trim()))
}

/// Runs a job to its end.
pub(crate) fn run_job(
    name: &str,
    n: usize,
    max_restarts: u32,
    args: &[String],
    limit: Duration,
) -> Job {
    Launch::start(name, n, max_restarts, args, limit).wait(limit + Duration::from_secs(15))
}

/// The failure-free run's outcome for `n` ranks and worker arguments `args` (no
/// mock kills), run once per test binary and shared by the tests that compare with
/// it.
pub(crate) fn baseline(n: usize, args: &[String]) -> BTreeMap<usize, Outcome> {
    type Cache = Mutex<BTreeMap<(usize, Vec<String>), BTreeMap<usize, Outcome>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (n, args.to_vec());
    if let Some(hit) = lock(cache).get(&key) {
        return hit.clone();
    }
    let job = run_job("robust_worker", n, 0, args, Duration::from_secs(60));
    assert!(
        job.status.success(),
        "the failure-free run failed\n{}",
        job.dump()
    );
    let results = job.results();
    assert_eq!(results.len(), n, "a RESULT line per rank\n{}", job.dump());
    lock(cache).insert(key, results.clone());
    results
}

/// `["--iters", "5", ...]` from `"--iters 5 ..."`.
pub(crate) fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}
