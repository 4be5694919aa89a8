//! `switchyard launch --launcher mpi` with the real `mpirun` (OpenMPI) on this
//! machine: what a SIGKILLed launcher leaves.
//!
//! Without `mpirun` every test says why and returns, unless
//! `SWITCHYARD_REQUIRE_MPIRUN=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{ChildGuard, mpirun, switchyard};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `mpirun` runs here; if not, says why (or fails under the variable).
fn have_mpirun() -> bool {
    if Command::new("mpirun").arg("--version").output().is_ok() {
        return true;
    }
    let required = std::env::var("SWITCHYARD_REQUIRE_MPIRUN").is_ok_and(|v| v.trim() == "1");
    assert!(
        !required,
        "SWITCHYARD_REQUIRE_MPIRUN=1 but there is no mpirun"
    );
    eprintln!("skipped: no mpirun (apt install openmpi-bin)");
    false
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped) within `limit`;
/// SIGKILLed either way, so that a failed test leaves nothing.
fn ended_within(pid: i32, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    let ended = loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if matches!(state, None | Some('Z')) {
            break true;
        }
        if Instant::now() >= until {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
    ended
}

/// The rank `mpirun` started here has no parent once the launcher (and with it
/// `mpirun`) is SIGKILLed: it dies with `mpirun`, and OpenMPI's session folder is in
/// the launcher's own folder, not loose in the temporary directory.
#[test]
fn a_killed_launcher_leaves_no_mpi_rank_and_no_loose_session_folder() {
    if !have_mpirun() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("switchyard-launch-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut c = switchyard();
    c.envs(mpirun::OPENMPI_ENV)
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env("TMPDIR", &tmp)
        .args(["launch", "-n", "1", "--launcher", "mpi", "--no-tracker"])
        .args(["--rendezvous-timeout", "60", "--timeout", "60", "--"])
        .args(["sh", "-c", "echo pid=$$; exec sleep 60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut guard = ChildGuard(Some(c.spawn().unwrap()));
    let child = guard.0.as_mut().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let rank: i32 = line
        .trim()
        .strip_prefix("[0] pid=")
        .unwrap_or_else(|| panic!("{line:?}"))
        .parse()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    guard.0 = None;
    let ended = ended_within(rank, Duration::from_secs(10));
    let loose: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ompi."))
        .collect();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ended, "the rank {rank} outlived the killed launcher");
    assert!(loose.is_empty(), "loose session folders: {loose:?}");
}

/// A job that ends as usual leaves nothing in the temporary directory: the
/// launcher's folder for `mpirun`'s sessions is gone.
#[test]
fn an_mpi_job_leaves_nothing_in_the_temporary_directory() {
    if !have_mpirun() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("switchyard-launch-mpi-ok-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut c = switchyard();
    c.envs(mpirun::OPENMPI_ENV)
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env("TMPDIR", &tmp)
        .args([
            "launch",
            "-n",
            "2",
            "--launcher",
            "mpi",
            "--no-tracker",
            "--",
        ])
        .args(["sh", "-c", "echo hello"]);
    let (out, _) = crate::support::run_bounded(c, Duration::from_secs(60));
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
