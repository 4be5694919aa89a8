//! The command's integration tests in one binary: each file is a module (run one with
//! `cargo test -p switchyard-cli --test it -- launch_supervise::`), so the workspace
//! links one test binary here instead of one per file, and the test harness runs the
//! files' tests side by side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Helpers shared by the modules below.
mod cluster;
mod netns;
mod robust_support;
mod support;

mod cluster_mpi;
mod cluster_script;
mod cluster_secret;
mod cluster_slurm;
mod cluster_ssh;
mod collective_faults;
mod collective_processes;
mod launch;
mod launch_generations;
mod launch_messages;
mod launch_mpi;
mod launch_ps;
mod launch_remote;
mod launch_slurm;
mod launch_supervise;
mod mpi;
mod netns_bootstrap;
mod netns_harness;
mod netns_launch;
mod robust_processes;
mod secret_launch;
mod tracker_help;
mod tracker_restart;
mod xgboost_interop;
