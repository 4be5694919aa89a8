//! The launcher's watchdog for robust jobs: a survivor that gave up on a silent rank
//! (alive to the kernel, so its connections stay open, but sending nothing past the
//! heartbeat deadline: stopped, hung, or cut off) says so in a tracker `print`, and
//! `switchyard launch` kills that process so that its restart policy starts it again,
//! as rabit's tracker-side watchdogs do. The report names the process's start number
//! (`DMLC_NUM_ATTEMPT`), so a late report never kills the process that replaced it.

/// What every report begins with.
const PREFIX: &str = "switchyard robust: silent rank ";

/// The `print` text reporting rank `rank`, start number `attempt`, as silent.
pub(crate) fn silent_report(rank: usize, attempt: u64, reason: &str) -> String {
    format!("{PREFIX}{rank} attempt {attempt}: {reason}")
}

/// The rank and start number a report names, if `text` is one.
pub(crate) fn parse_silent(text: &str) -> Option<(u32, u64)> {
    let rest = text.strip_prefix(PREFIX)?;
    let (rank, rest) = rest.split_once(" attempt ")?;
    let attempt = rest.split(':').next()?;
    Some((rank.trim().parse().ok()?, attempt.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_other_prints_are_not_reports() {
        let text = silent_report(3, 1, "no heartbeat for 812 ms");
        assert_eq!(parse_silent(&text), Some((3, 1)));
        assert_eq!(parse_silent("rank 3 attempt 1: hello"), None);
        assert_eq!(
            parse_silent("switchyard robust: silent rank x attempt 1: y"),
            None
        );
    }
}
