//! Ctrl-C during a collective.
//!
//! While a call waits with the GIL released, Python's own SIGINT handler only notes
//! the signal; `KeyboardInterrupt` would be raised after the call returns, which may
//! be the silence timeout later. So for the length of each call a handler of ours is
//! put in front of Python's: it raises the communicators' [`Interrupt`] (the call
//! then ends within about 20 ms, waiting or moving data, and tells the other ranks) and passes the signal
//! on to Python's handler, which notes it as usual. The caller then runs Python's
//! signal handlers (`PyErr_CheckSignals`), which raise `KeyboardInterrupt`.
//!
//! Where SIGINT is ignored or left to its default action (which ends the process, so
//! the peers see this rank's connections close), nothing is installed.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use switchyard::collective::Interrupt;

/// The flag every communicator of this process watches; made before the handler is
/// first installed, so that the handler only reads it (no allocation there).
static FLAG: OnceLock<Interrupt> = OnceLock::new();

/// The flag every communicator of this process watches.
pub(crate) fn interrupt() -> &'static Interrupt {
    FLAG.get_or_init(Interrupt::new)
}

/// The handler ours passes the signal on to, and whether it takes `siginfo`.
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static PREVIOUS_SIGINFO: AtomicBool = AtomicBool::new(false);

/// How many calls are inside a [`Watch`], and the disposition to restore after the
/// last (`None` when nothing was installed).
static INSTALLED: Mutex<(usize, Option<libc::sigaction>)> = Mutex::new((0, None));

/// Ours: async-signal-safe (atomic loads and stores, then the previous handler).
extern "C" fn on_sigint(signal: c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if let Some(flag) = FLAG.get() {
        flag.raise();
    }
    let previous = PREVIOUS.load(Ordering::Acquire);
    if previous == libc::SIG_DFL || previous == libc::SIG_IGN || previous == 0 {
        return;
    }
    // SAFETY: `previous` is the handler that was installed for SIGINT when ours
    // went in, with the calling convention its flags gave.
    unsafe {
        if PREVIOUS_SIGINFO.load(Ordering::Acquire) {
            let handler: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                std::mem::transmute(previous);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(c_int) = std::mem::transmute(previous);
            handler(signal);
        }
    }
}

/// Our handler in front of Python's, for as long as it lives.
#[derive(Debug)]
pub(crate) struct Watch(());

impl Watch {
    /// Installs the handler unless a call already did (calls on several threads
    /// share one installation), after lowering the flag.
    pub(crate) fn start() -> Watch {
        let flag = interrupt();
        let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
        if installed.0 == 0 {
            flag.clear();
            installed.1 = install();
        }
        installed.0 += 1;
        Watch(())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|p| p.into_inner());
        installed.0 -= 1;
        if installed.0 == 0 {
            if let Some(previous) = installed.1.take() {
                // SAFETY: restores the disposition read when ours went in.
                unsafe { libc::sigaction(libc::SIGINT, &previous, std::ptr::null_mut()) };
            }
        }
    }
}

/// Puts ours in front of the current SIGINT handler; returns the disposition to
/// restore, or `None` when SIGINT is ignored or default (nothing installed).
fn install() -> Option<libc::sigaction> {
    // SAFETY: plain sigaction calls on valid, zeroed structures.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGINT, std::ptr::null(), &mut previous) != 0 {
            return None;
        }
        let handler = previous.sa_sigaction;
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            return None;
        }
        PREVIOUS_SIGINFO.store(previous.sa_flags & libc::SA_SIGINFO != 0, Ordering::Release);
        PREVIOUS.store(handler, Ordering::Release);
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_sigint as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | (previous.sa_flags & libc::SA_ONSTACK);
        libc::sigemptyset(&mut ours.sa_mask);
        if libc::sigaction(libc::SIGINT, &ours, std::ptr::null_mut()) != 0 {
            return None;
        }
        Some(previous)
    }
}
