//! Starting a job, watching it, and letting its processes find each other.
//!
//! [`run_local`] (behind `switchyard launch -n N -- PROG ARGS`) starts `N` worker
//! processes (and [`LaunchOptions::servers`] servers after them), serves two ways for
//! them to meet, and supervises them until they are done:
//!
//! - a small **rendezvous** for switchyard programs: each process calls
//!   [`Bootstrap::from_env`] to learn its rank and the job size, binds its stub wherever
//!   it likes (port 0 is fine), and [`Bootstrap::exchange`]s its endpoint for
//!   everyone's (protocol in [`rendezvous`], served here by a [`RendezvousServer`]);
//! - a **rabit/XGBoost tracker** (`switchyard_tracker::Tracker`, both the classic and
//!   the JSON protocol) for programs that speak it: an unmodified XGBoost 1.7 script
//!   finds it through `DMLC_TRACKER_URI`/`DMLC_TRACKER_PORT`.
//!
//! The environment of each process:
//!
//! | variable | meaning |
//! |---|---|
//! | `SWITCHYARD_RANK` | worker's rank, `0..N` (workers only) |
//! | `SWITCHYARD_WORLD_SIZE` | `N` (workers only) |
//! | `SWITCHYARD_RENDEZVOUS` | `host:port` of the launcher's rendezvous (workers only) |
//! | `DMLC_TRACKER_URI`, `DMLC_TRACKER_PORT` | the tracker |
//! | `SWITCHYARD_SILENT_REPORTS` | `1`: the tracker takes robust mode's silent-rank reports (`switchyard-silent`) and the launcher kills the rank named (its watchdog) |
//! | `DMLC_TASK_ID` | `0..N` for workers, then `N..N+S` for servers |
//! | `DMLC_ROLE` | `worker` or `server` |
//! | `DMLC_NUM_WORKER`, `DMLC_NUM_SERVER` | `N`, `S` |
//! | `DMLC_NUM_ATTEMPT` | `0`, then `1, 2, ...` on each restart of that process |
//! | `DMLC_JOB_CLUSTER` | `local`, `ssh`, `slurm` or `mpi` |
//! | `SWITCHYARD_JOB_ID` | a fresh random id per job (the launcher's own `SWITCHYARD_JOB_ID` if set), the same for its every process and restart: credentials derived from the job secret for ZeroMQ's PLAIN differ between jobs ([`switchyard_secret::JobId`]) |
//!
//! # Supervision
//!
//! - Output is forwarded line by line, prefixed `[rank] ` (`[sJ] ` for server `J`).
//! - With [`LaunchOptions::progress`], stderr shows one status line on a terminal
//!   (joined, running, finished, restarted) or one log line per event otherwise, and a
//!   summary (per process: starts, wall time, exit status) at the end. A start names
//!   the process's host and the PID the launcher has: a local process's own, else
//!   its wrapper's on this host (`rank 3 on node1 running (srun pid 4242 on this
//!   host, DMLC_NUM_ATTEMPT=0)`); the program's PID on its host is not known here.
//! - A process that exits abnormally is restarted with `DMLC_NUM_ATTEMPT` one higher,
//!   up to [`LaunchOptions::max_restarts`] times, each restart announced naming the
//!   process and its host; then every process is stopped and the error names it
//!   ([`LaunchError::RankFailed`]).
//! - Every process leads its own process group; stopping sends SIGTERM to the group and
//!   SIGKILL after [`LaunchOptions::grace`], and a process's group is killed when it
//!   exits, so nothing it started outlives it; on Linux a child also dies with a
//!   SIGKILLed launcher (`PR_SET_PDEATHSIG`; its own background jobs can survive that
//!   one case). With
//!   [`LaunchOptions::stop_on_signals`], SIGINT and SIGTERM stop the job
//!   ([`LaunchError::Interrupted`]; the command exits with status 130). A process
//!   that ended as a cancelled one does (by SIGTERM, or with srun passing on Slurm's
//!   notice that its step was cancelled) up to a second before that signal counts
//!   as the interruption, not as its failure: `scancel` signals the launcher and
//!   every step at once, and a step's end can be seen first.
//! - A worker that neither checks in at the rendezvous nor gets a rank from the tracker
//!   within [`LaunchOptions::rendezvous_timeout`] stops the job
//!   ([`LaunchError::Missing`]); one that exits successfully first is fine.
//!
//! # Clusters: `ssh`, `slurm`, `mpi`
//!
//! [`LauncherKind::Ssh`], [`LauncherKind::Slurm`] and [`LauncherKind::Mpi`] start each
//! process through `ssh HOST`, `srun` or `mpirun -np 1`, with its variables on the
//! command line (`env K=V ...`); the hosts come from [`LaunchOptions::hostfile`] (one
//! host per line, `slots=N` optional), dealt to processes in turn. A real cluster needs:
//!
//! - the program (and for ssh, the current directory) at the same path on every host;
//! - the tracker and rendezvous reachable from every host: without
//!   [`LaunchOptions::host`] they bind every interface and processes are told the
//!   address this machine uses to reach others; pass `--host` when that is the wrong
//!   network, and open the ports (chosen by the OS) in firewalls;
//! - ssh: passwordless login (`BatchMode=yes`: a password prompt fails instead of
//!   hanging); no terminal is allocated, so a small watcher beside the remote program
//!   ends it (SIGTERM, SIGKILL after [`LaunchOptions::grace`]) when the session's
//!   input, held open by the launcher, closes: the launcher stopped it, died, or lost
//!   the connection; [`LaunchOptions::launcher_args`] go right after `ssh` (`-F
//!   CONFIG`, `-p PORT`);
//! - slurm: run inside an allocation (`salloc`/`sbatch`) with one task per process
//!   (without a hostfile, a job with more processes than the allocation has tasks is
//!   refused before anything starts); `srun` delivers the launcher's SIGTERM to its
//!   task;
//! - mpi: an `mpirun` on `PATH` that accepts `-np` and `--host` (OpenMPI; MPICH's
//!   Hydra uses `-hosts`), and, as root, OpenMPI's `--allow-run-as-root` through
//!   `OMPI_ALLOW_RUN_AS_ROOT=1` and `OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`.
//!
//! # MPI programs
//!
//! Under `mpirun` (builds with the `mpi` feature) [`Bootstrap::from_env`] takes rank and
//! size from MPI instead, and every endpoint is `mpi://RANK`: the same program runs
//! either way if it binds [`Bootstrap::stub_endpoint`].
//!
//! [`Bootstrap::from_env`]: switchyard_bootstrap::Bootstrap::from_env
//! [`Bootstrap::exchange`]: switchyard_bootstrap::Bootstrap::exchange
//! [`Bootstrap::stub_endpoint`]: switchyard_bootstrap::Bootstrap::stub_endpoint
//! [`rendezvous`]: switchyard_bootstrap::rendezvous
//! [`RendezvousServer`]: switchyard_bootstrap::RendezvousServer

//! # Who uses it
//!
//! The `switchyard` command (`switchyard launch`) and programs that start their own
//! jobs. A worker program needs only the facade's `switchyard::bootstrap`, so it does
//! not link this crate, its ssh/slurm/mpirun launchers, its console or the
//! parameter-server scheduler it serves.

mod console;
mod embedded;
mod error;
mod group;
mod hostfile;
mod options;
mod process;
mod remote;
mod signals;
mod supervise;

pub use error::LaunchError;
pub use options::{LaunchOptions, LauncherKind};
pub use process::run_local;
