//! The command's help: `switchyard tracker --help` tells how the tracker treats the job
//! secret, the top-level help names every command in one line each, no help line is
//! wider than 100 columns; and the bench flags the help describes behave so:
//! `--python` is refused where it would be ignored, the SVG chart is written only with
//! `--svg`.
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

/// The command's help output for `args`, checked to have succeeded.
fn help(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .env_remove("COLUMNS")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_top_level_help_lists_launch_tracker_and_bench_on_one_line_each() {
    let top = help(&["--help"]);
    for command in ["launch", "tracker", "bench"] {
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{command} ")))
            .unwrap_or_else(|| panic!("no {command:?} line in {top}"));
        let description = line.trim_start()[command.len()..].trim();
        assert!(
            !description.is_empty(),
            "{command} has no description in {top}"
        );
        // One line: the next line is another command, not a continuation.
        let next = top.lines().skip_while(|l| *l != line).nth(1).unwrap_or("");
        assert!(
            !next.starts_with("           "),
            "{command}'s description wraps: {top}"
        );
    }
    let about = top.lines().next().unwrap_or("");
    assert!(
        about.contains("tracker"),
        "the first line does not mention the tracker: {top}"
    );
}

#[test]
fn help_lines_are_wrapped_to_at_most_100_columns() {
    for args in [
        &["--help"][..],
        &["launch", "--help"],
        &["tracker", "--help"],
        &["bench", "--help"],
        &["bench", "allreduce", "--help"],
        &["bench", "robust", "--help"],
        &["launch", "-h"],
        &["tracker", "-h"],
    ] {
        for line in help(args).lines() {
            assert!(
                line.chars().count() <= 100,
                "{args:?}: {} columns: {line}",
                line.len()
            );
        }
    }
}

#[test]
fn bench_suites_that_only_time_refuse_instructions() {
    for suite in ["allreduce", "reduce-scatter", "tracker"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["bench", suite, "--quick", "--instructions"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{suite}: {stderr}");
        assert!(
            stderr.contains("measures times only; --instructions is implemented for"),
            "{suite}: {stderr}"
        );
    }
}

#[test]
fn bench_broadcast_and_allgather_refuse_python() {
    for op in ["broadcast", "allgather"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["bench", op, "--mesh-only", "--python", "python3"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{op}: {stderr}");
        assert!(
            stderr.contains("--python is for `bench allreduce` only"),
            "{op}: {stderr}"
        );
    }
}

#[test]
fn bench_writes_its_svg_chart_only_when_asked() {
    let dir = std::env::temp_dir().join(format!("switchyard-svg-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bench = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args([
                "bench",
                "broadcast",
                "-n",
                "2",
                "--mesh-only",
                "--quick",
                "--only",
                "8 B",
            ])
            .args(extra)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {out:?}");
    };
    bench(&[]);
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(files.is_empty(), "written unasked: {files:?}");
    let chart = dir.join("chart.svg");
    bench(&["--svg", chart.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&chart).unwrap().contains("<svg"));
    std::fs::remove_dir_all(&dir).unwrap();
}
