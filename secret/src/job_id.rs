//! The job id: a value every process of one job shares and no other job has, mixed
//! into credentials that would otherwise be the same in every job with the same secret
//! (the ZeroMQ PLAIN password, see `switchyard-transports`), so that one recorded in
//! one job logs in to no other.
//!
//! Where it comes from, first found wins ([`JobId::from_env`]):
//! 1. `SWITCHYARD_JOB_ID` ([`ENV_JOB_ID`]): `switchyard launch` sets a fresh random one
//!    ([`JobId::fresh`]) for every process of each job it starts, restarts included.
//! 2. Slurm: `SLURM_JOB_ID` with `SLURM_STEP_ID` (one `srun` step).
//! 3. Open MPI / PMIx: `PMIX_NAMESPACE`, else `OMPI_MCA_orte_ess_jobid`.
//! 4. torchrun: `TORCHELASTIC_RUN_ID`.
//!
//! With none of them there is no job id, and callers derive from the secret alone:
//! the weaker case, where a credential is the same in every job with that secret.
//! A job id is not secret (it may show in `ps`): it only makes credentials differ
//! between jobs; the secret is what makes them unguessable.

/// The variable `switchyard launch` sets to a fresh random job id for each job.
pub const ENV_JOB_ID: &str = "SWITCHYARD_JOB_ID";

/// This process's job id once fixed ([`JobId::for_process`]): credentials derived from
/// it must not change while the process lives.
static PROCESS: OnceLock<Option<JobId>> = OnceLock::new();

/// One job's id and where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobId {
    /// The id's text.
    pub value: String,
    /// The variable(s) it came from, for messages.
    pub source: &'static str,
}

use std::sync::OnceLock;

impl JobId {
    /// The job id this process's own credentials use, fixed on the first call: the
    /// environment's ([`from_env`](JobId::from_env)) unless a launcher in this process
    /// fixed it first ([`for_launch`](JobId::for_launch)).
    pub fn for_process() -> Option<JobId> {
        PROCESS.get_or_init(JobId::from_env).clone()
    }

    /// The job id a launcher gives every process of the job it starts: this process's,
    /// fixed now if it was not yet to `SWITCHYARD_JOB_ID` from the environment or else a
    /// fresh one, so that what the launcher serves itself (a parameter-server scheduler)
    /// derives the same credentials as its processes. A process whose id was fixed
    /// earlier (it used ZeroMQ before launching) keeps it for every job it launches;
    /// one fixed to none gets a fresh id for its processes, which its own sockets do not
    /// share.
    pub fn for_launch() -> Result<JobId, crate::SecretError> {
        let mut failed = None;
        let fixed = PROCESS.get_or_init(|| {
            let explicit = std::env::var(ENV_JOB_ID)
                .ok()
                .filter(|v| !v.trim().is_empty());
            match explicit {
                Some(value) => Some(JobId {
                    value,
                    source: ENV_JOB_ID,
                }),
                None => JobId::fresh().map_err(|e| failed = Some(e)).ok(),
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        match fixed {
            Some(id) => Ok(id.clone()),
            None => JobId::fresh(),
        }
    }

    /// A fresh random id (128 bits, as 32 hex digits) for a new job.
    pub fn fresh() -> Result<JobId, crate::SecretError> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| crate::SecretError::Random(e.to_string()))?;
        Ok(JobId {
            value: raw.iter().map(|b| format!("{b:02x}")).collect(),
            source: ENV_JOB_ID,
        })
    }

    /// This process's job id from its environment (order in the module's docs), or
    /// `None`; empty values count as unset.
    pub fn from_env() -> Option<JobId> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](JobId::from_env) over any lookup, so that the order can be tested
    /// without touching the process's environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<JobId> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let found = |value: String, source| Some(JobId { value, source });
        if let Some(id) = var(ENV_JOB_ID) {
            return found(id, ENV_JOB_ID);
        }
        if let Some(job) = var("SLURM_JOB_ID") {
            // Each `srun` is a step of its own: two steps of one allocation are two jobs.
            let step = var("SLURM_STEP_ID").unwrap_or_default();
            return found(format!("{job}.{step}"), "SLURM_JOB_ID+SLURM_STEP_ID");
        }
        if let Some(ns) = var("PMIX_NAMESPACE") {
            return found(ns, "PMIX_NAMESPACE");
        }
        if let Some(id) = var("OMPI_MCA_orte_ess_jobid") {
            return found(id, "OMPI_MCA_orte_ess_jobid");
        }
        var("TORCHELASTIC_RUN_ID").and_then(|id| found(id, "TORCHELASTIC_RUN_ID"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn id(vars: &[(&str, &str)]) -> Option<(String, &'static str)> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        JobId::from_lookup(|name| map.get(name).cloned()).map(|j| (j.value, j.source))
    }

    #[test]
    fn the_first_source_in_order_wins_and_empty_counts_as_unset() {
        let all = [
            ("TORCHELASTIC_RUN_ID", "t"),
            ("PMIX_NAMESPACE", "p"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "2"),
            (ENV_JOB_ID, "s"),
        ];
        assert_eq!(id(&all), Some(("s".into(), ENV_JOB_ID)));
        assert_eq!(id(&all[..4]).unwrap().0, "7.2");
        assert_eq!(id(&all[..2]).unwrap().0, "p");
        assert_eq!(id(&all[..1]).unwrap().0, "t");
        assert_eq!(
            id(&[(ENV_JOB_ID, " "), ("OMPI_MCA_orte_ess_jobid", "o")])
                .unwrap()
                .0,
            "o"
        );
        assert_eq!(id(&[]), None);
    }

    #[test]
    fn fresh_ids_differ() {
        let (a, b) = (JobId::fresh().unwrap(), JobId::fresh().unwrap());
        assert_eq!(a.value.len(), 32);
        assert_ne!(a, b);
    }
}
