//! The progress thread's loop: take commands, post sends, complete them, receive;
//! then poll, yield or nap by the idle policy described in `engine`.

mod receive;

use super::comms::Comms;
use super::credits::{Credits, MpiInbound};
use super::engine::{CONTROL_TAG, Command};
use super::ffi::{self, MpiError, Request};
use super::here::Turn;
use super::shared::Shared;
use super::wire::{Control, Encoded};
use crate::PeerId;
use crossbeam_channel::{Receiver, Sender};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};
use switchyard_msg::{Limits, Msg};

/// How long the progress thread keeps polling after its last piece of work.
pub(crate) const SPIN: Duration = Duration::from_micros(200);
/// How long it keeps polling while sends are in flight (a receiver that stopped
/// reading holds them; past this the thread naps and the sends wait).
pub(crate) const SPIN_WITH_SENDS: Duration = Duration::from_millis(10);
const FIRST_NAP: Duration = Duration::from_micros(50);
/// The longest the progress thread sleeps between polls when idle.
pub(crate) const MAX_NAP: Duration = Duration::from_millis(1);
/// Messages taken from one socket's tag per loop, so that one busy socket cannot
/// starve the others.
const BATCH: usize = 64;

/// A message being sent: its buffers, kept alive until MPI has finished every send
/// of it (the head, and each frame of a split message), and the credit it holds,
/// returned then.
pub(crate) struct Sending {
    _encoded: Encoded,
    credits: Option<Arc<Credits>>,
}

impl Sending {
    pub(crate) fn new(encoded: Encoded, credits: Option<Arc<Credits>>) -> Arc<Sending> {
        Arc::new(Sending {
            _encoded: encoded,
            credits,
        })
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(credits) = &self.credits {
            credits.release();
        }
    }
}

struct DealerEnd {
    router: i32,
    inbox: Sender<Msg>,
    hwm: usize,
    limits: Limits,
    connected: Option<Sender<()>>,
    turn: Arc<Turn>,
}

struct RouterEnd {
    generation: u64,
    events: Sender<MpiInbound>,
    hwm: usize,
    limits: Limits,
    turn: Arc<Turn>,
}

struct PeerState {
    identity: PeerId,
    readied: bool,
    live: bool,
    credits: Arc<Credits>,
}

pub(super) struct Progress {
    comms: Comms,
    /// This process's rank: its own dealers' hellos and byes need no MPI round trip.
    rank: i32,
    owns_mpi: bool,
    commands: Receiver<Command>,
    shared: Arc<Shared>,
    requests: Vec<Request>,
    /// The message each request of `requests` (same index) sends.
    in_flight: Vec<Arc<Sending>>,
    dealers: HashMap<i32, DealerEnd>,
    router: Option<RouterEnd>,
    peers: HashMap<(i32, i32), PeerState>,
    shutdown: Option<(bool, Sender<()>)>,
    /// The collectives' own duplicate of `MPI_COMM_WORLD`, made at the first
    /// [`Command::Run`] (or why it could not be; never retried, because
    /// `MPI_Comm_dup` is collective and the other ranks would not join a retry).
    collective: Option<Result<mpi::ffi::MPI_Comm, String>>,
}

impl Progress {
    pub(super) fn new(
        started: ffi::Started,
        comms: Comms,
        commands: Receiver<Command>,
        shared: Arc<Shared>,
    ) -> Progress {
        Progress {
            comms,
            rank: started.rank,
            owns_mpi: started.owns_mpi,
            commands,
            shared,
            requests: Vec::new(),
            in_flight: Vec::new(),
            dealers: HashMap::new(),
            router: None,
            peers: HashMap::new(),
            shutdown: None,
            collective: None,
        }
    }

    /// Serves commands and MPI until shutdown or a fatal MPI error.
    pub(super) fn run(mut self) {
        let mut last_work = Instant::now();
        let mut nap = FIRST_NAP;
        loop {
            let worked = match self.step() {
                Ok(worked) => worked,
                Err(e) => {
                    tracing::error!("mpi progress thread stops: {e}");
                    self.shared.fail(e.to_string());
                    return;
                }
            };
            if let Some((finalize, _)) = &self.shutdown {
                if self.requests.is_empty() {
                    let finalize = *finalize && self.owns_mpi;
                    self.finish(finalize);
                    return;
                }
            }
            if worked {
                last_work = Instant::now();
                nap = FIRST_NAP;
                continue;
            }
            // OpenMPI moves a rendezvous send's data only inside MPI calls, so a
            // thread that naps with sends in flight stalls them: poll longer then.
            let spin = if self.requests.is_empty() {
                SPIN
            } else {
                SPIN_WITH_SENDS
            };
            if last_work.elapsed() < spin {
                thread::yield_now();
                continue;
            }
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if self.commands.is_empty() {
                thread::park_timeout(nap);
            }
            self.shared.sleeping.store(false, Ordering::SeqCst);
            nap = (nap * 2).min(MAX_NAP);
        }
    }

    fn finish(&mut self, finalize: bool) {
        // No socket thread is inside MPI past this point, and none enters it.
        let _closed = self.shared.close();
        self.shared.fail("MPI was finalized at exit".into());
        if finalize {
            if let Err(e) = ffi::finalize() {
                eprintln!("switchyard: {e}");
            }
        }
        if let Some((_, done)) = self.shutdown.take() {
            let _ = done.send(());
        }
    }

    /// One pass over everything; `true` if anything happened.
    fn step(&mut self) -> Result<bool, MpiError> {
        let mut worked = self.take_commands()?;
        worked |= self.complete_sends()?;
        worked |= self.receive_control()?;
        worked |= self.receive_for_router()?;
        worked |= self.receive_for_dealers()?;
        Ok(worked)
    }

    fn post(
        &mut self,
        (dest, tag, source_tag): (i32, i32, i32),
        encoded: Encoded,
        credits: Option<Arc<Credits>>,
    ) -> Result<(), MpiError> {
        let mut requests = Vec::new();
        // SAFETY: `encoded` moves into `in_flight` next to its requests, also when a
        // later post failed, and stays there (its heap buffers unmoved) until
        // MPI_Testsome reports every one of them complete.
        let posted = unsafe {
            self.comms
                .post(&encoded, dest, tag, source_tag, &mut requests)
        };
        self.track(requests, Sending::new(encoded, credits));
        posted
    }

    /// Keeps a message's buffers next to each of its requests until they complete.
    fn track(&mut self, requests: Vec<Request>, sending: Arc<Sending>) {
        for request in requests {
            self.requests.push(request);
            self.in_flight.push(sending.clone());
        }
    }

    fn send_control(&mut self, dest: i32, note: &Control) -> Result<(), MpiError> {
        let encoded = Encoded {
            head: note.encode(),
            frames: Vec::new(),
        };
        self.post((dest, CONTROL_TAG, CONTROL_TAG), encoded, None)
    }

    fn take_commands(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        while let Ok(command) = self.commands.try_recv() {
            worked = true;
            match command {
                Command::Send {
                    dest,
                    tag,
                    source_tag,
                    encoded,
                    credits,
                } => self.post((dest, tag, source_tag), encoded, Some(credits))?,
                Command::Track { posted, sending } => self.track(posted.0, sending),
                Command::OpenDealer {
                    tag,
                    router,
                    identity,
                    inbox,
                    hwm,
                    limits,
                    connected,
                    turn,
                } => {
                    turn.serve();
                    self.dealers.insert(
                        tag,
                        DealerEnd {
                            router,
                            inbox,
                            hwm,
                            limits,
                            connected: Some(connected),
                            turn,
                        },
                    );
                    self.send_control(
                        router,
                        &Control::Hello {
                            dealer: tag,
                            identity: bytes::Bytes::copy_from_slice(identity.as_bytes()),
                        },
                    )?;
                }
                Command::CloseDealer { tag, router } => {
                    self.dealers.remove(&tag);
                    if router == self.rank {
                        // A dealer of this rank's own router is forgotten here, in
                        // command order. A bye through MPI's self-loopback would be
                        // received only after the commands queued behind this close,
                        // so a router bound right after it (a restart on the same
                        // endpoint) would inherit the closed dealer as a live peer.
                        self.forget(router, tag);
                    } else {
                        self.send_control(router, &Control::Bye { dealer: tag })?;
                    }
                }
                Command::BindRouter {
                    generation,
                    events,
                    hwm,
                    limits,
                    turn,
                } => self.bind_router(RouterEnd {
                    generation,
                    events,
                    hwm,
                    limits,
                    turn,
                })?,
                Command::UnbindRouter { generation } => {
                    if self.router.as_ref().map(|r| r.generation) == Some(generation) {
                        self.router = None;
                    }
                }
                Command::Shutdown { finalize, done } => {
                    self.shutdown = Some((finalize, done));
                }
                Command::Run(job) => {
                    // Separate from `self.comm`, so that a collective's messages can
                    // never match the sockets' probes, nor theirs the collective's.
                    let comm = self
                        .collective
                        .get_or_insert_with(|| ffi::dup_world().map_err(|e| e.to_string()))
                        .clone();
                    job(comm);
                }
            }
        }
        Ok(worked)
    }

    fn complete_sends(&mut self) -> Result<bool, MpiError> {
        let mut done = ffi::test_some(&mut self.requests)?;
        if done.is_empty() {
            return Ok(false);
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        for i in done {
            self.requests.swap_remove(i);
            // The message's credit returns with its last request.
            self.in_flight.swap_remove(i);
        }
        Ok(true)
    }
}
