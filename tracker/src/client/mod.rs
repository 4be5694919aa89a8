//! The worker side of both tracker protocols: join a job, learn a rank and the links
//! to other workers, send `print`s, and say `shutdown` at the end.
//!
//! - [`classic`]: the rabit protocol of XGBoost ≤ 2.0. The tracker assigns the rank and negotiates a tree and a ring;
//!   [`classic::Joined`] holds one connected [`TcpStream`](std::net::TcpStream) per
//!   linked rank.
//! - [`json`]: the protocol of XGBoost ≥ 2.1. The tracker only names each worker's ring successor; [`json::Joined`]
//!   holds the two ring links.
//!
//! Both share [`ClientConfig`] (connect retries, deadlines) and [`ClientError`].

pub mod classic;
mod config;
mod error;
pub mod json;
mod net;

pub use config::ClientConfig;
pub use error::ClientError;

/// Which tracker protocol a worker speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// The classic rabit protocol (XGBoost ≤ 2.0's `RabitTracker`, dmlc-core, and
    /// switchyard's tracker). The default.
    #[default]
    Classic,
    /// The JSON protocol of XGBoost ≥ 2.1 (also served by switchyard's tracker).
    Json,
}

impl std::str::FromStr for Protocol {
    type Err = String;

    /// `classic`/`rabit` or `json` (any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "classic" | "rabit" => Ok(Protocol::Classic),
            "json" => Ok(Protocol::Json),
            other => Err(format!(
                "unknown tracker protocol {other:?} (expected classic or json)"
            )),
        }
    }
}
