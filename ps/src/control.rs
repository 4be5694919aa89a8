//! A node's liveness thread: heartbeats to the scheduler, and the scheduler's word
//! (shutdown, abort) or silence back.
//!
//! It runs on its own thread with its own dealer, so that a worker busy computing
//! between calls still counts as alive, and a scheduler that dies is noticed within
//! [`PsConfig::dead_timeout`] even by a node that is not waiting on it.

use super::wire::{self, Control, NodeRole};
use super::{PsConfig, PsError};
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use switchyard_transports::{Dealer, DealerSocket, RecvError, Socket};

/// How often the thread looks at its stop flag while waiting for the scheduler.
const SLICE: Duration = Duration::from_millis(10);

/// What the liveness thread learnt.
#[derive(Clone, Debug)]
enum Outcome {
    Shutdown,
    Aborted(String),
    SchedulerSilent(Duration),
    Broken(String),
}

/// What the liveness thread passes on: the end of the job, or a failover.
#[derive(Clone, Debug)]
enum Note {
    End(Outcome),
    Failover { dead: u32, by: u32 },
}

/// The main thread's side of the liveness thread.
#[derive(Debug)]
pub(crate) struct Liveness {
    events: Receiver<Note>,
    outcome: Option<Outcome>,
    failovers: Vec<(u32, u32)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    scheduler: String,
}

impl Liveness {
    /// Starts heartbeats for node `role` `rank` to the scheduler at `scheduler`.
    pub(crate) fn start(scheduler: &str, role: NodeRole, rank: u32, config: &PsConfig) -> Liveness {
        // Unbounded, but it carries at most one failover per server and one end.
        let (tx, events) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (scheduler, config, stop) = (scheduler.to_string(), config.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("ps-{role}-{rank}-liveness"))
                .spawn(move || beat(&scheduler, role, rank, &config, &stop, &tx))
                .ok()
        };
        Liveness {
            events,
            outcome: None,
            failovers: Vec::new(),
            stop,
            thread,
            scheduler: scheduler.to_string(),
        }
    }

    /// `Ok` while the job runs; [`PsError::Finished`] once the scheduler shut it
    /// down; the failure once one is known.
    pub(crate) fn check(&mut self) -> Result<(), PsError> {
        while self.outcome.is_none() {
            match self.events.try_recv() {
                Ok(Note::End(outcome)) => self.outcome = Some(outcome),
                Ok(Note::Failover { dead, by }) => self.failovers.push((dead, by)),
                Err(_) => break,
            }
        }
        match &self.outcome {
            None => Ok(()),
            Some(Outcome::Shutdown) => Err(PsError::Finished),
            Some(Outcome::Aborted(reason)) => Err(PsError::Aborted {
                reason: reason.clone(),
            }),
            Some(Outcome::SchedulerSilent(silent)) => Err(PsError::SchedulerSilent {
                endpoint: self.scheduler.clone(),
                silent: *silent,
            }),
            Some(Outcome::Broken(reason)) => Err(PsError::Send {
                to: format!("scheduler at {}", self.scheduler),
                reason: reason.clone(),
            }),
        }
    }

    /// The failovers announced since the last call: (dead server, replacing server).
    pub(crate) fn take_failovers(&mut self) -> Vec<(u32, u32)> {
        std::mem::take(&mut self.failovers)
    }

    /// Stops the heartbeats (the node has finished).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.stop();
    }
}

fn beat(
    scheduler: &str,
    role: NodeRole,
    rank: u32,
    config: &PsConfig,
    stop: &AtomicBool,
    tx: &Sender<Note>,
) {
    let me = wire::addr(role, rank);
    let options = config
        .socket
        .clone()
        .with_connect_timeout(config.dead_timeout);
    let mut dealer = match DealerSocket::connect(scheduler, options) {
        Ok(d) => d,
        Err(e) => {
            let _ = tx.send(Note::End(Outcome::Broken(e.to_string())));
            return;
        }
    };
    let mut heard = Instant::now();
    let mut next_beat = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_beat {
            let note = wire::control(me, wire::SCHEDULER, &Control::Heartbeat { role, rank });
            // A full queue means the scheduler is not reading; its silence says so.
            let _ = dealer.try_send(note);
            next_beat = now + config.heartbeat;
        }
        if now.duration_since(heard) > config.dead_timeout {
            let _ = tx.send(Note::End(Outcome::SchedulerSilent(
                now.duration_since(heard),
            )));
            return;
        }
        let wait = SLICE.min(next_beat.saturating_duration_since(now));
        match dealer.recv_timeout(wait) {
            Ok(msg) => {
                heard = Instant::now();
                match wire::read_control(&msg, "scheduler") {
                    Ok(Control::Shutdown) => {
                        let _ = tx.send(Note::End(Outcome::Shutdown));
                        say_ended(&mut dealer, role, rank);
                        return;
                    }
                    Ok(Control::Abort { reason }) => {
                        let _ = tx.send(Note::End(Outcome::Aborted(reason)));
                        say_ended(&mut dealer, role, rank);
                        return;
                    }
                    Ok(Control::Failover { dead, by }) => {
                        let _ = tx.send(Note::Failover { dead, by });
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!("ps {me}: {e}"),
                }
            }
            Err(RecvError::Timeout | RecvError::Empty) => {}
            Err(e) => {
                let _ = tx.send(Note::End(Outcome::Broken(e.to_string())));
                return;
            }
        }
    }
}

/// Tells the scheduler that this node heard the end of the job, so that it may exit.
fn say_ended(dealer: &mut DealerSocket, role: NodeRole, rank: u32) {
    let me = wire::addr(role, rank);
    let note = wire::control(me, wire::SCHEDULER, &Control::Ended { role, rank });
    // Lost, it only makes the scheduler wait out its bound before it returns.
    let _ = dealer.try_send(note);
}
