//! Turning "run PROGRAM with these variables on that host" into a command line for
//! `ssh`, `srun` or `mpirun`.
//!
//! Each process gets its own wrapper command, so that the launcher can watch, stop and
//! restart it like a local child:
//!
//! | launcher | command |
//! |---|---|
//! | `ssh` | `ssh -o BatchMode=yes HOST 'cd DIR && exec env K=V... PROGRAM ARGS...'` |
//! | `slurm` | `srun --nodes=1 --ntasks=1 [--nodelist=HOST] env K=V... PROGRAM ARGS...` |
//! | `mpi` | `mpirun -np 1 [--host HOST] env K=V... PROGRAM ARGS...` |
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

/// The command that starts `spec` with `kind`; `cwd` is the directory a remote process
/// starts in (ssh only: srun and mpirun keep the caller's).
pub(crate) fn command(
    kind: LauncherKind,
    spec: &Spec<'_>,
    cwd: &Path,
) -> Result<Command, LaunchError> {
    let env_words = || spec.env.iter().map(|(k, v)| format!("{k}={v}"));
    let mut command = match kind {
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
                "env".into(),
            ];
            words.extend(env_words().map(|w| quote(&w)));
            words.push(quote(spec.program));
            words.extend(spec.args.iter().map(|a| quote(a)));
            let mut c = Command::new("ssh");
            c.args(["-o", "BatchMode=yes"])
                .arg(&host.name)
                .arg(words.join(" "));
            return Ok(c);
        }
        LauncherKind::Slurm => {
            let mut c = Command::new("srun");
            c.args(["--nodes=1", "--ntasks=1"]);
            if let Some(host) = spec.host {
                c.arg(format!("--nodelist={}", host.name));
            }
            c
        }
        LauncherKind::Mpi => {
            let mut c = Command::new("mpirun");
            c.args(["-np", "1"]);
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
        let c = command(LauncherKind::Ssh, &spec, Path::new("/work/dir x")).unwrap();
        assert_eq!(
            args_of(&c),
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "node1",
                "cd '/work/dir x' && exec env DMLC_TASK_ID=3 sh -c 'echo a b'"
            ]
        );
    }

    #[test]
    fn ssh_without_a_host_names_the_hostfile() {
        let spec = Spec {
            program: "p",
            args: &[],
            env: vec![],
            host: None,
        };
        let err = command(LauncherKind::Ssh, &spec, Path::new("/")).unwrap_err();
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
        let srun = command(LauncherKind::Slurm, &spec, Path::new("/")).unwrap();
        assert_eq!(
            args_of(&srun),
            [
                "srun",
                "--nodes=1",
                "--ntasks=1",
                "--nodelist=n2",
                "env",
                "K=v w",
                "p",
                "x"
            ]
        );
        let mpirun = command(
            LauncherKind::Mpi,
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
