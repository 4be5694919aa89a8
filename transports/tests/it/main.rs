//! The transports' integration tests in one binary: each file is a module (run one with
//! `cargo test -p switchyard-transports --test it -- hostile::`), so the workspace links
//! one test binary here instead of one per file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Helpers shared by the modules below.
mod hostile_support;
mod support;

mod conformance;
mod endpoints;
mod hostile;
mod hostile_memory;
mod malformed;
mod mpi_job;
mod poller;
mod zmq_job_id;
mod zmq_secret;
