use super::{rendezvous, LaunchError, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE};
use std::time::Duration;

/// What a process learns from the launcher: its rank, the job size, and where to
/// exchange endpoints.
///
/// # Examples
///
/// ```
/// use switchyard::launch::Bootstrap;
/// # fn main() -> Result<(), switchyard::launch::LaunchError> {
/// // Outside `switchyard launch` there is nothing to bootstrap from.
/// if std::env::var_os("SWITCHYARD_RANK").is_none() {
///     assert!(Bootstrap::from_env()?.is_none());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    /// This process's rank.
    pub rank: u32,
    /// Number of processes.
    pub world_size: u32,
    /// The launcher's rendezvous address.
    pub rendezvous: String,
}

fn var(name: &'static str) -> Result<String, LaunchError> {
    std::env::var(name).map_err(|e| LaunchError::Env {
        var: name,
        value: String::new(),
        reason: e.to_string(),
    })
}

fn number(name: &'static str) -> Result<u32, LaunchError> {
    let value = var(name)?;
    value.trim().parse::<u32>().map_err(|_| LaunchError::Env {
        var: name,
        value: value.clone(),
        reason: "not a non-negative integer".into(),
    })
}

impl Bootstrap {
    /// Reads the launcher's environment. `Ok(None)` when `SWITCHYARD_RANK` is unset
    /// (the process was not started by a launcher); an error names any variable that
    /// is missing or malformed.
    pub fn from_env() -> Result<Option<Bootstrap>, LaunchError> {
        if std::env::var_os(ENV_RANK).is_none() {
            return Ok(None);
        }
        let rank = number(ENV_RANK)?;
        let world_size = number(ENV_WORLD_SIZE)?;
        if world_size == 0 || rank >= world_size {
            return Err(LaunchError::Env {
                var: ENV_RANK,
                value: rank.to_string(),
                reason: format!("must be below {ENV_WORLD_SIZE}={world_size}"),
            });
        }
        let rendezvous = var(ENV_RENDEZVOUS)?;
        Ok(Some(Bootstrap {
            rank,
            world_size,
            rendezvous,
        }))
    }

    /// Sends this process's endpoint to the rendezvous and returns every rank's, in
    /// rank order, waiting at most `timeout` for the others.
    pub fn exchange(&self, endpoint: &str, timeout: Duration) -> Result<Vec<String>, LaunchError> {
        rendezvous::exchange(
            &self.rendezvous,
            self.rank,
            self.world_size,
            endpoint,
            timeout,
        )
    }
}
