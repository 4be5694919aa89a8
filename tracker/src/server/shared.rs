//! What every connection thread shares: the state machines (one lock), the inboxes
//! through which a machine's decision reaches another connection's thread, event
//! subscribers, and the job's ending.

use super::cap::Cap;
use super::machines::Machines;
use super::sequence::Sequence;
use super::{Event, JobOutcome, TrackerConfig};
use crate::classic::{self, Classic};
use crate::common::ConnId;
use crate::journal::Journal;
use crate::json::{self, Json};
use crate::record::Record;
use crossbeam_channel::{Receiver, Sender, unbounded};
use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use switchyard_secret::JobSecret;

/// Locks, ignoring poisoning: a panicking connection thread must not stop the others
/// (the machines never leave a half-made change behind a panic point).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A decision for a connection's thread.
#[derive(Debug)]
pub(crate) enum Go {
    /// Classic: send the assignment and negotiate, as `rank`.
    Turn(u32),
    /// JSON: send this peer frame.
    Peer { host: String, port: u16, rank: u32 },
    /// Either: the `start` waited for its batch, and the job's protocol was decided by
    /// the other one; refuse it for this reason.
    Refused(&'static str),
}

/// How the job ended.
#[derive(Clone, Debug)]
pub(crate) enum Ending {
    Done(JobOutcome),
    Failed(String),
    Stopped,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: TrackerConfig,
    /// The job secret every connection must prove, read once at start.
    pub(crate) secret: Option<JobSecret>,
    pub(crate) machines: Mutex<Machines>,
    /// Notified whenever the classic machine's holders change.
    pub(crate) changed: Condvar,
    inboxes: Mutex<HashMap<ConnId, Sender<Go>>>,
    /// Keeps each host's `print`s and `shutdown`s in accept order.
    pub(crate) sequence: Sequence,
    /// Open connections, and those to evict first when there are too many.
    pub(crate) cap: Cap<TcpStream>,
    subscribers: Mutex<Vec<Sender<Event>>>,
    pub(crate) end: Mutex<Option<Ending>>,
    pub(crate) ended: Condvar,
    pub(crate) stopping: AtomicBool,
    next_conn: AtomicU64,
}

impl Shared {
    pub(crate) fn new(
        config: TrackerConfig,
        journal: Option<(Journal, Vec<Record>)>,
        secret: Option<JobSecret>,
    ) -> Shared {
        let mut classic = Classic::new(config.workers, config.sort_by);
        let mut json = Json::new(config.workers, config.sort_by);
        let journal = journal.map(|(j, records)| {
            for r in &records {
                classic.apply(r);
                json.apply(r);
            }
            if !records.is_empty() {
                tracing::info!(records = records.len(), "replayed the state file");
            }
            j
        });
        let max_connections = config.max_connections;
        let shared = Shared {
            config,
            secret,
            machines: Mutex::new(Machines {
                classic,
                json,
                journal,
                #[cfg(test)]
                by_claim: false,
            }),
            changed: Condvar::new(),
            inboxes: Mutex::new(HashMap::new()),
            sequence: Sequence::default(),
            cap: Cap::new(max_connections),
            subscribers: Mutex::new(Vec::new()),
            end: Mutex::new(None),
            ended: Condvar::new(),
            stopping: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
        };
        shared.check_done(&lock(&shared.machines));
        shared
    }

    pub(crate) fn next_conn(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// An inbox for `conn`, removed again when the returned guard drops.
    pub(crate) fn inbox(&self, conn: ConnId) -> Inbox<'_> {
        let (tx, rx) = unbounded();
        lock(&self.inboxes).insert(conn, tx);
        Inbox {
            shared: self,
            conn,
            rx,
        }
    }

    fn send(&self, conn: ConnId, go: Go) {
        if let Some(tx) = lock(&self.inboxes).get(&conn) {
            let _ = tx.send(go);
        }
    }

    /// Refuses the waiting `start`s `conns`, for `reason` (see `machines`).
    pub(crate) fn refuse_waiting(&self, conns: Vec<ConnId>, reason: &'static str) {
        for conn in conns {
            self.send(conn, Go::Refused(reason));
        }
    }

    pub(crate) fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = unbounded();
        lock(&self.subscribers).push(tx);
        rx
    }

    pub(crate) fn publish(&self, event: Event) {
        lock(&self.subscribers).retain(|s| s.send(event.clone()).is_ok());
    }

    /// A connection was dropped: warn, naming the peer and the reason, and publish it.
    pub(crate) fn dropped(&self, peer: &str, reason: String) {
        tracing::warn!(%peer, %reason, "tracker dropped a connection");
        self.publish(Event::Dropped {
            peer: peer.to_string(),
            reason,
        });
    }

    /// `conn`'s whole command has arrived: waits until the connections from `host`
    /// accepted before `conn` have settled (see `sequence`), at most the read timeout:
    /// past it, the command is carried out anyway, possibly out of order, rather than
    /// lost.
    pub(crate) fn await_turn(&self, conn: ConnId, host: &str) {
        // Only now does it hold back its host's later connections for longer than the
        // grace: a stranger that stalls anywhere before the end of its command (a
        // partial hello, say) must not hold the job's prints and shutdowns for its
        // whole read timeout.
        self.sequence.heard(conn);
        if !self
            .sequence
            .await_turn(conn, host, self.config.read_timeout)
        {
            tracing::debug!(
                conn,
                %host,
                "an earlier connection from this host is still open; going on out of order"
            );
        }
    }

    pub(crate) fn print(&self, rank: i32, text: &str) {
        tracing::info!(rank, "{text}");
        self.publish(Event::Print {
            rank,
            text: text.to_string(),
        });
    }

    /// Logs and publishes rank `reporter`'s report that rank `rank`, start `attempt`,
    /// went silent.
    pub(crate) fn silent(&self, reporter: i32, rank: u32, attempt: u32, reason: &str) {
        tracing::warn!(
            reporter,
            rank,
            attempt,
            "robust: silent rank reported: {reason}"
        );
        self.publish(Event::Silent {
            reporter,
            rank,
            attempt,
            reason: reason.to_string(),
        });
    }

    /// Carries out a classic machine's actions (under the machines' lock).
    pub(crate) fn classic_actions(&self, m: &mut Machines, actions: Vec<classic::Action>) {
        for a in actions {
            match a {
                classic::Action::Turn { conn, rank } => self.send(conn, Go::Turn(rank)),
                classic::Action::Record(r) => self.note(m, r),
            }
        }
        self.changed.notify_all();
    }

    /// Carries out a JSON machine's actions (under the machines' lock); returns the
    /// error ports to signal, which the caller does after unlocking.
    pub(crate) fn json_actions(
        &self,
        m: &mut Machines,
        actions: Vec<json::Action>,
    ) -> Vec<(String, u16)> {
        let mut signal = Vec::new();
        for a in actions {
            match a {
                json::Action::PeerFrame {
                    conn,
                    host,
                    port,
                    rank,
                } => self.send(conn, Go::Peer { host, port, rank }),
                json::Action::SignalError { targets } => signal.extend(targets),
                json::Action::Record(r) => self.note(m, r),
            }
        }
        // A failed job ends only after its workers were told (`signalled`): ending it
        // first would let `switchyard tracker` exit before the error signals go out.
        if signal.is_empty() {
            self.check_done(m);
        }
        signal
    }

    /// Ends the job if it is over, once the error signals owed to workers are sent.
    pub(crate) fn signalled(&self) {
        let m = lock(&self.machines);
        self.check_done(&m);
    }

    /// Logs, keeps (if durable) and publishes a record, then checks whether the job
    /// ended.
    fn note(&self, m: &mut Machines, record: Record) {
        if record.is_durable() {
            if let Some(j) = &mut m.journal {
                if let Err(e) = j.append(&record) {
                    tracing::error!(error = %e, "cannot write the state file; a restart would lose this");
                }
            }
        }
        match record {
            Record::Assigned {
                rank,
                task_id,
                host,
                recover,
            } => {
                tracing::info!(rank, ?task_id, %host, recover, "rank assigned");
                self.publish(if recover {
                    Event::Recovered { rank }
                } else {
                    Event::Assigned {
                        rank,
                        task_id,
                        host,
                    }
                });
            }
            Record::JsonBatch { members } => {
                for (rank, mb) in members.into_iter().enumerate() {
                    tracing::info!(rank, task_id = ?mb.task_id, host = %mb.host, "rank assigned");
                    self.publish(Event::Assigned {
                        rank: rank as u32,
                        task_id: mb.task_id,
                        host: mb.host,
                    });
                }
            }
            Record::Linked { rank, accept, .. } => {
                tracing::debug!(rank, accept, "links negotiated");
                self.publish(Event::Linked { rank });
            }
            Record::ShutDown { rank, .. } => {
                tracing::info!(rank, "rank shut down");
                self.publish(Event::Shutdown { rank });
            }
            _ => {}
        }
        self.check_done(m);
    }

    fn check_done(&self, m: &Machines) {
        if let Some(reason) = m.json.failed() {
            self.end_with(Ending::Failed(reason.to_string()));
        } else if m.classic.is_done() {
            self.end_with(Ending::Done(JobOutcome {
                shut_down: m.classic.shut_down(),
            }));
        } else if m.json.is_done() {
            self.end_with(Ending::Done(JobOutcome {
                shut_down: m.json.shut_down(),
            }));
        }
    }

    /// Fails the job if it has not ended `limit` from now ([`TrackerConfig::job_timeout`]);
    /// returns as soon as it ends otherwise.
    pub(crate) fn fail_after(&self, limit: std::time::Duration) {
        let end = lock(&self.end);
        let (end, waited) = self
            .ended
            .wait_timeout_while(end, limit, |end| end.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        drop(end);
        if !waited.timed_out() {
            return;
        }
        let missing: Vec<u32> = {
            let m = lock(&self.machines);
            let (classic, json) = (m.classic.shut_down(), m.json.shut_down());
            (0..self.config.workers)
                .filter(|r| !classic.contains(r) && !json.contains(r))
                .collect()
        };
        self.end_with(Ending::Failed(format!(
            "the job did not end within the job timeout of {limit:?}: ranks {missing:?} \
             never shut down (a worker that died mid-job never does)"
        )));
    }

    /// Ends the job (the first ending wins).
    pub(crate) fn end_with(&self, ending: Ending) {
        let mut end = lock(&self.end);
        if end.is_none() {
            match &ending {
                Ending::Done(o) => tracing::info!(ranks = ?o.shut_down, "job finished"),
                // A warning, not an error: the caller of `wait` gets the reason and
                // reports it (`switchyard tracker` exits with it); at the default
                // error level the reason would be printed twice.
                Ending::Failed(r) => tracing::warn!(reason = %r, "job failed"),
                Ending::Stopped => tracing::info!("tracker stopped"),
            }
            *end = Some(ending);
            self.ended.notify_all();
        }
    }
}

/// A connection's inbox; unregistered on drop.
#[derive(Debug)]
pub(crate) struct Inbox<'a> {
    shared: &'a Shared,
    conn: ConnId,
    pub(crate) rx: Receiver<Go>,
}

impl Drop for Inbox<'_> {
    fn drop(&mut self) {
        lock(&self.shared.inboxes).remove(&self.conn);
    }
}
