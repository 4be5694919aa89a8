//! `switchyard launch --servers S`: a parameter-server job, with the scheduler served
//! by the launcher (DMLC_PS_ROOT_URI/PORT) as ps-lite's launcher serves it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;
use support::{example, run_bounded, switchyard};

#[test]
fn logistic_regression_trains_under_launch_with_two_servers() {
    let mut cmd = switchyard();
    cmd.args([
        "launch",
        "-n",
        "4",
        "--servers",
        "2",
        "--timeout",
        "120",
        "--",
    ])
    .arg(example("logistic_ps"))
    .args(["--rounds", "12"]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let accuracy: f64 = stdout
        .lines()
        .find_map(|l| l.split("test accuracy ").nth(1))
        .and_then(|rest| rest.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no test accuracy line in:\n{stdout}"));
    assert!(accuracy >= 90.0, "accuracy {accuracy}%:\n{stdout}");
    // Both servers served and exited cleanly (their reports go to stderr).
    let stderr = String::from_utf8_lossy(&out.stderr);
    for s in ["s0", "s1"] {
        assert!(stderr.contains(&format!("[{s}] server")), "{stderr}");
    }
}
