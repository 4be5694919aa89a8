use super::rendezvous::{read_check_in, write_endpoints};
use super::{LaunchError, ENV_RANK, ENV_RENDEZVOUS, ENV_WORLD_SIZE};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What [`run_local`] starts and how long it lets it run.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard::launch::LaunchOptions;
/// let opts = LaunchOptions::new(3, "target/release/examples/param_server")
///     .with_timeout(Duration::from_secs(60));
/// assert_eq!(opts.processes, 3);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LaunchOptions {
    /// How many processes.
    pub processes: u32,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
    /// How long every process has to check in at the rendezvous (default 60 s).
    pub rendezvous_timeout: Duration,
    /// How long the whole job may run before every process is stopped (default 1 h).
    pub timeout: Duration,
}

impl LaunchOptions {
    /// `processes` copies of `program`, no arguments, default timeouts.
    pub fn new(processes: u32, program: impl Into<String>) -> Self {
        LaunchOptions {
            processes,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            rendezvous_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(3600),
        }
    }

    /// Sets the arguments.
    pub fn with_args(mut self, args: Vec<String>) -> Self {
        self.args = args;
        self
    }

    /// Adds an environment variable for every process.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets [`LaunchOptions::rendezvous_timeout`].
    pub fn with_rendezvous_timeout(mut self, timeout: Duration) -> Self {
        self.rendezvous_timeout = timeout;
        self
    }

    /// Sets [`LaunchOptions::timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Kills and reaps every child still running when dropped, so that no error path
/// leaves a process behind.
struct Children(Vec<Option<Child>>);

impl Children {
    fn kill_all(&mut self) {
        for child in self.0.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.0.iter_mut().for_each(|c| *c = None);
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Copies a child's output line by line, each prefixed with its rank; sends on `done`
/// when the stream closes.
fn forward_output(
    rank: u32,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    done: Sender<()>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "[{rank}] {line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "[{rank}] {line}");
            }
        }
        let _ = done.send(());
    });
}

/// How long the launcher waits, after the job ended, for the last lines of output.
/// Bounded because a grandchild may inherit a pipe and keep it open.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

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

/// Serves the rendezvous until every rank has checked in, then answers them all.
fn serve_rendezvous(
    listener: TcpListener,
    world: u32,
    timeout: Duration,
) -> Result<(), LaunchError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    listener
        .set_nonblocking(true)
        .map_err(|e| LaunchError::Rendezvous {
            addr: addr.clone(),
            reason: e.to_string(),
        })?;
    let mut arrived: Vec<Option<(TcpStream, String)>> = (0..world).map(|_| None).collect();
    while arrived.iter().any(Option::is_none) {
        if Instant::now() >= deadline {
            let missing = (0..world)
                .filter(|r| arrived[*r as usize].is_none())
                .collect();
            return Err(LaunchError::Missing {
                missing,
                waited: started.elapsed(),
            });
        }
        let (mut stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "rendezvous accept failed");
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        // One slow or silent client may hold the loop for at most 5 s.
        let client_deadline = deadline.min(Instant::now() + Duration::from_secs(5));
        match read_check_in(&mut stream, client_deadline) {
            Ok(check_in) if check_in.world != world => {
                tracing::warn!(%peer, claimed = check_in.world, world, "rendezvous: wrong world size; closed");
            }
            Ok(check_in) if check_in.rank >= world => {
                tracing::warn!(%peer, rank = check_in.rank, world, "rendezvous: rank outside the job; closed");
            }
            Ok(check_in) if arrived[check_in.rank as usize].is_some() => {
                tracing::warn!(%peer, rank = check_in.rank, "rendezvous: rank already checked in; closed");
            }
            Ok(check_in) => arrived[check_in.rank as usize] = Some((stream, check_in.endpoint)),
            Err(e) => tracing::warn!(%peer, error = %e, "rendezvous: bad check-in; closed"),
        }
    }
    let (streams, endpoints): (Vec<_>, Vec<_>) = arrived.into_iter().flatten().unzip();
    let answer_deadline = Instant::now() + Duration::from_secs(10);
    for (rank, mut stream) in streams.into_iter().enumerate() {
        if let Err(e) = write_endpoints(&mut stream, &endpoints, answer_deadline) {
            tracing::warn!(rank, error = %e, "rendezvous: could not send the endpoint list");
        }
    }
    Ok(())
}

/// Starts `options.processes` copies of the program on this machine, serves their
/// rendezvous, forwards their output prefixed with `[rank]`, and waits for them.
///
/// Returns when every process has exited successfully. If one fails, the rendezvous
/// times out, or the job runs past [`LaunchOptions::timeout`], every other process is
/// killed and the error names the cause.
pub fn run_local(options: &LaunchOptions) -> Result<(), LaunchError> {
    let (output_done, output_closed) = unbounded();
    let mut streams = 0;
    let result = run_children(options, &output_done, &mut streams);
    drain_output(&output_closed, streams);
    result
}

/// The body of [`run_local`]; counts in `streams` the output streams it forwards.
fn run_children(
    options: &LaunchOptions,
    output_done: &Sender<()>,
    streams: &mut usize,
) -> Result<(), LaunchError> {
    let world = options.processes;
    if world == 0 {
        return Err(LaunchError::InvalidOption {
            option: "processes",
            value: "0".into(),
            reason: "a job needs at least one process (switchyard launch -n 1 or more)".into(),
        });
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| LaunchError::Rendezvous {
        addr: "127.0.0.1:0".into(),
        reason: e.to_string(),
    })?;
    let rendezvous_addr = listener
        .local_addr()
        .map_err(|e| LaunchError::Rendezvous {
            addr: "127.0.0.1:0".into(),
            reason: e.to_string(),
        })?
        .to_string();
    let mut children = Children(Vec::new());
    for rank in 0..world {
        let mut command = Command::new(&options.program);
        command
            .args(&options.args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_WORLD_SIZE, world.to_string())
            .env(ENV_RENDEZVOUS, &rendezvous_addr)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| LaunchError::Spawn {
            program: options.program.clone(),
            reason: e.to_string(),
        })?;
        if let Some(out) = child.stdout.take() {
            forward_output(rank, out, false, output_done.clone());
            *streams += 1;
        }
        if let Some(err) = child.stderr.take() {
            forward_output(rank, err, true, output_done.clone());
            *streams += 1;
        }
        children.0.push(Some(child));
    }
    let rendezvous: Receiver<Result<(), LaunchError>> = {
        let (tx, rx) = bounded(1);
        let timeout = options.rendezvous_timeout;
        std::thread::spawn(move || {
            let _ = tx.send(serve_rendezvous(listener, world, timeout));
        });
        rx
    };
    let deadline = Instant::now() + options.timeout;
    let mut rendezvous_done = false;
    loop {
        let mut running = 0;
        for (rank, slot) in children.0.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) if status.success() => *slot = None,
                Ok(Some(status)) => {
                    *slot = None;
                    children.kill_all();
                    return Err(LaunchError::RankFailed {
                        rank: rank as u32,
                        status: status.to_string(),
                    });
                }
                Ok(None) => running += 1,
                Err(e) => {
                    children.kill_all();
                    return Err(LaunchError::RankFailed {
                        rank: rank as u32,
                        status: format!("unknown ({e})"),
                    });
                }
            }
        }
        if running == 0 {
            return Ok(());
        }
        if !rendezvous_done {
            match rendezvous.try_recv() {
                Ok(Ok(())) => rendezvous_done = true,
                Ok(Err(e)) => {
                    children.kill_all();
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        if Instant::now() >= deadline {
            children.kill_all();
            return Err(LaunchError::JobTimeout {
                limit: options.timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
