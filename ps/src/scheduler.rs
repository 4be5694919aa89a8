//! The scheduler: registration, barriers, liveness and the end of the job.
//!
//! ps-lite's ADD_NODE, in switchyard terms: every server and worker registers (a
//! server with the endpoint it serves on); once all have come, each gets its rank and
//! the list of every server's endpoint. Afterwards the scheduler answers heartbeats,
//! releases barriers, and ends the job: with a shutdown to every server once every
//! worker said it is done, or with an abort naming the node that fell silent.

use super::schedule::{Action, Schedule};
use super::wire::{self, Control};
use super::{PsConfig, PsError};
use std::time::{Duration, Instant};
use switchyard_msg::Msg;
use switchyard_transports::{PeerId, RecvError, Router, RouterSocket, Socket};

/// How long the serving loop receives before it checks for silent nodes.
const SLICE: Duration = Duration::from_millis(20);
/// Longest the scheduler waits on one node's full queue (a node that does not read
/// its line for long is dead or stuck; its silence will tell).
const SEND_WAIT: Duration = Duration::from_millis(50);

/// A scheduler bound to its endpoint, ready to [`run`](Scheduler::run).
#[derive(Debug)]
pub struct Scheduler {
    router: RouterSocket,
    config: PsConfig,
}

/// How a job went, from the scheduler's side.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobReport {
    /// Workers that finished.
    pub workers: u32,
    /// Servers shut down.
    pub servers: u32,
    /// Barriers released.
    pub barriers: u64,
    /// Dead servers replaced by their replicas ([`PsConfig::replicate`]).
    pub failovers: u32,
}

impl Scheduler {
    /// Binds the scheduler's router at `endpoint` (`tcp://host:port`, `local://name`
    /// or `inproc://name`; `tcp://host:0` picks a port, see [`Scheduler::endpoint`]).
    pub fn bind(endpoint: &str, config: &PsConfig) -> Result<Scheduler, PsError> {
        config.check()?;
        let router = RouterSocket::bind(endpoint, config.socket.clone())
            .map_err(|e| PsError::transport(format!("scheduler binding {endpoint}"), e))?;
        Ok(Scheduler {
            router,
            config: config.clone(),
        })
    }

    /// The endpoint nodes connect to.
    pub fn endpoint(&self) -> &str {
        self.router.endpoint()
    }

    /// Runs the job to its end: `Ok` once every worker is done (the servers are told
    /// to stop), an error naming the node when one is silent for
    /// [`PsConfig::dead_timeout`] (everyone is told to abort) or when registration
    /// does not complete within [`PsConfig::join_timeout`].
    ///
    /// A state machine (the crate-private `schedule` module) makes every decision; this
    /// loop only receives, decodes and sends.
    pub fn run(mut self) -> Result<JobReport, PsError> {
        let mut schedule = Schedule::new(&self.config, Instant::now());
        // Whether the last receive found the queue empty: only then is the schedule
        // told it is idle (see the `schedule` module on why silence waits for that).
        let mut drained = true;
        loop {
            let received = if drained {
                self.router.recv_from_timeout(SLICE)
            } else {
                self.router.try_recv_from()
            };
            drained = received.is_err();
            let actions = match received {
                Ok((peer, msg)) => match wire::read_control(&msg, &peer.to_string()) {
                    Ok(note) => schedule.on_note(peer, note, Instant::now()),
                    Err(e) => {
                        tracing::warn!("ps scheduler: {e}");
                        continue;
                    }
                },
                Err(RecvError::Timeout | RecvError::Empty) => schedule.on_idle(Instant::now()),
                Err(e) => return Err(PsError::protocol("scheduler socket", e)),
            };
            for action in actions {
                match action {
                    Action::Send { to, note } => self.send(&to, &note),
                    Action::Answer { to, note } => {
                        let _ = self.router.try_send_to(&to, self.note(&note));
                    }
                    Action::Finish(outcome) => return outcome,
                }
            }
        }
    }

    fn note(&self, note: &Control) -> Msg {
        wire::control(wire::SCHEDULER, wire::SCHEDULER, note)
    }

    /// Sends `note` to `peer`, waiting a moment at most: the scheduler must not
    /// stall on one node, or it would miss the others' heartbeats.
    fn send(&mut self, peer: &PeerId, note: &Control) {
        let msg = self.note(note);
        if let Err(e) = self
            .router
            .send_to_deadline(peer, msg, Instant::now() + SEND_WAIT)
        {
            tracing::warn!("ps scheduler: {note:?} to {peer} not sent: {}", e.kind);
        }
    }
}
