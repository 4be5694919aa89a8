//! The processes of one interop job: where the scripts are, a log folder per job,
//! children whose output goes to files, the tracker's announced address, bounded waits,
//! and the checks every job's results must pass.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::support::ChildGuard;

/// How long one job (tracker start, n workers training, tracker exit) may take. A job
/// takes a few seconds; the margin is for a loaded 2-core CI machine.
pub(crate) const JOB_LIMIT: Duration = Duration::from_secs(240);
/// How much earlier than `JOB_LIMIT` `switchyard launch` is told to give up.
pub(crate) const LAUNCH_MARGIN: Duration = Duration::from_secs(30);
/// How long a tracker has to print its port.
pub(crate) const ANNOUNCE_LIMIT: Duration = Duration::from_secs(60);

/// An XGBoost generation under test, with the variable naming its interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Xgb {
    /// 1.7.6: classic rabit protocol; workers read `DMLC_*` from the environment.
    V17,
    /// 3.x: JSON protocol; `worker.py` passes the `DMLC_*` values as arguments.
    V3,
}

impl Xgb {
    pub(crate) fn var(self) -> &'static str {
        match self {
            Xgb::V17 => "SWITCHYARD_XGB17_PYTHON",
            Xgb::V3 => "SWITCHYARD_XGB3_PYTHON",
        }
    }

    /// The interpreter, or `None` (after saying why) when the variable is unset and
    /// XGBoost is not required.
    pub(crate) fn python(self) -> Option<PathBuf> {
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

/// One line of `worker.py`'s output.
#[derive(Debug, Deserialize)]
pub(crate) struct WorkerResult {
    pub(crate) rank: usize,
    pub(crate) task_id: String,
    pub(crate) world: usize,
    pub(crate) model_sha256: String,
    pub(crate) collectives_ok: bool,
}

/// The Python scripts' folder.
pub(crate) fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/xgboost_interop")
}

/// A fresh, empty folder for one job's logs and results.
pub(crate) fn job_dir(label: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("xgboost_interop")
        .join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One job at a time: n training processes per job are already more than the CI
/// machine's cores, and a job's time limit should not depend on its neighbours.
pub(crate) fn one_job_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Starts `command` with stdin closed and stderr (and stdout, unless `piped_stdout`)
/// going to files `dir/name.out` and `dir/name.err`.
pub(crate) fn spawn_logged(
    mut command: Command,
    dir: &Path,
    name: &str,
    piped_stdout: bool,
) -> ChildGuard {
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
/// `ANNOUNCE_LIMIT`. Every line is copied to `dir/name.out` by the reading thread.
pub(crate) fn announced(child: &mut Child, dir: &Path, name: &str) -> (String, u16) {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let copy = dir.join(format!("{name}.out"));
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
                read(&dir.join(format!("{name}.err")))
            ),
        }
    }
}

/// Waits for every child to exit successfully, all within `deadline`. Fails at the
/// first child that exits otherwise, or at the deadline; the guards then kill whatever
/// is left (so a crashed worker does not leave the test waiting for the deadline).
pub(crate) fn wait_all_succeed(
    children: &mut [(String, ChildGuard)],
    deadline: Instant,
    dir: &Path,
) {
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

/// A file's text, or a note saying why it could not be read.
pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// Every log of a job, for a failure message (the last 3000 bytes of each).
pub(crate) fn logs(dir: &Path) -> String {
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
pub(crate) fn check_results(dir: &Path, n: usize, task: impl Fn(usize) -> String) -> String {
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

/// Waits until every file in `paths` exists, within `deadline`, failing at once if a
/// child exits before (it cannot write its file any more, or ended too early).
pub(crate) fn wait_for_files(
    paths: &[PathBuf],
    children: &mut [(String, ChildGuard)],
    deadline: Instant,
    dir: &Path,
) {
    while !paths.iter().all(|p| p.exists()) {
        for (name, guard) in children.iter_mut() {
            if let Some(status) = guard.0.as_mut().unwrap().try_wait().unwrap() {
                panic!("{name} ended early: {status}\n{}", logs(dir));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no {paths:?} after {JOB_LIMIT:?}\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for every child to exit, whatever its status, all within `deadline`; returns
/// the statuses in order.
pub(crate) fn wait_all_exit(
    children: &mut [(String, ChildGuard)],
    deadline: Instant,
    dir: &Path,
) -> Vec<ExitStatus> {
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
    while statuses.iter().any(Option::is_none) {
        for (slot, (_, guard)) in statuses.iter_mut().zip(children.iter_mut()) {
            if slot.is_none() {
                *slot = guard.0.as_mut().unwrap().try_wait().unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "still running after {JOB_LIMIT:?}\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, guard) in children.iter_mut() {
        guard.0 = None;
    }
    statuses.into_iter().map(Option::unwrap).collect()
}
