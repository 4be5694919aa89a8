//! The few names that the server, the clients and the sans-IO state machines all
//! use. They live at the bottom so that the state machines and the clients never
//! import from the threaded server.

/// How a batch of `start`s is ordered into ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortBy {
    /// By the peer's IP address text, then task id (the default).
    #[default]
    Host,
    /// By task id.
    Task,
}

/// Identifies a connection to the server.
pub(crate) type ConnId = u64;

/// The job secret's purpose label for worker-to-tracker connections.
pub(crate) const TRACKER_PURPOSE: &str = "tracker";

/// The job secret's purpose label for the links between workers that the tracker
/// negotiates.
pub(crate) const PEER_PURPOSE: &str = "tracker-peer";

/// The wire name of switchyard's own classic command, a robust engine's report of a
/// silent peer (`i32` rank, `i32` start number, string reason). rabit never sends it,
/// and a rabit tracker refuses it as an unknown command (the engine then only warns).
pub const SILENT_COMMAND: &str = "switchyard-silent";
