//! The `switchyard` command: launch jobs and run benchmarks.
//!
//! ```text
//! switchyard launch -n 3 -- target/release/examples/param_server
//! switchyard bench transport --quick --json
//! ```

mod bench;
mod shell_words;
mod tracker_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;
use switchyard_launch::{LaunchError, LaunchOptions, run_local};

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Message passing for distributed ML: job launcher, rabit/XGBoost tracker and benchmarks",
    // Help text wraps at the terminal's width, at most 100 columns (100 when output is
    // not a terminal).
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a job: N copies of a program, with their tracker and rendezvous.
    ///
    /// Start N copies of a program (here, or through ssh, srun or mpirun), serve their
    /// tracker and rendezvous, and watch them: output prefixed by rank, progress on
    /// stderr, restarts, a summary at the end. Ctrl-C/SIGTERM stops every process
    /// (exit status 130).
    Launch {
        /// Number of worker processes (SWITCHYARD_RANK and DMLC_TASK_ID 0..N).
        #[arg(short = 'n', long = "processes", value_parser = clap::value_parser!(u32).range(1..))]
        processes: u32,
        /// Number of server processes (DMLC_ROLE=server), started after the workers.
        #[arg(long, default_value_t = 0)]
        servers: u32,
        /// How to start each process: local, ssh, slurm (srun) or mpi (mpirun).
        #[arg(long, default_value = "local", value_parser = parse_launcher)]
        launcher: switchyard_launch::LauncherKind,
        /// Hosts for --launcher ssh|slurm|mpi: one per line, optional `slots=N`.
        #[arg(long)]
        hostfile: Option<std::path::PathBuf>,
        /// Extra arguments for ssh, srun or mpirun, put right after the command's name
        /// and split as a shell splits words (quotes keep spaces), e.g.
        /// "-F ./ssh_config", "--partition=gpu" or "--mca plm_rsh_args '-p 2222'".
        #[arg(long, allow_hyphen_values = true, value_parser = shell_words::Words::parse)]
        launcher_args: Option<shell_words::Words>,
        /// Address the tracker and rendezvous bind and that processes are told
        /// (default: 127.0.0.1 for local jobs, else every interface and this machine's
        /// outward address).
        #[arg(long)]
        host: Option<String>,
        /// Network interface(s) every process binds and advertises its mesh on
        /// (SWITCHYARD_IFNAME, like NCCL_SOCKET_IFNAME: a comma list of names; default:
        /// the interface that routes to the rendezvous or tracker).
        #[arg(long)]
        interface: Option<String>,
        /// Restart a process that exits abnormally up to K times (DMLC_NUM_ATTEMPT+1).
        #[arg(long, default_value_t = 0)]
        max_restarts: u32,
        /// Do not serve the rabit/XGBoost tracker (no DMLC_TRACKER_* variables).
        #[arg(long)]
        no_tracker: bool,
        /// Stop every process if the job runs longer than this many seconds (1 or more).
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
        timeout: u64,
        /// Seconds every worker has to check in at the rendezvous or the tracker (1 or
        /// more).
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        rendezvous_timeout: u64,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
    /// Serve the tracker of a rabit/XGBoost job whose workers you start yourself.
    ///
    /// Serve a rabit / XGBoost job as its tracker (classic and JSON protocols) until
    /// every worker has sent `shutdown`; the workers are started elsewhere, with the
    /// DMLC_TRACKER_URI and DMLC_TRACKER_PORT it prints.
    Tracker(tracker_cmd::TrackerArgs),
    /// Run one of the benchmark suites (`switchyard bench --help` lists them).
    Bench {
        #[command(subcommand)]
        suite: bench::Suite,
    },
}

/// `--launcher`: clap already names the flag and the value, so the error is only the
/// reason (the library's own error would name them a second time).
fn parse_launcher(value: &str) -> Result<switchyard_launch::LauncherKind, String> {
    value
        .parse()
        .map_err(|_| "expected one of local, ssh, slurm, mpi".to_string())
}

/// Whether log lines on standard error may carry colour codes: only on a terminal (a
/// log redirected to a file must stay plain text), and never with `NO_COLOR` set to
/// anything but the empty string (<https://no-color.org>).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let traces = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr());
    match &cli.command {
        // `bench robust` reads when its workers' robust mode saw the mesh break from
        // their traces: unix-ns stamps on the bench's clock, no colour codes.
        Command::Bench { suite } if suite.stamps_traces() => {
            traces.with_timer(bench::UnixNanos).with_ansi(false).init()
        }
        _ => traces.init(),
    }
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Launch {
            processes,
            servers,
            launcher,
            hostfile,
            launcher_args,
            host,
            interface,
            max_restarts,
            no_tracker,
            timeout,
            rendezvous_timeout,
            program,
        } => {
            let (program, args) = program
                .split_first()
                .map(|(p, a)| (p.clone(), a.to_vec()))
                .unwrap_or_default();
            let mut options = LaunchOptions::new(processes, program)
                .with_args(args)
                .with_servers(servers)
                .with_launcher(launcher, hostfile)
                .with_launcher_args(launcher_args.map(|w| w.0).unwrap_or_default())
                .with_max_restarts(max_restarts)
                .with_tracker(!no_tracker)
                .with_progress(true)
                .with_stop_on_signals(true)
                .with_timeout(Duration::from_secs(timeout))
                .with_rendezvous_timeout(Duration::from_secs(rendezvous_timeout));
            if let Some(host) = host {
                options = options.with_host(host);
            }
            if let Some(interface) = interface {
                options = options.with_env(switchyard::bootstrap::ENV_IFNAME, interface);
            }
            match run_local(&options) {
                Err(e @ LaunchError::Interrupted { .. }) => {
                    eprintln!("switchyard: {e}");
                    // 128 + SIGINT, as a shell reports a job ended by Ctrl-C.
                    return ExitCode::from(130);
                }
                other => other.map_err(Into::into),
            }
        }
        Command::Tracker(args) => tracker_cmd::run(args),
        Command::Bench { suite } => bench::run(suite),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: {e}");
            ExitCode::FAILURE
        }
    }
}
