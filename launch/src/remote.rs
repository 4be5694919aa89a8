//! Turning "run PROGRAM with these variables on that host" into a command line for
//! `ssh`, `srun` or `mpirun`.
//!
//! Each process gets its own wrapper command, so that the launcher can watch, stop and
//! restart it like a local child:
//!
//! | launcher | command |
//! |---|---|
//! | `ssh` | `ssh [ARGS] -o BatchMode=yes -o ConnectTimeout=15 HOST 'cd DIR && WATCH && exec env K=V... PROGRAM ARGS...'` |
//! | `slurm` | `srun [ARGS] --nodes=1 --ntasks=1 --exact [--nodelist=HOST] env K=V... PROGRAM ARGS...` |
//! | `mpi` | `mpirun [ARGS] -np 1 [--host HOST] env K=V... PROGRAM ARGS...` |
//!
//! `ARGS` are the user's `--launcher-args`, first, so that theirs win where ssh takes
//! the first value of an option (`-o ConnectTimeout=60`).
//!
//! A real `ssh` does not end the remote process when the local `ssh` ends: without a
//! terminal, sshd sends no signal when the connection drops, and the process runs on
//! until it next writes. `WATCH` closes that hole. It starts, beside the program, a
//! shell that reads the session's standard input (which the launcher holds open as a
//! pipe for the process's life) and, at its end (the launcher stopped `ssh`, was
//! killed, or the connection dropped), sends the program SIGTERM and, after the
//! launcher's grace, SIGKILL. The program is `exec`'d in place of the login shell, so
//! it is the session's own process (its exit status and signals reach `ssh` as they
//! are) and the watcher finds it by the shell's PID. When the program ends first, the
//! watcher's input ends just after (sshd closes the session) and its SIGTERM finds no
//! process: PIDs are not reused within those milliseconds.
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
}

/// How long `ssh` may take to connect before the launch fails naming the host (the
/// user's own `-o ConnectTimeout=` in `--launcher-args` comes first and wins).
const SSH_CONNECT_TIMEOUT_S: u32 = 15;

/// The remote shell's watcher (see the module's documentation), for a grace of
/// `grace_tenths` tenths of a second. Standard input is kept as fd 3 for the watcher;
/// the watcher's own standard streams are /dev/null, so that it never holds the
/// session's output open (sshd would wait for it), and the program does not inherit fd 3.
fn watcher(grace_tenths: u128) -> String {
    format!(
        "exec 3<&0 && {{ (cat <&3 >/dev/null 2>&1; kill -TERM $$ 2>/dev/null || exit 0; \
         n=0; while kill -0 $$ 2>/dev/null && [ $n -lt {grace_tenths} ]; do sleep 0.1; n=$((n+1)); done; \
         kill -KILL $$ 2>/dev/null) </dev/null >/dev/null 2>&1 & }}"
    )
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
                watcher(wrapper.grace.as_millis().div_ceil(100).max(1)),
                "&&".into(),
                "exec".into(),
                "env".into(),
            ];
            words.extend(env_words().map(|w| quote(&w)));
            words.push(quote(spec.program));
            words.extend(spec.args.iter().map(|a| quote(a)));
            words.push("3<&-".into());
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
            line.starts_with("cd '/work/dir x' && exec 3<&0 && "),
            "{line}"
        );
        assert!(
            line.ends_with(" && exec env DMLC_TASK_ID=3 sh -c 'echo a b' 3<&-"),
            "{line}"
        );
    }

    /// The remote line run by a local `sh` whose standard input is a pipe we hold, as
    /// sshd runs it: `program` (with `args`) is ended when the pipe closes.
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
            .spawn()
            .unwrap()
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
        use std::os::unix::process::ExitStatusExt;
        let mut child = run_watched("sleep", &["30".to_string()]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended with its input open"
        );
        drop(child.stdin.take());
        let status = ends_within(&mut child, std::time::Duration::from_secs(5))
            .expect("still running 5 s after its input closed");
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    }

    #[test]
    fn a_remote_program_that_ignores_sigterm_is_killed_after_the_grace() {
        use std::os::unix::process::ExitStatusExt;
        let script = "trap '' TERM; while :; do sleep 0.1; done".to_string();
        let mut child = run_watched("sh", &["-c".to_string(), script]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let closed = std::time::Instant::now();
        drop(child.stdin.take());
        let status = ends_within(&mut child, std::time::Duration::from_secs(6))
            .expect("still running 6 s after its input closed");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
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
            ["mpirun", "-np", "1", "env", "K=v w", "p", "x"]
        );
    }
}
