//! A tracker for rabit- and XGBoost-style jobs, and the worker side of its protocols.
//!
//! Two protocols, one port:
//! - the **classic rabit protocol** of rabit and XGBoost ≤ 2.0 (binary: `i32`s and
//!   length-prefixed strings; `start`, `recover`, `print`, `shutdown`; tree and ring
//!   link maps; link negotiation), plus one command of
//!   switchyard's own, `switchyard-silent` (robust mode's report of a silent rank:
//!   `i32` rank, `i32` start number, string reason; [`Event::Silent`]);
//! - the **JSON protocol** of XGBoost ≥ 2.1 (length-prefixed JSON frames; the tracker
//!   hands each worker its ring successor).
//!
//! After the common magic, the next bytes tell them apart: a JSON hello starts with
//! `{"` where a classic worker sends its world size.
//!
//! # Serving a job
//!
//! ```
//! # fn main() -> Result<(), switchyard_tracker::TrackerError> {
//! use std::time::Duration;
//! use switchyard_tracker::{Tracker, TrackerConfig, TrackerError};
//!
//! let tracker = Tracker::start(TrackerConfig::new(4))?;
//! // Give the workers DMLC_TRACKER_URI and DMLC_TRACKER_PORT (XGBoost 2.1+: pass them
//! // as `dmlc_tracker_uri` / `dmlc_tracker_port` arguments instead).
//! let env = tracker.worker_env();
//! assert_eq!(env[1], ("DMLC_TRACKER_PORT".to_string(), tracker.addr().port().to_string()));
//! // No worker came: the job is not over.
//! assert!(matches!(
//!     tracker.wait(Some(Duration::from_millis(10))),
//!     Err(TrackerError::WaitTimedOut { .. })
//! ));
//! # Ok(()) }
//! ```
//!
//! [`Tracker::wait`] says whether the job succeeded: `Ok` after `n` distinct ranks
//! shut down, `Err` when a worker signalled an error (JSON `error`) or the tracker was
//! stopped. A tracker given a [`TrackerConfig::state_file`] appends every durable fact
//! (finished negotiations, ports, shutdowns, the JSON batch) to it and replays it at
//! start, so that a tracker killed after bootstrap and restarted on the same port
//! finishes the job: workers only come back for `print`, `shutdown` and `recover`. A
//! state file whose job finished is refused ([`TrackerError::FinishedState`]): a new
//! job needs a file of its own.
//!
//! Layers: [`wire`] (bytes, deadlines, caps), [`maps`] (link maps), the sans-IO state
//! machines ([`classic`], [`json`], fed by [`order`] and reporting [`record`]s, which
//! the [`journal`] keeps), the threaded [`server`], and the worker-side clients.

#![doc(test(attr(deny(warnings))))]

pub mod classic;
pub mod client;
pub mod journal;
pub mod json;
pub mod maps;
pub mod order;
pub mod record;
pub mod server;
pub mod wire;

pub use server::{Event, JobOutcome, SortBy, Tracker, TrackerConfig, TrackerError};
