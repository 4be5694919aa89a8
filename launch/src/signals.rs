//! SIGINT and SIGTERM as a flag the supervision loop polls.
//!
//! The handler only stores the signal number in an atomic (the one thing a handler may
//! safely do); the loop sees it within one poll interval, stops every child and
//! returns [`LaunchError::Interrupted`](super::LaunchError::Interrupted).

use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};

/// The last signal received, 0 if none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT and SIGTERM (once per program).
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the handler is async-signal-safe (one atomic store), and the
            // sigaction struct is zeroed then filled before the call reads it.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&mut action.sa_mask);
                action.sa_flags = libc::SA_RESTART;
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

/// The signal received since [`install`], if any, by name.
pub(crate) fn received() -> Option<&'static str> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => Some("a signal"),
    }
}
