//! [`run_local`]: one job from start to summary: the tracker and the rendezvous, every
//! process's environment, the supervision loop, the last output lines, the summary.

use super::console::Console;
use super::hostfile::{self, Host};
use super::supervise::{Notice, Proc, Role, Supervisor};
use super::{LaunchError, LaunchOptions, LauncherKind};
use super::{embedded, signals};
use crossbeam_channel::{Receiver, unbounded};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard_bootstrap::{
    ENV_RANK, ENV_RENDEZVOUS, ENV_TRACKER_PORT, ENV_TRACKER_URI, ENV_WORLD_SIZE, RendezvousServer,
    watchdog,
};

/// How long the launcher waits, after the job ended, for the last lines of output.
/// Bounded because a process may leave a pipe open in a daemon outside its group.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Starts the job `options` describes (on this machine, or through ssh, srun or mpirun),
/// serves its tracker and rendezvous, forwards output prefixed with `[rank]`, restarts
/// processes that fail while [`LaunchOptions::max_restarts`] allows, and waits.
///
/// Returns when every process has exited successfully. If one fails with no restarts
/// left, a worker never joins, the job runs past [`LaunchOptions::timeout`] or (with
/// [`LaunchOptions::stop_on_signals`]) SIGINT/SIGTERM arrives, every other process is
/// stopped (SIGTERM to its process group, SIGKILL after [`LaunchOptions::grace`]) and
/// the error names the cause.
pub fn run_local(options: &LaunchOptions) -> Result<(), LaunchError> {
    validate(options)?;
    let mut secret_env = secret_env(options.launcher)?;
    // A job id per job (restarts keep it): credentials derived from the secret for
    // mechanisms without fresh nonces (ZeroMQ PLAIN) then differ between jobs.
    // This process's own id (fresh unless SWITCHYARD_JOB_ID was set), so that the
    // parameter-server scheduler served from here derives the same password.
    let job_id = switchyard_secret::JobId::for_launch().map_err(|e| LaunchError::Spawn {
        program: options.program.clone(),
        reason: format!("no random job id: {e}"),
    })?;
    secret_env.push((switchyard_secret::ENV_JOB_ID.into(), job_id.value));
    if options.stop_on_signals {
        signals::install();
    }
    let hosts = hosts(options)?;
    let console = Console::new(options.progress);
    let (notice_tx, notices) = unbounded();
    let done = Arc::new(AtomicBool::new(false));
    let (bind, told) = addresses(options);

    let tracker = if options.tracker {
        Some(embedded::start(
            options.processes,
            &bind,
            notice_tx.clone(),
            done.clone(),
        )?)
    } else {
        None
    };
    let rendezvous = RendezvousServer::bind(&bind, options.processes)?;
    let port = rendezvous.port();
    // Processes are told the tracker's own choice when it bound every interface, and
    // the same rule's answer without a tracker: remote processes cannot reach this
    // machine's loopback.
    let told = match (&told, &tracker) {
        (Some(host), _) => host.clone(),
        (None, Some(t)) => t
            .worker_env()
            .into_iter()
            .find(|(k, _)| k == ENV_TRACKER_URI)
            .map(|(_, v)| v)
            .unwrap_or_else(outward_address),
        (None, None) => outward_address(),
    };
    let rendezvous_addr = format!("{told}:{port}");
    let rank_exits = rendezvous.exits();
    rendezvous.spawn(done.clone(), move |index| {
        let _ = notice_tx.send(Notice::Joined {
            index,
            via: "rendezvous",
        });
    })?;

    let tracker_env: Vec<(String, String)> = tracker
        .as_ref()
        .map(|t| {
            vec![
                (ENV_TRACKER_URI.into(), told.clone()),
                (ENV_TRACKER_PORT.into(), t.addr().port().to_string()),
                // This tracker takes robust mode's silent-rank command (see watchdog).
                (watchdog::ENV_SILENT_REPORTS.into(), "1".into()),
            ]
        })
        .unwrap_or_default();
    let mut tracker_env = tracker_env;
    let mut replicated = false;
    if options.servers > 0 {
        let config = ps_config(options)?;
        replicated = config.replicate && config.num_servers > 1;
        let port = start_ps_scheduler(options, config, &bind)?;
        tracker_env.push(("DMLC_PS_ROOT_URI".into(), told.clone()));
        tracker_env.push(("DMLC_PS_ROOT_PORT".into(), port.to_string()));
    }
    let procs = processes(options, &hosts, &tracker_env, &rendezvous_addr, &secret_env);

    let session = (options.launcher == LauncherKind::Mpi)
        .then(SessionDir::make)
        .transpose()?;
    let (output_done, output_closed) = unbounded();
    let mut supervisor = Supervisor::new(options, procs, console.clone(), notices, output_done)
        .with_replicated_servers(replicated)
        .with_rank_exits(rank_exits)
        .with_session_dir(session.as_ref().map(|s| s.0.clone()));
    let result = supervisor.run();
    supervisor.stop_all("stopped");
    done.store(true, Ordering::SeqCst);
    if let Some(tracker) = tracker {
        tracker.stop();
    }
    drain_output(&output_closed, supervisor.streams);
    console.summary(&supervisor.summary());
    // Every mpirun has ended: what a killed one left in its session folder goes.
    drop(supervisor);
    drop(session);
    result
}

/// The folder `mpirun`'s session folders go into on this host (`switchyard-mpi-PID`
/// in the temporary directory, this launcher's PID), removed when dropped: a `mpirun`
/// the launcher had to kill leaves its `ompi.*` folder there, not in the temporary
/// directory. Only a SIGKILLed launcher leaves it behind.
#[derive(Debug)]
struct SessionDir(std::path::PathBuf);

impl SessionDir {
    fn make() -> Result<SessionDir, LaunchError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("switchyard-mpi-{}", std::process::id()));
        // A folder of a dead launcher that had this PID: ours now.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| LaunchError::Spawn {
                program: "mpirun".into(),
                reason: format!("cannot make its session folder {}: {e}", path.display()),
            })?;
        Ok(SessionDir(path))
    }
}

impl Drop for SessionDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A job with servers is a parameter-server job: like ps-lite's launcher, serve its
/// scheduler (here on a thread of the launcher) and return its port, which processes
/// learn as `DMLC_PS_ROOT_PORT`. Its verdict is logged; the processes' exit statuses
/// decide the job's.
fn start_ps_scheduler(
    options: &LaunchOptions,
    config: switchyard_ps::PsConfig,
    bind: &str,
) -> Result<u16, LaunchError> {
    let endpoint = format!("tcp://{bind}:0");
    let failed = |reason: String| LaunchError::InvalidOption {
        option: "servers",
        value: options.servers.to_string(),
        reason: format!("cannot serve the parameter-server scheduler at {endpoint}: {reason}"),
    };
    let scheduler =
        switchyard_ps::Scheduler::bind(&endpoint, &config).map_err(|e| failed(e.to_string()))?;
    let port = scheduler
        .endpoint()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| failed(format!("no port in {}", scheduler.endpoint())))?;
    std::thread::Builder::new()
        .name("ps-scheduler".into())
        .spawn(move || match scheduler.run() {
            Ok(report) => tracing::info!(
                workers = report.workers,
                servers = report.servers,
                "parameter-server scheduler: job done"
            ),
            Err(e) => tracing::warn!(error = %e, "parameter-server scheduler"),
        })
        .map_err(|e| failed(e.to_string()))?;
    Ok(port)
}

/// The parameter-server settings of the job, read from the environment its processes
/// get (the launcher's, then `--env`): the scheduler must run with the liveness and
/// replication settings the servers and workers run with, or a server's death that
/// replication would survive aborts the job.
fn ps_config(options: &LaunchOptions) -> Result<switchyard_ps::PsConfig, LaunchError> {
    let (workers, servers) = (options.processes.to_string(), options.servers.to_string());
    let lookup = |var: &str| -> Option<String> {
        match var {
            "DMLC_ROLE" => Some("scheduler".into()),
            "DMLC_NUM_WORKER" => Some(workers.clone()),
            "DMLC_NUM_SERVER" => Some(servers.clone()),
            "DMLC_PS_ROOT_URI" => Some("127.0.0.1".into()),
            "DMLC_PS_ROOT_PORT" => Some("0".into()),
            _ => options
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == var)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(var).ok()),
        }
    };
    let refuse = |reason: String| LaunchError::InvalidOption {
        option: "servers",
        value: options.servers.to_string(),
        reason,
    };
    switchyard_ps::PsEnv::from_lookup(&lookup)
        .map_err(|e| refuse(e.to_string()))?
        .map(|env| env.config)
        .ok_or_else(|| refuse("no parameter-server role".into()))
}

/// Refuses options that cannot work, naming the option.
fn validate(options: &LaunchOptions) -> Result<(), LaunchError> {
    if options.processes == 0 {
        return Err(LaunchError::InvalidOption {
            option: "processes",
            value: "0".into(),
            reason: "a job needs at least one process (switchyard launch -n 1 or more)".into(),
        });
    }
    if options.launcher == LauncherKind::Local && options.hostfile.is_some() {
        return Err(LaunchError::InvalidOption {
            option: "hostfile",
            value: options
                .hostfile
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            reason: "a hostfile needs --launcher ssh, slurm or mpi".into(),
        });
    }
    if options.launcher == LauncherKind::Local && !options.launcher_args.is_empty() {
        return Err(LaunchError::InvalidOption {
            option: "launcher-args",
            value: options.launcher_args.join(" "),
            reason: "arguments for ssh, srun or mpirun need --launcher ssh, slurm or mpi".into(),
        });
    }
    Ok(())
}

/// The job secret's variable for processes started through a remote launcher: the
/// path in `SWITCHYARD_JOB_SECRET_FILE`, made absolute, never the secret itself, which
/// would show in `ps` on every host through the wrapper's command line (`env K=V`).
/// A secret given only by value cannot reach the remote hosts that way: refused, with
/// the way out. Local processes inherit the launcher's environment: nothing to add.
fn secret_env(kind: LauncherKind) -> Result<Vec<(String, String)>, LaunchError> {
    use switchyard_secret::{ENV_SECRET, ENV_SECRET_FILE, JobSecret};
    if kind == LauncherKind::Local {
        return Ok(Vec::new());
    }
    let refuse = |reason: String| LaunchError::InvalidOption {
        option: "launcher",
        value: kind.name().into(),
        reason,
    };
    // Fail closed here, before any process starts, on an unusable secret.
    JobSecret::from_env().map_err(|e| refuse(e.to_string()))?;
    if std::env::var_os(ENV_SECRET).is_some() {
        return Err(refuse(format!(
            "{ENV_SECRET} holds the secret itself, which a remote launcher could only pass \
             on the command line, where `ps` shows it; put the secret in a file readable \
             only by you at a path every host shares, and set {ENV_SECRET_FILE} to that \
             path instead"
        )));
    }
    let Some(path) = std::env::var_os(ENV_SECRET_FILE) else {
        return Ok(Vec::new());
    };
    let path = std::path::absolute(&path).unwrap_or_else(|_| path.into());
    Ok(vec![(
        ENV_SECRET_FILE.into(),
        path.to_string_lossy().into_owned(),
    )])
}

/// The hosts processes are dealt to (empty: wherever the launcher kind decides).
fn hosts(options: &LaunchOptions) -> Result<Vec<Host>, LaunchError> {
    match (&options.hostfile, options.launcher) {
        (Some(path), _) => hostfile::read(path),
        (None, LauncherKind::Ssh) => Err(LaunchError::InvalidOption {
            option: "hostfile",
            value: String::new(),
            reason: "--launcher ssh needs --hostfile with one host per line".into(),
        }),
        (None, LauncherKind::Slurm) => {
            let hosts = hostfile::from_slurm_allocation(&|name: &str| std::env::var(name).ok())?;
            fits_allocation(options, &hosts)?;
            Ok(hosts)
        }
        (None, _) => Ok(Vec::new()),
    }
}

/// Refuses a job with more processes than the Slurm allocation `slots` (one entry per
/// task) has tasks, before anything starts: each process is a one-task `srun` step,
/// and a step beyond the allocation's tasks waits for a free CPU that no step of this
/// job gives back, so the job would only end at the rendezvous timeout. Outside an
/// allocation (`slots` empty) Slurm places the steps itself.
fn fits_allocation(options: &LaunchOptions, slots: &[Host]) -> Result<(), LaunchError> {
    let wanted = u64::from(options.processes) + u64::from(options.servers);
    let tasks = slots.len() as u64;
    if slots.is_empty() || wanted <= tasks {
        return Ok(());
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| "(unset)".into());
    let servers = if options.servers > 0 {
        format!(
            " ({} workers and {} servers)",
            options.processes, options.servers
        )
    } else {
        String::new()
    };
    Err(LaunchError::InvalidOption {
        option: "processes",
        value: options.processes.to_string(),
        reason: format!(
            "the job needs {wanted} processes{servers}, one srun task each, but the Slurm \
             allocation has {tasks} tasks (SLURM_JOB_NODELIST={}, SLURM_TASKS_PER_NODE={}); \
             ask for at most {tasks}, or for an allocation with {wanted} tasks (sbatch/salloc -n {wanted})",
            var("SLURM_JOB_NODELIST"),
            var("SLURM_TASKS_PER_NODE"),
        ),
    })
}

/// The address to bind the tracker and the rendezvous, and the one to tell the
/// processes (`None`: the tracker's choice).
fn addresses(options: &LaunchOptions) -> (String, Option<String>) {
    match (&options.host, options.launcher) {
        (Some(host), _) => (host.clone(), Some(host.clone())),
        (None, LauncherKind::Local) => ("127.0.0.1".into(), Some("127.0.0.1".into())),
        (None, _) => ("0.0.0.0".into(), None),
    }
}

/// The address this machine would reach other hosts from (the tracker's rule for a
/// wildcard bind: the source address of the route outwards, no packet sent), or
/// loopback when it has no route.
fn outward_address() -> String {
    let outside = std::net::SocketAddr::from(([10, 255, 255, 255], 1));
    switchyard_net::route::local_address_towards(outside)
        .map(|ip| ip.to_string())
        .unwrap_or_else(|_| "127.0.0.1".into())
}

/// Every process with its variables: workers `0..processes`, then the servers.
fn processes(
    options: &LaunchOptions,
    hosts: &[Host],
    tracker_env: &[(String, String)],
    rendezvous_addr: &str,
    secret_env: &[(String, String)],
) -> Vec<Proc> {
    let workers = options.processes;
    let total = workers + options.servers;
    (0..total)
        .map(|task| {
            let (role, index) = if task < workers {
                (Role::Worker, task)
            } else {
                (Role::Server, task - workers)
            };
            let mut env: Vec<(String, String)> = Vec::new();
            if role == Role::Worker {
                env.push((ENV_RANK.into(), index.to_string()));
                env.push((ENV_WORLD_SIZE.into(), workers.to_string()));
                env.push((ENV_RENDEZVOUS.into(), rendezvous_addr.to_string()));
            }
            env.extend(tracker_env.iter().cloned());
            let role_name = if role == Role::Worker {
                "worker"
            } else {
                "server"
            };
            env.push(("DMLC_ROLE".into(), role_name.into()));
            env.push(("DMLC_TASK_ID".into(), task.to_string()));
            env.push(("DMLC_NUM_WORKER".into(), workers.to_string()));
            env.push(("DMLC_NUM_SERVER".into(), options.servers.to_string()));
            env.push(("DMLC_JOB_CLUSTER".into(), options.launcher.name().into()));
            env.extend(secret_env.iter().cloned());
            env.extend(options.env.iter().cloned());
            let host = (!hosts.is_empty()).then(|| hosts[task as usize % hosts.len()].clone());
            Proc::new(role, index, env, host)
        })
        .collect()
}

/// Waits until `count` output streams have closed or [`OUTPUT_DRAIN`] has passed, so
/// that a child's last lines are printed before the launcher returns.
fn drain_output(done: &Receiver<()>, count: usize) {
    let deadline = Instant::now() + OUTPUT_DRAIN;
    for _ in 0..count {
        if done.recv_deadline(deadline).is_err() {
            return;
        }
    }
}
