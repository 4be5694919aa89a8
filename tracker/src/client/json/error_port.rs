//! A worker's error port (XGBoost's JSON tracker protocol): a thread accepts
//! connections and reads one `i32` each; `1` (or the `-1` XGBoost's tracker sends)
//! raises a flag the session can wait on, `0` ends the thread.

use super::local_port;
use crate::client::ClientError;
use crate::wire::{self, Deadline};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Set once by the error listener's thread, waited on by the session.
#[derive(Debug, Default)]
struct Flag {
    set: Mutex<bool>,
    changed: Condvar,
}

impl Flag {
    fn raise(&self) {
        *self.set.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }
}

/// The error listener's thread: `1`/`-1` set `signalled`, `0` ends it.
#[derive(Debug)]
pub(super) struct ErrorWatch {
    pub(super) port: u16,
    loopback: IpAddr,
    signalled: Arc<Flag>,
    stopped: AtomicBool,
}

impl ErrorWatch {
    pub(super) fn start(listener: TcpListener) -> Result<ErrorWatch, ClientError> {
        let port = local_port(&listener)?;
        let loopback = match listener.local_addr() {
            Ok(SocketAddr::V6(_)) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let signalled = Arc::new(Flag::default());
        let flag = Arc::clone(&signalled);
        std::thread::Builder::new()
            .name("tracker-error-port".into())
            .spawn(move || {
                for stream in listener.incoming().map_while(Result::ok) {
                    match Deadline::new(&stream, Duration::from_secs(10)).i32("error signal") {
                        Ok(0) => break,
                        Ok(code) if code == 1 || code == -1 => {
                            tracing::error!(
                                code,
                                "the tracker signalled that another worker failed"
                            );
                            flag.raise();
                        }
                        Ok(code) => tracing::warn!(code, "unknown value on the error port"),
                        Err(e) => tracing::warn!(error = %e, "bad connection to the error port"),
                    }
                }
            })
            .map_err(|source| ClientError::PeerIo {
                what: "starting the error-port thread",
                source,
            })?;
        Ok(ErrorWatch {
            port,
            loopback,
            signalled,
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether an error signal came.
    pub(super) fn signalled(&self) -> bool {
        *self.signalled.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits at most `limit` for an error signal; whether one came.
    pub(super) fn wait(&self, limit: Duration) -> bool {
        let flag = &self.signalled;
        let set = flag.set.lock().unwrap_or_else(|p| p.into_inner());
        let (set, _) = flag
            .changed
            .wait_timeout_while(set, limit, |set| !*set)
            .unwrap_or_else(|p| p.into_inner());
        *set
    }

    /// Sends `0` to our own error port, once.
    pub(super) fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let addr = SocketAddr::new(self.loopback, self.port);
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            let _ = wire::write_all_within(&s, &0i32.to_le_bytes(), Duration::from_secs(5), "stop");
        }
    }
}

impl Drop for ErrorWatch {
    fn drop(&mut self) {
        self.stop();
    }
}
