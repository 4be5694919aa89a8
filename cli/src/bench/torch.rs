//! `switchyard bench torch --python PYTHON`: `torch.distributed` with the backend
//! "switchyard" (`python/switchyard/torch.py`) beside Gloo, in the same run.
//!
//! For each world size (`-n`, 2 and 4 by default) the coordinator launches
//! `python -m switchyard._torch_bench` through `switchyard launch` (importing
//! `switchyard.torch` there sets torchrun's variables, so both backends join through
//! `env://`), once with `--backend switchyard` and once with `--backend gloo`,
//! [`LAUNCHES`] times each, the side that goes first alternating. Each job times
//! `all_reduce` (f32 SUM), `broadcast`, `all_gather_into_tensor` (size = the gathered
//! total) and `reduce_scatter_tensor` (size = the whole input) at every size, and a DDP
//! training step of an MLP of 8.4 M parameters (size = the parameters' bytes); rank 0
//! writes the slowest rank's median time per call. Rows keep, per case, the median of
//! the launches, with Gloo as the baseline and `ratio` = Gloo's time / switchyard's.
//! The ranks run with one compute thread each (`OMP_NUM_THREADS=1`) and Gloo over
//! loopback (`GLOO_SOCKET_IFNAME=lo`).

use super::Row;
use super::report::human_size;
use clap::Args;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use switchyard_launch::{LaunchOptions, run_local};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The `torch.distributed` calls measured at every size, as the Python worker names them.
const CALLS: [&str; 4] = [
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
];

/// The training step, measured once per job.
const DDP_STEP: &str = "ddp_step";

/// Launches of each backend per world size in a full run; `--quick` makes one each,
/// a check that everything runs more than a figure to quote.
const LAUNCHES: usize = 3;

/// Set for every rank: torch's and numpy's thread pools would otherwise put several
/// compute threads per rank on the host's cores; Gloo runs over loopback.
const RANK_ENV: [(&str, &str); 3] = [
    ("OMP_NUM_THREADS", "1"),
    ("OPENBLAS_NUM_THREADS", "1"),
    ("GLOO_SOCKET_IFNAME", "lo"),
];

/// Flags of `bench torch`.
#[derive(Args, Debug, Clone)]
pub(crate) struct TorchArgs {
    #[command(flatten)]
    pub(crate) common: super::Common,
    /// A Python interpreter with torch and the switchyard package installed
    /// (`pip install ./python torch`). Also `SWITCHYARD_PYTHON`.
    #[arg(long, value_name = "PYTHON")]
    pub(crate) python: Option<PathBuf>,
    /// World sizes, each a job of its own (`-n 2,4` or `-n 2 -n 4`).
    #[arg(short = 'n', long = "processes", value_delimiter = ',', default_values_t = [2, 4])]
    pub(crate) processes: Vec<usize>,
}

/// One timed item of a job's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    call: &'static str,
    size: u64,
    iters: usize,
    reps: usize,
}

impl Item {
    /// `CALL:SIZE:ITERS:REPS`, as `python -m switchyard._torch_bench --plan` reads it.
    fn plan_text(&self) -> String {
        format!("{}:{}:{}:{}", self.call, self.size, self.iters, self.reps)
    }
}

fn sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![8, 256 << 10, 4 << 20]
    } else {
        vec![8, 4 << 10, 256 << 10, 4 << 20, 64 << 20]
    }
}

/// The items of a job: every call at every size, then the DDP step; `only` keeps the
/// items whose `CALL-SIZE` (`all_reduce-4 MiB`, `ddp_step`) contains it. Calls per
/// repetition: about 1 MiB of data (512 KiB with `--quick`), between 1 and 20 (10), so
/// that a full run of both backends at n = 2 and 4 takes 2 minutes on 2 idle cores and
/// up to 3-4 beside other builds (Gloo's small calls at n = 4 take 1-5 ms there), a
/// quick one 30 s to a minute; much of it is starting Python and torch.
fn plan(quick: bool, only: Option<&str>) -> Vec<Item> {
    let (budget, most): (u64, u64) = if quick {
        (512 << 10, 10)
    } else {
        (1 << 20, 20)
    };
    let selected = |name: &str| only.is_none_or(|only| name.contains(only));
    let mut items = Vec::new();
    for call in CALLS {
        for size in sizes(quick) {
            if !selected(&format!("{call}-{}", human_size(size))) {
                continue;
            }
            let iters = (budget / size).clamp(1, most) as usize;
            let reps = if quick || size >= 64 << 20 { 3 } else { 5 };
            items.push(Item {
                call,
                size,
                iters,
                reps,
            });
        }
    }
    if selected(DDP_STEP) {
        items.push(Item {
            call: DDP_STEP,
            size: 0,
            iters: 1,
            reps: if quick { 3 } else { 5 },
        });
    }
    items
}

fn plan_text(items: &[Item]) -> String {
    items
        .iter()
        .map(Item::plan_text)
        .collect::<Vec<_>>()
        .join(",")
}

/// What one job's rank 0 wrote: `(call, size, seconds)` per item, in plan order.
type Times = Vec<(String, u64, f64)>;

/// Reads the `CALL SIZE SECONDS` lines of a job's rank 0.
fn parse_times(text: &str) -> Result<Times> {
    let mut times = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [call, size, secs] = parts[..] else {
            return Err(format!("bench torch: cannot read the worker's line {line:?}").into());
        };
        times.push((call.to_string(), size.parse()?, secs.parse()?));
    }
    Ok(times)
}

/// Per `(call, size)`, the median of the launches that measured it, in the order the
/// first launch lists them.
fn medians(launches: &[Times]) -> Times {
    let mut order = Vec::new();
    let mut by_key: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for (call, size, secs) in launches.iter().flatten() {
        let key = (call.clone(), *size);
        if !by_key.contains_key(&key) {
            order.push(key.clone());
        }
        by_key.entry(key).or_default().push(*secs);
    }
    order
        .into_iter()
        .filter_map(|key| {
            let secs = super::median(by_key.remove(&key)?);
            Some((key.0, key.1, secs))
        })
        .collect()
}

/// The rows of world size `n`: switchyard's time per call as `ours`, Gloo's as the
/// baseline (ratio above 1: switchyard is faster).
fn rows(n: usize, ours: &Times, gloo: &Times) -> Vec<Row> {
    ours.iter()
        .filter_map(|(call, size, secs)| {
            let (_, _, theirs) = gloo.iter().find(|(c, s, _)| c == call && s == size)?;
            Some(Row::lower_better(
                "torch",
                &format!("n{n}-{call}"),
                *size,
                "seconds",
                *secs,
                *theirs,
                "gloo",
            ))
        })
        .collect()
}

/// Checks that `python` can run the worker: torch with `torch.distributed`, and the
/// switchyard package with its torch backend.
fn check_python(python: &Path) -> Result<()> {
    let probe = |code: &str| {
        Command::new(python)
            .args(["-c", code])
            .output()
            .map_err(|e| format!("bench torch: cannot run {} ({e})", python.display()))
    };
    let last_line = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stderr);
        text.lines().last().unwrap_or("").trim().to_string()
    };
    let torch = probe(
        "import torch.distributed as d; assert d.is_available(), 'torch.distributed is not available'",
    )?;
    if !torch.status.success() {
        return Err(format!(
            "bench torch: {} has no usable torch ({}): install torch into that interpreter (pip install torch)",
            python.display(),
            last_line(&torch)
        )
        .into());
    }
    let package = probe("import switchyard._torch_bench")?;
    if !package.status.success() {
        return Err(format!(
            "bench torch: {} cannot import switchyard.torch ({}): pip install ./python",
            python.display(),
            last_line(&package)
        )
        .into());
    }
    Ok(())
}

/// One job of `n` ranks on `backend`; returns what its rank 0 wrote. A job that fails
/// after its rank 0 wrote every item's time (torch 2.15's Gloo rank now and then
/// aborts in its teardown, "terminate called without an active exception": 3 of some
/// 50 launches here) keeps its times, with a note on stderr.
fn launch(python: &Path, backend: &str, n: usize, plan: &[Item], out: &Path) -> Result<Times> {
    let _ = std::fs::remove_file(out);
    let args = [
        "-m",
        "switchyard._torch_bench",
        "--backend",
        backend,
        "--out",
        &out.display().to_string(),
        "--plan",
        &plan_text(plan),
    ];
    let mut options = LaunchOptions::new(n as u32, python.display().to_string())
        .with_args(args.iter().map(|a| a.to_string()).collect())
        .with_timeout(Duration::from_secs(1800));
    for (key, value) in RANK_ENV {
        options = options.with_env(key, value);
    }
    let ran = run_local(&options);
    let times = std::fs::read_to_string(out)
        .map_err(Box::from)
        .and_then(|t| parse_times(&t));
    match (ran, times) {
        (Ok(()), times) => times.map_err(|e| {
            format!(
                "bench torch: the {backend} job of {n} ranks wrote no times in {}: {e}",
                out.display()
            )
            .into()
        }),
        (Err(e), Ok(times)) if times.len() == plan.len() => {
            eprintln!(
                "bench torch: the {backend} job of {n} ranks failed after writing its times ({e}); keeping them"
            );
            Ok(times)
        }
        (Err(e), _) => Err(format!("bench torch: the {backend} job of {n} ranks: {e}").into()),
    }
}

pub(crate) fn run(args: TorchArgs) -> Result<()> {
    args.common.times_only("torch")?;
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var_os("SWITCHYARD_PYTHON").map(PathBuf::from))
        .ok_or("bench torch needs --python PYTHON (or SWITCHYARD_PYTHON): an interpreter with torch and the switchyard package")?;
    if let Some(&n) = args.processes.iter().find(|&&n| n < 2) {
        return Err(format!("bench torch: -n {n}: every world size must be at least 2").into());
    }
    check_python(&python)?;
    let items = plan(args.common.quick, args.common.only.as_deref());
    if items.is_empty() {
        return Err("bench torch: --only selects no case".into());
    }
    let launches = if args.common.quick { 1 } else { LAUNCHES };
    let scratch =
        std::env::temp_dir().join(format!("switchyard-bench-torch-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let mut rows_by_n = Vec::new();
    for &n in &args.processes {
        let (mut ours, mut gloo) = (Vec::new(), Vec::new());
        for k in 0..launches {
            // Each side goes first in turn, so that neither always meets the machine
            // as the other left it.
            for side in [k % 2, 1 - k % 2] {
                let (backend, into) = if side == 0 {
                    ("switchyard", &mut ours)
                } else {
                    ("gloo", &mut gloo)
                };
                if let Some(ns) = super::probe::core_round_trip_ns() {
                    eprintln!(
                        "bench torch: n = {n}, {backend}, launch {}: core-to-core round trip {ns:.0} ns",
                        k + 1
                    );
                }
                let out = scratch.join(format!("{backend}-n{n}-{k}"));
                into.push(launch(&python, backend, n, &items, &out)?);
            }
        }
        rows_by_n.push(rows(n, &medians(&ours), &medians(&gloo)));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    report(&rows_by_n.concat(), args.common.json, launches);
    Ok(())
}

/// A time in the unit that suits it.
fn human_time(secs: f64) -> String {
    match secs {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.2} ms", s * 1e3),
        s => format!("{:.1} us", s * 1e6),
    }
}

fn report(rows: &[Row], json: bool, launches: usize) {
    if json {
        for row in rows {
            row.emit(true);
        }
        return;
    }
    println!(
        "# torch.distributed on CPU tensors, one host; per call the slowest rank's median, median of {launches} launch(es) of each backend"
    );
    println!(
        "{:<28} {:>9} {:>12} {:>12} {:>7}",
        "case", "size", "switchyard", "gloo", "ratio"
    );
    for row in rows {
        println!(
            "{:<28} {:>9} {:>12} {:>12} {:>7.2}",
            row.case,
            human_size(row.size),
            human_time(row.ours),
            human_time(row.baseline),
            row.ratio
        );
    }
    println!("(ratio = gloo's time / switchyard's: above 1, switchyard is faster)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_names_every_call_at_every_size_then_the_ddp_step() -> Result<()> {
        let items = plan(false, None);
        assert_eq!(items.len(), CALLS.len() * 5 + 1);
        assert_eq!(items[0].plan_text(), "all_reduce:8:20:5");
        let big = items
            .iter()
            .find(|i| i.size == 64 << 20)
            .ok_or("no 64 MiB item")?;
        assert_eq!((big.iters, big.reps), (1, 3));
        let last = items.last().ok_or("no items")?;
        assert_eq!(last.plan_text(), "ddp_step:0:1:5");
        assert_eq!(plan(true, None).len(), CALLS.len() * 3 + 1);
        let text = plan_text(&plan(true, Some("broadcast-256 KiB")));
        assert_eq!(text, "broadcast:262144:2:3");
        assert_eq!(plan_text(&plan(true, Some("ddp"))), "ddp_step:0:1:3");
        Ok(())
    }

    #[test]
    fn rows_are_medians_of_launches_with_gloo_as_the_baseline() -> Result<()> {
        let launch = |secs: f64| {
            parse_times(&format!(
                "all_reduce 8 {secs}\nddp_step 33574912 {}\n",
                secs * 1e3
            ))
        };
        let ours = medians(&[launch(1e-5)?, launch(3e-5)?, launch(2e-5)?]);
        let gloo = medians(&[launch(4e-4)?, launch(2e-4)?, launch(3e-4)?]);
        let rows = rows(4, &ours, &gloo);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].case.as_str(), rows[0].size), ("n4-all_reduce", 8));
        assert_eq!((rows[0].ours, rows[0].baseline), (2e-5, 3e-4));
        assert!((rows[0].ratio - 15.0).abs() < 1e-9);
        assert_eq!(rows[1].case, "n4-ddp_step");
        let named = (rows[1].baseline_name.as_str(), rows[1].metric.as_str());
        assert_eq!(named, ("gloo", "seconds"));
        assert!(parse_times("all_reduce 8").is_err());
        Ok(())
    }
}
