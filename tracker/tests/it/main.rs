//! The tracker's integration tests in one binary: each file is a module (run one with
//! `cargo test -p switchyard-tracker --test it -- classic_job::`), so the workspace
//! links one test binary here instead of one per file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Helpers shared by the modules below.
mod client_support;
mod support;

mod both_protocols;
mod classic_faults;
mod classic_job;
mod classic_recover;
mod client_classic;
mod client_json;
mod client_ours;
mod json_faults;
mod json_job;
mod print_order;
mod secret_tracker;
mod state_file;
