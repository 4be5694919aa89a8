//! A tracker for rabit- and XGBoost-style jobs, and the worker side of its protocols.
//!
//! Two protocols, one port:
//! - the **classic rabit protocol** of rabit and XGBoost ≤ 2.0 (binary: `i32`s and
//!   length-prefixed strings; `start`, `recover`, `print`, `shutdown`; tree and ring
//!   link maps; link negotiation), see `shared/rabit-protocol.md`;
//! - the **JSON protocol** of XGBoost ≥ 2.1 (length-prefixed JSON frames; the tracker
//!   hands each worker its ring successor), see `shared/xgboost-collective-protocol.md`.
//!
//! After the common magic, the next bytes tell them apart: a JSON hello starts with
//! `{"` where a classic worker sends its world size.
//!
//! Layers: [`wire`] (bytes, deadlines, caps), [`maps`] (link maps), the sans-IO state
//! machines ([`classic`], [`json`], fed by [`order`] and reporting [`record`]s, which
//! the [`journal`] keeps), the threaded [`server`], and the worker-side clients.

pub mod classic;
pub mod journal;
pub mod json;
pub mod maps;
pub mod order;
pub mod record;
pub mod server;
pub mod wire;

pub use server::{Event, JobOutcome, SortBy, Tracker, TrackerConfig, TrackerError};
