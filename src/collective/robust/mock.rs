//! Mock failures, rabit's way: `mock=rank,version,seq,ndeath` makes process `rank`
//! exit when it reaches call `seq` after checkpoint `version` on its `ndeath`-th
//! start (`DMLC_NUM_ATTEMPT` = `ndeath`), so that a test can kill a chosen worker at a
//! chosen call, and kill it again after its restart. A fifth field picks a kill point
//! rabit lacks: `recover` (inside recovery) or `replicate` (in a checkpoint, after
//! the local models were replicated and before the commit).

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
                ))
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
