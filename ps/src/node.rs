//! What every worker and server does with the scheduler: register, learn its rank and
//! the servers' endpoints, keep a liveness thread, wait at barriers, say it is done.

use super::control::Liveness;
use super::data::{self, DataLink};
use super::wire::{self, Control, Group, NodeRole};
use super::{DataPlane, PsConfig, PsError};
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Msg};
use switchyard_transports::{Dealer, DealerSocket, RecvError, Socket};

/// How long a blocking wait receives before it looks at the liveness thread again.
pub(crate) const SLICE: Duration = Duration::from_millis(20);

/// A registered node: its rank, the job's servers, its line to the scheduler.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) role: NodeRole,
    pub(crate) rank: u32,
    pub(crate) num_workers: u32,
    pub(crate) servers: Vec<String>,
    pub(crate) scheduler: String,
    pub(crate) config: PsConfig,
    dealer: DealerSocket,
    pub(crate) liveness: Liveness,
    /// A shutdown or abort read on the node's own line.
    ended: Option<Control>,
    /// Failovers read on the node's own line, not yet taken.
    failovers: Vec<(u32, u32)>,
    seen_failovers: Vec<(u32, u32)>,
    done: bool,
    /// The data plane, when the job opened one (taken by the worker or server).
    pub(crate) data: Option<DataLink>,
}

impl Node {
    /// Registers with the scheduler at `scheduler` as a `role` (a server giving the
    /// `endpoint` workers reach it at) and waits for the rank assignment.
    pub(crate) fn join(
        scheduler: &str,
        role: NodeRole,
        endpoint: String,
        config: &PsConfig,
    ) -> Result<Node, PsError> {
        config.check()?;
        let offers_data = config.resolve_data_plane()? == DataPlane::Link;
        let options = config
            .socket
            .clone()
            .with_connect_timeout(config.join_timeout);
        let mut dealer = DealerSocket::connect(scheduler, options).map_err(|e| {
            PsError::transport(format!("{role} joining the scheduler at {scheduler}"), e)
        })?;
        let hello = wire::control(
            wire::addr(role, u32::MAX),
            wire::SCHEDULER,
            &Control::Register {
                role,
                endpoint,
                data: offers_data,
            },
        );
        dealer.send(hello).map_err(|e| PsError::Send {
            to: format!("scheduler at {scheduler}"),
            reason: e.kind.to_string(),
        })?;
        let started = Instant::now();
        let msg = dealer
            .recv_timeout(config.join_timeout)
            .map_err(|e| match e {
                RecvError::Timeout => PsError::Timeout {
                    what: format!("{role} waiting for its rank"),
                    waited: started.elapsed(),
                    owed: format!("scheduler at {scheduler}"),
                    setting: "PsConfig::join_timeout",
                },
                other => PsError::protocol(format!("scheduler at {scheduler}"), other),
            })?;
        match wire::read_control(&msg, "scheduler")? {
            Control::Assign {
                rank,
                num_workers,
                servers,
                data,
            } => {
                if num_workers as usize != config.num_workers || servers.len() != config.num_servers
                {
                    return Err(PsError::Registration(format!(
                        "the scheduler runs {num_workers} workers and {} servers, this node was configured for {} and {}",
                        servers.len(),
                        config.num_workers,
                        config.num_servers
                    )));
                }
                let liveness = Liveness::start(scheduler, role, rank, config);
                let mut node = Node {
                    role,
                    rank,
                    num_workers,
                    servers,
                    scheduler: scheduler.to_string(),
                    config: config.clone(),
                    dealer,
                    liveness,
                    ended: None,
                    failovers: Vec::new(),
                    seen_failovers: Vec::new(),
                    done: false,
                    data: None,
                };
                if data {
                    node.data = node.open_data_plane()?;
                }
                Ok(node)
            }
            Control::Abort { reason } => Err(PsError::Registration(reason)),
            other => Err(PsError::protocol(
                "scheduler",
                format!("expected an assignment, got {other:?}"),
            )),
        }
    }

    /// Opens the data plane with every other node (see `data.rs`): `None` when the job's
    /// values travel over ZeroMQ after all, which this node's log says once.
    fn open_data_plane(&mut self) -> Result<Option<DataLink>, PsError> {
        let servers = self.servers.len() as u32;
        let size = servers as usize + self.num_workers as usize;
        let me = data::rank_of(self.role, self.rank, servers);
        let bound = data::bind(&self.scheduler, &self.config, me, size);
        let endpoint = match &bound {
            Ok(b) => b.endpoint().to_string(),
            Err(_) => String::new(),
        };
        self.send(&Control::DataEndpoint { endpoint })?;
        let peers = self.wait_note("waiting for the data plane's endpoints", |n| {
            matches!(n, Control::DataPeers { .. })
        })?;
        let Control::DataPeers { endpoints } = peers else {
            return Ok(None);
        };
        let opened = match bound {
            Ok(_) if endpoints.len() != size || endpoints.iter().any(String::is_empty) => {
                Err("a node has no data-plane endpoint".to_string())
            }
            Ok(bound) => {
                let timeout = self.config.join_timeout;
                data::open(bound, &endpoints, servers, &self.config, timeout)
            }
            Err(e) => Err(e),
        };
        self.send(&Control::DataOpened { ok: opened.is_ok() })?;
        let chosen = self.wait_note("waiting for the data plane's verdict", |n| {
            matches!(n, Control::DataChosen { .. })
        })?;
        let link = matches!(chosen, Control::DataChosen { link: true });
        let who = format!("ps {} {}", self.role, self.rank);
        match opened {
            Ok(plane) if link => Ok(Some(plane)),
            Ok(_) => {
                tracing::warn!(
                    "{who}: another node could not open the data plane; values travel over ZeroMQ"
                );
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(
                    "{who}: the data plane could not be opened ({e}); values travel over ZeroMQ"
                );
                Ok(None)
            }
        }
    }

    /// `Ok` while the job runs, else why not: what the liveness thread learnt, or a
    /// shutdown or abort sent on this node's own line (the scheduler sends there too,
    /// for a node whose liveness thread it has not heard from yet).
    pub(crate) fn check(&mut self) -> Result<(), PsError> {
        self.liveness.check()?;
        while self.ended.is_none() {
            let Ok(msg) = self.dealer.try_recv() else {
                break;
            };
            match wire::read_control(&msg, "scheduler")? {
                note @ (Control::Shutdown | Control::Abort { .. }) => self.ended = Some(note),
                Control::Failover { dead, by } => self.failovers.push((dead, by)),
                other => tracing::debug!("ps {} {}: stray {other:?}", self.role, self.rank),
            }
        }
        match &self.ended {
            Some(Control::Abort { reason }) => Err(PsError::Aborted {
                reason: reason.clone(),
            }),
            Some(_) => Err(PsError::Finished),
            None => Ok(()),
        }
    }

    /// Failovers announced since the last call, each once: (dead server, the server
    /// that now serves its keys). The scheduler sends them on both of a node's lines.
    pub(crate) fn take_failovers(&mut self) -> Vec<(u32, u32)> {
        let mut all = std::mem::take(&mut self.failovers);
        all.extend(self.liveness.take_failovers());
        all.retain(|f| !self.seen_failovers.contains(f));
        all.sort_unstable();
        all.dedup();
        self.seen_failovers.extend(all.iter().copied());
        all
    }

    /// This node's address in message headers.
    pub(crate) fn addr(&self) -> Addr {
        wire::addr(self.role, self.rank)
    }

    fn send(&mut self, note: &Control) -> Result<(), PsError> {
        let msg = wire::control(self.addr(), wire::SCHEDULER, note);
        self.dealer.send(msg).map_err(|e| PsError::Send {
            to: format!("scheduler at {}", self.scheduler),
            reason: e.kind.to_string(),
        })
    }

    /// Waits for the scheduler's note `want` and returns it.
    fn wait_note(
        &mut self,
        what: &str,
        want: impl Fn(&Control) -> bool,
    ) -> Result<Control, PsError> {
        let mut got = None;
        self.wait_for_note(what, |n| want(n), || {}, &mut got)?;
        got.ok_or(PsError::Finished)
    }

    /// Waits for the scheduler's answer `want`, calling `between` in every pause
    /// (a server keeps its sockets serviced there).
    fn wait_for(
        &mut self,
        what: &str,
        want: impl Fn(&Control) -> bool,
        between: impl FnMut(),
    ) -> Result<(), PsError> {
        self.wait_for_note(what, want, between, &mut None)
    }

    /// [`Node::wait_for`], keeping the note in `got`.
    fn wait_for_note(
        &mut self,
        what: &str,
        want: impl Fn(&Control) -> bool,
        mut between: impl FnMut(),
        got: &mut Option<Control>,
    ) -> Result<(), PsError> {
        let started = Instant::now();
        loop {
            self.liveness.check()?;
            match self.dealer.recv_timeout(SLICE) {
                Ok(msg) => {
                    let note = wire::read_control(&msg, "scheduler")?;
                    if want(&note) {
                        *got = Some(note);
                        return Ok(());
                    }
                    match note {
                        Control::Abort { reason } => return Err(PsError::Aborted { reason }),
                        Control::Failover { dead, by } => self.failovers.push((dead, by)),
                        _ => {}
                    }
                }
                Err(RecvError::Timeout | RecvError::Empty) => {}
                Err(e) => {
                    return Err(PsError::protocol(
                        format!("scheduler at {}", self.scheduler),
                        e,
                    ));
                }
            }
            between();
            if started.elapsed() > self.config.request_timeout {
                return Err(PsError::Timeout {
                    what: format!("{} {} {what}", self.role, self.rank),
                    waited: started.elapsed(),
                    owed: format!("scheduler at {}", self.scheduler),
                    setting: "PsConfig::request_timeout",
                });
            }
        }
    }

    /// Waits until every node of `group` has called `barrier(group)`.
    pub(crate) fn barrier(&mut self, group: Group, between: impl FnMut()) -> Result<(), PsError> {
        if !group.contains(self.role) {
            return Err(PsError::BadArguments(format!(
                "a {} cannot wait at a barrier of {group:?}",
                self.role
            )));
        }
        self.send(&Control::Barrier { group })?;
        self.wait_for(
            &format!("at a barrier of {group:?}"),
            |n| *n == Control::Release { group },
            between,
        )
    }

    /// Tells the scheduler this worker has finished and stops the heartbeats.
    pub(crate) fn done(&mut self) -> Result<(), PsError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let result = self
            .send(&Control::Done)
            .and_then(|()| self.wait_for("saying it is done", |n| *n == Control::Ack, || {}));
        self.liveness.stop();
        // Shut down already means every worker is done, this one included.
        match result {
            Err(PsError::Finished) => Ok(()),
            other => other,
        }
    }
}

/// The endpoint a server binds: a fresh name on the scheduler's in-process backend,
/// or port 0 on `host` (or the address that reaches the scheduler) for tcp.
pub(crate) fn server_bind_endpoint(scheduler: &str, host: Option<&str>) -> Result<String, PsError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    for scheme in ["local://", "inproc://"] {
        if let Some(name) = scheduler.strip_prefix(scheme) {
            return Ok(format!("{scheme}{name}-server-{}-{n}", std::process::id()));
        }
    }
    let Some(address) = scheduler.strip_prefix("tcp://") else {
        return Err(PsError::BadArguments(format!(
            "scheduler endpoint {scheduler}: the parameter server runs over local://, inproc:// or tcp://"
        )));
    };
    let host = match host {
        Some(h) => h.to_string(),
        None => route_to(address).unwrap_or_else(|| "127.0.0.1".to_string()),
    };
    Ok(format!("tcp://{host}:0"))
}

/// The local address of the route to `address` (`host:port`): what the scheduler's
/// host can reach us at, bracketed when it is IPv6 so that it can stand in a URL.
fn route_to(address: &str) -> Option<String> {
    use std::net::ToSocketAddrs;
    let target = address.to_socket_addrs().ok()?.next()?;
    let ip = switchyard_net::route::local_address_towards(target).ok()?;
    Some(if ip.is_ipv6() {
        format!("[{ip}]")
    } else {
        ip.to_string()
    })
}

/// Sends `msg` from a node and maps the failure to a [`PsError`] naming `to`.
pub(crate) fn send_to(dealer: &mut DealerSocket, msg: Msg, to: &str) -> Result<(), PsError> {
    dealer.send(msg).map_err(|e| PsError::Send {
        to: to.to_string(),
        reason: e.kind.to_string(),
    })
}
