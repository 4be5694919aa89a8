//! Where a rabit/XGBoost tracker is, and who this worker is to it.

use super::TrackerProtocol;

/// Where a tracker is and who this worker is to it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrackerJoin {
    /// Host name or address of the tracker.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// This worker's identity across restarts (`DMLC_TASK_ID`); `None` for none.
    pub task_id: Option<String>,
    /// The protocol it speaks.
    pub protocol: TrackerProtocol,
}

impl TrackerJoin {
    /// A classic tracker at `host:port`, no task id.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        TrackerJoin {
            host: host.into(),
            port,
            task_id: None,
            protocol: TrackerProtocol::Classic,
        }
    }

    /// Sets the task id.
    pub fn with_task_id(mut self, task_id: impl Into<String>) -> Self {
        self.task_id = Some(task_id.into());
        self
    }

    /// Sets the protocol.
    pub fn with_protocol(mut self, protocol: TrackerProtocol) -> Self {
        self.protocol = protocol;
        self
    }
}
