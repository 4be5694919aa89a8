//! Children in process groups of their own, so that stopping one stops everything it
//! started (a shell's background jobs, Python's worker processes): no orphans.
//!
//! Each child leads a new group (`setpgid(0, 0)` before exec, via
//! [`CommandExt::process_group`]). Stopping sends SIGTERM to the whole group, waits up
//! to the grace period for the leader, then sends SIGKILL to the group. A group's id
//! cannot be reused while any member lives, so signalling it after the leader was
//! reaped reaches only leftovers of the same child.
//!
//! A side effect: a terminal's Ctrl-C reaches only the launcher's own group, and the
//! launcher passes it on by stopping every child (see `signals`).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Makes `command` start its child in a new process group and, on Linux, die with
/// SIGKILL if the launcher dies first (`PR_SET_PDEATHSIG`): even a SIGKILLed launcher,
/// which can stop nothing, leaves no child behind (a grandchild can survive that case).
pub(crate) fn own_group(command: &mut Command) {
    command.process_group(0);
    #[cfg(target_os = "linux")]
    {
        // SAFETY: between fork and exec the closure calls only prctl(2) and getppid(2),
        // both async-signal-safe; it allocates nothing and takes no lock.
        let launcher = std::process::id();
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died before prctl: nobody would send the signal.
                if u32::try_from(libc::getppid()).ok() != Some(launcher) {
                    return Err(std::io::Error::other("the launcher is gone"));
                }
                Ok(())
            });
        }
    }
}

/// Sends `signal` to every process in the group led by `child` (ignores a group that
/// is already gone).
pub(crate) fn signal_group(pgid: u32, signal: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        // kill(0 or -1, ...) would hit the launcher's own group or everything.
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(-pgid, signal);
    }
}

/// Stops every child in `children` (SIGTERM to each group, up to `grace` for them all
/// to exit, then SIGKILL) and reaps them; returns each one's exit status, in order
/// (`None` where waiting failed).
///
/// A child whose standard input is a pipe of ours (`ssh`, whose remote side ends its
/// program when that input closes) is asked by closing it instead of SIGTERM: the
/// remote program gets its SIGTERM there, and whatever it prints until it exits still
/// comes back through the live connection; SIGTERM would end `ssh` itself at once and
/// cut those last lines off.
pub(crate) fn stop_all(mut children: Vec<Child>, grace: Duration) -> Vec<Option<ExitStatus>> {
    for child in &mut children {
        if child.stdin.take().is_none() {
            signal_group(child.id(), libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    let mut children: Vec<(Child, Option<ExitStatus>)> =
        children.into_iter().map(|c| (c, None)).collect();
    loop {
        let mut running = 0;
        for (child, status) in children.iter_mut().filter(|(_, s)| s.is_none()) {
            match child.try_wait() {
                Ok(Some(s)) => *status = Some(s),
                Ok(None) => running += 1,
                Err(_) => {}
            }
        }
        if running == 0 || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .map(|(mut child, status)| {
            // SIGKILL the group even when the leader went: its leftovers go too.
            signal_group(child.id(), libc::SIGKILL);
            status.or_else(|| child.wait().ok())
        })
        .collect()
}
