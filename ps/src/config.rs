//! Settings of a parameter-server job, in code or from ps-lite's environment.

use super::{PsError, Sharding};
use std::time::Duration;
use switchyard_transports::SocketOptions;

/// The shape of the job and its timeouts. Every node of a job must use the same
/// numbers of workers and servers, sharding and split threshold.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `num_workers`, `num_servers` | (given) | nodes the scheduler waits for |
/// | `sharding` | range over all of `u64` | which server owns a key ([`Sharding`]) |
/// | `split_threshold` | 65536 values | longer values are split over every server |
/// | `heartbeat` | 200 ms | how often each node tells the scheduler it is alive |
/// | `dead_timeout` | 5 s | silence after which a node or the scheduler counts as dead |
/// | `request_timeout` | 120 s | longest a worker waits for a push/pull answer or a barrier; a sync round open this long is refused ([`PsError::RoundIncomplete`]) |
/// | `join_timeout` | 60 s | longest registration takes, for the scheduler and each node |
/// | `host` | the address that reaches the scheduler | where a server binds its `tcp://` socket |
/// | `socket` | [`SocketOptions::default`] | options of every socket |
/// | `replicate` | off | each server's keys also on the next server: a dead server is replaced |
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PsConfig {
    /// Number of workers.
    pub num_workers: u32,
    /// Number of servers.
    pub num_servers: u32,
    /// Which server owns a key.
    pub sharding: Sharding,
    /// Values of at least this many elements are split over every server.
    pub split_threshold: u64,
    /// Interval between heartbeats.
    pub heartbeat: Duration,
    /// Silence after which a node or the scheduler is declared dead.
    pub dead_timeout: Duration,
    /// Longest wait for an answer to a request or a barrier.
    pub request_timeout: Duration,
    /// Longest registration may take.
    pub join_timeout: Duration,
    /// The host a server binds on for `tcp://` jobs; `None`: the local address of
    /// the route to the scheduler.
    pub host: Option<String>,
    /// Options of every socket.
    pub socket: SocketOptions,
    /// Keep each server's keys also on the next server of the ring, so that the job
    /// goes on when one server dies (sync mode; one failure per job).
    pub replicate: bool,
}

impl PsConfig {
    /// A job of `num_workers` workers and `num_servers` servers with the defaults.
    pub fn new(num_workers: u32, num_servers: u32) -> PsConfig {
        PsConfig {
            num_workers,
            num_servers,
            sharding: Sharding::default(),
            split_threshold: 1 << 16,
            heartbeat: Duration::from_millis(200),
            dead_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(120),
            join_timeout: Duration::from_secs(60),
            host: None,
            socket: SocketOptions::default(),
            replicate: false,
        }
    }

    /// Sets [`PsConfig::replicate`].
    pub fn with_replication(mut self, on: bool) -> Self {
        self.replicate = on;
        self
    }

    /// Sets [`PsConfig::sharding`].
    pub fn with_sharding(mut self, sharding: Sharding) -> Self {
        self.sharding = sharding;
        self
    }

    /// Sets [`PsConfig::split_threshold`].
    pub fn with_split_threshold(mut self, values: u64) -> Self {
        self.split_threshold = values;
        self
    }

    /// Sets [`PsConfig::heartbeat`] and [`PsConfig::dead_timeout`].
    pub fn with_liveness(mut self, heartbeat: Duration, dead_timeout: Duration) -> Self {
        self.heartbeat = heartbeat;
        self.dead_timeout = dead_timeout;
        self
    }

    /// Sets [`PsConfig::request_timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`PsConfig::join_timeout`].
    pub fn with_join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// Sets [`PsConfig::host`].
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Sets [`PsConfig::socket`].
    pub fn with_socket_options(mut self, options: SocketOptions) -> Self {
        self.socket = options;
        self
    }

    pub(crate) fn check(&self) -> Result<(), PsError> {
        if self.num_workers == 0 || self.num_servers == 0 {
            return Err(PsError::BadArguments(format!(
                "a job needs at least one worker and one server (got {} and {})",
                self.num_workers, self.num_servers
            )));
        }
        Ok(())
    }
}

/// What a process is in a ps-lite style job (`DMLC_ROLE`).
///
/// Non-exhaustive: a later version may accept more of ps-lite's `DMLC_ROLE` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PsRole {
    /// `DMLC_ROLE=scheduler`.
    Scheduler,
    /// `DMLC_ROLE=server`.
    Server,
    /// `DMLC_ROLE=worker`.
    Worker,
}

/// A process's part in a job, read from ps-lite's environment variables.
///
/// | variable | meaning |
/// |---|---|
/// | `DMLC_ROLE` | `scheduler`, `server` or `worker` |
/// | `DMLC_NUM_WORKER` | number of workers |
/// | `DMLC_NUM_SERVER` | number of servers |
/// | `DMLC_PS_ROOT_URI` | the scheduler's host (IP or name) |
/// | `DMLC_PS_ROOT_PORT` | the scheduler's port |
/// | `DMLC_NODE_HOST` (optional) | the host a server binds and advertises |
/// | `PS_HEARTBEAT_INTERVAL` (optional) | seconds between heartbeats ([`PsConfig::heartbeat`]) |
/// | `PS_HEARTBEAT_TIMEOUT` (optional) | seconds of silence that mean death ([`PsConfig::dead_timeout`]) |
///
/// | `SWITCHYARD_PS_REPLICATE` (optional) | `1`: [`PsConfig::replicate`] |
///
/// The two `PS_HEARTBEAT_*` names are ps-lite's; fractions are allowed (`0.5`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PsEnv {
    /// This process's role.
    pub role: PsRole,
    /// The scheduler's endpoint, `tcp://ROOT_URI:ROOT_PORT`.
    pub scheduler: String,
    /// The job's shape (defaults for everything the environment does not say).
    pub config: PsConfig,
}

impl PsEnv {
    /// Reads the environment: `Ok(None)` when `DMLC_ROLE` is unset, an error naming
    /// the variable when one is missing or does not parse.
    pub fn from_env() -> Result<Option<PsEnv>, PsError> {
        PsEnv::from_lookup(|var| std::env::var(var).ok())
    }

    /// As [`PsEnv::from_env`], with variables from `lookup` (for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<PsEnv>, PsError> {
        let Some(role) = lookup("DMLC_ROLE") else {
            return Ok(None);
        };
        let role = match role.trim() {
            "scheduler" => PsRole::Scheduler,
            "server" => PsRole::Server,
            "worker" => PsRole::Worker,
            other => {
                return Err(PsError::Env {
                    var: "DMLC_ROLE",
                    reason: format!("{other:?} is not scheduler, server or worker"),
                });
            }
        };
        let need = |var: &'static str| {
            lookup(var).ok_or(PsError::Env {
                var,
                reason: "not set".into(),
            })
        };
        let number = |var: &'static str| -> Result<u32, PsError> {
            let text = need(var)?;
            text.trim().parse().map_err(|_| PsError::Env {
                var,
                reason: format!("{text:?} is not a number"),
            })
        };
        let workers = number("DMLC_NUM_WORKER")?;
        let servers = number("DMLC_NUM_SERVER")?;
        let uri = need("DMLC_PS_ROOT_URI")?;
        let port = number("DMLC_PS_ROOT_PORT")?;
        if port > u32::from(u16::MAX) {
            return Err(PsError::Env {
                var: "DMLC_PS_ROOT_PORT",
                reason: format!("{port} is not a port"),
            });
        }
        let mut config = PsConfig::new(workers, servers);
        config.host = lookup("DMLC_NODE_HOST");
        let seconds = |var: &'static str| -> Result<Option<Duration>, PsError> {
            let Some(text) = lookup(var) else {
                return Ok(None);
            };
            match text.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s.is_finite() => Ok(Some(Duration::from_secs_f64(s))),
                _ => Err(PsError::Env {
                    var,
                    reason: format!("{text:?} is not a positive number of seconds"),
                }),
            }
        };
        if let Some(d) = seconds("PS_HEARTBEAT_INTERVAL")? {
            config.heartbeat = d;
        }
        if let Some(d) = seconds("PS_HEARTBEAT_TIMEOUT")? {
            config.dead_timeout = d;
        }
        config.replicate = match lookup("SWITCHYARD_PS_REPLICATE").as_deref().map(str::trim) {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(PsError::Env {
                    var: "SWITCHYARD_PS_REPLICATE",
                    reason: format!("{other:?} is not 0 or 1"),
                });
            }
        };
        config.check()?;
        Ok(Some(PsEnv {
            role,
            scheduler: format!("tcp://{}:{port}", uri.trim()),
            config,
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn reads_ps_lite_variables() {
        let e = PsEnv::from_lookup(env(&[
            ("DMLC_ROLE", "server"),
            ("DMLC_NUM_WORKER", "4"),
            ("DMLC_NUM_SERVER", "2"),
            ("DMLC_PS_ROOT_URI", "10.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9091"),
            ("PS_HEARTBEAT_TIMEOUT", "2.5"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(e.role, PsRole::Server);
        assert_eq!(e.config.dead_timeout, Duration::from_millis(2500));
        assert_eq!(e.scheduler, "tcp://10.0.0.1:9091");
        assert_eq!((e.config.num_workers, e.config.num_servers), (4, 2));
    }

    #[test]
    fn names_the_missing_or_bad_variable() {
        assert!(PsEnv::from_lookup(env(&[])).unwrap().is_none());
        let err = PsEnv::from_lookup(env(&[("DMLC_ROLE", "worker"), ("DMLC_NUM_WORKER", "4")]))
            .unwrap_err();
        assert!(err.to_string().contains("DMLC_NUM_SERVER"), "{err}");
        let err = PsEnv::from_lookup(env(&[("DMLC_ROLE", "boss")])).unwrap_err();
        assert!(err.to_string().contains("DMLC_ROLE"), "{err}");
        let err = PsEnv::from_lookup(env(&[
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "4"),
            ("DMLC_NUM_SERVER", "x"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains("DMLC_NUM_SERVER") && err.to_string().contains("\"x\""),
            "{err}"
        );
        let err = PsEnv::from_lookup(env(&[
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "1"),
            ("DMLC_NUM_SERVER", "1"),
            ("DMLC_PS_ROOT_URI", "h"),
            ("DMLC_PS_ROOT_PORT", "1"),
            ("PS_HEARTBEAT_INTERVAL", "-1"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("PS_HEARTBEAT_INTERVAL"), "{err}");
    }
}
