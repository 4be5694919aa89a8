//! Real XGBoost against `switchyard tracker`: XGBoost 1.7.6 workers (classic rabit
//! protocol, `rabit-protocol.md`) and XGBoost 3.x workers (JSON protocol,
//! `xgboost-collective-protocol.md`) train the same small model once under XGBoost's own
//! tracker and once under ours. Every rank must hold the same model, and our job's model
//! must be byte-identical to the reference job's (the rank order, hence each rank's data
//! slice, has to match too). An unmodified 1.7 script also runs under `switchyard launch`.
//!
//! The Python side is `tests/xgboost/worker.py` and `tests/xgboost/ref_tracker.py`. The
//! interpreters come from `SWITCHYARD_XGB17_PYTHON` and `SWITCHYARD_XGB3_PYTHON`
//! (`scripts/xgboost-venvs.sh` makes them); when one is unset the test says so and
//! passes, unless `SWITCHYARD_REQUIRE_XGBOOST=1` (CI), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use support::{switchyard, ChildGuard};

/// How long one job (tracker start, n workers training, tracker exit) may take. A job
/// takes a few seconds; the margin is for a loaded 2-core CI machine.
const JOB_LIMIT: Duration = Duration::from_secs(240);
/// How much earlier than `JOB_LIMIT` `switchyard launch` is told to give up.
const LAUNCH_MARGIN: Duration = Duration::from_secs(30);
/// How long a tracker has to print its port.
const ANNOUNCE_LIMIT: Duration = Duration::from_secs(60);

/// An XGBoost generation under test, with the variable naming its interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Xgb {
    /// 1.7.6: classic rabit protocol; workers read `DMLC_*` from the environment.
    V17,
    /// 3.x: JSON protocol; `worker.py` passes the `DMLC_*` values as arguments.
    V3,
}

impl Xgb {
    fn var(self) -> &'static str {
        match self {
            Xgb::V17 => "SWITCHYARD_XGB17_PYTHON",
            Xgb::V3 => "SWITCHYARD_XGB3_PYTHON",
        }
    }

    /// The interpreter, or `None` (after saying why) when the variable is unset and
    /// XGBoost is not required.
    fn python(self) -> Option<PathBuf> {
        let required = std::env::var("SWITCHYARD_REQUIRE_XGBOOST").as_deref() == Ok("1");
        match std::env::var_os(self.var()) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                assert!(
                    path.exists(),
                    "{} names {}, which does not exist",
                    self.var(),
                    path.display()
                );
                Some(path)
            }
            _ if required => panic!(
                "SWITCHYARD_REQUIRE_XGBOOST=1 but {} is unset (scripts/xgboost-venvs.sh)",
                self.var()
            ),
            _ => {
                eprintln!(
                    "skipped: {} is unset (scripts/xgboost-venvs.sh makes the venvs)",
                    self.var()
                );
                None
            }
        }
    }
}

/// Whose tracker serves the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tracker {
    /// `tests/xgboost/ref_tracker.py`: XGBoost's `RabitTracker` of the same version.
    Reference,
    /// `switchyard tracker`.
    Switchyard,
}

/// One line of `worker.py`'s output.
#[derive(Debug, Deserialize)]
struct WorkerResult {
    rank: usize,
    task_id: String,
    world: usize,
    model_sha256: String,
    collectives_ok: bool,
}

/// The Python scripts' folder.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/xgboost")
}

/// A fresh, empty folder for one job's logs and results.
fn job_dir(label: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("xgboost_interop")
        .join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One job at a time: n training processes per job are already more than the CI
/// machine's cores, and a job's time limit should not depend on its neighbours.
fn one_job_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts `command` with stdin closed and stderr (and stdout, unless `piped_stdout`)
/// going to files `dir/name.out` and `dir/name.err`.
fn spawn_logged(mut command: Command, dir: &Path, name: &str, piped_stdout: bool) -> ChildGuard {
    let stdout = if piped_stdout {
        Stdio::piped()
    } else {
        Stdio::from(File::create(dir.join(format!("{name}.out"))).unwrap())
    };
    let child = command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
    ChildGuard(Some(child))
}

/// Reads the tracker's stdout until it has named its address and port (the
/// `DMLC_TRACKER_URI=` and `DMLC_TRACKER_PORT=` lines, in that order), within
/// `ANNOUNCE_LIMIT`. Every line is copied to `dir/tracker.out` by the reading thread.
fn announced(child: &mut Child, dir: &Path) -> (String, u16) {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let copy = dir.join("tracker.out");
    std::thread::spawn(move || {
        let mut log = File::create(copy).ok();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(log) = log.as_mut() {
                use std::io::Write;
                let _ = writeln!(log, "{line}");
            }
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + ANNOUNCE_LIMIT;
    let mut uri = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(host) = line.strip_prefix("DMLC_TRACKER_URI=") {
                    uri = Some(host.trim().to_string());
                } else if let Some(port) = line.strip_prefix("DMLC_TRACKER_PORT=") {
                    let uri = uri.expect("DMLC_TRACKER_URI before DMLC_TRACKER_PORT");
                    return (uri, port.trim().parse().expect("a port number"));
                }
            }
            Err(e) => panic!(
                "the tracker named no port within {ANNOUNCE_LIMIT:?} ({e}); stderr:\n{}",
                read(&dir.join("tracker.err"))
            ),
        }
    }
}

/// Waits for every child to exit successfully, all within `deadline`. Fails at the
/// first child that exits otherwise, or at the deadline; the guards then kill whatever
/// is left (so a crashed worker does not leave the test waiting for the deadline).
fn wait_all_succeed(children: &mut [(String, ChildGuard)], deadline: Instant, dir: &Path) {
    let mut done = vec![false; children.len()];
    while done.contains(&false) {
        for (done, (name, guard)) in done.iter_mut().zip(children.iter_mut()) {
            if *done {
                continue;
            }
            if let Some(status) = guard.0.as_mut().unwrap().try_wait().unwrap() {
                assert!(status.success(), "{name}: {status}\n{}", logs(dir));
                *done = true;
            }
        }
        if Instant::now() > deadline {
            let stuck: Vec<&str> = children
                .iter()
                .zip(&done)
                .filter(|(_, done)| !**done)
                .map(|((name, _), _)| name.as_str())
                .collect();
            panic!(
                "still running after {JOB_LIMIT:?}: {stuck:?}\n{}",
                logs(dir)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, guard) in children.iter_mut() {
        guard.0 = None;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// Every log of a job, for a failure message (the last 3000 bytes of each).
fn logs(dir: &Path) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("out" | "err")))
        .collect();
    names.sort();
    let mut text = String::new();
    for path in names {
        let body = read(&path);
        let tail = &body[body.len().saturating_sub(3000)..];
        let tail = tail.trim_start_matches(|c: char| !c.is_ascii());
        text += &format!("--- {}\n{tail}\n", path.display());
    }
    text
}

/// Reads `rank-0.json` .. `rank-(n-1).json` and checks one job's invariants: every
/// rank present with world n, rank i held by task `task(i)` (the order both trackers
/// give one host's batch), the collectives right, one model everywhere. Returns the
/// model's hash.
fn check_results(dir: &Path, n: usize, task: impl Fn(usize) -> String) -> String {
    let mut hashes = Vec::new();
    for rank in 0..n {
        let path = dir.join(format!("rank-{rank}.json"));
        let text = read(&path);
        let result: WorkerResult = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{}: {e}: {text:?}\n{}", path.display(), logs(dir)));
        assert_eq!(result.rank, rank, "{}", path.display());
        assert_eq!(result.world, n, "rank {rank}'s world\n{}", logs(dir));
        assert_eq!(result.task_id, task(rank), "rank {rank}'s task");
        assert!(
            result.collectives_ok,
            "rank {rank}'s collectives\n{}",
            logs(dir)
        );
        hashes.push(result.model_sha256);
    }
    assert!(
        hashes.iter().all(|h| *h == hashes[0]),
        "ranks hold different models: {hashes:?}"
    );
    hashes.swap_remove(0)
}

/// Runs one job of `n` workers of `xgb` under `tracker` and returns the model hash.
///
/// Workers get task ids `w0` .. `w(n-1)` and start in reverse order, so that arrival
/// order differs from rank order: the tracker has to sort the batch (by host, then by
/// task id) for rank i to be worker `wi`.
fn run_job(xgb: Xgb, python: &Path, tracker: Tracker, n: usize) -> String {
    let dir = job_dir(&format!("{xgb:?}-{tracker:?}-n{n}"));
    let deadline = Instant::now() + JOB_LIMIT;
    let mut command = match tracker {
        Tracker::Reference => {
            let mut c = Command::new(python);
            c.arg(scripts().join("ref_tracker.py"))
                .args(["-n", &n.to_string(), "--host", "127.0.0.1"])
                .args(["--timeout", &JOB_LIMIT.as_secs().to_string()]);
            if xgb == Xgb::V17 {
                // 1.7's "host" order is by host only, ties in arrival order (racy here);
                // its "task" order is the (host, task) order ours and 3.x's give one host.
                c.args(["--sort-by", "task"]);
            }
            c
        }
        Tracker::Switchyard => {
            let mut c = switchyard();
            c.args(["tracker", "-n", &n.to_string(), "--host", "127.0.0.1"]);
            c
        }
    };
    command.env("RUST_LOG", "info");
    let mut tracker_guard = spawn_logged(command, &dir, "tracker", true);
    let (uri, port) = announced(tracker_guard.0.as_mut().unwrap(), &dir);
    assert_eq!(uri, "127.0.0.1", "the address the tracker was told to use");

    let mut children: Vec<(String, ChildGuard)> = Vec::new();
    for i in (0..n).rev() {
        let mut worker = Command::new(python);
        worker
            .arg(scripts().join("worker.py"))
            .arg("--out-dir")
            .arg(&dir)
            .env("DMLC_TRACKER_URI", &uri)
            .env("DMLC_TRACKER_PORT", port.to_string())
            .env("DMLC_TASK_ID", format!("w{i}"));
        let name = format!("w{i}");
        children.push((name.clone(), spawn_logged(worker, &dir, &name, false)));
    }
    children.push(("tracker".into(), tracker_guard));
    wait_all_succeed(&mut children, deadline, &dir);
    check_results(&dir, n, |rank| format!("w{rank}"))
}

/// The reference job's model hash for (version, n), computed once per test binary.
fn reference_hash(xgb: Xgb, python: &Path, n: usize) -> String {
    static CACHE: OnceLock<Mutex<HashMap<(Xgb, usize), String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hash) = cache.lock().unwrap().get(&(xgb, n)) {
        return hash.clone();
    }
    let hash = run_job(xgb, python, Tracker::Reference, n);
    cache.lock().unwrap().insert((xgb, n), hash.clone());
    hash
}

/// The reference job, then ours: both consistent, and the same model.
fn same_model_under_both_trackers(xgb: Xgb, n: usize) {
    let Some(python) = xgb.python() else { return };
    let _one = one_job_at_a_time();
    let theirs = reference_hash(xgb, &python, n);
    let ours = run_job(xgb, &python, Tracker::Switchyard, n);
    assert_eq!(
        ours, theirs,
        "{xgb:?}, n = {n}: the model differs from the reference job's"
    );
}

/// The harness and the venv alone: XGBoost's own tracker gives every rank one model
/// (a failure here is not about switchyard).
fn reference_jobs_are_consistent(xgb: Xgb) {
    let Some(python) = xgb.python() else { return };
    let _one = one_job_at_a_time();
    for n in [2, 4] {
        reference_hash(xgb, &python, n);
    }
}

#[test]
fn xgboost17_reference_jobs_are_consistent() {
    reference_jobs_are_consistent(Xgb::V17);
}

#[test]
fn xgboost3_reference_jobs_are_consistent() {
    reference_jobs_are_consistent(Xgb::V3);
}

#[test]
fn xgboost17_two_workers_same_model_as_reference() {
    same_model_under_both_trackers(Xgb::V17, 2);
}

#[test]
fn xgboost17_four_workers_same_model_as_reference() {
    same_model_under_both_trackers(Xgb::V17, 4);
}

#[test]
fn xgboost3_two_workers_same_model_as_reference() {
    same_model_under_both_trackers(Xgb::V3, 2);
}

#[test]
fn xgboost3_four_workers_same_model_as_reference() {
    same_model_under_both_trackers(Xgb::V3, 4);
}

/// `worker.py` under `switchyard launch`, whose embedded tracker and task ids (`0`, `1`)
/// replace the reference's: the same model as the reference job of two workers. For
/// 1.7 the script is an unmodified XGBoost program (it reads `DMLC_*` from the
/// environment); for 3.x it copies them into its `CommunicatorContext` arguments.
fn same_model_under_switchyard_launch(xgb: Xgb) {
    let Some(python) = xgb.python() else { return };
    let _one = one_job_at_a_time();
    let theirs = reference_hash(xgb, &python, 2);
    let dir = job_dir(&format!("{xgb:?}-launch-n2"));
    let mut launch = switchyard();
    // The launcher's own limit comes first: it stops its workers, which the guard's
    // SIGKILL of the launcher would leave running.
    launch
        .args(["launch", "-n", "2", "--timeout"])
        .arg((JOB_LIMIT - LAUNCH_MARGIN).as_secs().to_string())
        .arg("--")
        .arg(&python)
        .arg(scripts().join("worker.py"))
        .arg("--out-dir")
        .arg(&dir);
    let guard = spawn_logged(launch, &dir, "launch", false);
    let mut children = vec![("launch".to_string(), guard)];
    wait_all_succeed(&mut children, Instant::now() + JOB_LIMIT, &dir);
    let ours = check_results(&dir, 2, |rank| rank.to_string());
    assert_eq!(
        ours, theirs,
        "{xgb:?}: the model differs from the reference job's"
    );
}

#[test]
fn xgboost17_script_under_switchyard_launch_same_model_as_reference() {
    same_model_under_switchyard_launch(Xgb::V17);
}

#[test]
fn xgboost3_script_under_switchyard_launch_same_model_as_reference() {
    same_model_under_switchyard_launch(Xgb::V3);
}
