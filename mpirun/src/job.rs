//! Runs this test binary's ignored `in_mpi_job` tests under `mpirun`, bounded by a
//! timeout, and hands back what every rank printed.

// A test harness: a failure to spawn or wait is a failed test, reported by panicking.
#![allow(clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What an `mpirun` run left behind.
#[derive(Debug)]
pub struct JobOutput {
    /// Whether mpirun exited with status 0.
    pub success: bool,
    /// mpirun's exit code (`None` if a signal ended it).
    pub code: Option<i32>,
    /// What mpirun itself printed (its reports name failed ranks), then every rank's
    /// output under a `== rank R ==` line.
    pub output: String,
    /// Each rank's stdout and stderr, by rank, as the rank wrote them. Kept apart
    /// because ranks write at once: forwarded through mpirun, one rank's line can be
    /// cut by another's (libtest flushes `test result: ` before `ok`).
    pub ranks: Vec<String>,
    /// How long the job ran.
    pub elapsed: Duration,
}

/// OpenMPI 4's MCA variable for the directory under which mpirun makes its session
/// directory (default: the system's temporary directory).
const SESSION_BASE_VAR: &str = "OMPI_MCA_orte_tmpdir_base";

/// A directory of one job's own for OpenMPI's session directory. OpenMPI 4 makes its
/// top-level session directory (`/tmp/ompi.HOST.UID`) by checking, then calling
/// `mkdir`, and removes it when its last job ends; two mpiruns that start at the same
/// moment (the 2- and 3-rank jobs of one test binary, or two test binaries) can both
/// see it missing, and the slower one fails in `orte_init` ("File exists") before any
/// rank starts. A base per job leaves nothing to race for.
struct SessionBase(std::path::PathBuf);

impl SessionBase {
    fn create() -> SessionBase {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Short: OpenMPI puts Unix sockets under it, whose paths are limited to ~100 bytes.
        let path = std::env::temp_dir().join(format!("sy-mpi-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("a session directory for mpirun");
        SessionBase(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for SessionBase {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Each rank runs under `sh`, which sends its output to a file of its own named by its
/// rank (OpenMPI sets `OMPI_COMM_WORLD_RANK`, MPICH's hydra `PMI_RANK`) and then
/// becomes the test binary (`exec`), so MPI sees the binary itself.
const RANK_OUTPUT_SCRIPT: &str = r#"r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-x}}}"; exec "$0" "$@" > "$SWITCHYARD_RANK_OUTPUT/rank.$r" 2>&1"#;

/// The variable that tells [`RANK_OUTPUT_SCRIPT`] where to write.
const RANK_OUTPUT_VAR: &str = "SWITCHYARD_RANK_OUTPUT";

/// Runs `mpirun -np N <this test binary> --ignored --test-threads=1 FILTER` and waits
/// at most `timeout`; on timeout mpirun is terminated (which ends its ranks).
pub fn run_ranks(np: usize, filter: &str, timeout: Duration) -> JobOutput {
    run_ranks_with(np, filter, timeout, &[])
}

/// [`run_ranks`] with extra environment variables for every rank (mpirun's ranks on
/// this host inherit its environment).
pub fn run_ranks_with(
    np: usize,
    filter: &str,
    timeout: Duration,
    env: &[(&str, &str)],
) -> JobOutput {
    let exe = std::env::current_exe().expect("test binary path");
    // Dropped (and removed) when this function returns or unwinds.
    let session = SessionBase::create();
    let rank_output = session.path().join("out");
    std::fs::create_dir_all(&rank_output).expect("a directory for the ranks' output");
    let mut command = crate::command(np);
    command
        .args(["sh", "-c", RANK_OUTPUT_SCRIPT])
        .arg(exe)
        .args(["--ignored", "--test-threads=1", "--nocapture", filter])
        .env("RUST_BACKTRACE", "0")
        .env(RANK_OUTPUT_VAR, &rank_output)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.env(SESSION_BASE_VAR, session.path());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .expect("mpirun must be installed for the mpi feature's tests (apt install openmpi-bin)");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break Some(status);
        }
        if started.elapsed() > timeout {
            // SIGTERM lets mpirun take its ranks down; SIGKILL if it does not.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let ranks: Vec<String> = (0..np)
        .map(|rank| {
            std::fs::read_to_string(rank_output.join(format!("rank.{rank}"))).unwrap_or_default()
        })
        .collect();
    let mut output = format!(
        "{}{}",
        out_reader.join().unwrap_or_default(),
        err_reader.join().unwrap_or_default()
    );
    for (rank, text) in ranks.iter().enumerate() {
        output.push_str(&format!("== rank {rank} ==\n{text}"));
    }
    match status {
        Some(status) => JobOutput {
            success: status.success(),
            code: status.code(),
            output,
            ranks,
            elapsed,
        },
        None => panic!("mpirun -np {np} {filter} ran past {timeout:?}; output:\n{output}"),
    }
}

/// Runs the filter under mpirun and fails the test with every rank's output if the
/// job failed or ran no test.
pub fn expect_ranks_pass(np: usize, filter: &str, timeout: Duration) {
    expect_ranks_pass_with(np, filter, timeout, &[]);
}

/// [`expect_ranks_pass`] with extra environment variables for every rank.
pub fn expect_ranks_pass_with(np: usize, filter: &str, timeout: Duration, env: &[(&str, &str)]) {
    let job = run_ranks_with(np, filter, timeout, env);
    assert!(
        job.success,
        "mpirun -np {np} {filter} failed ({:?}):\n{}",
        job.code, job.output
    );
    for (rank, text) in job.ranks.iter().enumerate() {
        assert!(
            text.contains("test result: ok"),
            "rank {rank} did not report a passing test run:\n{}",
            job.output
        );
        assert!(
            !text.contains(" 0 passed"),
            "the filter {filter} matched no test on rank {rank}:\n{}",
            job.output
        );
    }
}
