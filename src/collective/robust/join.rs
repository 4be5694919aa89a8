//! Forming a robust communicator through a tracker, and forming its mesh again after
//! each failure (the tracker's `recover`).

use super::RobustOptions;
use super::engine::{Rejoin, Report, RobustEngine, SilentReport};
use super::retry::{After, Retries, attempt_limit};
use crate::bootstrap::{Bootstrap, Rendezvous};
use crate::collective::error::{Call, CollectiveError};
use crate::collective::options::heartbeat_var;
use crate::collective::setup::tracker_spec;
use crate::collective::tracked::{JoinAs, TrackerMesh, tracker_mesh};
use crate::collective::{CommOptions, Communicator, TrackerJoin, TrackerProtocol};
use std::time::Instant;
use switchyard_net::env::{self, EnvError, Lookup};
use switchyard_tracker::client::ClientConfig;
use switchyard_tracker::client::classic::ClassicClient;

/// Forms this rank's mesh through the tracker (`how`: the first `start`, or a
/// survivor's `recover`), in attempts, within [`CommOptions::timeout`] in all.
///
/// A rank that dies while a mesh forms fails everyone's attempt: the endpoint
/// exchange breaks, a connection is refused, or (worst) a peer that got the dead
/// rank's endpoint waits for it to answer. So each attempt waits for answers at most
/// a quarter of the timeout (1 to 5 s); only the wait for the tracker's first batch
/// may take all of it. A failed attempt is tried again: the launcher restarts the
/// dead rank meanwhile, and the next attempt includes it.
fn form(
    spec: &TrackerJoin,
    options: &CommOptions,
    how: JoinAs,
) -> Result<TrackerMesh, CollectiveError> {
    form_counted(spec, options, how).map(|(mesh, _)| mesh)
}

/// [`form`], and the attempts it took. When to try again and when to give up is
/// [`Retries`]' to decide; this runs the attempts and sleeps the pauses.
fn form_counted(
    spec: &TrackerJoin,
    options: &CommOptions,
    how: JoinAs,
) -> Result<(TrackerMesh, u32), CollectiveError> {
    let mut attempt_options = options.clone();
    attempt_options.setup_limit = Some(attempt_limit(options.timeout));
    let keep_session = how == JoinAs::Start;
    let seed = format!("{}/{how:?}", spec.task_id.as_deref().unwrap_or_default());
    let mut retries = Retries::new(&seed, Instant::now(), options.timeout);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match tracker_mesh(spec, &attempt_options, how, keep_session) {
            Ok(mesh) => return Ok((mesh, attempts)),
            Err(e) => match retries.failed(Instant::now()) {
                After::GiveUp => return Err(e),
                After::Retry(pause) => {
                    tracing::warn!(?how, error = %e, ?pause, "robust: forming the mesh failed; trying again");
                    std::thread::sleep(pause);
                }
            },
        }
    }
}

/// `options` with what robust mode needs that the caller left unset: heartbeats
/// ([`CommOptions::ROBUST_HEARTBEAT`]), so that a stopped or cut-off rank is given up
/// on within a second, unless `SWITCHYARD_HEARTBEAT_MS` says otherwise (0: off).
///
/// The variable is parsed, not just looked for: a malformed value is an error, where
/// its mere presence used to suppress the default and leave the heartbeat off.
fn robust_defaults(
    mut options: CommOptions,
    lookup: &(impl Lookup + ?Sized),
) -> Result<CommOptions, EnvError> {
    if options.heartbeat.is_none() {
        options.heartbeat = match heartbeat_var(lookup)? {
            Some(beat) => beat,
            None => Some(CommOptions::ROBUST_HEARTBEAT),
        };
    }
    Ok(options)
}

/// A robust communicator that cannot be formed from what it was given.
fn refused(reason: &str) -> CollectiveError {
    CollectiveError::InvalidArgument {
        call: Call::Setup,
        reason: reason.into(),
    }
}

impl Communicator {
    /// [`Communicator::join`] with [`CommOptions::robust`] set: joins the classic
    /// tracker of `bootstrap` in robust mode.
    pub(crate) fn join_robust(
        bootstrap: &Bootstrap,
        options: CommOptions,
        robust: RobustOptions,
    ) -> Result<Communicator, CollectiveError> {
        let spec = match tracker_spec(bootstrap) {
            Some(spec) => Some(spec),
            // `switchyard launch` gives its workers both its rendezvous, which the
            // bootstrap names, and its tracker, which robust mode joins.
            None if matches!(bootstrap.rendezvous, Rendezvous::Launcher(_)) => {
                Bootstrap::from_tracker_lookup(&switchyard_net::env::ProcessEnv)
                    .map_err(|e| CollectiveError::setup("reading the environment", e))?
                    .as_ref()
                    .and_then(tracker_spec)
            }
            None => None,
        };
        let Some(spec) = spec else {
            return Err(refused(
                "robust mode joins a tracker, and DMLC_TRACKER_URI / DMLC_TRACKER_PORT are not \
                 set (run under `switchyard launch`, or give a tracker)",
            ));
        };
        if spec.protocol == TrackerProtocol::Json {
            return Err(refused(
                "robust mode needs the classic tracker protocol: XGBoost's JSON protocol has no \
                 `recover` for survivors to rejoin with",
            ));
        }
        if spec.task_id.is_none() {
            return Err(refused(
                "robust mode needs a task id (DMLC_TASK_ID): a restarted process gets its rank \
                 back from the tracker by it",
            ));
        }
        let spec = &spec;
        let options = robust_defaults(options, &env::ProcessEnv)
            .map_err(|e| CollectiveError::setup("reading the environment", e))?;
        let silent_reports = env::flag(
            &env::ProcessEnv,
            crate::bootstrap::watchdog::ENV_SILENT_REPORTS,
        )
        .map_err(|e| CollectiveError::setup("reading the environment", e))?
        .unwrap_or(false);
        let first = form(spec, &options, JoinAs::Start)?;
        let rank = u32::try_from(first.rank).map_err(|_| refused("rank past u32"))?;
        let (again, again_options) = (spec.clone(), options.clone());
        let rejoin: Rejoin = Box::new(move || {
            form(&again, &again_options, JoinAs::Recover { rank }).map(|m| m.engine)
        });
        let session = ClassicClient::new(
            &spec.host,
            spec.port,
            spec.task_id.clone(),
            ClientConfig::default().with_timeout(options.timeout),
        )
        .map(|client| client.session(rank, first.world as u32));
        let report: Option<Report> = match session {
            // Under `switchyard launch`, reported with the tracker's silent-rank
            // command, never a print: the launcher kills the rank it names, and a
            // print's text is any worker's. Elsewhere a print for the log only (a
            // tracker of rabit's fails on a command it does not know).
            Ok(session) => {
                let command = silent_reports;
                Some(Box::new(move |silent: SilentReport<'_>| {
                    let rank = u32::try_from(silent.rank).unwrap_or(u32::MAX);
                    let attempt = u32::try_from(silent.attempt).unwrap_or(u32::MAX);
                    let sent = if command {
                        session.report_silent(rank, attempt, silent.reason)
                    } else {
                        session.print(&crate::bootstrap::watchdog::describe(
                            rank,
                            attempt,
                            silent.reason,
                        ))
                    };
                    if let Err(e) = sent {
                        tracing::warn!(error = %e, "robust: reporting a silent rank to the tracker failed");
                    }
                }))
            }
            Err(_) => None,
        };
        let engine = RobustEngine::new(first.engine, rejoin, report, robust);
        let mut comm = Communicator::with_engine(Box::new(engine), options, first.processor_name);
        comm.tracker = first.link.map(|mut link| {
            link.keep_rank_on_drop();
            link
        });
        Ok(comm)
    }
}

#[cfg(test)]
#[path = "reform_tests.rs"]
mod reform_tests;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::collective::ENV_HEARTBEAT;
    use std::time::Duration;

    #[test]
    fn robust_mode_beats_unless_told_otherwise_and_refuses_a_malformed_deadline() {
        let none: [(&str, &str); 0] = [];
        let beat = |vars: &[(&str, &str)]| robust_defaults(CommOptions::default(), vars);
        assert_eq!(
            beat(&none).unwrap().heartbeat,
            Some(CommOptions::ROBUST_HEARTBEAT)
        );
        assert_eq!(beat(&[(ENV_HEARTBEAT, "0")]).unwrap().heartbeat, None);
        assert_eq!(
            beat(&[(ENV_HEARTBEAT, "250")]).unwrap().heartbeat,
            Some(Duration::from_millis(250))
        );
        // Before, the variable's presence alone suppressed the default: heartbeats off.
        let err = beat(&[(ENV_HEARTBEAT, "abc")]).unwrap_err();
        assert_eq!((err.var(), err.value()), (ENV_HEARTBEAT, Some("abc")));
        // A deadline the caller chose stands.
        let chosen = CommOptions::default().with_heartbeat(Some(Duration::from_secs(2)));
        assert_eq!(
            robust_defaults(chosen, &[(ENV_HEARTBEAT, "abc")])
                .unwrap()
                .heartbeat,
            Some(Duration::from_secs(2))
        );
    }
}
