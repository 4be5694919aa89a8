//! `switchyard launch --launcher ssh` over real sshd, on the hosts of the test cluster
//! (`cluster/`, `scripts/test-cluster.sh`): the launcher runs on node0, as on a head
//! node, and logs in to each host with the cluster's ssh configuration
//! (`--launcher-args "-F ssh_config"`), by host name, as users do.
//!
//! What a real sshd does that the stand-in of `netns_launch` hid: ending the local
//! `ssh` does not end the remote process (no terminal, no signal), so the launcher's
//! remote command watches its session's input and ends the program when it closes.
//!
//! Needs root and openssh-server: without them every test says why and returns,
//! unless `SWITCHYARD_REQUIRE_CLUSTER=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::cluster::{Cluster, Joined};
use crate::support::{ChildGuard, example, run_bounded, test_accuracy};
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `switchyard launch -n N --launcher ssh` on node0 over the cluster's hostfile,
/// running the example `program ARGS`.
fn launch(
    cluster: &Cluster,
    n: usize,
    launch_args: &[&str],
    program: &str,
    args: &[&str],
) -> Command {
    launch_path(cluster, n, launch_args, example(program).as_os_str(), args)
}

/// As [`launch`], for any program.
fn launch_path(
    cluster: &Cluster,
    n: usize,
    launch_args: &[&str],
    program: &std::ffi::OsStr,
    args: &[&str],
) -> Command {
    let mut c = cluster.command(0, env!("CARGO_BIN_EXE_switchyard"));
    let head = Cluster::addr(0).to_string();
    let ssh_args = format!("-F {}", cluster.ssh_config().display());
    c.arg("launch")
        .args(["-n", &n.to_string(), "--launcher", "ssh", "--hostfile"])
        .arg(cluster.hostfile())
        .args(["--launcher-args", &ssh_args])
        // Host names do not resolve here (no DNS in the namespaces): the tracker is
        // told by address.
        .args([
            "--host",
            &head,
            "--rendezvous-timeout",
            "30",
            "--timeout",
            "90",
        ])
        .args(launch_args)
        .arg("--")
        .arg(program)
        .args(args);
    c
}

#[test]
fn an_ssh_job_over_real_sshd_runs_each_rank_on_its_host_and_leaves_nothing() {
    let Some(cluster) = Cluster::up(3) else {
        return;
    };
    let command = launch(
        &cluster,
        3,
        &[],
        "netns_worker",
        &["env", "--iters", "20", "--timeout", "20"],
    );
    let (out, _) = run_bounded(command, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let seen = Joined::all(&stdout);
    assert_eq!(seen.len(), 3, "{stdout}\n{stderr}");
    for (task, j) in seen.iter().enumerate() {
        // Task t went to the hostfile's line t (node t) and ran there.
        assert_eq!((j.prefix, j.rank), (Some(task), task), "{seen:?}");
        assert_eq!(j.addr, Cluster::addr(task).to_string(), "{seen:?}");
        assert!(
            stdout
                .lines()
                .any(|l| l == format!("[{task}] done iters=20")),
            "rank {task} did not finish:\n{stdout}"
        );
        assert!(
            stderr.contains(&format!("rank {task} on node{task} running (ssh pid ")),
            "the launcher did not say where rank {task} runs:\n{stderr}"
        );
    }
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(5));
    assert!(left.is_empty(), "left running (host, pid): {left:?}");
}

#[test]
fn a_parameter_server_job_trains_over_real_sshd() {
    let Some(cluster) = Cluster::up(3) else {
        return;
    };
    let command = launch(
        &cluster,
        3,
        &["--servers", "2"],
        "logistic_ps",
        &["--rounds", "12"],
    );
    let (out, _) = run_bounded(command, Duration::from_secs(150));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let accuracy = test_accuracy(&stdout);
    assert!(accuracy >= 90.0, "accuracy {accuracy}%:\n{stdout}");
    // Servers are placed after the workers, round the hostfile: s0 on node0, s1 on node1.
    for (server, host) in [(0, 0), (1, 1)] {
        assert!(
            stderr.contains(&format!("server {server} on node{host} running (ssh pid ")),
            "server {server} not on node{host}:\n{stderr}"
        );
        assert!(stderr.contains(&format!("[s{server}] server")), "{stderr}");
    }
    let left = cluster.wait_none_running("logistic_ps", Duration::from_secs(5));
    assert!(left.is_empty(), "left running (host, pid): {left:?}");
}

#[test]
fn a_host_whose_sshd_is_down_is_named_within_seconds() {
    let Some(cluster) = Cluster::up(3) else {
        return;
    };
    cluster.stop_sshd(2);
    let command = launch(
        &cluster,
        3,
        &[],
        "netns_worker",
        &["env", "--iters", "0", "--timeout", "20"],
    );
    let (out, took) = run_bounded(command, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        took < Duration::from_secs(20),
        "took {took:?} to name the host:\n{stderr}"
    );
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("switchyard: "))
        .unwrap_or_default();
    assert!(
        last.contains("rank 2 on node2 exited with exit status: 255")
            && last.contains("ssh's own failure"),
        "the error does not name the rank, the host and ssh: {last:?}\n{stderr}"
    );
    // ssh's own message, under the rank's prefix.
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("[2] ") && l.contains("Connection refused")),
        "{stderr}"
    );
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(10));
    assert!(left.is_empty(), "left running (host, pid): {left:?}");
}

/// `ssh` exits with 255 for its own failures and for a remote program killed by a
/// signal alike: the remote side's report tells a rank killed by SIGKILL (the OOM
/// killer's signal) or SIGABRT apart from a host that refused.
#[test]
fn a_rank_killed_by_a_signal_is_not_blamed_on_ssh() {
    let Some(cluster) = Cluster::up(2) else {
        return;
    };
    for (signal, name) in [("KILL", "SIGKILL"), ("ABRT", "SIGABRT")] {
        let script = format!("[ \"$DMLC_TASK_ID\" = 1 ] && kill -{signal} $$; exec sleep 20");
        let command = launch_path(&cluster, 2, &[], "sh".as_ref(), &["-c", &script]);
        let (out, took) = run_bounded(command, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(took < Duration::from_secs(15), "took {took:?}:\n{stderr}");
        let last = stderr
            .lines()
            .rev()
            .find(|l| l.starts_with("switchyard: "))
            .unwrap_or_default();
        assert!(
            last.contains("rank 1 on node1 exited with")
                && last.contains(&format!("the program was killed by {name}"))
                && !last.contains("ssh's own failure"),
            "{name}: {last:?}\n{stderr}"
        );
        // The report is the launcher's, not the job's output.
        assert!(!stderr.contains("switchyard-remote-status"), "{stderr}");
    }
}

/// Starts a 3-rank job that runs until stopped, and waits until every rank has
/// joined. The ranks print nothing after that: a remote process that writes would
/// die of SIGPIPE once its `ssh` is gone, and hide an orphan that a silent one (a
/// long computation) shows.
/// With `wrapped`, each rank is a shell that starts the worker and waits for it (as
/// a job script or a Python parent does), and stopping the shell alone would leave
/// the worker running.
fn running_job(cluster: &Cluster, wrapped: bool) -> (ChildGuard, mpsc::Receiver<String>) {
    let worker = example("netns_worker");
    let worker_args = [
        "env",
        "--iters",
        "0",
        "--timeout",
        "20",
        "--progress",
        "1000000000000",
    ];
    let mut command = if wrapped {
        let mut args = vec!["-c", "\"$0\" \"$@\" & wait", worker.to_str().unwrap()];
        args.extend(worker_args);
        launch_path(cluster, 3, &[], "sh".as_ref(), &args)
    } else {
        launch(cluster, 3, &[], "netns_worker", &worker_args)
    };
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard(Some(command.spawn().expect("spawn the launcher")));
    let child = guard.0.as_mut().unwrap();
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let mut seen = Vec::new();
    let mut joined = [false; 3];
    let by = Instant::now() + Duration::from_secs(60);
    while joined.contains(&false) {
        let Ok(line) = rx.recv_timeout(by.saturating_duration_since(Instant::now())) else {
            panic!("the job did not get going: {seen:#?}");
        };
        for (t, j) in joined.iter_mut().enumerate() {
            *j |= line.starts_with(&format!("[{t}] joined "));
        }
        seen.push(line);
    }
    assert_eq!(cluster.running(&example("netns_worker")).len(), 3);
    (guard, rx)
}

/// Waits up to `limit` for the launcher to exit.
fn exit_within(guard: &mut ChildGuard, limit: Duration) -> ExitStatus {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = guard.0.as_mut().unwrap().try_wait().unwrap() {
            guard.0 = None;
            return status;
        }
        assert!(
            Instant::now() < until,
            "the launcher still runs after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_on_the_launcher_ends_every_remote_process() {
    ctrl_c_ends_every_remote_process(false);
}

#[test]
fn ctrl_c_on_the_launcher_ends_what_each_remote_program_started() {
    ctrl_c_ends_every_remote_process(true);
}

/// Ctrl-C on the launcher of a [`running_job`]: it exits with 130 and nothing runs
/// the worker on any host.
fn ctrl_c_ends_every_remote_process(wrapped: bool) {
    let Some(cluster) = Cluster::up(3) else {
        return;
    };
    let (mut guard, rx) = running_job(&cluster, wrapped);
    let pid = guard.0.as_ref().unwrap().id();
    let sent = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = exit_within(&mut guard, Duration::from_secs(20));
    // The reader threads may still be forwarding what the launcher wrote before it
    // exited: read until they end (both pipes closed), for 5 s at most.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut lines: Vec<String> = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
    assert_eq!(status.code(), Some(130), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("interrupted by SIGINT")),
        "{lines:#?}"
    );
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "left running after Ctrl-C (host, pid): {left:?}"
    );
}

#[test]
fn a_killed_launcher_leaves_no_remote_process() {
    let Some(cluster) = Cluster::up(3) else {
        return;
    };
    let (mut guard, _rx) = running_job(&cluster, false);
    // SIGKILL: the launcher stops nothing itself; its ssh sessions' input closes.
    guard.0.as_mut().unwrap().kill().unwrap();
    let _ = exit_within(&mut guard, Duration::from_secs(5));
    // The grace (3 s) for the workers' SIGTERM, and time for ssh to notice.
    let left = cluster.wait_none_running("netns_worker", Duration::from_secs(15));
    assert!(
        left.is_empty(),
        "left running after the launcher died (host, pid): {left:?}"
    );
}
