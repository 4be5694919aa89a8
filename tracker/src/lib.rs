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
//! Protocol references, in this repository: `docs/rabit-protocol.md` (the classic
//! protocol) and `docs/xgboost-protocol.md` (the JSON protocol).
//!
//! # Public surface
//!
//! The server ([`Tracker`], [`TrackerConfig`], [`Event`], [`JobOutcome`],
//! [`TrackerError`], [`SortBy`], [`JournalError`]), the worker side ([`client`]), the
//! byte-level helpers that both use ([`wire`]), and the wire name of switchyard's own
//! classic command ([`SILENT_COMMAND`]). Everything else is private (the crate's own
//! tests reach the link maps through a hidden module behind the non-default `testing`
//! feature, which is not part of the API).
//!
//! # Layers
//!
//! Each module imports only from the layers below it (the names are the source
//! files under `src/`):
//!
//! | layer | modules | sits on |
//! |-------|---------|---------|
//! | 5. threaded server | `server/` | layers 1 to 3 (not `client/`) |
//! | 4. worker-side clients | `client/` | `wire`, `common` |
//! | 3. sans-IO state machines | `classic/`, `json/`, and `journal` (the state file) | `maps`, `order`, `record`, `common` |
//! | 2. pure helpers | `maps` (link maps), `order` (batch order), `record` (what the machines report) | `common` |
//! | 1. foundations | `wire` (bytes, deadlines, caps), `common` ([`SortBy`], [`SILENT_COMMAND`], connection ids, the job secret's purpose labels) | std and dependencies only |
//!
//! The clients and the server are siblings: neither imports the other. The state
//! machines never name `server` or `client`; the server feeds them what connections
//! say and acts on what they return.

#![doc(test(attr(deny(warnings))))]

mod classic;
pub mod client;
mod common;
mod journal;
mod json;
// Private but for the `testing` re-export below, which needs its items `pub`.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
mod maps;
mod order;
mod record;
mod server;
pub mod wire;

pub use common::{SILENT_COMMAND, SortBy};
pub use journal::JournalError;
pub use server::{Event, JobOutcome, Tracker, TrackerConfig, TrackerError};

/// Internals that the crate's own integration tests check against. **Not part of the
/// API**: it exists only with the non-default `testing` feature, which this crate's
/// tests turn on (a dev-dependency on itself), and may change in any release.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    pub use crate::maps::{Links, link_maps};
}
