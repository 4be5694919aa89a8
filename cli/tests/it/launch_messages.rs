//! `switchyard launch` errors name the command's flags, not the library's Rust names:
//! `--timeout` for the job's time limit, `--hostfile` (with no odd empty value) for a
//! missing or misplaced hostfile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Runs `switchyard launch ARGS`, which must fail, and returns its standard error.
fn failed_launch(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("launch")
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

#[test]
fn the_job_time_limit_error_names_the_timeout_flag() {
    let stderr = failed_launch(&["-n", "1", "--timeout", "1", "--", "sleep", "30"]);
    assert!(stderr.contains("its time limit (--timeout)"), "{stderr}");
    assert!(!stderr.contains("LaunchOptions"), "{stderr}");
}

#[test]
fn ssh_without_a_hostfile_names_the_missing_flag_plainly() {
    let stderr = failed_launch(&["-n", "1", "--launcher", "ssh", "--", "true"]);
    assert!(
        stderr.contains("switchyard: --hostfile: --launcher ssh needs --hostfile"),
        "{stderr}"
    );
    assert!(!stderr.contains("= :"), "{stderr}");
}

#[test]
fn a_hostfile_for_a_local_job_is_named_with_its_flag_and_path() {
    let stderr = failed_launch(&["-n", "1", "--hostfile", "/etc/hosts", "--", "true"]);
    assert!(
        stderr.contains("--hostfile /etc/hosts: a hostfile needs --launcher ssh, slurm or mpi"),
        "{stderr}"
    );
    assert!(!stderr.contains("launch option"), "{stderr}");
}

#[test]
fn an_unknown_launcher_is_named_once_with_the_choices() {
    let stderr = failed_launch(&["-n", "1", "--launcher", "foo", "--", "true"]);
    assert!(
        stderr.contains("expected one of local, ssh, slurm, mpi"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("foo").count(), 1, "{stderr}");
}

#[test]
fn a_zero_timeout_is_refused_before_anything_starts() {
    for flag in ["--timeout", "--rendezvous-timeout"] {
        let stderr = failed_launch(&["-n", "1", flag, "0", "--", "true"]);
        assert!(stderr.contains(flag), "{stderr}");
        assert!(!stderr.contains("running"), "{stderr}");
    }
}
