//! `switchyard tracker` as a process: it prints where it listens, a SIGKILLed tracker
//! restarted on the same port with the same state file finishes the job, and the exit
//! status says whether the job succeeded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{ChildGuard, switchyard};

const WAIT: Duration = Duration::from_secs(30);

/// A running `switchyard tracker` and the port it printed.
struct Running {
    guard: ChildGuard,
    port: u16,
    stderr: mpsc::Receiver<String>,
}

fn spawn_tracker(args: &[&str]) -> Running {
    spawn_tracker_with(args, &[])
}

/// [`spawn_tracker`] with `env` added to its environment.
fn spawn_tracker_with(args: &[&str], env: &[(&str, &str)]) -> Running {
    let child = switchyard()
        .arg("tracker")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = ChildGuard(Some(child));
    let child: &mut Child = guard.0.as_mut().unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let (etx, erx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = etx.send(line.unwrap_or_default());
        }
    });
    let uri = rx.recv_timeout(WAIT).expect("no DMLC_TRACKER_URI line");
    assert_eq!(uri, "DMLC_TRACKER_URI=127.0.0.1");
    let port = rx.recv_timeout(WAIT).expect("no DMLC_TRACKER_PORT line");
    let port = port
        .strip_prefix("DMLC_TRACKER_PORT=")
        .expect("port line")
        .parse()
        .unwrap();
    Running {
        guard,
        port,
        stderr: erx,
    }
}

impl Running {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Waits for the process to exit; its status.
    fn exit(&mut self) -> std::process::ExitStatus {
        let started = Instant::now();
        let child = self.guard.0.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() >= WAIT {
                // What it said so far, to tell a hang from a slow exit.
                let said = self.stderr.try_iter().collect::<Vec<_>>().join("\n");
                panic!("tracker still running after {WAIT:?}; its stderr:\n{said}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reads standard error lines until one contains `needle` (appending to `log`).
    fn wait_for(&self, needle: &str, log: &mut String) {
        let deadline = Instant::now() + WAIT;
        while !log.contains(needle) {
            assert!(Instant::now() < deadline, "no {needle:?} on stderr: {log}");
            if let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(100)) {
                log.push_str(&line);
                log.push('\n');
            }
        }
    }

    fn stderr_text(&self) -> String {
        // The reader thread may still be forwarding what the tracker wrote before it
        // exited: read up to the end of the stream (the thread then drops its sender),
        // not just what has arrived (a loaded machine once gave an empty text here).
        let deadline = Instant::now() + WAIT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    lines.push(format!("(standard error still open after {WAIT:?})"));
                    break;
                }
            }
        }
        lines.join("\n")
    }
}

fn i32le(v: i32) -> [u8; 4] {
    v.to_le_bytes()
}

fn read_i32(st: &mut TcpStream) -> i32 {
    let mut b = [0u8; 4];
    st.read_exact(&mut b).unwrap();
    i32::from_le_bytes(b)
}

fn classic(addr: SocketAddr, rank: i32, world: i32, task: &str, cmd: &str) -> TcpStream {
    let mut st = TcpStream::connect_timeout(&addr, WAIT).unwrap();
    st.set_read_timeout(Some(WAIT)).unwrap();
    st.write_all(&i32le(0xFF99)).unwrap();
    assert_eq!(read_i32(&mut st), 0xFF99);
    let mut b = Vec::new();
    b.extend(i32le(rank));
    b.extend(i32le(world));
    for s in [task, cmd] {
        b.extend(i32le(s.len() as i32));
        b.extend(s.as_bytes());
    }
    st.write_all(&b).unwrap();
    st
}

/// A classic worker of a world of 2 up to the end of link setup; returns its rank and
/// its peer link.
fn worker(addr: SocketAddr, task: &str) -> (i32, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut st = classic(addr, -1, -1, task, "start");
    let rank = read_i32(&mut st);
    let (_parent, world, k) = (read_i32(&mut st), read_i32(&mut st), read_i32(&mut st));
    assert_eq!((world, k), (2, 1));
    for _ in 0..3 {
        read_i32(&mut st);
    }
    st.write_all(&i32le(0)).unwrap();
    let (conn, accept) = (read_i32(&mut st), read_i32(&mut st));
    assert_eq!(conn + accept, 1);
    let link = if conn == 1 {
        let n = read_i32(&mut st);
        let mut host = vec![0u8; n as usize];
        st.read_exact(&mut host).unwrap();
        let port = read_i32(&mut st);
        assert_eq!(read_i32(&mut st), 1 - rank);
        let host = String::from_utf8(host).unwrap();
        let mut p = TcpStream::connect(format!("{host}:{port}")).unwrap();
        p.write_all(&i32le(rank)).unwrap();
        st.write_all(&i32le(0)).unwrap();
        st.write_all(&i32le(0)).unwrap();
        p
    } else {
        st.write_all(&i32le(0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        st.write_all(&i32le(i32::from(port))).unwrap();
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            match listener.accept() {
                Ok((p, _)) => break p,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "rank {rank}: no peer connected");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    };
    // The tracker closes once it has recorded the negotiation (in the state file too).
    assert_eq!(st.read(&mut [0u8; 1]).unwrap(), 0);
    (rank, link)
}

#[test]
fn a_sigkilled_tracker_restarted_with_its_state_file_finishes_the_job() {
    let state: PathBuf =
        std::env::temp_dir().join(format!("sy-tracker-restart-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&state);
    let state_arg = state.to_str().unwrap();
    let mut first = spawn_tracker(&["-n", "2", "--state", state_arg]);
    let addr = first.addr();
    let w = std::thread::spawn(move || worker(addr, "1"));
    let (r0, _l0) = worker(addr, "0");
    let (r1, _l1) = w.join().unwrap();
    assert_eq!((r0, r1), (0, 1));
    let mut log = String::new();
    classic(addr, 0, 2, "0", "shutdown");
    first.wait_for("rank 0 shut down", &mut log);
    // SIGKILL: no chance to clean up.
    first.guard.0.as_mut().unwrap().kill().unwrap();
    first.guard.0.as_mut().unwrap().wait().unwrap();

    let port = addr.port().to_string();
    let mut second = spawn_tracker(&["-n", "2", "--port", &port, "--state", state_arg]);
    assert_eq!(second.port, addr.port());
    let mut p = classic(addr, 1, 2, "1", "print");
    p.write_all(&i32le(5)).unwrap();
    p.write_all(b"hello").unwrap();
    let mut log = String::new();
    second.wait_for("rank 1: hello", &mut log);
    classic(addr, 1, 2, "1", "shutdown");
    let status = second.exit();
    let err = second.stderr_text();
    assert!(status.success(), "exit {status:?}; stderr:\n{log}{err}");
    assert!(err.contains("job finished: ranks [0, 1]"), "{err}");
    let _ = std::fs::remove_file(&state);
}

/// A JSON worker's `error`: the job fails with "disk full".
fn fail_the_job(t: &Running) {
    let mut st = TcpStream::connect_timeout(&t.addr(), WAIT).unwrap();
    st.set_read_timeout(Some(WAIT)).unwrap();
    let frame = |s: &str| [&i32le(s.len() as i32)[..], s.as_bytes()].concat();
    st.write_all(&i32le(0xFF99)).unwrap();
    st.write_all(&frame(r#"{"rank":0,"task_id":"w0","world_size":1}"#))
        .unwrap();
    st.write_all(&frame(r#"{"cmd":3,"code":1,"msg":"disk full"}"#))
        .unwrap();
}

#[test]
fn a_failed_job_exits_non_zero_with_the_reason() {
    let mut t = spawn_tracker(&["-n", "1", "--sort-by", "task", "--read-timeout", "5"]);
    fail_the_job(&t);
    let status = t.exit();
    let err = t.stderr_text();
    assert!(!status.success());
    // Once, and as plain text: standard error is a pipe here, as when it goes to a file.
    assert_eq!(err.matches("disk full").count(), 1, "{err}");
    assert!(
        !err.contains('\x1b'),
        "colour codes in a log that is not a terminal: {err:?}"
    );
}

/// A job script with a fixed `--state` path runs its next job on the finished job's
/// file: the tracker refuses it before listening, naming the file and the way out, and
/// exits non-zero, instead of printing `job finished` and exiting 0.
#[test]
fn a_finished_jobs_state_file_is_refused_with_a_non_zero_exit() {
    let state: PathBuf =
        std::env::temp_dir().join(format!("sy-tracker-finished-{}.jsonl", std::process::id()));
    std::fs::write(
        &state,
        concat!(
            "{\"kind\":\"job\",\"workers\":2}\n",
            "{\"kind\":\"shut_down\",\"protocol\":\"classic\",\"rank\":0}\n",
            "{\"kind\":\"shut_down\",\"protocol\":\"classic\",\"rank\":1}\n",
        ),
    )
    .unwrap();
    let mut command = switchyard();
    command
        .args(["tracker", "-n", "2", "--state"])
        .arg(&state)
        .env_remove("SWITCHYARD_JOB_SECRET")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE");
    let (out, _) = support::run_bounded(command, WAIT);
    let _ = std::fs::remove_file(&state);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit {:?}; stdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(!stdout.contains("DMLC_TRACKER_PORT"), "{stdout}");
    assert!(!stderr.contains("job finished"), "{stderr}");
    for needle in [state.to_str().unwrap(), "already finished", "delete"] {
        assert!(stderr.contains(needle), "no {needle:?} in {stderr}");
    }
}

/// `SWITCHYARD_JOB_SECRET` shorter than the minimum: `switchyard tracker` refuses to
/// start, naming the variable and the minimum length, instead of listening and then
/// dropping every connection.
#[test]
fn a_too_short_job_secret_stops_the_tracker_command_at_start() {
    let mut command = switchyard();
    command
        .args(["tracker", "-n", "2"])
        .env("SWITCHYARD_JOB_SECRET", "short")
        .env_remove("SWITCHYARD_JOB_SECRET_FILE");
    let (out, _) = support::run_bounded(command, WAIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit {:?}; {stderr}", out.status);
    assert!(!stdout.contains("DMLC_TRACKER_PORT"), "{stdout}");
    for needle in ["SWITCHYARD_JOB_SECRET", "at least 16"] {
        assert!(stderr.contains(needle), "no {needle:?} in {stderr}");
    }
}

/// Log lines (here the tracker's warning that the job failed) written to a pipe or a
/// file carry no colour codes, nor with `NO_COLOR` set.
#[test]
fn log_lines_that_do_not_go_to_a_terminal_carry_no_colour_codes() {
    for env in [
        &[("RUST_LOG", "warn")][..],
        &[("RUST_LOG", "warn"), ("NO_COLOR", "1")][..],
    ] {
        let mut t = spawn_tracker_with(&["-n", "1", "--read-timeout", "5"], env);
        fail_the_job(&t);
        assert!(!t.exit().success());
        let err = t.stderr_text();
        assert!(err.contains("WARN"), "{env:?}: no warning in {err}");
        assert!(!err.contains('\x1b'), "{env:?}: colour codes in {err:?}");
    }
}

/// `--job-timeout`: a job that has not ended in time (here no worker ever comes, as
/// after a restart that came when the workers had given up, or a worker that died
/// mid-job) fails with a non-zero exit naming the ranks that never shut down.
#[test]
fn a_job_that_runs_past_the_job_timeout_exits_non_zero() {
    let mut t = spawn_tracker(&["-n", "2", "--job-timeout", "1"]);
    let status = t.exit();
    let err = t.stderr_text();
    assert!(!status.success(), "exit {status:?}; {err}");
    assert!(err.contains("job timeout"), "{err}");
    assert!(err.contains("ranks [0, 1] never shut down"), "{err}");
}
