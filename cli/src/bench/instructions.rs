//! Instruction counts per message from valgrind's callgrind, beside the wall-clock
//! ratios: on a shared 2-core machine times swing by 2x between launches, while the
//! instructions a fixed workload executes barely move, so they are the measure to
//! choose between designs by (and times the one to report).
//!
//! Each case runs in a process of its own per side (ours, then the baseline) under
//! `valgrind --tool=callgrind`, twice: with `LOW` and with `HIGH` messages. The
//! difference of the two totals divided by `HIGH - LOW` is the cost of one message,
//! with start-up, connection set-up and teardown left out. Every thread of the
//! process counts (the sender, the receiver, libzmq's I/O thread): a message's whole
//! cost. Valgrind runs the threads one at a time, so a waiting thread's polls and
//! spins are part of the count; the rows say which side waits how.

use super::report::Row;
use std::path::Path;
use std::process::Command;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Messages of the shorter and the longer run (`quick`: a third as many).
fn counts(quick: bool) -> (usize, usize) {
    if quick {
        (1_000, 3_000)
    } else {
        (3_000, 9_000)
    }
}

/// Units (calls, rounds) of the shorter and the longer run of a workload whose unit
/// costs millions of instructions: `quick` counts `low` and `3 * low`, a full run
/// twice as many.
pub(crate) fn unit_counts(low: usize, quick: bool) -> (usize, usize) {
    let low = if quick { low } else { 2 * low };
    (low, 3 * low)
}

/// The total instructions (`Ir`) of `args` run by this executable under callgrind.
fn instructions_of(args: &[String]) -> Result<u64> {
    let exe = std::env::current_exe()?;
    let out_dir = std::env::temp_dir().join(format!(
        "switchyard-callgrind-{}-{}",
        std::process::id(),
        args.join("-").replace(['/', ' '], "_")
    ));
    std::fs::create_dir_all(&out_dir)?;
    let out_file = out_dir.join("callgrind.out");
    let run = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--dump-instr=no")
        .arg(&exe)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run valgrind (apt install valgrind): {e}"))?;
    let total = total_ir(&out_file);
    let _ = std::fs::remove_dir_all(&out_dir);
    if !run.status.success() {
        return Err(format!(
            "{} {} under callgrind failed ({}): {}",
            exe.display(),
            args.join(" "),
            run.status,
            String::from_utf8_lossy(&run.stderr)
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" / ")
        )
        .into());
    }
    total
}

/// The `summary:` (or `totals:`) line of a callgrind output file: its total `Ir`.
fn total_ir(path: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("no callgrind output at {}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no instruction total in {}", path.display()).into())
}

/// Instructions per unit of `one(count)`, the arguments that run one side of a case
/// with `count` units (messages, calls, rounds), from runs of `low` and `high` units.
fn per_unit(one: &dyn Fn(usize) -> Vec<String>, (low, high): (usize, usize)) -> Result<f64> {
    let a = instructions_of(&one(low))?;
    let b = instructions_of(&one(high))?;
    Ok(b.saturating_sub(a) as f64 / (high - low) as f64)
}

/// Instructions per message of both sides of a case, ours then the baseline: each
/// runs `switchyard bench RUNNER --side SIDE ARGS... --count N` (a hidden side runner).
pub(crate) fn both_sides(runner: &str, args: &[String], quick: bool) -> Result<(f64, f64)> {
    named_sides(runner, ["ours", "baseline"], args, counts(quick))
}

/// Instructions per unit of two sides of a case, named `sides` (ours first), each run
/// as `switchyard bench RUNNER --side SIDE ARGS... --count N` for both counts.
pub(crate) fn named_sides(
    runner: &str,
    sides: [&str; 2],
    args: &[String],
    counts: (usize, usize),
) -> Result<(f64, f64)> {
    let ours = one_side(runner, sides[0], args, counts)?;
    let baseline = one_side(runner, sides[1], args, counts)?;
    Ok((ours, baseline))
}

/// Instructions per unit of one side of a case: `switchyard bench RUNNER --side SIDE
/// ARGS... --count N` for both counts.
pub(crate) fn one_side(
    runner: &str,
    side: &str,
    args: &[String],
    counts: (usize, usize),
) -> Result<f64> {
    let one = |count: usize| -> Vec<String> {
        let mut all: Vec<String> = ["bench", runner, "--side", side].map(String::from).to_vec();
        all.extend(args.iter().cloned());
        all.extend(["--count".to_string(), count.to_string()]);
        all
    };
    per_unit(&one, counts)
}

/// A row of instructions per message, ours beside the baseline (fewer is better).
pub(crate) fn row(
    suite: &str,
    case: &str,
    size: u64,
    ours: f64,
    baseline: f64,
    baseline_name: &str,
) -> Row {
    unit_row(suite, case, size, "msg", ours, baseline, baseline_name)
}

/// A row of instructions per `unit` (`call`, `round`), ours beside the baseline.
pub(crate) fn unit_row(
    suite: &str,
    case: &str,
    size: u64,
    unit: &str,
    ours: f64,
    baseline: f64,
    baseline_name: &str,
) -> Row {
    Row::lower_better(
        suite,
        case,
        size,
        &format!("instructions_per_{unit}"),
        ours,
        baseline,
        baseline_name,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::total_ir;

    #[test]
    fn the_total_is_read_from_summary_or_totals() {
        let dir = std::env::temp_dir().join(format!("sy-cg-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out");
        std::fs::write(
            &file,
            "version: 1\nevents: Ir\nfn=main\n5 10\nsummary: 123456\n",
        )
        .unwrap();
        assert_eq!(total_ir(&file).unwrap(), 123_456);
        std::fs::write(&file, "events: Ir\ntotals: 42\n").unwrap();
        assert_eq!(total_ir(&file).unwrap(), 42);
        std::fs::write(&file, "events: Ir\n").unwrap();
        assert!(total_ir(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
