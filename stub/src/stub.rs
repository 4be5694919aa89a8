use crate::{AddressTable, ClusterLayout, StubError, StubSocket};
use crossbeam_channel::{Receiver, SendTimeoutError, Sender, bounded};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use switchyard_msg::{Addr, Msg};
use switchyard_transports::{Router, RouterSocket, Socket, SocketOptions};

/// How often the forwarding thread looks at its stop flag while idle.
const STOP_POLL: Duration = Duration::from_millis(50);

/// What every socket of a process shares with its stub.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rank: usize,
    pub(crate) table: AddressTable,
    pub(crate) endpoints: Vec<String>,
    pub(crate) options: SocketOptions,
    /// One bounded mailbox per thread hosted here, by slot.
    pub(crate) mailboxes: Vec<Sender<Msg>>,
    pub(crate) misrouted: AtomicU64,
}

/// A stub whose router is bound but which does not yet know its peers' endpoints.
///
/// Binding first lets a process use `tcp://127.0.0.1:0` and report the port it got to
/// whatever bootstrap collects the endpoints (see `switchyard::bootstrap`).
#[derive(Debug)]
pub struct BoundStub {
    layout: ClusterLayout,
    rank: usize,
    router: RouterSocket,
}

impl BoundStub {
    /// The endpoint other processes connect to, with the real port.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Starts forwarding, given every process's endpoint in rank order (this one's
    /// included).
    pub fn start(self, endpoints: Vec<String>) -> Result<Stub, StubError> {
        let table = AddressTable::new(&self.layout)?;
        if endpoints.len() != table.num_processes() {
            return Err(StubError::EndpointCount {
                expected: table.num_processes(),
                got: endpoints.len(),
            });
        }
        let options = self.router.options().clone();
        let hosted = table.hosted_by(self.rank).len();
        let (mailboxes, inboxes): (Vec<_>, Vec<_>) =
            (0..hosted).map(|_| bounded(options.hwm)).unzip();
        let shared = Arc::new(Shared {
            rank: self.rank,
            table,
            endpoints,
            options,
            mailboxes,
            misrouted: AtomicU64::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let forwarder = {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            let router = self.router;
            std::thread::Builder::new()
                .name(format!("switchyard-stub-{}", self.rank))
                .spawn(move || forward(router, &shared, &stop))
                .map_err(|e| StubError::Layout {
                    reason: format!("cannot start the stub thread: {e}"),
                })?
        };
        Ok(Stub {
            shared,
            inboxes: inboxes.into_iter().map(|rx| Mutex::new(Some(rx))).collect(),
            stop,
            forwarder: Some(forwarder),
        })
    }
}

/// One per process: hands each local thread its socket and forwards messages that
/// arrive from other processes to the right thread.
///
/// Sending needs no hop through the stub: a [`StubSocket`] puts a message for a local
/// thread straight into that thread's mailbox, and one for a remote thread on its own
/// connection to the remote process's stub. Only the receiving side forwards, touching
/// headers only; frames move without a copy.
///
/// # Examples
///
/// One process, one worker and one server, on the `local` backend:
///
/// ```
/// use std::time::Duration;
/// use switchyard_msg::{Addr, Kind, Msg};
/// use switchyard_stub::{ClusterLayout, Stub};
/// use switchyard_transports::{Socket, SocketOptions};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layout = ClusterLayout::new(1, 1, 1, 1).with_separate_servers(false);
/// let bound = Stub::bind(layout, 0, "local://stub-doc", SocketOptions::default())?;
/// let endpoint = bound.endpoint().to_string();
/// let stub = bound.start(vec![endpoint])?;
/// let mut worker = stub.worker(0, 0)?;
/// let mut server = stub.server(0, 0)?;
/// worker.send(Msg::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get))?;
/// let get = server.recv_timeout(Duration::from_secs(5))?;
/// server.send(get.reply(Kind::Put).with_frame(&b"w"[..]))?;
/// assert_eq!(worker.recv_timeout(Duration::from_secs(5))?.header.kind, Kind::Put);
/// // An address outside the layout comes back to the sender:
/// let lost = Msg::new(Addr::worker(0, 0), Addr::server(5, 0), Kind::Get);
/// assert!(worker.send(lost).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Stub {
    shared: Arc<Shared>,
    inboxes: Vec<Mutex<Option<Receiver<Msg>>>>,
    stop: Arc<AtomicBool>,
    forwarder: Option<JoinHandle<()>>,
}

impl Stub {
    /// Binds process `rank`'s router at `endpoint` for the job laid out by `layout`.
    pub fn bind(
        layout: ClusterLayout,
        rank: usize,
        endpoint: &str,
        options: SocketOptions,
    ) -> Result<BoundStub, StubError> {
        let processes = layout.num_processes()?;
        if rank >= processes {
            return Err(StubError::RankOutOfRange { rank, processes });
        }
        let router = RouterSocket::bind(endpoint, options)?;
        Ok(BoundStub {
            layout,
            rank,
            router,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The job's address table.
    pub fn table(&self) -> &AddressTable {
        &self.shared.table
    }

    /// The addresses hosted by this process.
    pub fn local_addresses(&self) -> &[Addr] {
        self.shared.table.hosted_by(self.shared.rank)
    }

    /// Messages that reached this process for a thread it does not host (dropped
    /// with a `warn`): a sign that processes disagree about the layout.
    pub fn misrouted(&self) -> u64 {
        self.shared.misrouted.load(Ordering::Relaxed)
    }

    /// The socket of worker `id` in worker group `group`, which must live here.
    pub fn worker(&self, group: u32, id: u32) -> Result<StubSocket, StubError> {
        self.socket(Addr::worker(group, id))
    }

    /// The socket of server `id` in server group `group`, which must live here.
    pub fn server(&self, group: u32, id: u32) -> Result<StubSocket, StubError> {
        self.socket(Addr::server(group, id))
    }

    /// The socket of the thread at `addr`. Each is handed out once; messages that
    /// arrive before it is taken wait in its mailbox (up to the HWM).
    pub fn socket(&self, addr: Addr) -> Result<StubSocket, StubError> {
        let location = self
            .shared
            .table
            .locate(addr)
            .ok_or(StubError::UnknownAddress { addr })?;
        if location.process != self.shared.rank {
            return Err(StubError::NotLocal {
                addr,
                process: location.process,
                rank: self.shared.rank,
            });
        }
        let inbox = self
            .inboxes
            .get(location.slot)
            .and_then(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).take())
            .ok_or(StubError::AlreadyTaken { addr })?;
        Ok(StubSocket::new(addr, inbox, Arc::clone(&self.shared)))
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(forwarder) = self.forwarder.take() {
            let _ = forwarder.join();
        }
    }
}

/// The forwarding loop: messages from other processes into local mailboxes.
fn forward(mut router: RouterSocket, shared: &Shared, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let (peer, msg) = match router.recv_from_timeout(STOP_POLL) {
            Ok(received) => received,
            Err(switchyard_transports::RecvError::Timeout) => continue,
            Err(e) => {
                tracing::warn!(rank = shared.rank, error = %e, "stub router failed; forwarding stops");
                return;
            }
        };
        let dst = msg.header.dst;
        let mailbox = shared
            .table
            .locate(dst)
            .filter(|l| l.process == shared.rank)
            .and_then(|l| shared.mailboxes.get(l.slot));
        let Some(mailbox) = mailbox else {
            shared.misrouted.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(rank = shared.rank, %peer, %dst, "dropped message for a thread this process does not host");
            continue;
        };
        // A full mailbox holds back everything behind it, which pushes back on the
        // senders through the router's HWM instead of dropping anything.
        let mut msg = msg;
        loop {
            match mailbox.send_deadline(msg, Instant::now() + STOP_POLL) {
                Ok(()) => break,
                Err(SendTimeoutError::Timeout(back)) if !stop.load(Ordering::Relaxed) => msg = back,
                Err(_) => break,
            }
        }
    }
}
