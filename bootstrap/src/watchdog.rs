//! The launcher's watchdog for robust jobs: a survivor that gave up on a silent rank
//! (alive to the kernel, so its connections stay open, but sending nothing past the
//! heartbeat deadline: stopped, hung, or cut off) says so to the tracker, and
//! `switchyard launch` kills that process so that its restart policy starts it again,
//! as rabit's tracker-side watchdogs do. The report names the process's start number
//! (`DMLC_NUM_ATTEMPT`), so a late report never kills the process that replaced it.
//!
//! The report is the tracker's own `switchyard-silent` command
//! ([`switchyard_tracker::SILENT_COMMAND`]), carrying the rank and start
//! number as integers, never a `print`: a print's text is the worker's (its log lines,
//! anything it echoes), and a launcher that read a command in it would kill a
//! healthy rank whenever a worker printed the right words. Prints are only logged.

/// Set (to `1`) by `switchyard launch` beside the address of its own tracker: that
/// tracker knows the `switchyard-silent` command and the launcher acts on it. Without
/// it the robust engine reports a silent rank as a plain `print`, for the log only:
/// a tracker of rabit's or XGBoost's fails on a command it does not know, and no
/// watchdog would act on the report there anyway.
pub const ENV_SILENT_REPORTS: &str = "SWITCHYARD_SILENT_REPORTS";

/// The line the launcher logs for a report, beside the kill.
pub fn describe(rank: u32, attempt: u32, reason: &str) -> String {
    format!("switchyard robust: silent rank {rank} attempt {attempt}: {reason}")
}
