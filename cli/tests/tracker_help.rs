//! `switchyard tracker --help` tells how the tracker treats the job secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn the_help_says_the_tracker_honours_the_job_secret_and_xgboost_must_leave_it_unset() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["tracker", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap().replace('\n', " ");
    for needle in [
        "the tracker honours the job secret",
        "SWITCHYARD_JOB_SECRET_FILE",
        "for XGBoost jobs leave both variables unset",
    ] {
        assert!(help.contains(needle), "no {needle:?} in {help}");
    }
}
