//! `switchyard launch` supervision: the DMLC environment, restarts with
//! `DMLC_NUM_ATTEMPT`, progress and summary lines, signals (exit 130 within 5 s) and no
//! orphans, and an unmodified XGBoost 1.7 script under the embedded tracker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{ChildGuard, run_bounded, switchyard};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh folder under the system temp folder, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn workers_and_servers_get_the_dmlc_environment() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "2", "--servers", "1", "--", "sh", "-c"])
        .arg(
            "echo role=$DMLC_ROLE task=$DMLC_TASK_ID workers=$DMLC_NUM_WORKER \
         servers=$DMLC_NUM_SERVER attempt=$DMLC_NUM_ATTEMPT cluster=$DMLC_JOB_CLUSTER \
         tracker=$DMLC_TRACKER_URI:${DMLC_TRACKER_PORT:+port} rank=${SWITCHYARD_RANK:-none}",
        );
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let common = "workers=2 servers=1 attempt=0 cluster=local tracker=127.0.0.1:port";
    for expected in [
        format!("[0] role=worker task=0 {common} rank=0"),
        format!("[1] role=worker task=1 {common} rank=1"),
        format!("[s0] role=server task=2 {common} rank=none"),
    ] {
        assert!(
            stdout.lines().any(|l| l == expected),
            "no {expected:?} in\n{stdout}"
        );
    }
}

#[test]
fn a_failing_process_is_restarted_with_the_next_attempt_number() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "2", "--max-restarts", "2", "--", "sh", "-c"])
        .arg(
            r#"echo attempt $DMLC_NUM_ATTEMPT
               if [ "$SWITCHYARD_RANK" = 1 ] && [ "$DMLC_NUM_ATTEMPT" -lt 2 ]; then exit 5; fi"#,
        );
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        "[0] attempt 0",
        "[1] attempt 0",
        "[1] attempt 1",
        "[1] attempt 2",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}"
        );
    }
    assert!(!stdout.contains("[0] attempt 1"), "{stdout}");
    // Not a terminal: one plain line per event, then the summary.
    for line in [
        "switchyard: rank 1 exited with exit status: 5; restarted with DMLC_NUM_ATTEMPT=1",
        "switchyard: rank 1 exited with exit status: 5; restarted with DMLC_NUM_ATTEMPT=2",
        "switchyard: rank 0 finished (exit status: 0)",
        "switchyard: summary",
    ] {
        assert!(stderr.contains(line), "no {line:?} in\n{stderr}");
    }
    let row = |name: &str| {
        stderr
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no summary row for {name} in\n{stderr}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    // "rank", "1", starts, wall, "exit", "status:", "0"
    assert_eq!(row("rank 1")[2], "3", "{stderr}");
    assert_eq!(row("rank 0")[2], "1", "{stderr}");
    assert_eq!(row("rank 1")[4..], ["exit", "status:", "0"], "{stderr}");
}

#[test]
fn when_restarts_run_out_the_job_stops_and_names_the_rank() {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "2", "--max-restarts", "1", "--", "sh", "-c"])
        .arg(r#"if [ "$SWITCHYARD_RANK" = 0 ]; then exit 4; else exec sleep 60; fi"#);
    let (out, took) = run_bounded(cmd, Duration::from_secs(90));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "rank 0 exited with exit status: 4 after 1 restart; every other process was stopped"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopped (another process failed)"),
        "{stderr}"
    );
    // Before the sleeping rank's minute was up: it was stopped, not waited for.
    assert!(
        took < Duration::from_secs(60),
        "the sleeping rank was not stopped: {took:?}"
    );
}

/// Whether process `pid` is gone (no entry, or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn read_pid(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Each rank starts a background `sleep` (a grandchild of the launcher), writes both
/// pids, and says `ready`.
const TREE: &str = r#"sleep 300 & echo $! > "$PIDS/grandchild.$SWITCHYARD_RANK"
echo $$ > "$PIDS/child.$SWITCHYARD_RANK"; echo ready; wait"#;

/// Ranks that ignore SIGTERM (inherited by their background jobs) and need the SIGKILL.
const STUBBORN_TREE: &str = r#"trap '' TERM
sleep 300 & echo $! > "$PIDS/grandchild.$SWITCHYARD_RANK"
echo $$ > "$PIDS/child.$SWITCHYARD_RANK"; echo ready; wait"#;

fn signal_stops_everything(signal: &str, tree: &str) {
    let dir = TempDir::new(&format!("signal-{signal}-{}", tree.len()));
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "2", "--", "sh", "-c", tree])
        .env("PIDS", &dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard(Some(cmd.spawn().unwrap()));
    let launcher = guard.0.as_mut().unwrap();
    let stdout = launcher.stdout.take().unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = 0;
    while ready < 2 {
        let line = rx
            .recv_deadline(deadline)
            .expect("both ranks ready within 30 s");
        ready += usize::from(line.ends_with("] ready"));
    }
    let pids: Vec<u32> = ["child.0", "child.1", "grandchild.0", "grandchild.1"]
        .iter()
        .map(|f| read_pid(&dir.0.join(f)))
        .collect();
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args([format!("-{signal}"), launcher.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(60),
            "launcher still running after {signal}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = sent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    // The launcher's grace period (3 s) and a SIGKILL take under 5 s on a quiet
    // machine; the bound is far above that, so that a loaded runner cannot trip it,
    // and far below the 300 s the trees' sleeps would otherwise keep them.
    assert!(took < Duration::from_secs(60), "{took:?}\n{stderr}");
    if tree == STUBBORN_TREE {
        // The SIGKILL came after the grace period, not instead of the SIGTERM.
        assert!(took >= Duration::from_secs(3), "{took:?}\n{stderr}");
    }
    assert!(
        stderr.contains(&format!("interrupted by SIG{signal}")),
        "{stderr}"
    );
    for pid in pids {
        assert!(gone(pid), "process {pid} outlived the launcher\n{stderr}");
    }
}

#[test]
fn sigterm_stops_every_child_and_grandchild_with_status_130() {
    signal_stops_everything("TERM", TREE);
}

#[test]
fn sigint_stops_every_child_and_grandchild_with_status_130() {
    signal_stops_everything("INT", TREE);
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_within_5_s() {
    signal_stops_everything("TERM", STUBBORN_TREE);
}

#[test]
fn what_a_finished_process_left_running_is_stopped() {
    let dir = TempDir::new("leftover");
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "1", "--", "sh", "-c"])
        .arg(r#"sleep 300 > /dev/null 2>&1 & echo $! > "$PIDS/grandchild""#)
        .env("PIDS", &dir.0);
    let (out, _) = run_bounded(cmd, Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = read_pid(&dir.0.join("grandchild"));
    assert!(gone(pid), "the background sleep {pid} outlived its rank");
}

/// The Python of an XGBoost venv, from `var`; `None` (after saying why) when unset,
/// unless CI requires XGBoost.
fn xgboost_python(var: &str) -> Option<std::ffi::OsString> {
    let python = std::env::var_os(var);
    if python.is_none() {
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_XGBOOST").as_deref() != Ok("1"),
            "SWITCHYARD_REQUIRE_XGBOOST=1 but {var} is unset"
        );
        eprintln!("skipped: {var} is unset (scripts/xgboost-venvs.sh makes the venv)");
    }
    python
}

/// Runs `script` in 3 workers under the launcher and checks that each joined through
/// the tracker, printed through it, and summed the ranks.
fn xgboost_job(python: std::ffi::OsString, script: &str) {
    let mut cmd = switchyard();
    cmd.args(["launch", "-n", "3", "--timeout", "100", "--"])
        .arg(python)
        .args(["-c", script]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for r in 0..3 {
        let line = format!("[{r}] rank {r} of 3 task {r} sum 6.0");
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}"
        );
        assert!(
            stderr.contains(&format!("switchyard: rank {r} joined (tracker)")),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("[tracker] hello from rank {r}")),
            "{stderr}"
        );
    }
}

/// An unmodified XGBoost 1.7 script (rabit reads DMLC_* from the environment) runs under
/// the launcher's tracker (classic protocol).
#[test]
fn an_xgboost_17_script_joins_the_embedded_tracker() {
    let Some(python) = xgboost_python("SWITCHYARD_XGB17_PYTHON") else {
        return;
    };
    xgboost_job(
        python,
        r#"
import os
import numpy as np
from xgboost import collective
with collective.CommunicatorContext():
    r, w = collective.get_rank(), collective.get_world_size()
    s = collective.allreduce(np.array([r + 1.0] * 4), collective.Op.SUM)
    collective.communicator_print(f"hello from rank {r}\n")
    print("rank", r, "of", w, "task", os.environ["DMLC_TASK_ID"], "sum", s[0], flush=True)
"#,
    );
}

/// XGBoost 3.x ignores the environment: the script passes the launcher's DMLC_*
/// values on, and joins the same embedded tracker over the JSON protocol.
#[test]
fn an_xgboost_3_script_joins_the_embedded_tracker() {
    let Some(python) = xgboost_python("SWITCHYARD_XGB3_PYTHON") else {
        return;
    };
    xgboost_job(
        python,
        r#"
import os
import numpy as np
from xgboost import collective
e = os.environ
with collective.CommunicatorContext(
    dmlc_communicator="rabit",
    dmlc_tracker_uri=e["DMLC_TRACKER_URI"],
    dmlc_tracker_port=int(e["DMLC_TRACKER_PORT"]),
    dmlc_task_id=e["DMLC_TASK_ID"],
):
    r, w = collective.get_rank(), collective.get_world_size()
    s = collective.allreduce(np.array([r + 1.0] * 4), collective.Op.SUM)
    collective.communicator_print(f"hello from rank {r}")
    print("rank", r, "of", w, "task", e["DMLC_TASK_ID"], "sum", s[0], flush=True)
"#,
    );
}

/// On a terminal, progress is one status line redrawn in place, not log lines. The
/// terminal is a pseudo-terminal from util-linux `script`.
#[test]
fn a_terminal_gets_one_status_line_instead_of_log_lines() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` (util-linux) to give the launcher a terminal");
        return;
    }
    let launch = format!(
        "'{}' launch -n 2 -- sh -c 'sleep 0.2; echo hi from $SWITCHYARD_RANK'",
        env!("CARGO_BIN_EXE_switchyard")
    );
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &launch, "/dev/null"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(60));
    let screen = text(&out.stdout);
    assert!(out.status.success(), "{screen:?}");
    assert!(
        screen.contains("hi from 0") && screen.contains("hi from 1"),
        "{screen:?}"
    );
    assert!(
        screen.contains("\r\x1b[Kswitchyard: 2 processes | joined 0/2 | running"),
        "{screen:?}"
    );
    assert!(!screen.contains("switchyard: rank 0 running"), "{screen:?}");
    assert!(screen.contains("switchyard: summary"), "{screen:?}");
}

/// A SIGKILLed launcher cannot stop anything, but its children die with it
/// (PR_SET_PDEATHSIG). Their background jobs are out of reach; the test ends them.
#[cfg(target_os = "linux")]
#[test]
fn children_die_with_a_sigkilled_launcher() {
    let dir = TempDir::new("sigkill");
    let mut cmd = switchyard();
    // --timeout bounds the blocking reads below: the launcher ends the job (closing
    // the pipe) if the ranks never say ready.
    cmd.args([
        "launch",
        "-n",
        "2",
        "--timeout",
        "30",
        "--",
        "sh",
        "-c",
        TREE,
    ])
    .env("PIDS", &dir.0)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let mut guard = ChildGuard(Some(cmd.spawn().unwrap()));
    let launcher = guard.0.as_mut().unwrap();
    let stdout = BufReader::new(launcher.stdout.take().unwrap());
    let mut lines = stdout.lines().map_while(Result::ok);
    let ready = lines
        .by_ref()
        .filter(|l| l.ends_with("] ready"))
        .take(2)
        .count();
    assert_eq!(ready, 2);
    let child = |f: &str| read_pid(&dir.0.join(f));
    let (children, grandchildren) = (
        [child("child.0"), child("child.1")],
        [child("grandchild.0"), child("grandchild.1")],
    );
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !children.iter().all(|p| gone(*p)) {
        assert!(
            Instant::now() < deadline,
            "children {children:?} outlived the launcher"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in grandchildren {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// A XGBoost 1.7 worker that fails before it reaches the tracker is restarted with
/// DMLC_NUM_ATTEMPT=1 and the job still trains together.
#[test]
fn a_restarted_xgboost_17_worker_joins_the_same_job() {
    let Some(python) = xgboost_python("SWITCHYARD_XGB17_PYTHON") else {
        return;
    };
    let script = r#"
import os, sys
import numpy as np
from xgboost import collective
task, attempt = os.environ["DMLC_TASK_ID"], os.environ["DMLC_NUM_ATTEMPT"]
if task == "1" and attempt == "0":
    sys.exit(3)
with collective.CommunicatorContext():
    r = collective.get_rank()
    s = collective.allreduce(np.array([r + 1.0] * 4), collective.Op.SUM)
    print("task", task, "attempt", attempt, "sum", s[0], flush=True)
"#;
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "2",
        "--max-restarts",
        "1",
        "--timeout",
        "100",
        "--",
    ])
    .arg(python)
    .args(["-c", script]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        "[0] task 0 attempt 0 sum 3.0",
        "[1] task 1 attempt 1 sum 3.0",
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}"
        );
    }
    assert!(
        stderr.contains("rank 1 exited with exit status: 3; restarted with DMLC_NUM_ATTEMPT=1"),
        "{stderr}"
    );
}
