//! Mock failures, rabit's way: `mock=rank,version,seq,ndeath` makes process `rank`
//! exit when it reaches call `seq` after checkpoint `version` on its `ndeath`-th
//! start (`DMLC_NUM_ATTEMPT` = `ndeath`), so that a test can kill a chosen worker at a
//! chosen call, and kill it again after its restart. A fifth field picks a kill point
//! rabit lacks: `recover` (inside recovery) or `replicate` (in a checkpoint, after
//! the local models were replicated and before the commit).
//!
//! A kill that can never strike (a call past its version's calls, a version after the
//! last checkpoint, a start that never came, a rank the job lacks) is accepted, as in
//! rabit, but when a rank finishes the job it logs a warning naming each such kill
//! aimed at it and why ([`never_fired`]), on stderr and in the log: a test that counted on it would otherwise
//! pass without the failure it meant to cause.

/// Environment variable with mock kills, separated by spaces: `"0,0,1,0 1,1,1,0,recover"`.
pub const ENV_MOCK: &str = "SWITCHYARD_MOCK";

/// The exit status of a process that a mock kill ended.
pub const MOCK_EXIT_STATUS: i32 = 254;

/// Where in a call a [`MockKill`] strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KillPoint {
    /// On entering the call (rabit's only point; a checkpoint counts as the call
    /// after the last collective of its version).
    Call,
    /// Inside recovery at that call: after rejoining the other ranks, before
    /// agreeing with them.
    Recover,
    /// In the checkpoint at that call, after the local models were replicated and
    /// before the checkpoint is committed.
    Replicate,
}

/// One planned death.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MockKill {
    /// The rank that dies.
    pub rank: usize,
    /// The checkpoint version of the call.
    pub version: u64,
    /// The call's number since that checkpoint, from 0.
    pub seq: u64,
    /// Which start of the process dies (`DMLC_NUM_ATTEMPT`; 0 is the first).
    pub ndeath: u64,
    /// Where in the call.
    pub point: KillPoint,
}

impl MockKill {
    /// Parses `rank,version,seq,ndeath[,point]`.
    ///
    /// ```
    /// use switchyard::collective::{KillPoint, MockKill};
    /// let kill = MockKill::parse("1,2,0,1,recover")?;
    /// assert_eq!((kill.rank, kill.version, kill.seq, kill.ndeath), (1, 2, 0, 1));
    /// assert_eq!(kill.point, KillPoint::Recover);
    /// assert!(MockKill::parse("1,2,x,0").is_err());
    /// # Ok::<(), String>(())
    /// ```
    pub fn parse(text: &str) -> Result<MockKill, String> {
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if !(4..=5).contains(&fields.len()) {
            return Err(format!(
                "mock kill {text:?}: expected rank,version,seq,ndeath[,point]"
            ));
        }
        let number = |i: usize, name: &str| -> Result<u64, String> {
            fields[i]
                .parse()
                .map_err(|_| format!("mock kill {text:?}: {name} {:?} is not a number", fields[i]))
        };
        let point = match fields.get(4).copied() {
            None | Some("call") => KillPoint::Call,
            Some("recover") => KillPoint::Recover,
            Some("replicate") => KillPoint::Replicate,
            Some(other) => {
                return Err(format!(
                    "mock kill {text:?}: point {other:?} is not call, recover or replicate"
                ));
            }
        };
        Ok(MockKill {
            rank: usize::try_from(number(0, "rank")?).map_err(|e| e.to_string())?,
            version: number(1, "version")?,
            seq: number(2, "seq")?,
            ndeath: number(3, "ndeath")?,
            point,
        })
    }

    /// Parses a space-separated list (the form of [`ENV_MOCK`]).
    pub fn parse_list(text: &str) -> Result<Vec<MockKill>, String> {
        text.split_whitespace().map(MockKill::parse).collect()
    }
}

/// What one process saw of its versions: enough to say why a mock kill aimed at it
/// never struck.
#[derive(Clone, Debug, Default)]
pub(crate) struct History {
    /// The version of this process's first call (later than 0 for a restarted process
    /// that resumed from a checkpoint).
    pub(crate) began: Option<u64>,
    /// Each committed checkpoint: the version it closed and its call number.
    pub(crate) checkpoints: Vec<(u64, u64)>,
    /// The version and call count at the end of the job.
    pub(crate) ended: Option<(u64, u64)>,
}

/// A warning for each kill in `kills` that can no longer strike, now that this process
/// (`rank` of `world`, start `attempt`, with `history`) finished the job: the kills
/// aimed at this rank and start, those aimed at later starts of it (there will be
/// none), and on rank 0 those aimed at ranks the job does not have.
pub(crate) fn never_fired(
    kills: &[MockKill],
    (rank, world): (usize, usize),
    attempt: u64,
    history: &History,
) -> Vec<String> {
    let (end_version, end_calls) = history.ended.unwrap_or_default();
    let began = history.began.unwrap_or(end_version);
    let checkpoint_of = |version: u64| {
        history
            .checkpoints
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, call)| *call)
    };
    let mut warnings = Vec::new();
    for k in kills {
        let why = if k.rank >= world {
            if rank != 0 {
                continue;
            }
            format!("the job has ranks 0..{world} only")
        } else if k.rank != rank || k.ndeath < attempt {
            continue;
        } else if k.ndeath > attempt {
            format!(
                "rank {rank} finished the job in its start {attempt}, so start {} never came",
                k.ndeath
            )
        } else if k.version < began {
            format!("this start of rank {rank} resumed from version {began}, after it")
        } else if k.version > end_version {
            format!(
                "the job ended at version {end_version} (the last checkpoint), so version {} never began",
                k.version
            )
        } else {
            // The calls of the kill's version: those before its checkpoint, or for the
            // last version those made after the last checkpoint.
            let (calls, checkpoint) = match checkpoint_of(k.version) {
                Some(call) => (call, Some(call)),
                None => (end_calls, None),
            };
            match (k.point, checkpoint) {
                (KillPoint::Call, Some(call)) if k.seq > call => format!(
                    "version {} had {calls} calls and its checkpoint at call {call}",
                    k.version
                ),
                (KillPoint::Call, None) if k.seq >= calls => format!(
                    "version {} had only {calls} calls after the last checkpoint",
                    k.version
                ),
                (KillPoint::Replicate, Some(call)) if k.seq != call => {
                    format!("version {}'s checkpoint was call {call}", k.version)
                }
                (KillPoint::Replicate, None) => format!(
                    "no checkpoint followed version {} (the job ended in it)",
                    k.version
                ),
                (KillPoint::Recover, _) => "no recovery happened at that call".to_string(),
                _ => "its call was never reached".to_string(),
            }
        };
        warnings.push(format!("mock kill {} never fired: {why}", describe(k)));
    }
    warnings
}

/// A kill as it was written (`rank,version,seq,ndeath[,point]`).
fn describe(k: &MockKill) -> String {
    let point = match k.point {
        KillPoint::Call => "",
        KillPoint::Recover => ",recover",
        KillPoint::Replicate => ",replicate",
    };
    format!("{},{},{},{}{point}", k.rank, k.version, k.seq, k.ndeath)
}

/// Tells of `warning` (from [`never_fired`]) about rank `rank`'s start `attempt`: on
/// stderr, as [`strike`] tells of a kill, so that a program without a tracing
/// subscriber sees it too, and in the log.
pub(crate) fn warn(rank: usize, attempt: u64, warning: &str) {
    let line = format!("switchyard mock: rank {rank} (attempt {attempt}): {warning}");
    eprintln!("{line}");
    #[cfg(test)]
    PRINTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(line);
    tracing::warn!(rank, attempt, "{warning}");
}

/// Every line [`warn`] printed, for tests to find theirs.
#[cfg(test)]
pub(crate) static PRINTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// What a thread-ranked test's mock kill unwinds with, instead of exiting the
/// process (see [`UNWIND`]).
#[cfg(test)]
pub(crate) struct MockDeath;

#[cfg(test)]
thread_local! {
    /// Set by tests whose ranks are threads: a mock kill panics with [`MockDeath`],
    /// which drops the rank's communicator as a process exit would close it.
    pub(crate) static UNWIND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Exits the process if `kills` plan a death for `rank` here.
pub(crate) fn strike(
    kills: &[MockKill],
    rank: usize,
    (version, seq): (u64, u64),
    attempt: u64,
    point: KillPoint,
) {
    let due = kills.iter().any(|k| {
        k.rank == rank
            && k.version == version
            && k.seq == seq
            && k.ndeath == attempt
            && k.point == point
    });
    if due {
        eprintln!(
            "switchyard mock: rank {rank} exits at version {version} call {seq} ({point:?}, attempt {attempt})"
        );
        #[cfg(test)]
        if UNWIND.get() {
            std::panic::panic_any(MockDeath);
        }
        std::process::exit(MOCK_EXIT_STATUS);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_kill_that_cannot_fire_gets_its_reason() {
        // Versions 0 and 1 checkpointed at call 3; 2 calls made in version 2 when the
        // job ended.
        let history = History {
            began: Some(0),
            checkpoints: vec![(0, 3), (1, 3)],
            ended: Some((2, 2)),
        };
        let kills = MockKill::parse_list(
            "1,2,2,0 1,1,2,0,replicate 1,2,0,0,replicate 1,0,1,0,recover 0,9,0,0",
        )
        .unwrap();
        let warnings = never_fired(&kills, (1, 2), 0, &history);
        assert_eq!(
            warnings,
            [
                "mock kill 1,2,2,0 never fired: version 2 had only 2 calls after the last checkpoint",
                "mock kill 1,1,2,0,replicate never fired: version 1's checkpoint was call 3",
                "mock kill 1,2,0,0,replicate never fired: no checkpoint followed version 2 (the job ended in it)",
                "mock kill 1,0,1,0,recover never fired: no recovery happened at that call",
            ]
        );
    }
}
