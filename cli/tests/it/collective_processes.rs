//! The collectives between real processes: the `allreduce` example under
//! `switchyard launch` (mesh over ZeroMQ control and the TCP data path), for several
//! world sizes, each rank checking a closed form.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::{example, run_bounded, switchyard};

#[test]
fn allreduce_example_across_processes() {
    for n in [1, 2, 3, 4, 5, 7] {
        let mut cmd = switchyard();
        cmd.args(["launch", "-n", &n.to_string(), "--timeout", "120", "--"])
            .arg(example("allreduce"));
        let (out, _) = run_bounded(cmd, Duration::from_secs(180));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "n={n}\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for r in 0..n {
            assert!(
                stdout.contains(&format!("[{r}] rank {r} of {n}: 5 steps")),
                "n={n}: {stdout}"
            );
        }
    }
}

#[test]
fn allreduce_example_over_the_zeromq_data_path() {
    let mut cmd = switchyard();
    cmd.env("SWITCHYARD_DATA_PATH", "zmq")
        .args(["launch", "-n", "3", "--timeout", "120", "--"])
        .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(180));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `launch --interface NAME` reaches every process as SWITCHYARD_IFNAME: the mesh binds
/// that interface (here loopback by name), and a name that matches nothing is an error
/// naming it, not a silent fallback.
#[test]
fn launch_interface_picks_the_mesh_interface() {
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "2",
        "--interface",
        "lo",
        "--timeout",
        "120",
        "--",
    ])
    .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[1] rank 1 of 2: 5 steps"), "{stdout}");

    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "2",
        "--interface",
        "nosuchif0",
        "--timeout",
        "60",
        "--",
    ])
    .arg(example("allreduce"));
    let (out, _) = run_bounded(cmd, Duration::from_secs(120));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("nosuchif0"), "{all}");
}
