//! `switchyard bench allreduce|broadcast|allgather|reduce-scatter -n N`: the mesh
//! engine beside MPI's own collectives (`MPI_Reduce_scatter_block` for
//! reduce-scatter, size = the whole input), nccl-tests style.
//!
//! The coordinating process starts `N` copies of itself through `switchyard launch`
//! (the mesh) and under `mpirun -np N` with MPI's defaults (shared memory on one
//! host), alternately, [`ALTERNATIONS`] times each, then the mesh with shared memory
//! off and `mpirun` restricted to TCP (`btl tcp,self`) once each. In each job every
//! rank times the same sizes; rank 0 writes the slowest rank's median time per size
//! to a file the coordinator reads; a series of several launches keeps, per size, the
//! median of its launches. Before every launch it measures how far apart two cores
//! are (`probe.rs`) and prints it to stderr: on a virtual machine that moves between
//! fast and slow from one second to the next, and the alternation puts both engines
//! under both. Then it
//! prints one table (size, time, algbw, busbw per engine), JSON rows with the mesh as
//! `ours` and each MPI variant as `baseline`, and with `--svg PATH` an SVG chart of busbw
//! by size (no file is written without it).
//!
//! The mesh runs as users get it, ranks on one host through shared memory, and again
//! with `SWITCHYARD_SHM=0` (every byte over loopback TCP), shown as the "mesh tcp"
//! column and as JSON rows of case `nN-tcp` against the same MPI baselines: the TCP
//! path's figures, which a job spanning hosts gets between them.
//!
//! `allreduce` also runs the mesh job in checked mode (`CommOptions::check`), shown as
//! the "mesh checked" column and as JSON rows of their own case, `nN-checked`, with
//! the checked mesh as `ours` and the default mesh as `baseline`: the price of
//! checked mode, while the `nN` rows stay comparable with earlier runs.
//!
//! `allreduce` also runs under load (`loaded.rs`): rows of case `nN-loaded`, the mesh
//! against MPI's shared memory and against a 50 us spin while a load generator keeps
//! every core busy.
//!
//! `allreduce --python PYTHON` adds rows of case `nN-python`: the Python package's
//! allreduce on numpy arrays (`python -m switchyard._bench`, the same loop) against
//! the Rust worker and against mpi4py's `Allreduce` under `mpirun` when PYTHON has
//! mpi4py, the three launched in turn three times each.

mod loaded;
mod worker;

use super::Row;
use super::report::human_size;
use clap::{Args, ValueEnum};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_launch::{LaunchOptions, run_local};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Which collective a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Op {
    Allreduce,
    Broadcast,
    Allgather,
    ReduceScatter,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Broadcast => "broadcast",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce-scatter",
        }
    }

    /// nccl-tests' bus bandwidth factor: what each link carries relative to `size`.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Broadcast => 1.0,
            Op::Allgather | Op::ReduceScatter => (n - 1.0) / n,
        }
    }
}

/// Which engine a worker process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Engine {
    Mesh,
    Mpi,
}

/// Flags of the collective suites.
#[derive(Args, Debug, Clone)]
pub(crate) struct CollectiveArgs {
    #[command(flatten)]
    pub(crate) common: super::Common,
    /// Number of processes.
    #[arg(short = 'n', long = "processes", default_value_t = 4)]
    pub(crate) processes: usize,
    /// Only the mesh (no MPI rows; for builds without the `mpi` feature).
    #[arg(long)]
    pub(crate) mesh_only: bool,
    /// Also write an SVG chart of busbw against size to this file (none is written
    /// without it).
    #[arg(long, value_name = "PATH")]
    pub(crate) svg: Option<PathBuf>,
    /// `allreduce` only (broadcast and allgather refuse it): a Python interpreter with
    /// the switchyard package installed (`pip install ./python`). Adds the same
    /// allreduce from Python on numpy arrays, compared with the Rust worker in
    /// alternated launches, and mpi4py's `Allreduce` under `mpirun` when that
    /// interpreter has mpi4py. Also `SWITCHYARD_PYTHON`.
    #[arg(long, value_name = "PYTHON")]
    pub(crate) python: Option<PathBuf>,
    /// Internal: run as one rank of a job with this engine.
    #[arg(long, hide = true)]
    pub(crate) worker: Option<Engine>,
    /// Internal: where rank 0 of a worker job writes its times.
    #[arg(long, hide = true)]
    pub(crate) out: Option<PathBuf>,
    /// Internal: the worker runs the mesh in checked mode.
    #[arg(long, hide = true)]
    pub(crate) checked: bool,
}

/// The times a job's rank 0 wrote, by size.
fn read_times(path: &Path) -> Result<BTreeMap<usize, f64>> {
    let text = std::fs::read_to_string(path)?;
    let mut times = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some(size), Some(secs)) = (parts.next(), parts.next()) {
            times.insert(size.parse()?, secs.parse()?);
        }
    }
    Ok(times)
}

/// The arguments that make a copy of this command a worker of `engine`.
fn worker_args(op: Op, engine: Engine, common: &super::Common, out: &Path) -> Vec<String> {
    let mut args = vec![
        "bench".to_string(),
        op.name().to_string(),
        "--worker".to_string(),
        format!("{engine:?}").to_lowercase(),
        "--out".to_string(),
        out.display().to_string(),
    ];
    if common.quick {
        args.push("--quick".into());
    }
    if let Some(only) = &common.only {
        args.extend(["--only".to_string(), only.clone()]);
    }
    args
}

/// How a mesh job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mesh {
    /// As users get it: shared memory between the ranks.
    Default,
    /// In checked mode.
    Checked,
    /// With shared memory off: every pair over loopback TCP.
    Tcp,
    /// With a 50 us spin (`SWITCHYARD_SPIN_US=50`).
    ShortSpin,
}

/// Runs the mesh job as `mesh` says and reads its times.
fn run_mesh(
    op: Op,
    n: usize,
    common: &super::Common,
    out: &Path,
    mesh: Mesh,
) -> Result<BTreeMap<usize, f64>> {
    let exe = std::env::current_exe()?;
    let mut args = worker_args(op, Engine::Mesh, common, out);
    if mesh == Mesh::Checked {
        args.push("--checked".into());
    }
    let mut options = LaunchOptions::new(n as u32, exe.display().to_string())
        .with_args(args)
        .with_timeout(Duration::from_secs(1800));
    match mesh {
        Mesh::Tcp => options = options.with_env("SWITCHYARD_SHM", "0"),
        Mesh::ShortSpin => options = options.with_env("SWITCHYARD_SPIN_US", "50"),
        Mesh::Default | Mesh::Checked => {}
    }
    run_local(&options)?;
    read_times(out)
}

fn run_mpi(
    op: Op,
    n: usize,
    common: &super::Common,
    tcp_only: bool,
    out: &Path,
) -> Result<BTreeMap<usize, f64>> {
    let exe = std::env::current_exe()?;
    let mut command = switchyard_mpirun::command(n);
    if tcp_only {
        command.env("OMPI_MCA_btl", "tcp,self");
    }
    let status = command
        .arg(exe)
        .args(worker_args(op, Engine::Mpi, common, out))
        .status()
        .map_err(|e| format!("cannot start mpirun ({e}): install an MPI or pass --mesh-only"))?;
    if !status.success() {
        return Err(format!("mpirun -np {n} exited with {status}").into());
    }
    read_times(out)
}

/// One engine's measurements.
struct Series {
    name: &'static str,
    times: BTreeMap<usize, f64>,
}

fn busbw(op: Op, n: usize, size: usize, secs: f64) -> f64 {
    size as f64 / secs / 1e9 * op.bus_factor(n)
}

/// Launches of the mesh and of MPI's shared memory, alternated, behind the main rows.
const ALTERNATIONS: usize = 3;

/// Runs `launch` after probing the machine's core-to-core round trip, which it
/// notes in `probes` (stderr shows them all at the end).
fn probed<T>(
    probes: &mut Vec<String>,
    name: &str,
    launch: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if let Some(ns) = super::probe::core_round_trip_ns() {
        probes.push(format!("{name} {ns:.0}"));
    }
    launch()
}

pub(crate) fn run(op: Op, args: CollectiveArgs) -> Result<()> {
    args.common.times_only(op.name())?;
    if let Some(engine) = args.worker {
        let out = args.out.ok_or("--worker needs --out")?;
        return worker::work(op, engine, &args.common, &out, args.checked);
    }
    if op != Op::Allreduce && args.python.is_some() {
        return Err(format!(
            "bench {}: --python is for `bench allreduce` only; there are no Python {} rows",
            op.name(),
            op.name()
        )
        .into());
    }
    let n = args.processes;
    if n < 2 {
        return Err("-n must be at least 2".into());
    }
    if !args.mesh_only && !cfg!(feature = "mpi") {
        return Err("the MPI rows need a build with `--features mpi` (or pass --mesh-only)".into());
    }
    let scratch = std::env::temp_dir().join(format!("switchyard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let file = |name: &str| scratch.join(name);
    let mut probes = Vec::new();
    let (mut mesh, mut mpi) = (Vec::new(), Vec::new());
    for _ in 0..if args.mesh_only { 1 } else { ALTERNATIONS } {
        mesh.push(probed(&mut probes, "mesh", || {
            run_mesh(op, n, &args.common, &file("mesh"), Mesh::Default)
        })?);
        if !args.mesh_only {
            mpi.push(probed(&mut probes, "mpi", || {
                run_mpi(op, n, &args.common, false, &file("mpi"))
            })?);
        }
    }
    let mut series = vec![Series {
        name: "mesh",
        times: medians(&mesh),
    }];
    let tcp = Series {
        name: "mesh tcp",
        times: probed(&mut probes, "mesh-tcp", || {
            run_mesh(op, n, &args.common, &file("mesh-tcp"), Mesh::Tcp)
        })?,
    };
    let checked = if op == Op::Allreduce {
        Some(Series {
            name: "mesh checked",
            times: run_mesh(op, n, &args.common, &file("mesh-checked"), Mesh::Checked)?,
        })
    } else {
        None
    };
    let loaded = if op == Op::Allreduce {
        Some(loaded::run(op, n, &args.common, !args.mesh_only, &scratch)?)
    } else {
        None
    };
    let python_exe = args
        .python
        .clone()
        .or_else(|| std::env::var_os("SWITCHYARD_PYTHON").map(PathBuf::from));
    let python = match (&python_exe, op) {
        (Some(python), Op::Allreduce) => run_python(python, n, &args.common, &scratch)?,
        _ => Vec::new(),
    };
    if !args.mesh_only {
        series.push(Series {
            name: "MPI shm",
            times: medians(&mpi),
        });
        series.push(Series {
            name: "MPI tcp",
            times: probed(&mut probes, "mpi-tcp", || {
                run_mpi(op, n, &args.common, true, &file("mpi-tcp"))
            })?,
        });
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if !probes.is_empty() {
        eprintln!(
            "core-to-core cache-line round trip (ns) before each launch: {}",
            probes.join(", ")
        );
    }
    report(op, n, &args, &series, checked.as_ref(), &tcp, &python)?;
    if let Some(loaded) = &loaded {
        loaded::report(op.name(), n, args.common.json, loaded);
    }
    Ok(())
}

/// Launches of the Rust job and the Python job, alternated, behind the Python rows:
/// the two are compared per size as the medians of their launches, so that a slow
/// spell of the machine (TCP on loopback is bimodal here) hits both alike.
const PYTHON_PAIRS: usize = 3;

/// Set for the Python jobs: numpy's OpenBLAS otherwise starts a thread pool in every
/// Python process whose threads spin at import (4% of a Python job's CPU samples in a
/// `perf record -e cpu-clock` profile), CPU that 4 ranks on 2 cores take from the
/// collective. The benchmark calls no BLAS.
const ONE_BLAS_THREAD: [(&str, &str); 2] =
    [("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1")];

/// The Python rows: the switchyard package's allreduce under `switchyard launch`,
/// alternated with the Rust worker's and, when `python` has mpi4py, with mpi4py's
/// `Allreduce` under `mpirun` ([`PYTHON_PAIRS`] launches each, each side first in
/// turn; a series per side, the Rust one first, each the medians of its launches).
/// Without mpi4py a note says there is no mpi4py row.
fn run_python(
    python: &Path,
    n: usize,
    common: &super::Common,
    scratch: &Path,
) -> Result<Vec<Series>> {
    let plan = worker::plan(common);
    let worker_args = |out: &Path| {
        vec![
            "-m".to_string(),
            "switchyard._bench".to_string(),
            "--out".to_string(),
            out.display().to_string(),
            "--plan".to_string(),
            plan.clone(),
        ]
    };
    let has_mpi4py = std::process::Command::new(python)
        .args(["-c", "import mpi4py.MPI"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_mpi4py {
        eprintln!(
            "bench allreduce: {} has no mpi4py: no mpi4py row",
            python.display()
        );
    }
    let run_rust = |launch: usize| {
        let out = scratch.join(format!("rust{launch}"));
        run_mesh(Op::Allreduce, n, common, &out, Mesh::Default)
    };
    let run_py = |launch: usize| {
        let out = scratch.join(format!("python{launch}"));
        let mut options = LaunchOptions::new(n as u32, python.display().to_string())
            .with_args(worker_args(&out))
            .with_timeout(Duration::from_secs(1800));
        for (key, value) in ONE_BLAS_THREAD {
            options = options.with_env(key, value);
        }
        run_local(&options)?;
        read_times(&out)
    };
    let run_mpi4py = |launch: usize| -> Result<BTreeMap<usize, f64>> {
        let out = scratch.join(format!("mpi4py{launch}"));
        let status = switchyard_mpirun::command(n)
            .envs(ONE_BLAS_THREAD)
            .arg(python)
            .args(worker_args(&out))
            .arg("--mpi4py")
            .status()
            .map_err(|e| format!("cannot start mpirun for mpi4py ({e})"))?;
        if !status.success() {
            return Err(format!("mpirun -np {n} (mpi4py) exited with {status}").into());
        }
        read_times(&out)
    };
    let sides = if has_mpi4py { 3 } else { 2 };
    let mut launches: Vec<Vec<BTreeMap<usize, f64>>> = vec![Vec::new(); sides];
    for launch in 0..PYTHON_PAIRS {
        // Each side goes first in turn: whichever runs later would otherwise always
        // meet the machine as the one before left it.
        for k in 0..sides {
            let side = (launch + k) % sides;
            let times = match side {
                0 => run_rust(launch)?,
                1 => run_py(launch)?,
                _ => run_mpi4py(launch)?,
            };
            launches[side].push(times);
        }
    }
    let names = ["rust paired", "python switchyard", "mpi4py shm"];
    Ok(names
        .into_iter()
        .zip(&launches)
        .map(|(name, side)| Series {
            name,
            times: medians(side),
        })
        .collect())
}

/// Per size, the median of the launches that measured it.
fn medians(launches: &[BTreeMap<usize, f64>]) -> BTreeMap<usize, f64> {
    let mut by_size: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for launch in launches {
        for (&size, &t) in launch {
            by_size.entry(size).or_default().push(t);
        }
    }
    by_size
        .into_iter()
        .map(|(size, times)| (size, super::median(times)))
        .collect()
}

/// Prints the table or the JSON rows and writes the chart. `series` holds the mesh
/// first, then the MPI baselines; `checked`, the mesh in checked mode, is compared
/// with the mesh only; `tcp`, the mesh without shared memory, with the MPI baselines
/// as the mesh is (case `nN-tcp`).
fn report(
    op: Op,
    n: usize,
    args: &CollectiveArgs,
    series: &[Series],
    checked: Option<&Series>,
    tcp: &Series,
    python: &[Series],
) -> Result<()> {
    let suite = op.name();
    let mesh = &series[0];
    if args.common.json {
        emit_python_rows(suite, n, python);
    }
    if let (Some(checked), true) = (checked, args.common.json) {
        for (&size, &ours) in &checked.times {
            let Some(&theirs) = mesh.times.get(&size) else {
                continue;
            };
            Row::lower_better(
                suite,
                &format!("n{n}-checked"),
                size as u64,
                "time_us",
                ours * 1e6,
                theirs * 1e6,
                &format!("mesh {suite}"),
            )
            .emit(true);
        }
    }
    let columns: Vec<&Series> = series
        .iter()
        .take(1)
        .chain(checked)
        .chain(std::iter::once(tcp))
        .chain(&series[1..])
        .chain(python)
        .collect();
    let series = &columns[..];
    if args.common.json {
        let cases = [(mesh, format!("n{n}")), (tcp, format!("n{n}-tcp"))];
        let bases = series.iter().skip(1).filter(|s| s.name.starts_with("MPI"));
        for (base, (ours_series, case)) in bases.flat_map(|b| cases.iter().map(move |c| (b, c))) {
            for (&size, &ours) in &ours_series.times {
                let Some(&theirs) = base.times.get(&size) else {
                    continue;
                };
                let baseline = format!("{} {suite}", base.name);
                Row::lower_better(
                    suite,
                    case,
                    size as u64,
                    "time_us",
                    ours * 1e6,
                    theirs * 1e6,
                    &baseline,
                )
                .emit(true);
                Row::higher_better(
                    suite,
                    case,
                    size as u64,
                    "busbw_GBps",
                    busbw(op, n, size, ours),
                    busbw(op, n, size, theirs),
                    &baseline,
                )
                .emit(true);
            }
        }
    } else {
        println!(
            "# {suite}, {n} processes on one host; times are the slowest rank's median per call"
        );
        print!("{:>9}", "size");
        for s in series {
            print!(
                " | {:>10} {:>8} {:>8}",
                format!("{} us", s.name.split(' ').next().unwrap_or("")),
                "algbw",
                "busbw"
            );
        }
        println!();
        print!("{:>9}", "");
        for s in series {
            print!(" | {:>27}", s.name);
        }
        println!();
        for &size in mesh.times.keys() {
            print!("{:>9}", human_size(size as u64));
            for s in series {
                match s.times.get(&size) {
                    Some(&t) => print!(
                        " | {:>10.1} {:>8.3} {:>8.3}",
                        t * 1e6,
                        size as f64 / t / 1e9,
                        busbw(op, n, size, t)
                    ),
                    None => print!(" | {:>27}", "-"),
                }
            }
            println!();
        }
        println!(
            "(algbw and busbw in GB/s, busbw = algbw x {:.3})",
            op.bus_factor(n)
        );
    }
    if let Some(svg_path) = &args.svg {
        std::fs::write(
            svg_path,
            super::chart::busbw_svg(
                &format!("{suite} busbw, n = {n}"),
                &series_points(op, n, series),
            ),
        )
        .map_err(|e| format!("--svg {}: {e}", svg_path.display()))?;
        eprintln!("chart: {}", svg_path.display());
    }
    Ok(())
}

/// The Python rows, case `nN-python`: the package's allreduce against the Rust
/// worker's in the alternated launches (the price of calling from Python), and
/// against mpi4py's when measured. `python` is as [`run_python`] returns it.
fn emit_python_rows(suite: &str, n: usize, python: &[Series]) {
    let [rust, ours, rest @ ..] = python else {
        return;
    };
    let case = format!("n{n}-python");
    let baselines = std::iter::once((rust, "Rust mesh allreduce (alternated launches)"))
        .chain(rest.iter().map(|s| (s, "mpi4py Allreduce (MPI shm)")));
    for (base, name) in baselines {
        for (&size, &t) in &ours.times {
            if let Some(&theirs) = base.times.get(&size) {
                Row::lower_better(
                    suite,
                    &case,
                    size as u64,
                    "time_us",
                    t * 1e6,
                    theirs * 1e6,
                    name,
                )
                .emit(true);
            }
        }
    }
}

fn series_points(op: Op, n: usize, series: &[&Series]) -> Vec<(String, Vec<(f64, f64)>)> {
    series
        .iter()
        .map(|s| {
            let points = s
                .times
                .iter()
                .map(|(&size, &t)| (size as f64, busbw(op, n, size, t)))
                .collect();
            (s.name.to_string(), points)
        })
        .collect()
}
