//! Settings of a parameter-server job, in code or from ps-lite's environment.

use super::{PsError, Sharding};
use std::time::Duration;
use switchyard_net::env::{self, EnvError};
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
/// | `request_timeout` | 120 s | longest a worker waits for a push/pull answer or a barrier; a push waiting this long for its sync rounds is withdrawn ([`PsError::RoundIncomplete`]) |
/// | `join_timeout` | 60 s | longest registration takes, for the scheduler and each node |
/// | `host` | the address that reaches the scheduler | where a server binds its `tcp://` socket |
/// | `socket` | [`SocketOptions::default`] | options of every socket |
/// | `replicate` | off | each server's keys also on the next server: a dead server is replaced |
/// | `data_plane` | `SWITCHYARD_PS_DATA`, else [`DataPlane::Link`] | what values travel on ([`DataPlane`]) |
/// | `shared_memory` | on | on the data plane, processes of one host talk through shared memory (off: TCP) |
/// | `spin` | the link's choice | on the data plane, how long a wait polls before it sleeps |
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PsConfig {
    /// Number of workers (a `usize`, as a communicator's world size is).
    pub num_workers: usize,
    /// Number of servers.
    pub num_servers: usize,
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
    /// What values travel on; `None`: as `SWITCHYARD_PS_DATA` says, the data plane
    /// when it is unset. The job uses the data plane only when every node asks for it.
    pub data_plane: Option<DataPlane>,
    /// On the data plane, whether a worker and a server on one host talk through
    /// shared memory (else TCP, as between hosts).
    pub shared_memory: bool,
    /// On the data plane, how long a wait polls before it sleeps; `None`: the link
    /// chooses (50 us where the host may have more threads than cores).
    pub spin: Option<Duration>,
}

/// What a job's values (pushes, pulls, push_pulls and their answers) travel on.
/// Registration, barriers, heartbeats, the two-phase checks and withdrawals,
/// replication and failover always travel over ZeroMQ.
///
/// Non-exhaustive: a later version may add planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataPlane {
    /// The collectives' links, opened worker <-> server once every node has
    /// registered: TCP between hosts, shared memory between processes of one host
    /// (`SWITCHYARD_PS_DATA=link`, the default). Where they cannot be opened the job
    /// falls back to [`DataPlane::Zmq`], and says so in the log.
    Link,
    /// The nodes' ZeroMQ Dealer/Router sockets, beside the control messages
    /// (`SWITCHYARD_PS_DATA=zmq`).
    Zmq,
}

/// The variable that chooses the [`DataPlane`] of a node whose
/// [`PsConfig::data_plane`] is `None`.
pub(crate) const DATA_VAR: &str = "SWITCHYARD_PS_DATA";

impl PsConfig {
    /// A job of `num_workers` workers and `num_servers` servers with the defaults.
    pub fn new(num_workers: usize, num_servers: usize) -> PsConfig {
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
            data_plane: None,
            shared_memory: true,
            spin: None,
        }
    }

    /// Sets [`PsConfig::shared_memory`].
    pub fn with_shared_memory(mut self, on: bool) -> Self {
        self.shared_memory = on;
        self
    }

    /// Sets [`PsConfig::spin`].
    pub fn with_spin(mut self, spin: Duration) -> Self {
        self.spin = Some(spin);
        self
    }

    /// Sets [`PsConfig::data_plane`].
    pub fn with_data_plane(mut self, plane: DataPlane) -> Self {
        self.data_plane = Some(plane);
        self
    }

    /// The data plane this node asks for: [`PsConfig::data_plane`], else
    /// `SWITCHYARD_PS_DATA`, else [`DataPlane::Link`].
    pub(crate) fn resolve_data_plane(&self) -> Result<DataPlane, PsError> {
        match self.data_plane {
            Some(plane) => Ok(plane),
            None => Ok(data_plane_from(&env::ProcessEnv)?.unwrap_or(DataPlane::Link)),
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
        // Ranks travel as u32 in the job's messages.
        if u32::try_from(self.num_workers).is_err() || u32::try_from(self.num_servers).is_err() {
            return Err(PsError::BadArguments(format!(
                "a job has at most {} workers and as many servers (got {} and {})",
                u32::MAX,
                self.num_workers,
                self.num_servers
            )));
        }
        Ok(())
    }

    /// [`PsConfig::num_workers`] as the job's messages carry it (checked by
    /// `check` to fit).
    pub(crate) fn workers_u32(&self) -> u32 {
        u32::try_from(self.num_workers).unwrap_or(u32::MAX)
    }

    /// [`PsConfig::num_servers`] as the job's messages carry it.
    pub(crate) fn servers_u32(&self) -> u32 {
        u32::try_from(self.num_servers).unwrap_or(u32::MAX)
    }
}

/// `SWITCHYARD_PS_DATA` as `lookup` has it: `None` when unset.
fn data_plane_from(lookup: &(impl env::Lookup + ?Sized)) -> Result<Option<DataPlane>, EnvError> {
    env::one_of(
        lookup,
        DATA_VAR,
        &[("link", DataPlane::Link), ("zmq", DataPlane::Zmq)],
    )
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
/// | `SWITCHYARD_PS_DATA` (optional) | `link` (the default) or `zmq`: [`PsConfig::data_plane`] |
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
        PsEnv::from_lookup(&env::ProcessEnv)
    }

    /// As [`PsEnv::from_env`], with variables from `lookup` (a map or a closure in a
    /// test, the launcher's own table for its scheduler).
    ///
    /// # Errors
    ///
    /// [`PsError::Env`] naming the variable, its value and what was expected; or a
    /// configuration that cannot work (no workers, no servers).
    pub fn from_lookup(lookup: &(impl env::Lookup + ?Sized)) -> Result<Option<PsEnv>, PsError> {
        let role = env::one_of(
            lookup,
            "DMLC_ROLE",
            &[
                ("scheduler", PsRole::Scheduler),
                ("server", PsRole::Server),
                ("worker", PsRole::Worker),
            ],
        )?;
        let Some(role) = role else {
            return Ok(None);
        };
        let needed = "set in every process of a parameter-server job (DMLC_ROLE is set)";
        let number = |var: &str| -> Result<u32, EnvError> {
            env::u32(lookup, var)?
                .ok_or_else(|| EnvError::missing(var, format!("{}, {needed}", env::INTEGER)))
        };
        let workers = number("DMLC_NUM_WORKER")?;
        let servers = number("DMLC_NUM_SERVER")?;
        let uri = env::required(
            lookup,
            "DMLC_PS_ROOT_URI",
            &format!("the scheduler's host, {needed}"),
        )?;
        // 0 is allowed: a launcher that serves the scheduler itself binds any port.
        let port_expected = "a port number (0..65535)";
        let port: u16 =
            env::parse(lookup, "DMLC_PS_ROOT_PORT", port_expected)?.ok_or_else(|| {
                EnvError::missing("DMLC_PS_ROOT_PORT", format!("{port_expected}, {needed}"))
            })?;
        let mut config = PsConfig::new(workers as usize, servers as usize);
        config.host = env::text(lookup, "DMLC_NODE_HOST");
        if let Some(d) = env::positive_seconds(lookup, "PS_HEARTBEAT_INTERVAL")? {
            config.heartbeat = d;
        }
        if let Some(d) = env::positive_seconds(lookup, "PS_HEARTBEAT_TIMEOUT")? {
            config.dead_timeout = d;
        }
        config.replicate = env::one_of(
            lookup,
            "SWITCHYARD_PS_REPLICATE",
            &[("0", false), ("1", true)],
        )?
        .unwrap_or(false);
        config.data_plane = data_plane_from(lookup)?;
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

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_ps_lite_variables() {
        let e = PsEnv::from_lookup(&env(&[
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
        assert!(PsEnv::from_lookup(&env(&[])).unwrap().is_none());
        let err = PsEnv::from_lookup(&env(&[("DMLC_ROLE", "worker"), ("DMLC_NUM_WORKER", "4")]))
            .unwrap_err();
        assert!(err.to_string().contains("DMLC_NUM_SERVER"), "{err}");
        let err = PsEnv::from_lookup(&env(&[("DMLC_ROLE", "boss")])).unwrap_err();
        assert!(err.to_string().contains("DMLC_ROLE"), "{err}");
        let err = PsEnv::from_lookup(&env(&[
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "4"),
            ("DMLC_NUM_SERVER", "x"),
        ]))
        .unwrap_err();
        assert!(
            err.to_string().contains("DMLC_NUM_SERVER") && err.to_string().contains("\"x\""),
            "{err}"
        );
        let err = PsEnv::from_lookup(&env(&[
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

    /// Each variable's malformed value, in the one wording: variable, value, what was
    /// expected.
    #[test]
    fn a_malformed_value_is_named_with_its_value() {
        let base = [
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_WORKER", "1"),
            ("DMLC_NUM_SERVER", "1"),
            ("DMLC_PS_ROOT_URI", "h"),
            ("DMLC_PS_ROOT_PORT", "1"),
        ];
        for (var, bad, expected) in [
            ("DMLC_ROLE", "boss", "scheduler, server or worker"),
            ("DMLC_NUM_WORKER", "four", "a non-negative integer"),
            ("DMLC_NUM_SERVER", "-1", "a non-negative integer"),
            ("DMLC_PS_ROOT_PORT", "70000", "a port number (0..65535)"),
            (
                "PS_HEARTBEAT_INTERVAL",
                "soon",
                "a positive number of seconds",
            ),
            ("PS_HEARTBEAT_TIMEOUT", "0", "a positive number of seconds"),
            ("SWITCHYARD_PS_REPLICATE", "yes", "0 or 1"),
            ("SWITCHYARD_PS_DATA", "tcp", "link or zmq"),
        ] {
            let mut vars = env(&base);
            vars.insert(var.to_string(), bad.to_string());
            let err = PsEnv::from_lookup(&vars).unwrap_err();
            let PsError::Env(inner) = &err else {
                panic!("{var}={bad}: not an environment error: {err}");
            };
            assert_eq!((inner.var(), inner.value()), (var, Some(bad)));
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("{var}={bad:?}: expected {expected}")),
                "{text}"
            );
        }
    }
}
