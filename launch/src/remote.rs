//! Turning "run PROGRAM with these variables on that host" into a command line for
//! `ssh`, `srun` or `mpirun`.
//!
//! Each process gets its own wrapper command, so that the launcher can watch, stop and
//! restart it like a local child:
//!
//! | launcher | command |
//! |---|---|
//! | `ssh` | `ssh [ARGS] -o BatchMode=yes -o ConnectTimeout=15 HOST 'cd DIR && START setsid env K=V... PROGRAM ARGS... && WATCH && REPORT'` |
//! | `slurm` | `srun [ARGS] --nodes=1 --ntasks=1 --exact [--nodelist=HOST] env K=V... PROGRAM ARGS...` |
//! | `mpi` | `mpirun [ARGS] -np 1 [--host HOST] setpriv --pdeathsig KILL env K=V... PROGRAM ARGS...` |
//!
//! `ARGS` are the user's `--launcher-args`, first, so that theirs win where ssh takes
//! the first value of an option (`-o ConnectTimeout=60`).
//!
//! The remote login shell starts the program in the background (`START`, its
//! standard input the session's) and keeps its PID. `setsid` (util-linux, on every
//! Linux) makes the program lead a process group of its own, as the local launcher's
//! children do, so that what it starts (a shell's commands, a job script's steps, a
//! Python parent's workers) is stopped with it. A real `ssh` does not end the remote
//! process when the local `ssh` ends: without a terminal, sshd sends no signal when
//! the connection drops, and the process runs on until it next writes. `WATCH` closes
//! that hole. It starts, beside the program, a shell that reads the session's
//! standard input (which the launcher holds open as a pipe for the process's life)
//! and, at its end (the launcher stopped `ssh`, was killed, or the connection
//! dropped), sends the program's group SIGTERM and, once the program has exited or
//! after the launcher's grace, SIGKILL. When the program ends first, the login shell
//! SIGKILLs what it left in its group (as the local launcher does), reports and
//! exits; the watcher's input ends just after (sshd closes the session) and its
//! SIGTERM finds no group: group ids are not reused within those milliseconds.
//!
//! `REPORT`: the login shell waits for the program and prints its status on stderr
//! after [`STATUS_MARKER`], then exits with it. `ssh` exits with 255 both for its own
//! failures (a host that refuses, a failed login, a dropped connection) and for a
//! remote program killed by a signal; with the report the launcher tells them apart
//! (a program killed by SIGKILL, the OOM killer's signal, is no longer blamed on
//! ssh), and the report line never reaches the job's output. The status follows the
//! shell's rule: a program killed by signal N reports 128+N (as does one that exits
//! with 128+N itself, which the shell cannot tell apart), and `ssh` exits with it.
//!
//! Under `mpirun`, each rank is started by `setpriv --pdeathsig KILL` (util-linux),
//! so that it dies with its parent: `mpirun` itself on the launch host, OpenMPI's
//! daemon elsewhere. The launcher's children die with it (`group`), and a `mpirun`
//! killed with SIGKILL cannot stop its rank, which ran on with no parent. A rank's
//! own children are not covered. OpenMPI's session folders on the launch host
//! (`OMPI_MCA_orte_local_tmpdir_base`) go into a folder the launcher makes and
//! removes at its end ([`Wrapper::session_dir`]), where a killed `mpirun` leaves its
//! `ompi.*` folder; a SIGKILLed launcher leaves that folder
//! (`switchyard-mpi-PID` in the temporary directory).
//!
//! The variables travel on the command line (`env K=V`) rather than through the
//! wrapper's environment, because `ssh` does not forward it and `srun`/`mpirun` forward
//! it only by site policy. The ssh command line is one string that the remote login
//! shell splits again, so every word is quoted for `sh`.
//!
//! Because the variables are on the command line, where `ps` on every host shows
//! them, a job secret travels only as `SWITCHYARD_JOB_SECRET_FILE` (a path that must
//! exist on every host, e.g. a shared home directory); a launch whose secret is only in
//! `SWITCHYARD_JOB_SECRET` is refused with a remote launcher (see `process.rs`).

use super::hostfile::Host;
use super::{LaunchError, LauncherKind};
use std::path::Path;
use std::process::Command;

/// One process to start: the program, its arguments, its variables and its host.
#[derive(Debug, Clone)]
pub(crate) struct Spec<'a> {
    /// The program.
    pub(crate) program: &'a str,
    /// Its arguments.
    pub(crate) args: &'a [String],
    /// Its variables, in the order they are set.
    pub(crate) env: Vec<(String, String)>,
    /// Where it runs (`None`: wherever the wrapper decides).
    pub(crate) host: Option<&'a Host>,
}

/// How processes are wrapped: the launcher, the user's extra arguments for its command,
/// and the grace a remote process gets between SIGTERM and SIGKILL when `ssh` ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wrapper<'a> {
    /// Which wrapper.
    pub(crate) kind: LauncherKind,
    /// Words put right after `ssh`, `srun` or `mpirun`.
    pub(crate) args: &'a [String],
    /// The remote grace (ssh only).
    pub(crate) grace: std::time::Duration,
    /// Where `mpirun` keeps its session folders on this host (mpi only; `None`:
    /// OpenMPI's default, the temporary directory).
    pub(crate) session_dir: Option<&'a Path>,
}

/// How long `ssh` may take to connect before the launch fails naming the host (the
/// user's own `-o ConnectTimeout=` in `--launcher-args` comes first and wins).
const SSH_CONNECT_TIMEOUT_S: u32 = 15;

/// What the remote shell prints on stderr before the program's status, once the
/// program has ended (see the module's documentation). It starts with an ASCII record
/// separator, which programs do not print before a fixed text by chance.
pub(crate) const STATUS_MARKER: &str = "\u{1e}switchyard-remote-status ";

/// The remote shell's watcher (see the module's documentation), for a grace of
/// `grace_tenths` tenths of a second; the program's PID, which is its process group's
/// id, is in `sy_pid`. Standard input is kept as fd 3 for the watcher; the watcher's
/// own standard streams are /dev/null, so that it never holds the session's output
/// open (sshd would wait for it). The grace waits for the program itself, not its
/// whole group: a group member that has died but was not reaped still counts in
/// `kill -0`.
fn watcher(grace_tenths: u128) -> String {
    format!(
        "{{ (cat <&3 >/dev/null 2>&1; kill -TERM -$sy_pid 2>/dev/null || exit 0; \
         n=0; while kill -0 $sy_pid 2>/dev/null && [ $n -lt {grace_tenths} ]; do sleep 0.1; n=$((n+1)); done; \
         kill -KILL -$sy_pid 2>/dev/null) </dev/null >/dev/null 2>&1 & }}"
    )
}

/// The remote shell's last words: wait for the program, SIGKILL what it left running
/// in its group, report its status on stderr after [`STATUS_MARKER`], exit with it.
/// (`wait`'s own stderr is dropped: shells announce a job killed by a signal there,
/// "Killed", which would cut into the job's output.)
fn report() -> String {
    "{ wait $sy_pid 2>/dev/null; sy_status=$?; kill -KILL -$sy_pid 2>/dev/null; \
     printf '\\036switchyard-remote-status %s\\n' $sy_status >&2; exit $sy_status; }"
        .to_string()
}

/// `line` (a line of an ssh process's stderr) without the remote status report at
/// its end, and the status reported, if the line ends with one. The report follows
/// whatever the program printed last without a newline.
pub(crate) fn split_status(line: &str) -> (&str, Option<i32>) {
    match line.rsplit_once(STATUS_MARKER) {
        Some((before, status)) => match status.trim().parse::<i32>() {
            Ok(status) => (before, Some(status)),
            Err(_) => (line, None),
        },
        None => (line, None),
    }
}

/// What the wrapper of one start reported, shared by the thread that forwards its
/// stderr and the supervision loop: the remote shell's status (ssh), and whether
/// Slurm said the step was cancelled (srun).
#[derive(Debug, Default)]
pub(crate) struct RemoteReport {
    state: std::sync::Mutex<ReportState>,
    changed: std::sync::Condvar,
}

/// What has come back so far.
#[derive(Debug, Default, Clone, Copy)]
struct ReportState {
    /// The status the remote shell reported.
    status: Option<i32>,
    /// srun passed on Slurm's notice that the step was cancelled.
    cancelled: bool,
    /// The stream has ended: nothing more will come.
    closed: bool,
}

/// What a start's wrapper had reported by the time it was asked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reported {
    /// The status the remote shell reported (ssh only).
    pub(crate) status: Option<i32>,
    /// Slurm cancelled the step (srun only; see [`is_cancel_notice`]).
    pub(crate) cancelled: bool,
}

impl RemoteReport {
    fn update(&self, f: impl FnOnce(&mut ReportState)) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state);
        self.changed.notify_all();
    }

    /// The remote shell reported `status`.
    pub(crate) fn report(&self, status: i32) {
        self.update(|s| s.status = Some(status));
    }

    /// srun passed on Slurm's notice that the step was cancelled.
    pub(crate) fn cancelled(&self) {
        self.update(|s| s.cancelled = true);
    }

    /// The stream ended: no report will come after this.
    pub(crate) fn close(&self) {
        self.update(|s| s.closed = true);
    }

    /// What was reported, once the stream has closed or `limit` has passed. The
    /// wrapper has exited when this is asked, so its stream ends at once unless
    /// something else holds it; what it sent is read by then.
    pub(crate) fn wait(&self, limit: std::time::Duration) -> Reported {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (state, _) = self
            .changed
            .wait_timeout_while(state, limit, |s| !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        Reported {
            status: state.status,
            cancelled: state.cancelled,
        }
    }
}

/// Whether `line` (of srun's stderr) is Slurm's word that the step was cancelled:
/// slurmstepd's `*** STEP 12.3 ON node1 CANCELLED AT 2024-05-01T10:00:00 ***` (also
/// `JOB`, and `... DUE TO TIME LIMIT`), or srun's own `srun: forcing job termination`,
/// which it prints when it is signalled itself, as every process of the job is when
/// the job is cancelled.
pub(crate) fn is_cancel_notice(line: &str) -> bool {
    (line.contains("*** STEP ") || line.contains("*** JOB ")) && line.contains(" CANCELLED AT ")
        || line
            .trim_start()
            .starts_with("srun: forcing job termination")
}

/// How an `ssh` start ended, for the job's messages: ssh's own `status`, explained
/// by what the remote shell reported (`remote`), or, when nothing came back and ssh
/// exited with 255, as ssh's own failure.
pub(crate) fn describe_ssh_exit(status: std::process::ExitStatus, remote: Option<i32>) -> String {
    let text = status.to_string();
    match remote {
        None if status.code() == Some(255) => format!(
            "{text} (ssh's own failure, no status came back from the remote host: the host refused or could not be reached, the login failed or the connection dropped; ssh's message is above)"
        ),
        None | Some(0) => text,
        Some(code @ 129..=192) => {
            let signal = code - 128;
            let name = signal_name(signal);
            let why = match signal {
                libc::SIGKILL => ", e.g. by the kernel's OOM killer",
                libc::SIGABRT => ": it aborted",
                _ => "",
            };
            format!("{text} (reported by the remote host: the program was killed by {name}{why})")
        }
        Some(code) if status.code() == Some(code) => {
            format!("{text} (the program's own, reported by the remote host)")
        }
        Some(code) => format!("{text} (the remote host reported exit status {code})"),
    }
}

/// `SIGKILL` for 9: the signals a program commonly dies of, by name; others by number.
fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {signal}"),
    };
    name.to_string()
}

/// The command that starts `spec` with `wrapper`; `cwd` is the directory a remote
/// process starts in (ssh only: srun and mpirun keep the caller's).
pub(crate) fn command(
    wrapper: &Wrapper<'_>,
    spec: &Spec<'_>,
    cwd: &Path,
) -> Result<Command, LaunchError> {
    let env_words = || spec.env.iter().map(|(k, v)| format!("{k}={v}"));
    let mut command = match wrapper.kind {
        LauncherKind::Local => {
            let mut c = Command::new(spec.program);
            c.args(spec.args).envs(spec.env.iter().map(|(k, v)| (k, v)));
            return Ok(c);
        }
        LauncherKind::Ssh => {
            let host = spec.host.ok_or_else(|| LaunchError::InvalidOption {
                option: "hostfile",
                value: String::new(),
                reason: "--launcher ssh needs --hostfile with one host per line".into(),
            })?;
            let mut words = vec![
                "cd".to_string(),
                quote(&cwd.display().to_string()),
                "&&".into(),
                "exec".into(),
                "3<&0".into(),
                "&&".into(),
                "{".into(),
                "setsid".into(),
                "env".into(),
            ];
            words.extend(env_words().map(|w| quote(&w)));
            words.push(quote(spec.program));
            words.extend(spec.args.iter().map(|a| quote(a)));
            // A background program's input would be /dev/null: it gets the session's,
            // as a foreground one would; not the watcher's fd 3.
            words.extend(["<&3", "3<&-", "&", "}", "&&", "sy_pid=$!", "&&"].map(String::from));
            words.push(watcher(wrapper.grace.as_millis().div_ceil(100).max(1)));
            words.push("&&".into());
            words.push(report());
            let mut c = Command::new("ssh");
            c.args(wrapper.args)
                .args(["-o", "BatchMode=yes", "-o"])
                .arg(format!("ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"))
                .arg(&host.name)
                .arg(words.join(" "));
            return Ok(c);
        }
        LauncherKind::Slurm => {
            let mut c = Command::new("srun");
            // `--exact`: a step gets the one CPU it asks for, not every CPU the job
            // has on the node (Slurm 21.08+), which left the next steps waiting
            // ("Requested nodes are busy") until the first ones ended.
            c.args(wrapper.args)
                .args(["--nodes=1", "--ntasks=1", "--exact"]);
            if let Some(host) = spec.host {
                c.arg(format!("--nodelist={}", host.name));
            }
            c
        }
        LauncherKind::Mpi => {
            let mut c = Command::new("mpirun");
            c.args(wrapper.args).args(["-np", "1"]);
            if let Some(host) = spec.host {
                c.args(["--host", &host.name]);
            }
            if let Some(dir) = wrapper.session_dir {
                c.env("OMPI_MCA_orte_local_tmpdir_base", dir);
            }
            // The rank dies with its parent (see the module's documentation).
            c.args(["setpriv", "--pdeathsig", "KILL"]);
            c
        }
    };
    command
        .arg("env")
        .args(env_words())
        .arg(spec.program)
        .args(spec.args);
    Ok(command)
}

/// `word` quoted for a POSIX shell: unchanged when it has only characters the shell
/// leaves alone, else in single quotes (a `'` inside becomes `'\''`).
pub(crate) fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn args_of(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn quoting_keeps_plain_words_and_wraps_the_rest() {
        assert_eq!(quote("DMLC_ROLE=worker"), "DMLC_ROLE=worker");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    /// A wrapper of `kind` with `args` and a 1 s grace.
    fn wrapper(kind: LauncherKind, args: &[String]) -> Wrapper<'_> {
        Wrapper {
            kind,
            args,
            grace: std::time::Duration::from_secs(1),
            session_dir: None,
        }
    }

    #[test]
    fn ssh_runs_one_quoted_shell_line_in_the_same_directory() {
        let host = Host {
            name: "node1".into(),
        };
        let args = vec!["-c".to_string(), "echo a b".to_string()];
        let spec = Spec {
            program: "sh",
            args: &args,
            env: vec![("DMLC_TASK_ID".into(), "3".into())],
            host: Some(&host),
        };
        let user = vec!["-F".to_string(), "my config".to_string()];
        let c = command(
            &wrapper(LauncherKind::Ssh, &user),
            &spec,
            Path::new("/work/dir x"),
        )
        .unwrap();
        let words = args_of(&c);
        assert_eq!(
            words[..7],
            [
                "ssh",
                "-F",
                "my config",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=15"
            ]
        );
        assert_eq!(words[7], "node1");
        assert_eq!(words.len(), 9, "{words:?}");
        let line = &words[8];
        assert!(
            line.starts_with(
                "cd '/work/dir x' && exec 3<&0 && { setsid env DMLC_TASK_ID=3 sh -c 'echo a b' <&3 3<&- & } && sy_pid=$! && "
            ),
            "{line}"
        );
        assert!(line.ends_with(&format!(" && {}", report())), "{line}");
    }

    /// The remote line run by a local `sh` whose standard input is a pipe we hold, as
    /// sshd runs it: `program` (with `args`) is ended when the pipe closes. Its stderr
    /// is piped (the remote shell's report is there).
    fn run_watched(program: &str, args: &[String]) -> std::process::Child {
        let host = Host { name: "h".into() };
        let spec = Spec {
            program,
            args,
            env: vec![],
            host: Some(&host),
        };
        let c = command(&wrapper(LauncherKind::Ssh, &[]), &spec, Path::new("/")).unwrap();
        let line = args_of(&c).pop().unwrap();
        std::process::Command::new("sh")
            .args(["-c", &line])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The PID a watched program printed as its first line.
    fn first_line_pid(child: &mut std::process::Child) -> libc::pid_t {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        line.trim().parse().unwrap()
    }

    /// Whether process `pid` has ended (gone, or a zombie nobody reaped yet) within
    /// `limit`; it is SIGKILLed either way, so that a failed test leaves nothing.
    fn ended_within(pid: libc::pid_t, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        let ended = loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if matches!(state, None | Some('Z')) {
                break true;
            }
            if start.elapsed() >= limit {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        // SAFETY: kill(2) with plain integers.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        ended
    }

    /// The rest of `child`'s stderr, split into what the program printed and the
    /// remote shell's report.
    fn stderr_and_report(child: &mut std::process::Child) -> (Vec<String>, Vec<i32>) {
        use std::io::Read;
        let mut text = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let mut lines = Vec::new();
        let mut reports = Vec::new();
        for line in text.lines() {
            let (before, status) = split_status(line);
            lines.extend((!before.is_empty()).then(|| before.to_string()));
            reports.extend(status);
        }
        (lines, reports)
    }

    /// Waits up to `limit` for `child` to end.
    fn ends_within(
        child: &mut std::process::Child,
        limit: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    #[test]
    fn the_remote_program_ends_when_the_session_input_closes() {
        let mut child = run_watched("sleep", &["30".to_string()]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended with its input open"
        );
        drop(child.stdin.take());
        let status = ends_within(&mut child, std::time::Duration::from_secs(5))
            .expect("still running 5 s after its input closed");
        // The shell's status for a program ended by SIGTERM, reported and passed on.
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
        assert_eq!(stderr_and_report(&mut child).1, [128 + libc::SIGTERM]);
    }

    #[test]
    fn a_remote_program_that_ignores_sigterm_is_killed_after_the_grace() {
        let script = "trap '' TERM; while :; do sleep 0.1; done".to_string();
        let mut child = run_watched("sh", &["-c".to_string(), script]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let closed = std::time::Instant::now();
        drop(child.stdin.take());
        let status = ends_within(&mut child, std::time::Duration::from_secs(6))
            .expect("still running 6 s after its input closed");
        assert_eq!(status.code(), Some(128 + libc::SIGKILL), "{status}");
        assert!(
            closed.elapsed() >= std::time::Duration::from_millis(900),
            "killed before the 1 s grace: {:?}",
            closed.elapsed()
        );
    }

    #[test]
    fn a_remote_program_that_ends_first_keeps_its_status() {
        let mut child = run_watched("sh", &["-c".to_string(), "exit 7".to_string()]);
        let status = ends_within(&mut child, std::time::Duration::from_secs(5)).unwrap();
        assert_eq!(status.code(), Some(7));
        assert_eq!(stderr_and_report(&mut child), (vec![], vec![7]));
    }

    #[test]
    fn what_the_remote_program_started_is_stopped_with_it() {
        // A wrapper (a shell, a job script, a Python parent) and its worker: SIGTERM
        // to the wrapper alone ends it and orphans the worker.
        let script = "sleep 30 & echo $!; wait".to_string();
        let mut child = run_watched("sh", &["-c".to_string(), script]);
        let worker = first_line_pid(&mut child);
        drop(child.stdin.take());
        ends_within(&mut child, std::time::Duration::from_secs(5))
            .expect("still running 5 s after its input closed");
        assert!(
            ended_within(worker, std::time::Duration::from_secs(5)),
            "the program's child {worker} outlived it"
        );
    }

    #[test]
    fn what_a_remote_program_left_running_is_stopped_when_it_ends() {
        let script = "sleep 30 & echo $!".to_string();
        let mut child = run_watched("sh", &["-c".to_string(), script]);
        let worker = first_line_pid(&mut child);
        let status = ends_within(&mut child, std::time::Duration::from_secs(5)).unwrap();
        assert!(status.success(), "{status}");
        assert!(
            ended_within(worker, std::time::Duration::from_secs(5)),
            "the program's child {worker} outlived it"
        );
    }

    #[test]
    fn a_remote_program_killed_by_a_signal_is_reported_as_such() {
        for (signal, name) in [(libc::SIGKILL, "KILL"), (libc::SIGABRT, "ABRT")] {
            // Its last line lacks a newline: the report follows it on the same line.
            let script = format!("printf 'last words' >&2; kill -{name} $$");
            let mut child = run_watched("sh", &["-c".to_string(), script]);
            let status = ends_within(&mut child, std::time::Duration::from_secs(5)).unwrap();
            assert_eq!(status.code(), Some(128 + signal), "{status}");
            let (lines, reports) = stderr_and_report(&mut child);
            assert_eq!(lines, ["last words"]);
            assert_eq!(reports, [128 + signal]);
        }
    }

    #[test]
    fn ssh_exits_are_explained_by_the_remote_report() {
        use std::os::unix::process::ExitStatusExt;
        let exited = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        // No report and 255: ssh's own failure.
        let text = describe_ssh_exit(exited(255), None);
        assert!(text.contains("ssh's own failure"), "{text}");
        // 255 with a report: the program's own 255.
        let text = describe_ssh_exit(exited(255), Some(255));
        assert!(text.contains("the program's own"), "{text}");
        assert!(!text.contains("ssh's own"), "{text}");
        // A remote program killed by SIGKILL (ssh exits 255 when the remote side
        // dies of a signal, with the shell's 137 when the shell reports it).
        for ssh in [exited(255), exited(137)] {
            let text = describe_ssh_exit(ssh, Some(137));
            assert!(text.contains("killed by SIGKILL"), "{text}");
            assert!(!text.contains("ssh's own"), "{text}");
        }
        let text = describe_ssh_exit(exited(134), Some(134));
        assert!(text.contains("killed by SIGABRT: it aborted"), "{text}");
        assert_eq!(describe_ssh_exit(exited(1), None), "exit status: 1");
        assert_eq!(
            split_status("out\u{1e}switchyard-remote-status 9"),
            ("out", Some(9))
        );
        assert_eq!(split_status("plain"), ("plain", None));
    }

    #[test]
    fn slurms_cancel_notices_are_recognised() {
        for line in [
            "slurmstepd-node1: error: *** STEP 2.1 ON node1 CANCELLED AT 2026-11-29T04:12:53 ***",
            "slurmstepd: error: *** JOB 2 ON node0 CANCELLED AT 2026-11-29T04:12:53 DUE TO TIME LIMIT ***",
            "srun: forcing job termination",
        ] {
            assert!(is_cancel_notice(line), "{line}");
        }
        for line in [
            "srun: error: node1: task 0: Terminated",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            "the order was CANCELLED AT noon",
        ] {
            assert!(!is_cancel_notice(line), "{line}");
        }
    }

    #[test]
    fn ssh_without_a_host_names_the_hostfile() {
        let spec = Spec {
            program: "p",
            args: &[],
            env: vec![],
            host: None,
        };
        let err = command(&wrapper(LauncherKind::Ssh, &[]), &spec, Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("--hostfile"), "{err}");
    }

    #[test]
    fn srun_and_mpirun_pass_the_variables_through_env() {
        let host = Host { name: "n2".into() };
        let spec = Spec {
            program: "p",
            args: &["x".to_string()],
            env: vec![("K".into(), "v w".into())],
            host: Some(&host),
        };
        let user = vec!["--mpi=none".to_string()];
        let srun = command(&wrapper(LauncherKind::Slurm, &user), &spec, Path::new("/")).unwrap();
        assert_eq!(
            args_of(&srun),
            [
                "srun",
                "--mpi=none",
                "--nodes=1",
                "--ntasks=1",
                "--exact",
                "--nodelist=n2",
                "env",
                "K=v w",
                "p",
                "x"
            ]
        );
        let mpirun = command(
            &wrapper(LauncherKind::Mpi, &[]),
            &Spec { host: None, ..spec },
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(
            args_of(&mpirun),
            [
                "mpirun",
                "-np",
                "1",
                "setpriv",
                "--pdeathsig",
                "KILL",
                "env",
                "K=v w",
                "p",
                "x"
            ]
        );
    }
}
