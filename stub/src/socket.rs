use crate::stub::Shared;
use crossbeam_channel::{Receiver, SendTimeoutError, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use switchyard_msg::{Addr, Msg};
use switchyard_transports::{
    Dealer, DealerSocket, PeerId, RecvError, SendError, SendErrorKind, Socket, SocketOptions,
};

/// A thread's socket, from [`crate::Stub::worker`] or [`crate::Stub::server`].
///
/// `recv` polls its mailbox for up to [`SocketOptions::recv_spin`] (yielding the core)
/// before it parks the thread.
///
/// `send` routes by `msg.header.dst`: to a local thread's mailbox directly, or over
/// this socket's own connection to the destination process (opened on first use, in
/// the thread that uses it). An address outside the table fails at once with
/// [`SendErrorKind::UnknownAddress`] and the message comes back. `recv` reads this
/// thread's mailbox.
///
/// The socket is `Send`: make it in the main thread and move it into its thread.
#[derive(Debug)]
pub struct StubSocket {
    addr: Addr,
    inbox: Receiver<Msg>,
    shared: Arc<Shared>,
    remotes: Vec<Option<DealerSocket>>,
    endpoint: String,
}

impl StubSocket {
    pub(crate) fn new(addr: Addr, inbox: Receiver<Msg>, shared: Arc<Shared>) -> Self {
        let remotes = (0..shared.table.num_processes()).map(|_| None).collect();
        let endpoint = format!("stub://{}/{addr}", shared.rank);
        StubSocket {
            addr,
            inbox,
            shared,
            remotes,
            endpoint,
        }
    }

    /// This thread's address.
    pub fn addr(&self) -> Addr {
        self.addr
    }

    fn fail(&self, msg: Msg, kind: SendErrorKind) -> SendError {
        SendError {
            msg,
            kind,
            endpoint: self.endpoint.clone(),
        }
    }

    /// The connection to `process`, opened if needed.
    fn remote(&mut self, process: usize) -> Result<&mut DealerSocket, String> {
        if self.remotes[process].is_none() {
            let identity = PeerId::new(format!("{}/{}", self.shared.rank, self.addr))
                .unwrap_or_else(|| PeerId::from_index(self.shared.rank as u64));
            let options = self.shared.options.clone().with_identity(identity);
            let dealer = DealerSocket::connect(&self.shared.endpoints[process], options)
                .map_err(|e| e.to_string())?;
            self.remotes[process] = Some(dealer);
        }
        self.remotes[process]
            .as_mut()
            .ok_or_else(|| "connection vanished".to_string())
    }

    fn route(&mut self, msg: Msg, deadline: Option<Instant>) -> Result<(), SendError> {
        let dst = msg.header.dst;
        let Some(location) = self.shared.table.locate(dst) else {
            return Err(self.fail(msg, SendErrorKind::UnknownAddress(dst)));
        };
        if location.process == self.shared.rank {
            let mailbox = &self.shared.mailboxes[location.slot];
            return match deadline {
                Some(deadline) => mailbox.send_deadline(msg, deadline).map_err(|e| match e {
                    SendTimeoutError::Timeout(m) => self.fail(m, SendErrorKind::Timeout),
                    SendTimeoutError::Disconnected(m) => self.fail(m, SendErrorKind::Disconnected),
                }),
                None => mailbox.try_send(msg).map_err(|e| match e {
                    TrySendError::Full(m) => self.fail(m, SendErrorKind::Full),
                    TrySendError::Disconnected(m) => self.fail(m, SendErrorKind::Disconnected),
                }),
            };
        }
        let dealer = match self.remote(location.process) {
            Ok(dealer) => dealer,
            Err(reason) => return Err(self.fail(msg, SendErrorKind::Backend(reason))),
        };
        match deadline {
            Some(deadline) => dealer.send_deadline(msg, deadline),
            None => dealer.try_send(msg),
        }
    }
}

impl Socket for StubSocket {
    fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<Msg, RecvError> {
        let disconnected = || RecvError::Disconnected {
            endpoint: self.endpoint.clone(),
        };
        // Poll for a bounded time before parking: a parked thread costs a wake-up
        // (tens of microseconds on a VM) on every message that arrives for it.
        let spin_until = Instant::now() + self.shared.options.recv_spin;
        let spin_until = deadline.map_or(spin_until, |d| d.min(spin_until));
        while Instant::now() < spin_until {
            if let Ok(msg) = self.inbox.try_recv() {
                return Ok(msg);
            }
            std::thread::yield_now();
        }
        match deadline {
            Some(deadline) => self.inbox.recv_deadline(deadline).map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => RecvError::Timeout,
                crossbeam_channel::RecvTimeoutError::Disconnected => disconnected(),
            }),
            None => self.inbox.recv().map_err(|_| disconnected()),
        }
    }

    fn try_recv(&mut self) -> Result<Msg, RecvError> {
        self.inbox.try_recv().map_err(|_| RecvError::Empty)
    }

    fn send_deadline(&mut self, msg: Msg, deadline: Instant) -> Result<(), SendError> {
        self.route(msg, Some(deadline))
    }

    fn try_send(&mut self, msg: Msg) -> Result<(), SendError> {
        self.route(msg, None)
    }

    fn options(&self) -> &SocketOptions {
        &self.shared.options
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }
}
