//! The heartbeat of the TCP data path ([`CommOptions::heartbeat`]) with ranks as
//! processes, since only a whole process can be stopped: three ranks (this test binary
//! again, one process each) form a mesh over `tcp://127.0.0.1` with the stream data
//! path, passing their endpoints through files, and report on stdout what happens.
//!
//! - a rank that sleeps 3 s between two allreduces (slow but alive) is never reported;
//! - a rank stopped with SIGSTOP while the others wait for it in an allreduce is
//!   reported by both, naming it, between the deadline (800 ms) and 2 s after the stop;
//! - without a heartbeat the same stop is not reported within 2 s.
//!
//! Every child is killed on every way out of a test (a guard), stopped ones included.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, BootstrapError, EndpointExchange};
use switchyard::collective::{CommOptions, Communicator, DataPath, ReduceOp};

/// Set in a child: its rank.
const RANK: &str = "SWITCHYARD_TEST_HEARTBEAT_RANK";
/// Set in a child: the folder where the ranks leave their endpoints.
const DIR: &str = "SWITCHYARD_TEST_HEARTBEAT_DIR";
/// Set in a child: `slow` or `stop`.
const SCENARIO: &str = "SWITCHYARD_TEST_HEARTBEAT_SCENARIO";
/// Ranks in each mesh.
const SIZE: usize = 3;
/// The heartbeat deadline of the tests that have one.
const DEADLINE: Duration = Duration::from_millis(800);
/// Longest any one test may take before its children are killed and it fails.
const LIMIT: Duration = Duration::from_secs(60);
/// What the children print that the parent reads begins with this.
const SAY: &str = "hb:";

/// One test at a time: their timings should not depend on each other's load.
static SERIAL: Mutex<()> = Mutex::new(());

/// The child's side: a rank of the mesh, doing what its scenario says. Returns at once
/// in the parent (where `RANK` is not set).
#[test]
fn child_rank() {
    let Ok(rank) = std::env::var(RANK) else {
        return;
    };
    let rank: usize = rank.parse().unwrap();
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let scenario = std::env::var(SCENARIO).unwrap();
    // The deadline comes from SWITCHYARD_HEARTBEAT_MS (0: off), which the parent sets.
    let options = CommOptions::from_env()
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_data_path(DataPath::Tcp);
    say(rank, &format!("heartbeat {:?}", options.heartbeat));
    let boot = Bootstrap::from_exchange(rank, SIZE, DirExchange(dir.clone()));
    let mut comm = Communicator::join(&boot, options).unwrap();
    let expected = (1..=SIZE).sum::<usize>() as f64;
    let mut buf = vec![rank as f64 + 1.0; 8];
    comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
    assert!(buf.iter().all(|v| *v == expected));
    match scenario.as_str() {
        "slow" => {
            if rank == 2 {
                // Busy in "user code", not touching the communicator.
                std::thread::sleep(Duration::from_secs(3));
            }
            let mut buf = vec![rank as f64 + 1.0; 8];
            comm.allreduce(&mut buf, ReduceOp::Sum).unwrap();
            assert!(buf.iter().all(|v| *v == expected));
            say(rank, "done");
        }
        "stop" if rank == 2 => {
            say(rank, "ready");
            // The parent stops, then kills, this process.
            std::thread::sleep(LIMIT);
        }
        "stop" => {
            say(rank, "waiting");
            let mut buf = vec![rank as f64 + 1.0; 8];
            match comm.allreduce(&mut buf, ReduceOp::Sum) {
                Err(e) => say(rank, &format!("result: failed: {e}")),
                Ok(()) => say(rank, "result: ok"),
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// A line for the parent, at once.
fn say(rank: usize, what: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{SAY} {rank} {what}").unwrap();
    out.flush().unwrap();
}

/// Leaves this rank's endpoint in `dir`, whole or not at all (written aside, then
/// renamed).
fn publish(dir: &Path, rank: usize, endpoint: &str) {
    let aside = dir.join(format!("endpoint-{rank}.part"));
    std::fs::write(&aside, endpoint).unwrap();
    std::fs::rename(aside, dir.join(format!("endpoint-{rank}"))).unwrap();
}

/// Every rank's endpoint, once all are in `dir` (at most 20 s).
fn gather(dir: &Path) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<Option<String>> = (0..SIZE)
            .map(|r| std::fs::read_to_string(dir.join(format!("endpoint-{r}"))).ok())
            .collect();
        if found.iter().all(Option::is_some) {
            return found.into_iter().flatten().collect();
        }
        assert!(Instant::now() < until, "endpoints missing: {found:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The children's endpoint exchange: a file per rank in the test's directory (one use
/// per process). Endpoints bind on loopback.
#[derive(Debug)]
struct DirExchange(PathBuf);

impl EndpointExchange for DirExchange {
    fn exchange(
        &mut self,
        rank: u32,
        _world: u32,
        endpoint: &str,
        _timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        publish(&self.0, rank as usize, endpoint);
        Ok(gather(&self.0))
    }
}

/// A line a child printed, with when the parent read it.
struct Line {
    rank: usize,
    at: Instant,
    text: String,
}

/// The children of one test and what they print. Dropping it kills every child that
/// is still there (SIGKILL ends stopped ones too), waits for them, and removes the
/// endpoint folder.
struct Mesh {
    children: Vec<Child>,
    lines: Receiver<Line>,
    /// Lines read and not yet taken by [`Mesh::next_from`], in order.
    unread: Vec<Line>,
    /// Everything read so far, for failure messages.
    log: Vec<String>,
    dir: PathBuf,
}

impl Mesh {
    /// Starts `SIZE` ranks running `scenario` with heartbeat deadline `beat_ms` (0: off).
    fn start(scenario: &str, beat_ms: u64) -> Mesh {
        let dir = std::env::temp_dir().join(format!(
            "switchyard-heartbeat-{}-{scenario}-{beat_ms}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (tx, lines) = channel();
        let mut mesh = Mesh {
            children: Vec::new(),
            lines,
            unread: Vec::new(),
            log: Vec::new(),
            dir,
        };
        for rank in 0..SIZE {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .arg(support::test_name(module_path!(), "child_rank"))
                .args(["--exact", "--nocapture", "--test-threads=1"])
                .env(RANK, rank.to_string())
                .env(DIR, &mesh.dir)
                .env(SCENARIO, scenario)
                .env("SWITCHYARD_HEARTBEAT_MS", beat_ms.to_string())
                .env_remove("SWITCHYARD_DATA_PATH")
                .env_remove("SWITCHYARD_JOB_SECRET")
                .env_remove("SWITCHYARD_JOB_SECRET_FILE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let out = child.stdout.take().unwrap();
            let err = child.stderr.take().unwrap();
            mesh.children.push(child);
            for (stream, tag) in [
                (Box::new(out) as Box<dyn std::io::Read + Send>, "out"),
                (Box::new(err), "err"),
            ] {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for text in BufReader::new(stream).lines().map_while(Result::ok) {
                        let at = Instant::now();
                        let text = match text.find(SAY) {
                            // The test harness may have begun the line ("test
                            // child_rank ... ") without ending it.
                            Some(i) if tag == "out" => text[i..].to_string(),
                            _ if tag == "out" => text,
                            _ => format!("[stderr] {text}"),
                        };
                        if tx.send(Line { rank, at, text }).is_err() {
                            return;
                        }
                    }
                });
            }
        }
        mesh
    }

    /// The first line not taken yet that rank `rank` says (`SAY`) and that begins
    /// with `what`, with when it was read; `None` if none comes by `until`. Other lines
    /// stay for later calls.
    fn next_from(&mut self, rank: usize, what: &str, until: Instant) -> Option<(Instant, String)> {
        let prefix = format!("{SAY} {rank} {what}");
        loop {
            if let Some(i) = self.unread.iter().position(|l| l.text.starts_with(&prefix)) {
                let line = self.unread.remove(i);
                return Some((line.at, line.text));
            }
            let wait = until.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(wait).ok()?;
            self.log.push(format!("rank {}: {}", line.rank, line.text));
            self.unread.push(line);
        }
    }

    /// Whether any rank said a line containing `what` so far.
    fn said(&mut self, what: &str) -> bool {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(format!("rank {}: {}", line.rank, line.text));
            self.unread.push(line);
        }
        self.unread.iter().any(|l| l.text.contains(what))
    }

    /// [`Mesh::next_from`], failing the test (children killed) when it does not come.
    fn expect(&mut self, rank: usize, what: &str, until: Instant) -> (Instant, String) {
        match self.next_from(rank, what, until) {
            Some(found) => found,
            None => {
                self.drain();
                panic!("rank {rank} never said {what:?}:\n{}", self.log.join("\n"))
            }
        }
    }

    /// Reads what is left to read now, for a failure message.
    fn drain(&mut self) {
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(format!("rank {}: {}", line.rank, line.text));
        }
    }

    /// Sends `signal` to rank `rank`'s process.
    fn signal(&self, rank: usize, signal: libc::c_int) {
        let pid = self.children[rank].id() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child, which has not been waited for yet
        // (its pid cannot have been reused).
        let done = unsafe { libc::kill(pid, signal) };
        assert_eq!(done, 0, "kill({pid}, {signal})");
    }

    /// Waits for every child to exit by `until`; each must succeed.
    fn all_exit(&mut self, until: Instant) {
        for rank in 0..SIZE {
            loop {
                if let Some(status) = self.children[rank].try_wait().unwrap() {
                    if !status.success() {
                        self.drain();
                        panic!("rank {rank} failed: {status}\n{}", self.log.join("\n"));
                    }
                    break;
                }
                if Instant::now() >= until {
                    self.drain();
                    panic!("rank {rank} still running\n{}", self.log.join("\n"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// (a) Rank 2 computes for 3 s between two allreduces, not touching its communicator,
/// while ranks 0 and 1 wait for it in the second: its heartbeat thread keeps beating,
/// nobody fails, and the second allreduce is right on every rank.
#[test]
fn a_slow_but_alive_rank_is_not_reported() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let until = Instant::now() + LIMIT;
    let mut mesh = Mesh::start("slow", DEADLINE.as_millis() as u64);
    let started = Instant::now();
    for rank in 0..SIZE {
        mesh.expect(rank, "done", until);
    }
    mesh.all_exit(until);
    println!(
        "slow rank: all done after {:.2?} (rank 2 slept 3 s)",
        started.elapsed()
    );
}

/// The ranks are connected and waiting in the allreduce rank 2 will never join (rank 2
/// is alive, beating, and asleep): returns once all said so, and a moment more so that
/// ranks 0 and 1 are inside the call.
fn wait_for_the_stop(mesh: &mut Mesh, until: Instant) {
    mesh.expect(2, "ready", until);
    mesh.expect(0, "waiting", until);
    mesh.expect(1, "waiting", until);
    // Longer than the deadline: rank 2 is not in a call but beating, and nobody may
    // report it meanwhile.
    std::thread::sleep(DEADLINE + Duration::from_millis(400));
    assert!(!mesh.said("result"), "{}", mesh.log.join("\n"));
}

/// (b) Rank 2 is stopped while ranks 0 and 1 wait for it: both fail with an error
/// naming rank 2, between the deadline and 2 s after the stop; then rank 2 is killed.
#[test]
fn a_stopped_rank_is_reported_within_the_deadline() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let until = Instant::now() + LIMIT;
    let mut mesh = Mesh::start("stop", DEADLINE.as_millis() as u64);
    wait_for_the_stop(&mut mesh, until);
    // Taken before the signal: the stop happens after it, so no detection can look
    // earlier than it was.
    let stopped = Instant::now();
    mesh.signal(2, libc::SIGSTOP);
    let mut detected = Vec::new();
    for rank in 0..2 {
        let (at, text) = mesh.expect(rank, "result", stopped + Duration::from_secs(5));
        let took = at.saturating_duration_since(stopped);
        println!("rank {rank} detected the stop of rank 2 after {took:.3?}: {text}");
        assert!(
            text.contains("failed") && text.contains("lost rank 2") && text.contains("heartbeat"),
            "rank {rank}: {text}\n{}",
            mesh.log.join("\n")
        );
        detected.push(took);
    }
    mesh.signal(2, libc::SIGKILL);
    for (rank, took) in detected.iter().enumerate() {
        assert!(
            *took >= DEADLINE && *took <= Duration::from_secs(2),
            "rank {rank} detected the stop after {took:?}, not within 0.8 s..2 s"
        );
    }
    // Ranks 0 and 1 leave on their own after their error; rank 2 was killed.
    let (zero, one) = mesh.children.split_at_mut(1);
    for (rank, child) in [(0, &mut zero[0]), (1, &mut one[0])] {
        let left = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "rank {rank}: {status}");
                break;
            }
            assert!(
                Instant::now() < left,
                "rank {rank} did not leave after its error"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// (c) Without a heartbeat the same stop goes unreported for 2 s (the silence timeout,
/// here 30 s, is all there is): the option is what makes the difference.
#[test]
fn without_a_heartbeat_a_stop_is_not_reported_within_two_seconds() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let until = Instant::now() + LIMIT;
    let mut mesh = Mesh::start("stop", 0);
    mesh.expect(0, "heartbeat None", until);
    wait_for_the_stop(&mut mesh, until);
    mesh.signal(2, libc::SIGSTOP);
    let stopped = Instant::now();
    for rank in 0..2 {
        if let Some((at, text)) = mesh.next_from(rank, "result", stopped + Duration::from_secs(2)) {
            panic!(
                "rank {rank} reported the stop after {:?} without a heartbeat: {text}",
                at.saturating_duration_since(stopped)
            );
        }
    }
    println!("without a heartbeat: no report 2 s after the stop");
    // The guard kills all three.
}
