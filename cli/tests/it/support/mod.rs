//! Helpers shared by the command's integration tests: bounded child processes, the
//! `switchyard` binary, the facade's examples, and `mpirun`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `mpirun` commands with the OpenMPI settings, from the workspace's one helper.
#[allow(unused_imports)]
pub(crate) use switchyard_mpirun as mpirun;

/// Kills and reaps the child if the test fails before it exits.
pub(crate) struct ChildGuard(pub(crate) Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `command` to completion or kills it after `limit`, returning its output and
/// how long it ran.
pub(crate) fn run_bounded(mut command: Command, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut guard = ChildGuard(Some(child));
    loop {
        let child = guard.0.as_mut().unwrap();
        if child.try_wait().expect("try_wait").is_some() {
            let output = guard.0.take().unwrap().wait_with_output().expect("output");
            return (output, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "{command:?} still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `switchyard` binary cargo built for these tests.
pub(crate) fn switchyard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// An example of the facade package, built for this test binary's features and
/// profile into its target directory.
pub(crate) fn example(name: &str) -> PathBuf {
    static EXAMPLES: OnceLock<PathBuf> = OnceLock::new();
    let path = EXAMPLES.get_or_init(build_examples).join(name);
    assert!(path.exists(), "{} is not built", path.display());
    path
}

/// Runs `cargo build -p switchyard --examples` once per test binary and returns the
/// examples' folder.
///
/// The examples belong to the facade (`cargo run --example` at the root finds them),
/// not to this package, so `cargo test -p switchyard-cli` would not build them, and a
/// copy left by an earlier build may predate the library under test. Cargo is quick
/// when they are fresh, as they are under `cargo test --workspace`.
fn build_examples() -> PathBuf {
    // <target dir>/<profile dir>/switchyard
    let bin = Path::new(env!("CARGO_BIN_EXE_switchyard"));
    let profile_dir = bin.parent().expect("the binary's folder");
    let target_dir = profile_dir.parent().expect("the target folder");
    let examples = profile_dir.join("examples");
    let Some(cargo) = std::env::var_os("CARGO") else {
        // Run by hand rather than by cargo: the examples as the last build left them.
        return examples;
    };
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("odd profile folder {}", profile_dir.display()),
    };
    // The facade's features as this package forwards them, so that the examples link
    // the backends the tests expect (tests/mpi.rs needs the MPI backend in them).
    let features: Vec<&str> = [
        ("zmq", cfg!(feature = "zmq")),
        ("mpi", cfg!(feature = "mpi")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "switchyard", "--examples", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--no-default-features")
        .arg(format!("--features={}", features.join(",")));
    let (out, _) = run_bounded(command, Duration::from_secs(1800));
    assert!(
        out.status.success(),
        "building the examples failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    examples
}

/// The name the test harness gives test `name` of the module at `module` (pass
/// `module_path!()`): its path without the binary's own name. A test that re-runs this
/// binary as a child with `--exact` must name itself so, since every test file is a
/// module of one binary.
pub(crate) fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_binary, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// The factor by which soaks and sweeps repeat or grow: `SWITCHYARD_TEST_SCALE`, 1
/// (what CI runs) when unset. A nightly-style run raises it; a value that is not a
/// positive integer fails the test rather than quietly running at scale 1.
pub(crate) fn scale() -> u64 {
    match std::env::var("SWITCHYARD_TEST_SCALE") {
        Err(_) => 1,
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("SWITCHYARD_TEST_SCALE={text:?}: expected a positive integer"),
        },
    }
}

/// The `test accuracy P%` that `examples/logistic_ps.rs` prints, as a percentage;
/// fails the test, showing `text`, when there is none.
pub(crate) fn test_accuracy(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.split("test accuracy ").nth(1))
        .and_then(|rest| rest.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no test accuracy line in:\n{text}"))
}
