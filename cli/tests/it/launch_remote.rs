//! `switchyard launch --launcher ssh|slurm|mpi`: each process goes through `ssh HOST`,
//! `srun` or `mpirun`. Stand-in scripts first on `PATH` record their arguments and run
//! the command here. They stay beside the tests on the real engines (`cluster_*.rs`)
//! for what those cannot show: the exact command line of each process (quoting, the
//! variables it carries, what a secret given by value becomes), and the refusals that
//! happen before any engine is asked, on machines without root or a cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;
use support::{run_bounded, switchyard};

/// `ssh [-o OPT]... HOST COMMAND`: run COMMAND with sh, as a remote login shell would
/// (logged with printf: dash's echo would expand the command's backslashes).
const SSH: &str = r#"#!/bin/sh
printf '%s\n' "ssh $*" >> "$STANDIN_LOG"
while [ "$1" = "-o" ]; do shift 2; done
shift
exec sh -c "$*"
"#;

/// `srun --OPTION... PROGRAM ARGS`.
const SRUN: &str = r#"#!/bin/sh
echo "srun $*" >> "$STANDIN_LOG"
while case "$1" in --*) true;; *) false;; esac; do shift; done
exec "$@"
"#;

/// `mpirun -np 1 [--host HOST] PROGRAM ARGS`.
const MPIRUN: &str = r#"#!/bin/sh
echo "mpirun $*" >> "$STANDIN_LOG"
[ "$1" = "-np" ] && shift 2
[ "$1" = "--host" ] && shift 2
exec "$@"
"#;

/// A folder with the stand-ins, a hostfile and the log, removed when dropped.
pub(crate) struct Cluster(PathBuf);

impl Cluster {
    pub(crate) fn new(name: &str, hostfile: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("switchyard-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        for (file, body) in [("ssh", SSH), ("srun", SRUN), ("mpirun", MPIRUN)] {
            let path = dir.join("bin").join(file);
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(dir.join("hosts"), hostfile).unwrap();
        Cluster(dir)
    }

    pub(crate) fn hostfile(&self) -> PathBuf {
        self.0.join("hosts")
    }

    /// Replaces the stand-in `name` (`ssh`, `srun`, `mpirun`) with the script `body`.
    pub(crate) fn replace_standin(&self, name: &str, body: &str) {
        let path = self.0.join("bin").join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// `switchyard launch` with the stand-ins first on PATH.
    pub(crate) fn launch(&self, args: &[&str]) -> std::process::Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.0.join("bin")];
        dirs.extend(std::env::split_paths(&path));
        let mut cmd = switchyard();
        cmd.env("PATH", std::env::join_paths(dirs).unwrap())
            .env("STANDIN_LOG", self.0.join("log"))
            // Tests that want a job secret set it after this.
            .env_remove("SWITCHYARD_JOB_SECRET")
            .env_remove("SWITCHYARD_JOB_SECRET_FILE")
            .arg("launch")
            .args(args);
        cmd
    }

    /// The stand-ins' argument lines, one per process.
    pub(crate) fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.0.join("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) const HOSTS: &str = "# test cluster\nnodeA slots=2\nnodeB\n";
const PRINT: &str = "echo task=$DMLC_TASK_ID cluster=$DMLC_JOB_CLUSTER rank=$SWITCHYARD_RANK";

/// Runs 3 workers through `launcher` and checks their output and the log line of each.
fn three_workers(launcher: &str, with_hostfile: bool) -> Vec<String> {
    // Tests run in parallel in one process: one folder per launcher and hostfile use.
    let cluster = Cluster::new(&format!("remote-{launcher}-{with_hostfile}"), HOSTS);
    let hostfile = cluster.hostfile();
    let mut args = vec!["-n", "3", "--launcher", launcher, "--host", "127.0.0.1"];
    if with_hostfile {
        args.extend(["--hostfile", hostfile.to_str().unwrap()]);
    }
    args.extend(["--", "sh", "-c", PRINT]);
    let (out, _) = run_bounded(cluster.launch(&args), Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for task in 0..3 {
        let line = format!("[{task}] task={task} cluster={launcher} rank={task}");
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in\n{stdout}\n{stderr}"
        );
    }
    let log = cluster.log();
    assert_eq!(log.len(), 3, "{log:?}");
    log
}

/// The log line of the process with `DMLC_TASK_ID=task`.
fn line_of(log: &[String], task: u32) -> &str {
    let word = format!("DMLC_TASK_ID={task} ");
    log.iter()
        .find(|l| l.contains(&word))
        .unwrap_or_else(|| panic!("no process with task {task} in {log:?}"))
}

#[test]
fn ssh_runs_each_process_on_its_host_in_this_directory() {
    let log = three_workers("ssh", true);
    let cwd = std::env::current_dir().unwrap();
    for (task, host) in [(0, "nodeA"), (1, "nodeA"), (2, "nodeB")] {
        let line = line_of(&log, task);
        let start = format!("ssh -o BatchMode=yes -o ConnectTimeout=15 {host} cd ");
        assert!(line.starts_with(&start), "{line}");
        assert!(line.contains(&cwd.display().to_string()), "{line}");
        assert!(line.contains("DMLC_TRACKER_URI=127.0.0.1 "), "{line}");
        assert!(line.contains("DMLC_NUM_ATTEMPT=0 "), "{line}");
        // The program's argument is one quoted word for the remote shell (then the
        // session's input as its own, not the watcher's copy, in the background).
        assert!(
            line.contains(&format!("sh -c '{PRINT}' <&3 3<&- & }}")),
            "{line}"
        );
    }
}

#[test]
fn slurm_hands_each_process_to_srun_on_its_node() {
    let log = three_workers("slurm", true);
    for (task, host) in [(0, "nodeA"), (1, "nodeA"), (2, "nodeB")] {
        let line = line_of(&log, task);
        let start = format!("srun --nodes=1 --ntasks=1 --exact --nodelist={host} env ");
        assert!(line.starts_with(&start), "{line}");
    }
}

#[test]
fn slurm_without_a_hostfile_lets_srun_place_the_processes() {
    let log = three_workers("slurm", false);
    for task in 0..3 {
        assert!(
            line_of(&log, task).starts_with("srun --nodes=1 --ntasks=1 --exact env "),
            "{log:?}"
        );
    }
}

#[test]
fn mpi_hands_each_process_to_mpirun_on_its_host() {
    let log = three_workers("mpi", true);
    for (task, host) in [(0, "nodeA"), (1, "nodeA"), (2, "nodeB")] {
        let line = line_of(&log, task);
        assert!(
            line.starts_with(&format!(
                "mpirun -np 1 --host {host} setpriv --pdeathsig KILL env "
            )),
            "{line}"
        );
    }
}

const SECRET: &str = "remote-secret-remote-secret-12345";

/// A secret file goes to the remote processes by its path, never by its content.
#[test]
fn the_secret_file_path_travels_and_the_secret_does_not() {
    let cluster = Cluster::new("remote-secret-file", HOSTS);
    let secret_file = cluster.0.join("job.secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let hostfile = cluster.hostfile();
    for launcher in ["ssh", "slurm", "mpi"] {
        let _ = std::fs::remove_file(cluster.0.join("log"));
        let args = [
            "-n",
            "2",
            "--launcher",
            launcher,
            "--host",
            "127.0.0.1",
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo file=$SWITCHYARD_JOB_SECRET_FILE",
        ];
        let mut cmd = cluster.launch(&args);
        cmd.env("SWITCHYARD_JOB_SECRET_FILE", &secret_file);
        let (out, _) = run_bounded(cmd, Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{launcher}: {stdout}\n{stderr}");
        let log = cluster.log();
        assert_eq!(log.len(), 2, "{launcher}: {log:?}");
        let word = format!("SWITCHYARD_JOB_SECRET_FILE={}", secret_file.display());
        for line in &log {
            assert!(line.contains(&word), "{launcher}: {line}");
            assert!(
                !line.contains(SECRET),
                "{launcher}: the secret is on the command line"
            );
        }
        assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
    }
}

/// A secret given only by value cannot reach remote hosts without showing in `ps`:
/// refused before any process starts, naming the way out.
#[test]
fn a_secret_value_with_a_remote_launcher_is_refused() {
    let cluster = Cluster::new("remote-secret-value", HOSTS);
    let hostfile = cluster.hostfile();
    for launcher in ["ssh", "slurm", "mpi"] {
        let args = [
            "-n",
            "1",
            "--launcher",
            launcher,
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--",
            "true",
        ];
        let mut cmd = cluster.launch(&args);
        cmd.env("SWITCHYARD_JOB_SECRET", SECRET);
        let (out, _) = run_bounded(cmd, Duration::from_secs(30));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{launcher}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("set SWITCHYARD_JOB_SECRET_FILE to that path"),
            "{launcher}: {stderr}"
        );
        assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
        assert!(cluster.log().is_empty(), "{launcher}: a process started");
    }
}

#[test]
fn ssh_without_a_hostfile_is_refused() {
    let cluster = Cluster::new("remote-nohosts", HOSTS);
    let cmd = cluster.launch(&["-n", "1", "--launcher", "ssh", "--", "true"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--launcher ssh needs --hostfile"),
        "{stderr}"
    );
    assert!(cluster.log().is_empty());
}

#[test]
fn a_bad_hostfile_line_is_named() {
    let cluster = Cluster::new("remote-badhosts", "nodeA\nnodeB cpus=4\n");
    let hostfile = cluster.hostfile();
    let args = [
        "-n",
        "1",
        "--launcher",
        "ssh",
        "--hostfile",
        hostfile.to_str().unwrap(),
        "--",
        "true",
    ];
    let (out, _) = run_bounded(cluster.launch(&args), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("line 2: unknown field \"cpus=4\""),
        "{stderr}"
    );
}

#[test]
fn an_unknown_launcher_is_refused_by_the_command_line() {
    let (out, _) = run_bounded(
        Cluster::new("remote-unknown", HOSTS).launch(&[
            "-n",
            "1",
            "--launcher",
            "pbs",
            "--",
            "true",
        ]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("expected one of local, ssh, slurm, mpi"),
        "{stderr}"
    );
}

/// The value of `NAME=` among the words of a stand-in's log line.
fn word_value<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// Without `--host`, processes on other hosts are told this machine's outward
/// address (their own loopback is not this machine's), with the tracker or without it
/// (`--no-tracker`): the rendezvous and the parameter-server root as the tracker.
#[test]
fn without_the_tracker_remote_processes_are_told_the_trackers_outward_address() {
    let cluster = Cluster::new("remote-no-tracker", HOSTS);
    let hostfile = cluster.hostfile();
    for launcher in ["ssh", "slurm", "mpi"] {
        let run = |extra: &[&str]| {
            let _ = std::fs::remove_file(cluster.0.join("log"));
            let mut args = vec!["-n", "1", "--launcher", launcher, "--hostfile"];
            args.push(hostfile.to_str().unwrap());
            args.extend(extra);
            args.extend(["--", "true"]);
            let (out, _) = run_bounded(cluster.launch(&args), Duration::from_secs(60));
            assert!(
                out.status.success(),
                "{launcher} {extra:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            cluster.log()
        };
        let with = run(&[]);
        let tracker = word_value(&with[0], "DMLC_TRACKER_URI")
            .unwrap()
            .to_string();
        let without = run(&["--no-tracker", "--servers", "1"]);
        assert_eq!(without.len(), 2, "{without:?}");
        let worker = line_of(&without, 0);
        assert_eq!(word_value(worker, "DMLC_TRACKER_URI"), None, "{worker}");
        let rendezvous = word_value(worker, "SWITCHYARD_RENDEZVOUS").unwrap();
        assert_eq!(
            rendezvous.rsplit_once(':').map(|(host, _)| host),
            Some(tracker.as_str()),
            "{launcher}: {worker}"
        );
        for line in &without {
            assert_eq!(
                word_value(line, "DMLC_PS_ROOT_URI"),
                Some(tracker.as_str()),
                "{launcher}: {line}"
            );
        }
    }
}

/// The lines of `stderr` that the launcher wrote (`switchyard: ...`).
fn launcher_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("switchyard: "))
        .collect()
}

/// A remote process's PID is not known on this host: progress names the PID it has
/// as its wrapper's on this host, beside the process and its host, never as if it
/// were the program's on that host ("pid N on nodeA").
#[test]
fn progress_names_the_pid_as_the_wrappers_on_this_host() {
    let cluster = Cluster::new("remote-pids", HOSTS);
    let hostfile = cluster.hostfile();
    for (launcher, wrapper) in [("ssh", "ssh"), ("slurm", "srun"), ("mpi", "mpirun")] {
        let args = [
            "-n",
            "3",
            "--launcher",
            launcher,
            "--host",
            "127.0.0.1",
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--",
            "true",
        ];
        let (out, _) = run_bounded(cluster.launch(&args), Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{launcher}: {stderr}");
        let lines = launcher_lines(&stderr);
        for (rank, host) in [(0, "nodeA"), (1, "nodeA"), (2, "nodeB")] {
            let start = format!("switchyard: rank {rank} on {host} running ({wrapper} pid ");
            let line = lines
                .iter()
                .find(|l| l.starts_with(&start))
                .unwrap_or_else(|| panic!("{launcher}: no {start:?} in\n{stderr}"));
            let rest = &line[start.len()..];
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(0);
            assert!(digits > 0, "{launcher}: {line}");
            assert!(
                rest[digits..].starts_with(" on this host, DMLC_NUM_ATTEMPT=0)"),
                "{launcher}: {line}"
            );
        }
        assert!(
            !lines
                .iter()
                .any(|l| l.contains(" on nodeA,") || l.contains(" on nodeB,")),
            "{launcher}: a PID named as if on the remote host:\n{stderr}"
        );
    }
}

/// A restart notice names the host the process runs on, as its failure would.
#[test]
fn a_restart_notice_names_the_host() {
    let cluster = Cluster::new("remote-restart", HOSTS);
    let hostfile = cluster.hostfile();
    // Rank 2 (on nodeB) fails its first start and succeeds its second.
    let program = r#"[ "$SWITCHYARD_RANK.$DMLC_NUM_ATTEMPT" = 2.0 ] && exit 3; exit 0"#;
    for launcher in ["ssh", "slurm", "mpi"] {
        let args = [
            "-n",
            "3",
            "--launcher",
            launcher,
            "--host",
            "127.0.0.1",
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--max-restarts",
            "1",
            "--",
            "sh",
            "-c",
            program,
        ];
        let (out, _) = run_bounded(cluster.launch(&args), Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{launcher}: {stderr}");
        let restart = "switchyard: rank 2 on nodeB exited with exit status: 3";
        let line = launcher_lines(&stderr)
            .into_iter()
            .find(|l| l.starts_with(restart))
            .unwrap_or_else(|| panic!("{launcher}: no {restart:?} in\n{stderr}"));
        assert!(
            line.contains("; restarted with DMLC_NUM_ATTEMPT=1 (--max-restarts 1)"),
            "{launcher}: {line}"
        );
    }
}
