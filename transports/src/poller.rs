//! Waiting on several sockets at once (Singa's Poller).

// The sealed-trait pattern: `Sealed::watch` returns a crate-private type on purpose,
// so that no one outside the crate can implement or call it.
#![allow(private_interfaces)]

use crate::{DealerSocket, RouterSocket, TransportError};
use crossbeam_channel::{Receiver, Select};
use std::time::{Duration, Instant};

/// How a socket is watched: a crossbeam receiver or a libzmq socket.
pub(crate) enum Watch<'a> {
    /// A message is already buffered inside the socket.
    Ready,
    /// A crossbeam channel (the `local` and `mpi` backends).
    Channel(&'a dyn Selectable),
    #[cfg(feature = "zmq")]
    Zmq(&'a zmq::Socket),
}

impl<'a> Watch<'a> {
    /// Watches `rx`, or is [`Watch::Ready`] if it holds a message already.
    pub(crate) fn channel<T>(rx: &'a Receiver<T>) -> Watch<'a> {
        if rx.is_empty() {
            Watch::Channel(rx)
        } else {
            Watch::Ready
        }
    }
}

/// A crossbeam receiver of any message type, so that one [`Select`] can wait on the
/// channels of every socket.
pub(crate) trait Selectable {
    fn register<'s>(&'s self, select: &mut Select<'s>) -> usize;
}

impl<T> Selectable for Receiver<T> {
    fn register<'s>(&'s self, select: &mut Select<'s>) -> usize {
        select.recv(self)
    }
}

mod sealed {
    /// Implemented by the sockets, which ask their backend (`BackendSocket::watch`).
    pub trait Sealed {
        fn watch(&self) -> super::Watch<'_>;
    }
}

/// A socket a [`Poller`] can wait on: [`DealerSocket`] and [`RouterSocket`].
pub trait Pollable: sealed::Sealed {}

impl sealed::Sealed for DealerSocket {
    fn watch(&self) -> Watch<'_> {
        self.backend_watch()
    }
}
impl Pollable for DealerSocket {}

impl sealed::Sealed for RouterSocket {
    fn watch(&self) -> Watch<'_> {
        self.backend_watch()
    }
}
impl Pollable for RouterSocket {}

/// Waits until one of several sockets has something to receive.
///
/// Sockets of one backend are watched with that backend's own mechanism (crossbeam's
/// `Select`, `zmq_poll`) and wake at once. A mix of `local` and ZeroMQ sockets is
/// watched in turns of at most 1 ms each, so it may answer up to 1 ms late.
///
/// Readiness may be spurious: the event that woke the poller can be a connection
/// notice or a message dropped as malformed, so follow a poll with `try_recv`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_msg::{Addr, Kind, Msg};
/// use switchyard_transports::{Dealer, DealerSocket, Poller, Router, RouterSocket, Socket, SocketOptions};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let a = RouterSocket::bind("local://poll-a", SocketOptions::default())?;
/// let mut b = RouterSocket::bind("local://poll-b", SocketOptions::default())?;
/// let mut dealer = DealerSocket::connect("local://poll-b", SocketOptions::default())?;
/// dealer.send(Msg::new(Addr::worker(0, 0), Addr::server(0, 1), Kind::Get))?;
/// let mut poller = Poller::new();
/// assert_eq!(poller.poll(&[&a, &b], Duration::from_secs(5))?, Some(1));
/// assert_eq!(b.try_recv()?.header.kind, Kind::Get);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Poller {
    _private: (),
}

impl Poller {
    /// A poller.
    pub fn new() -> Self {
        Poller::default()
    }

    /// Waits at most `timeout` and returns the index in `sockets` of one that is
    /// readable, or `None` if none became readable in time.
    pub fn poll(
        &mut self,
        sockets: &[&dyn Pollable],
        timeout: Duration,
    ) -> Result<Option<usize>, TransportError> {
        let deadline = Instant::now() + timeout;
        let watches: Vec<Watch<'_>> = sockets.iter().map(|s| s.watch()).collect();
        if let Some(i) = watches.iter().position(|w| matches!(w, Watch::Ready)) {
            return Ok(Some(i));
        }
        let has_local = watches.iter().any(|w| matches!(w, Watch::Channel(_)));
        let has_zmq = watches.len() > usize::from(has_local) * count_local(&watches);
        loop {
            let now = Instant::now();
            let slice = match (has_local, has_zmq) {
                (true, true) => {
                    (deadline.saturating_duration_since(now)).min(Duration::from_millis(1))
                }
                _ => deadline.saturating_duration_since(now),
            };
            if has_local {
                if let Some(i) = poll_local(&watches, slice) {
                    return Ok(Some(i));
                }
            }
            #[cfg(feature = "zmq")]
            if has_zmq {
                let zmq_slice = if has_local { Duration::ZERO } else { slice };
                if let Some(i) = poll_zmq(&watches, zmq_slice)? {
                    return Ok(Some(i));
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }
}

fn count_local(watches: &[Watch<'_>]) -> usize {
    watches
        .iter()
        .filter(|w| matches!(w, Watch::Channel(_)))
        .count()
}

fn poll_local(watches: &[Watch<'_>], wait: Duration) -> Option<usize> {
    let mut select = Select::new();
    let mut index_of = Vec::new();
    for (i, watch) in watches.iter().enumerate() {
        if let Watch::Channel(rx) = watch {
            rx.register(&mut select);
            index_of.push(i);
        }
    }
    select.ready_timeout(wait).ok().map(|k| index_of[k])
}

#[cfg(feature = "zmq")]
fn poll_zmq(watches: &[Watch<'_>], wait: Duration) -> Result<Option<usize>, TransportError> {
    let mut items = Vec::new();
    let mut index_of = Vec::new();
    for (i, watch) in watches.iter().enumerate() {
        if let Watch::Zmq(socket) = watch {
            items.push(socket.as_poll_item(zmq::POLLIN));
            index_of.push(i);
        }
    }
    let ms = i64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i64::MAX);
    zmq::poll(&mut items, ms).map_err(|e| TransportError::Backend {
        backend: "zmq",
        endpoint: "poller".into(),
        reason: e.to_string(),
    })?;
    Ok(items
        .iter()
        .position(|item| item.is_readable())
        .map(|k| index_of[k]))
}
