//! The stable fuzz driver. See `docs/reference/fuzzing.md` and `fuzz/src/lib.rs`.
//!
//! ```text
//! fuzz [run] [--seconds S] [--iterations N] [--seed N] [--corpus DIR] [TARGET...]
//! fuzz seed [--corpus DIR]      write the seed corpus (fuzz/corpus/TARGET/seed-NN)
//! fuzz replay [--corpus DIR] [TARGET...]
//! fuzz list
//! ```
//!
//! `--seconds` is the whole run's time, shared evenly by the targets; with neither
//! `--seconds` nor `--iterations`, each target runs 100,000 inputs. A crash is written
//! to `fuzz/artifacts/TARGET/crash-HASH` and the driver exits with status 1.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use switchyard_fuzz::driver::{self, Budget};
use switchyard_fuzz::{corpus, Target, TARGETS};

struct Args {
    command: String,
    seconds: Option<f64>,
    iterations: Option<u64>,
    seed: u64,
    corpus: PathBuf,
    targets: Vec<&'static Target>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        command: "run".to_string(),
        seconds: None,
        iterations: None,
        seed: 0x5359_f022,
        corpus: corpus::default_dir(),
        targets: Vec::new(),
    };
    let mut words = std::env::args().skip(1);
    let mut first = true;
    while let Some(word) = words.next() {
        let mut value = |name: &str| words.next().ok_or(format!("{name} needs a value"));
        match word.as_str() {
            "run" | "seed" | "replay" | "list" if first => args.command = word,
            "--seconds" => {
                let v = value("--seconds")?;
                args.seconds = Some(
                    v.parse()
                        .map_err(|_| format!("--seconds {v:?}: not a number"))?,
                );
            }
            "--iterations" => {
                let v = value("--iterations")?;
                args.iterations = Some(
                    v.parse()
                        .map_err(|_| format!("--iterations {v:?}: not a count"))?,
                );
            }
            "--seed" => {
                let v = value("--seed")?;
                args.seed = v
                    .parse()
                    .map_err(|_| format!("--seed {v:?}: not a number"))?;
            }
            "--corpus" => args.corpus = PathBuf::from(value("--corpus")?),
            "-h" | "--help" => return Err(String::new()),
            name => {
                let target = TARGETS
                    .iter()
                    .find(|t| t.name == name)
                    .ok_or_else(|| format!("no target {name:?}; `fuzz list` names them"))?;
                args.targets.push(target);
            }
        }
        first = false;
    }
    if args.targets.is_empty() {
        args.targets = TARGETS.iter().collect();
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(why) => {
            if !why.is_empty() {
                eprintln!("fuzz: {why}");
            }
            eprintln!(
                "usage: fuzz [run|seed|replay|list] [--seconds S] [--iterations N] [--seed N] [--corpus DIR] [TARGET...]"
            );
            return ExitCode::from(2);
        }
    };
    let result = match args.command.as_str() {
        "list" => {
            for target in TARGETS {
                println!("{}", target.name);
            }
            Ok(())
        }
        "seed" => seed(&args),
        "replay" => fuzz(&args, 0, None),
        _ => {
            let iterations = args.iterations.unwrap_or(if args.seconds.is_some() {
                u64::MAX
            } else {
                100_000
            });
            let share = args
                .seconds
                .map(|s| Duration::from_secs_f64(s.max(0.0) / args.targets.len() as f64));
            fuzz(&args, iterations, share)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("fuzz: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Writes every target's seeds into the corpus folder.
fn seed(args: &Args) -> Result<(), String> {
    for target in &args.targets {
        let written = corpus::write_seeds(&args.corpus, target.name, &(target.seeds)())
            .map_err(|e| format!("writing seeds of {}: {e}", target.name))?;
        println!(
            "{}: {written} seeds in {}",
            target.name,
            args.corpus.join(target.name).display()
        );
    }
    Ok(())
}

/// Replays each target's corpus, then mutates it for `iterations` inputs or `share`
/// of time, whichever ends first.
fn fuzz(args: &Args, iterations: u64, share: Option<Duration>) -> Result<(), String> {
    for target in &args.targets {
        let inputs = corpus::read(&args.corpus, target.name)
            .map_err(|e| format!("reading the corpus of {}: {e}", target.name))?;
        let inputs: Vec<Vec<u8>> = inputs.into_iter().map(|(_, bytes)| bytes).collect();
        let started = Instant::now();
        let budget = Budget {
            iterations,
            deadline: share.map(|share| started + share),
        };
        match driver::run(target, &inputs, args.seed, budget) {
            Ok(report) => println!(
                "{}: {} inputs ({} from the corpus) in {:.1} s, {} outcomes, seed {}",
                target.name,
                report.executions,
                inputs.len(),
                started.elapsed().as_secs_f64(),
                report.labels,
                args.seed,
            ),
            Err(finding) => {
                let folder = corpus::artifacts_dir().join(target.name);
                let path = folder.join(corpus::hash_name(&finding.input));
                let saved = std::fs::create_dir_all(&folder)
                    .and_then(|()| std::fs::write(&path, &finding.input));
                let place = match saved {
                    Ok(()) => path.display().to_string(),
                    Err(e) => format!("nowhere ({e})"),
                };
                return Err(format!(
                    "{}: crash on a {}-byte input (saved to {place}; rerun with --seed {}): {}",
                    target.name,
                    finding.input.len(),
                    args.seed,
                    finding.message
                ));
            }
        }
    }
    Ok(())
}
