//! What a newcomer meets first: the README's one `use` brings the
//! collectives, a launch of zero processes names the option that is wrong, and a
//! program started without a launcher says that it runs alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in the child that [`started_by_hand_says_it_is_a_world_of_one`] starts.
const CHILD: &str = "SWITCHYARD_NEWCOMER_TEST_CHILD";

#[test]
fn prelude_brings_the_collectives() -> Result<(), Box<dyn std::error::Error>> {
    use switchyard::prelude::*;
    let mut comm = Communicator::solo();
    let mut grad = [1.5f32, 2.5];
    comm.allreduce(&mut grad, ReduceOp::Sum)?;
    assert_eq!(grad, [1.5, 2.5]);
    assert_eq!(comm.options().timeout, CommOptions::default().timeout);
    let err: Result<(), CollectiveError> = comm.broadcast(&mut grad, 3);
    assert!(matches!(err, Err(CollectiveError::InvalidArgument { .. })));
    Ok(())
}

#[test]
fn launching_zero_processes_names_the_option() {
    let err = switchyard_launch::run_local(&switchyard_launch::LaunchOptions::new(0, "true"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("processes"), "{err}");
    assert!(!err.contains("SWITCHYARD_WORLD_SIZE"), "{err}");
}

#[test]
fn started_by_hand_says_it_is_a_world_of_one() {
    if std::env::var_os(CHILD).is_some() {
        let comm = switchyard::collective::Communicator::from_env().unwrap();
        assert_eq!(comm.world_size(), 1);
        // A second communicator does not repeat the notice.
        let again = switchyard::collective::Communicator::from_env().unwrap();
        assert_eq!(again.world_size(), 1);
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .arg(support::test_name(
            module_path!(),
            "started_by_hand_says_it_is_a_world_of_one",
        ))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in std::env::vars_os().map(|(k, _)| k) {
        let name = var.to_string_lossy();
        if name.starts_with("SWITCHYARD_")
            || name.starts_with("OMPI_")
            || name.starts_with("PMI")
            || name.starts_with("SLURM_")
        {
            child.env_remove(&var);
        }
    }
    let mut child = child.spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child test ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("running as a world of one rank").count(),
        1,
        "{stderr}"
    );
}

/// The Rust blocks of the README and of the guide (`docs/guide/`) are whole programs a
/// newcomer can paste: each has its own visible `fn main` and none hides lines
/// from the reader with rustdoc's `# `. They compile and run as the crate's doc tests
/// (`src/lib.rs` includes the README and every guide page).
#[test]
fn readme_rust_blocks_are_whole_programs() {
    macro_rules! page {
        ($path:literal) => {
            ($path, include_str!(concat!("../../", $path)))
        };
    }
    let pages = [
        page!("README.md"),
        page!("docs/guide/launching.md"),
        page!("docs/guide/collectives.md"),
        page!("docs/guide/parameter-server.md"),
        page!("docs/guide/several-hosts.md"),
        page!("docs/guide/tracker.md"),
        page!("docs/guide/robust-mode.md"),
        page!("docs/guide/python.md"),
        page!("docs/guide/job-secret.md"),
        page!("docs/guide/mpi.md"),
        page!("docs/guide/sockets.md"),
    ];
    let mut blocks = Vec::new();
    for (page, text) in pages {
        let mut current: Option<Vec<&str>> = None;
        for line in text.lines() {
            match &mut current {
                None if line.starts_with("```rust") => current = Some(Vec::new()),
                None => {}
                Some(_) if line.starts_with("```") => {
                    blocks.extend(current.take().map(|block| (page, block)))
                }
                Some(block) => block.push(line),
            }
        }
    }
    assert!(blocks.len() >= 4, "{} Rust blocks", blocks.len());
    assert!(
        blocks.iter().any(|(page, _)| *page == "README.md"),
        "no Rust block in the README"
    );
    for (page, block) in &blocks {
        let text = block.join("\n");
        assert!(
            block.iter().any(|l| l.starts_with("fn main(")),
            "no visible fn main in {page}:\n{text}"
        );
        assert!(
            !block.iter().any(|l| *l == "#" || l.starts_with("# ")),
            "lines hidden from the reader in {page}:\n{text}"
        );
    }
}
