//! The facade's integration tests in one binary: each file is a module (run one with
//! `cargo test -p switchyard --test it -- heartbeat::`), so the workspace links one
//! test binary here instead of one per file, and the test harness runs the files'
//! tests side by side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Helpers shared by the modules below.
mod collective_suite;
mod support;
mod tracker_support;

mod background;
mod bootstrap_env;
mod bootstrap_iface;
mod bootstrap_secret;
mod bootstrap_unique_id;
mod collective;
mod collective_clocks;
mod collective_mismatch;
mod collective_mpi;
mod failed_call;
mod heartbeat;
mod interrupt;
mod newcomer;
mod prepare_failed;
mod ps_processes;
mod sim_calls;
mod sim_robust;
mod tracker_env;
mod tracker_facade;
mod tracker_ours;
mod tracker_reference;
