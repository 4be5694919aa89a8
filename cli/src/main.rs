//! The `switchyard` command: launch jobs and run benchmarks.
//!
//! ```text
//! switchyard launch -n 3 -- target/release/examples/param_server
//! switchyard bench transport --quick --json
//! ```

mod bench;
mod tracker_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::Duration;
use switchyard::launch::{run_local, LaunchOptions};

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Message passing for distributed ML: launcher and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start N copies of a program on this machine, with a rendezvous for their
    /// endpoints (SWITCHYARD_RANK, SWITCHYARD_WORLD_SIZE, SWITCHYARD_RENDEZVOUS).
    Launch {
        /// Number of processes.
        #[arg(short = 'n', long = "processes", value_parser = clap::value_parser!(u32).range(1..))]
        processes: u32,
        /// Stop every process if the job runs longer than this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Seconds every process has to check in at the rendezvous.
        #[arg(long, default_value_t = 60)]
        rendezvous_timeout: u64,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true)]
        program: Vec<String>,
    },
    /// Serve a rabit / XGBoost job as its tracker (classic and JSON protocols).
    Tracker(tracker_cmd::TrackerArgs),
    /// Run a benchmark suite.
    Bench {
        #[command(subcommand)]
        suite: bench::Suite,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Launch {
            processes,
            timeout,
            rendezvous_timeout,
            program,
        } => {
            let (program, args) = program
                .split_first()
                .map(|(p, a)| (p.clone(), a.to_vec()))
                .unwrap_or_default();
            let options = LaunchOptions::new(processes, program)
                .with_args(args)
                .with_timeout(Duration::from_secs(timeout))
                .with_rendezvous_timeout(Duration::from_secs(rendezvous_timeout));
            run_local(&options).map_err(Into::into)
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
