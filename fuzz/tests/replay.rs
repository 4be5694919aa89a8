//! Replays `fuzz/corpus/*` through every target as a normal test, checks that the checked-in seeds are what `fuzz seed` writes, and runs the
//! stable driver briefly so that its mutations are exercised on every `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchyard_fuzz::driver::{self, Budget};
use switchyard_fuzz::{corpus, TARGETS};

#[test]
fn corpus_replays_cleanly() {
    for target in TARGETS {
        let inputs = corpus::read(&corpus::default_dir(), target.name).unwrap();
        assert!(!inputs.is_empty(), "fuzz/corpus/{} is empty", target.name);
        for (path, input) in inputs {
            // A panic here names the file through the target's message; print it first.
            eprintln!("{}: {}", target.name, path.display());
            (target.run)(&input);
        }
    }
}

#[test]
fn checked_in_seeds_are_generated_ones() {
    for target in TARGETS {
        let folder = corpus::default_dir().join(target.name);
        for (index, seed) in (target.seeds)().iter().enumerate() {
            let path = folder.join(corpus::seed_name(index));
            let on_disk = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("{}: {e}; run `fuzz seed`", path.display()));
            assert_eq!(
                &on_disk,
                seed,
                "{} is stale; run `fuzz seed`",
                path.display()
            );
        }
    }
}

#[test]
fn driver_runs_deterministically() {
    for target in TARGETS {
        let seeds = (target.seeds)();
        let budget = Budget {
            iterations: 3000,
            deadline: None,
        };
        let first = driver::run(target, &seeds, 1, budget).unwrap();
        assert_eq!(first.executions, 3000 + seeds.len() as u64);
        assert!(first.labels > 1, "{}: {first:?}", target.name);
        assert_eq!(driver::run(target, &seeds, 1, budget).unwrap(), first);
    }
}

/// The driver reports a panicking target with the input that did it.
#[test]
fn driver_catches_a_panic() {
    fn picky(data: &[u8]) -> String {
        assert!(!data.starts_with(b"SY\x02\x00\x00"), "found it");
        "fine".to_string()
    }
    let target = switchyard_fuzz::Target {
        name: "picky",
        run: picky,
        seeds: Vec::new,
        max_len: 16,
    };
    let seeds = vec![b"SY\x02\x00\x01".to_vec()];
    let budget = Budget {
        iterations: 100_000,
        deadline: None,
    };
    let finding = driver::run(&target, &seeds, 3, budget).unwrap_err();
    assert!(finding.input.starts_with(b"SY\x02\x00\x00"), "{finding:?}");
    assert!(finding.message.contains("found it"), "{finding:?}");
}
