//! The supervision loop: start every process, watch them, restart the ones that fail
//! while restarts are left, and stop everything when the job is over, failed, timed out
//! or interrupted.
//!
//! The loop polls every [`POLL`]: children (`try_wait`), notices from the rendezvous
//! and the tracker, the signal flag and the deadlines. Polling rather than blocking
//! keeps one thread in charge of every child, so no child is ever waited for twice.

use super::console::{Console, SummaryRow, forward_output};
use super::group;
use super::hostfile::Host;
use super::remote::{self, RemoteReport, Spec};
use super::{LaunchError, LaunchOptions, LauncherKind, signals};
use crossbeam_channel::{Receiver, Sender};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_bootstrap::RankExits;

/// How often the loop looks at everything.
const POLL: Duration = Duration::from_millis(10);

/// How long the loop waits, after an `ssh` or `srun` failed, for the rest of its
/// stderr (where the remote shell's status report and Slurm's cancel notice are).
/// Bounded because something else (a multiplexing master of ssh's, a program's
/// background child under a stand-in) may hold the stream open.
const REPORT_WAIT: Duration = Duration::from_secs(2);

/// How long a process that ended as a cancelled one does (by SIGTERM, or with srun
/// passing on Slurm's cancel notice) is held, before it counts as failed, for the
/// launcher's own SIGINT or SIGTERM. Slurm cancelling a job (`scancel`, its time
/// limit) signals the launcher and every step at once, from different daemons, so a
/// step's end can be seen first; the job was interrupted, not failed by that rank.
const CANCEL_WINDOW: Duration = Duration::from_secs(1);

/// What the rendezvous and the tracker tell the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Worker `index` checked in (it is alive and talking).
    Joined {
        /// The worker's index (its `DMLC_TASK_ID` and `SWITCHYARD_RANK`).
        index: u32,
        /// `rendezvous` or `tracker`.
        via: &'static str,
    },
    /// A line for the log (a tracker `print`, a dropped connection).
    Log(String),
    /// A robust job's survivors gave up on worker `index`'s start number `attempt`
    /// as silent ([`watchdog`](switchyard_bootstrap::watchdog)): kill it, so that it is restarted.
    Silent {
        /// The worker's index.
        index: u32,
        /// Which start of it.
        attempt: u32,
        /// The survivor's report.
        text: String,
    },
}

/// A worker or a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `DMLC_ROLE=worker`, rank `index`.
    Worker,
    /// `DMLC_ROLE=server`.
    Server,
}

/// One supervised process across its restarts.
#[derive(Debug)]
pub(crate) struct Proc {
    /// Worker or server.
    pub(crate) role: Role,
    /// Index within its role.
    pub(crate) index: u32,
    /// Its variables, except `DMLC_NUM_ATTEMPT` (set per start).
    pub(crate) env: Vec<(String, String)>,
    /// Where it runs.
    pub(crate) host: Option<Host>,
    child: Option<Child>,
    /// What the remote side of the running start reports (ssh only).
    report: Option<Arc<RemoteReport>>,
    /// Restarts so far (`DMLC_NUM_ATTEMPT`).
    attempt: u32,
    first_start: Option<Instant>,
    /// How it ended and when, once it has for good.
    end: Option<(String, Instant)>,
    joined: bool,
}

impl Proc {
    /// A process not yet started.
    pub(crate) fn new(
        role: Role,
        index: u32,
        env: Vec<(String, String)>,
        host: Option<Host>,
    ) -> Self {
        Proc {
            role,
            index,
            env,
            host,
            child: None,
            report: None,
            attempt: 0,
            first_start: None,
            end: None,
            joined: false,
        }
    }

    /// `rank 3` or `server 0`, as errors and the summary name it.
    pub(crate) fn name(&self) -> String {
        match self.role {
            Role::Worker => format!("rank {}", self.index),
            Role::Server => format!("server {}", self.index),
        }
    }

    /// `rank 3 on node1` where it runs on a host of the hostfile or the Slurm
    /// allocation, else as [`Proc::name`].
    pub(crate) fn name_on(&self) -> String {
        match &self.host {
            Some(host) => format!("{} on {}", self.name(), host.name),
            None => self.name(),
        }
    }

    /// The prefix of its output lines: `[3] ` or `[s0] `.
    fn prefix(&self) -> String {
        match self.role {
            Role::Worker => format!("[{}] ", self.index),
            Role::Server => format!("[s{}] ", self.index),
        }
    }
}

/// The loop's state.
pub(crate) struct Supervisor<'a> {
    options: &'a LaunchOptions,
    procs: Vec<Proc>,
    console: Arc<Console>,
    notices: Receiver<Notice>,
    output_done: Sender<()>,
    /// Output streams being forwarded (for the final drain).
    pub(crate) streams: usize,
    cwd: PathBuf,
    restarts: u32,
    /// A parameter-server job with replication: one server may die, its keys served
    /// by its replica, without ending the job (and it is not restarted: the scheduler
    /// has already handed its keys over and refuses a late server).
    replicated_servers: bool,
    /// Servers lost that way.
    servers_lost: u32,
    /// Where `mpirun` keeps its session folders (see `remote`).
    session_dir: Option<PathBuf>,
    /// Where workers that ended for good are reported: the rendezvous refuses the
    /// communicators they never formed at once, naming them.
    rank_exits: Option<RankExits>,
}

impl std::fmt::Debug for Supervisor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("procs", &self.procs)
            .finish_non_exhaustive()
    }
}

impl<'a> Supervisor<'a> {
    /// A loop over `procs`; nothing starts before [`Supervisor::run`].
    pub(crate) fn new(
        options: &'a LaunchOptions,
        procs: Vec<Proc>,
        console: Arc<Console>,
        notices: Receiver<Notice>,
        output_done: Sender<()>,
    ) -> Self {
        Supervisor {
            options,
            procs,
            console,
            notices,
            output_done,
            streams: 0,
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            restarts: 0,
            replicated_servers: false,
            servers_lost: 0,
            session_dir: None,
            rank_exits: None,
        }
    }

    /// Reports every worker that ends for good to the rendezvous through `exits`.
    pub(crate) fn with_rank_exits(mut self, exits: RankExits) -> Self {
        self.rank_exits = Some(exits);
        self
    }

    /// Points `mpirun`'s session folders on this host at `dir`, which the caller
    /// makes and removes.
    pub(crate) fn with_session_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.session_dir = dir;
        self
    }

    /// Marks the job as a parameter-server job whose servers replicate each other:
    /// the first server that dies is left to the scheduler's failover.
    pub(crate) fn with_replicated_servers(mut self, on: bool) -> Self {
        self.replicated_servers = on;
        self
    }

    /// Starts every process and supervises the job until it ends.
    pub(crate) fn run(&mut self) -> Result<(), LaunchError> {
        for i in 0..self.procs.len() {
            self.start(i)?;
        }
        self.show_status();
        let started = Instant::now();
        let deadline = started + self.options.timeout;
        let join_deadline = started + self.options.rendezvous_timeout;
        let mut join_checked = false;
        loop {
            if self.options.stop_on_signals {
                if let Some(signal) = signals::received() {
                    self.console
                        .event(&format!("{signal} received; stopping every process"));
                    self.stop_all("stopped (interrupted)");
                    return Err(LaunchError::Interrupted { signal });
                }
            }
            self.take_notices();
            if let Some(err) = self.reap()? {
                return Err(err);
            }
            if self.procs.iter().all(|p| p.end.is_some()) {
                return Ok(());
            }
            if !join_checked && Instant::now() >= join_deadline {
                join_checked = true;
                let missing: Vec<u32> = self
                    .procs
                    .iter()
                    .filter(|p| p.role == Role::Worker && !p.joined && p.end.is_none())
                    .map(|p| p.index)
                    .collect();
                if !missing.is_empty() {
                    self.stop_all("stopped (never joined)");
                    return Err(LaunchError::Missing {
                        missing,
                        waited: started.elapsed(),
                    });
                }
            }
            if Instant::now() >= deadline {
                self.stop_all("stopped (job timeout)");
                return Err(LaunchError::JobTimeout {
                    limit: self.options.timeout,
                });
            }
            self.show_status();
            std::thread::sleep(POLL);
        }
    }

    /// Starts (or restarts) process `i` with its current attempt number.
    fn start(&mut self, i: usize) -> Result<(), LaunchError> {
        let options = self.options;
        let proc = &mut self.procs[i];
        let mut env = proc.env.clone();
        env.push((
            switchyard_bootstrap::ENV_NUM_ATTEMPT.into(),
            proc.attempt.to_string(),
        ));
        let spec = Spec {
            program: &options.program,
            args: &options.args,
            env,
            host: proc.host.as_ref(),
        };
        let wrapper = remote::Wrapper {
            kind: options.launcher,
            args: &options.launcher_args,
            grace: options.grace,
            session_dir: self.session_dir.as_deref(),
        };
        let mut command = remote::command(&wrapper, &spec, &self.cwd)?;
        // Over ssh the remote side ends its program when this pipe closes (see
        // `remote`): the `Child` keeps it open until the process is reaped or this
        // launcher dies.
        let stdin = if options.launcher == LauncherKind::Ssh {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        group::own_group(&mut command);
        let wrapper_name = command.get_program().to_string_lossy().into_owned();
        let mut child = command.spawn().map_err(|e| LaunchError::Spawn {
            program: wrapper_name.clone(),
            reason: e.to_string(),
        })?;
        let prefix = proc.prefix();
        // The remote shell reports the program's status on stderr (see `remote`), and
        // srun passes on Slurm's word that the step was cancelled there.
        proc.report =
            matches!(options.launcher, LauncherKind::Ssh | LauncherKind::Slurm).then(Arc::default);
        if let Some(out) = child.stdout.take() {
            forward_output(
                self.console.clone(),
                prefix.clone(),
                out,
                false,
                self.output_done.clone(),
                None,
            );
            self.streams += 1;
        }
        if let Some(err) = child.stderr.take() {
            forward_output(
                self.console.clone(),
                prefix,
                err,
                true,
                self.output_done.clone(),
                proc.report.clone(),
            );
            self.streams += 1;
        }
        let pid = child.id();
        proc.child = Some(child);
        proc.first_start.get_or_insert_with(Instant::now);
        // A remote process's PID is not known here: the one at hand is its wrapper's
        // (ssh, srun, mpirun) on this host, and is named as such.
        let text = if options.launcher == LauncherKind::Local {
            format!(
                "{} running (pid {pid}, DMLC_NUM_ATTEMPT={})",
                proc.name(),
                proc.attempt
            )
        } else {
            format!(
                "{} running ({wrapper_name} pid {pid} on this host, DMLC_NUM_ATTEMPT={})",
                proc.name_on(),
                proc.attempt
            )
        };
        self.console.event(&text);
        Ok(())
    }

    /// Handles every notice waiting.
    fn take_notices(&mut self) {
        while let Ok(notice) = self.notices.try_recv() {
            match notice {
                Notice::Joined { index, via } => {
                    let Some(proc) = self
                        .procs
                        .iter_mut()
                        .find(|p| p.role == Role::Worker && p.index == index)
                    else {
                        continue;
                    };
                    if !proc.joined {
                        proc.joined = true;
                        let text = format!("{} joined ({via})", proc.name());
                        self.console.event(&text);
                    }
                }
                Notice::Log(text) => self.console.child_line(true, &text),
                Notice::Silent {
                    index,
                    attempt,
                    text,
                } => {
                    let Some(proc) = self.procs.iter_mut().find(|p| {
                        p.role == Role::Worker && p.index == index && p.attempt == attempt
                    }) else {
                        continue;
                    };
                    if let Some(pid) = proc.child.as_ref().map(std::process::Child::id) {
                        let line = format!("{} killed: {text}", proc.name_on());
                        group::signal_group(pid, libc::SIGKILL);
                        self.console.event(&line);
                    }
                }
            }
        }
    }

    /// Looks at every running child: finished ones are recorded, failed ones restarted
    /// or, with no restarts left, end the job (`Ok(Some(error))`).
    fn reap(&mut self) -> Result<Option<LaunchError>, LaunchError> {
        for i in 0..self.procs.len() {
            let proc = &mut self.procs[i];
            let Some(child) = proc.child.as_mut() else {
                continue;
            };
            let status = match child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => status,
                Err(e) => {
                    let name = proc.name();
                    self.stop_all("stopped");
                    return Ok(Some(LaunchError::RankFailed {
                        process: name,
                        status: format!("unknown status ({e})"),
                        restarts: 0,
                    }));
                }
            };
            let pid = child.id();
            proc.child = None;
            let report = proc.report.take();
            // Whatever it left running in its group goes with it: no orphans.
            group::signal_group(pid, libc::SIGKILL);
            if status.success() {
                proc.end = Some((status.to_string(), Instant::now()));
                if let (Role::Worker, Some(exits)) = (proc.role, &self.rank_exits) {
                    exits.exited(proc.index, &format!("finished ({status})"));
                }
                let text = format!("{} finished ({status})", proc.name());
                self.console.event(&text);
                continue;
            }
            let reported = report
                .map(|report| report.wait(REPORT_WAIT))
                .unwrap_or_default();
            let cancel_like = reported.cancelled || ended_by_sigterm(status, reported.status);
            // ssh's status alone cannot tell its own failure from a remote program's
            // death by a signal (255 for both): the remote shell's report, read to the
            // end of ssh's stderr, can.
            let status = if self.options.launcher == LauncherKind::Ssh {
                remote::describe_ssh_exit(status, reported.status)
            } else {
                status.to_string()
            };
            // A signal to the launcher seen by now, or (for an end like a cancelled
            // one) within CANCEL_WINDOW, is why this process ended: the job was
            // interrupted; the process neither failed nor is restarted.
            let window = if cancel_like {
                CANCEL_WINDOW
            } else {
                Duration::ZERO
            };
            let interrupted = if self.options.stop_on_signals {
                signal_within(window)
            } else {
                None
            };
            if let Some(signal) = interrupted {
                let name = proc.name_on();
                proc.end = Some((format!("stopped (interrupted): {status}"), Instant::now()));
                self.console.event(&format!(
                    "{signal} received as {name} ended ({status}); stopping every process"
                ));
                self.stop_all("stopped (interrupted)");
                return Ok(Some(LaunchError::Interrupted { signal }));
            }
            if proc.role == Role::Server && self.replicated_servers && self.servers_lost == 0 {
                self.servers_lost += 1;
                let text = format!(
                    "{} exited with {status}; its keys are served by its replica (one server may be lost per job; not restarted)",
                    proc.name()
                );
                proc.end = Some((
                    format!("lost ({status}), replaced by its replica"),
                    Instant::now(),
                ));
                self.console.event(&text);
                continue;
            }
            if proc.attempt < self.options.max_restarts {
                proc.attempt += 1;
                proc.joined = false;
                self.restarts += 1;
                let text = format!(
                    "{} exited with {status}; restarted with DMLC_NUM_ATTEMPT={} (--max-restarts {})",
                    proc.name_on(),
                    proc.attempt,
                    self.options.max_restarts
                );
                self.console.event(&text);
                self.start(i)?;
                continue;
            }
            proc.end = Some((status.clone(), Instant::now()));
            let restarts = proc.attempt;
            let name = proc.name_on();
            self.console.event(&format!("{name} failed ({status})"));
            self.stop_all("stopped (another process failed)");
            return Ok(Some(LaunchError::RankFailed {
                process: name,
                status,
                restarts,
            }));
        }
        Ok(None)
    }

    /// Stops every running child (SIGTERM, grace, SIGKILL to each group) and records
    /// `why` as its end.
    pub(crate) fn stop_all(&mut self, why: &str) {
        let running: Vec<usize> = (0..self.procs.len())
            .filter(|i| self.procs[*i].child.is_some())
            .collect();
        let children: Vec<Child> = running
            .iter()
            .filter_map(|i| self.procs[*i].child.take())
            .collect();
        let statuses = group::stop_all(children, self.options.grace);
        let now = Instant::now();
        for (i, status) in running.into_iter().zip(statuses) {
            let status = status
                .map(|s| s.to_string())
                .unwrap_or_else(|| "unknown".into());
            self.procs[i].end = Some((format!("{why}: {status}"), now));
        }
    }

    /// The status line: counts of joined, running, finished and restarted.
    fn show_status(&self) {
        let workers = self.procs.iter().filter(|p| p.role == Role::Worker).count();
        let joined = self.procs.iter().filter(|p| p.joined).count();
        let running = self.procs.iter().filter(|p| p.child.is_some()).count();
        let finished = self.procs.iter().filter(|p| p.end.is_some()).count();
        self.console.status(format!(
            "switchyard: {} processes | joined {joined}/{workers} | running {running} | finished {finished} | restarted {}",
            self.procs.len(),
            self.restarts
        ));
    }

    /// One row per process for the summary.
    pub(crate) fn summary(&self) -> Vec<SummaryRow> {
        let now = Instant::now();
        self.procs
            .iter()
            .map(|p| {
                let (status, ended) = p
                    .end
                    .clone()
                    .unwrap_or_else(|| ("not finished".into(), now));
                SummaryRow {
                    process: p.name(),
                    starts: if p.first_start.is_some() {
                        p.attempt + 1
                    } else {
                        0
                    },
                    status,
                    wall: p
                        .first_start
                        .map(|s| ended.duration_since(s))
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
}

/// Whether a process ended as SIGTERM ends one: killed by it, or, through a wrapper
/// that passes a signal on as `128 + N` (srun, ssh's remote shell, mpirun), 143.
fn ended_by_sigterm(status: std::process::ExitStatus, remote: Option<i32>) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let by_wrapper = 128 + libc::SIGTERM;
    status.signal() == Some(libc::SIGTERM)
        || status.code() == Some(by_wrapper)
        || remote == Some(by_wrapper)
}

/// The signal the launcher received, if it has by now or does within `window`.
fn signal_within(window: Duration) -> Option<&'static str> {
    let until = Instant::now() + window;
    loop {
        if let Some(signal) = signals::received() {
            return Some(signal);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

impl Drop for Supervisor<'_> {
    /// No error path leaves a child behind.
    fn drop(&mut self) {
        self.stop_all("stopped");
    }
}
