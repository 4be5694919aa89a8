//! The exit hook, registered when MPI starts: with glibc through `on_exit`, which
//! tells the hook the exit status it needs (see [`at_exit`]), elsewhere `atexit`.

use super::engine::{Command, Engine};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Environment variable: seconds a rank that exits with status 0 waits for the
/// others in `MPI_Finalize` before it gives up (default 60).
pub const ENV_FINALIZE_TIMEOUT: &str = "SWITCHYARD_MPI_FINALIZE_TIMEOUT";

/// At exit: a rank that ends well flushes its sends and calls `MPI_Finalize`; a rank
/// that fails skips it, so that `mpirun` sees a process end without finalizing and
/// takes the whole job down naming that rank, instead of every rank waiting in
/// `MPI_Finalize` for one that will never arrive.
fn at_exit(status: i32) {
    let Some(engine) = Engine::started() else {
        return;
    };
    if status != 0 {
        eprintln!(
            "switchyard: mpi rank {} exits with status {status} without MPI_Finalize, \
             so that mpirun ends the job",
            engine.world.rank
        );
        return;
    }
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    let linger = Duration::from_millis(engine.linger_ms.load(Ordering::Relaxed));
    // The facade's MPI engine refuses a malformed value when it starts; this exit
    // path has no caller to fail, so it says so and takes the default.
    let finalize_timeout = match std::env::var(ENV_FINALIZE_TIMEOUT) {
        Ok(v) if v.trim().is_empty() => Duration::from_secs(60),
        Ok(v) => v.trim().parse::<u64>().map_or_else(
            |_| {
                eprintln!(
                    "switchyard: {ENV_FINALIZE_TIMEOUT}={v:?}: expected a non-negative \
                     integer (seconds); waiting the default 60 s"
                );
                Duration::from_secs(60)
            },
            Duration::from_secs,
        ),
        Err(_) => Duration::from_secs(60),
    };
    if engine
        .submit(Command::Shutdown {
            finalize: true,
            done: done_tx,
        })
        .is_err()
    {
        return;
    }
    if done_rx.recv_timeout(linger + finalize_timeout).is_err() {
        eprintln!(
            "switchyard: mpi rank {} gave up waiting for the other ranks in MPI_Finalize \
             after {:?} ({ENV_FINALIZE_TIMEOUT})",
            engine.world.rank,
            linger + finalize_timeout
        );
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn register_exit_hook() {
    use std::ffi::{c_int, c_void};
    unsafe extern "C" {
        // glibc: like atexit, but the handler learns the exit status.
        fn on_exit(function: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
    }
    extern "C" fn hook(status: c_int, _: *mut c_void) {
        at_exit(status);
    }
    // SAFETY: registers a plain function with no captured state.
    unsafe {
        on_exit(hook, std::ptr::null_mut());
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn register_exit_hook() {
    extern "C" {
        fn atexit(function: extern "C" fn()) -> std::ffi::c_int;
    }
    // Without the exit status, a failing rank still finalizes; the finalize timeout
    // bounds its wait.
    extern "C" fn hook() {
        at_exit(0);
    }
    // SAFETY: registers a plain function with no captured state.
    unsafe {
        atexit(hook);
    }
}
