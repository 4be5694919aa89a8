use crate::PeerId;
use std::time::Duration;
use switchyard_msg::Limits;

/// Settings shared by every socket, with defaults chosen for ML jobs on one cluster.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `hwm` | 1000 | messages queued per peer and direction before a send blocks (ZeroMQ `SNDHWM`/`RCVHWM`; the `local` backend's channel capacity) |
/// | `send_timeout` | 30 s | how long `send` blocks on a full peer before it returns the message in a [`crate::SendError`] |
/// | `connect_timeout` | 30 s | how long `Dealer::connect` waits for a router's READY |
/// | `linger` | 1 s | how long a closed ZeroMQ socket keeps trying to deliver queued messages |
/// | `identity` | none | the dealer's identity as its router sees it; unset means a unique one is made |
/// | `limits` | [`Limits::default`] | header, frame-count and frame-size limits for decoding |
/// | `recv_spin` | 200 µs | how long a stub thread's receive polls (yielding the core) before it sleeps; 0 sleeps at once |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use switchyard_transports::SocketOptions;
/// let opts = SocketOptions::default().with_hwm(64).with_send_timeout(Duration::from_millis(50));
/// assert_eq!(opts.hwm, 64);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SocketOptions {
    /// High-water mark in messages, per peer and direction.
    pub hwm: usize,
    /// Longest a `send` blocks on a full peer.
    pub send_timeout: Duration,
    /// Longest a `connect` waits for the router's READY.
    pub connect_timeout: Duration,
    /// How long a closed ZeroMQ socket keeps delivering what is queued.
    pub linger: Duration,
    /// The dealer's identity; `None` makes a unique one.
    pub identity: Option<PeerId>,
    /// Decoding limits.
    pub limits: Limits,
    /// How long a receive keeps polling, yielding the core between polls, before it
    /// parks the thread. Waking a parked thread costs about 30 µs on small VMs,
    /// so a reply that comes back within this window is picked up
    /// without that cost; an idle thread still ends up parked and uses no CPU. Used by
    /// the stub's thread sockets.
    pub recv_spin: Duration,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            hwm: 1000,
            send_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            linger: Duration::from_secs(1),
            identity: None,
            limits: Limits::default(),
            recv_spin: Duration::from_micros(200),
        }
    }
}

impl SocketOptions {
    /// Sets [`SocketOptions::hwm`] (at least 1).
    pub fn with_hwm(mut self, hwm: usize) -> Self {
        self.hwm = hwm.max(1);
        self
    }

    /// Sets [`SocketOptions::send_timeout`].
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// Sets [`SocketOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`SocketOptions::linger`].
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Sets [`SocketOptions::identity`].
    pub fn with_identity(mut self, identity: PeerId) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Sets [`SocketOptions::recv_spin`].
    pub fn with_recv_spin(mut self, spin: Duration) -> Self {
        self.recv_spin = spin;
        self
    }

    /// Sets [`SocketOptions::limits`].
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}
