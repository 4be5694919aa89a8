//! One classic connection: hello, then `print`, `shutdown`, `switchyard-silent` (a
//! robust engine's silent-rank report), or `start`/`recover` with
//! the wait for the batch and the turn, the assignment and the link negotiation.

use super::accept::{Bad, Waited, await_decision};
use super::machines::MIXED_JSON;
use super::shared::{Go, Shared, lock};
use crate::classic::{Assignment, Command, Hello, task_id};
use crate::common::ConnId;
use crate::wire::{Deadline, put_i32, put_str, write_all_within};
use std::net::TcpStream;
use std::time::Instant;

pub(crate) fn session(
    sh: &Shared,
    conn: ConnId,
    stream: &TcpStream,
    host: &str,
    rank: i32,
    world: i32,
    r: &mut Deadline<'_>,
) -> Result<(), Bad> {
    let max = sh.config.limits.max_str;
    let task = task_id(r.str("task id", max)?);
    let text = r.str("command", max)?;
    let command = Command::parse(&text)
        .ok_or_else(|| Bad::Protocol(format!("unknown command {text:?} from rank {rank}")))?;
    let hello = Hello {
        rank,
        world,
        task_id: task,
        command,
    };
    match command {
        Command::Print => {
            let text = r.str("print text", max)?;
            sh.await_turn(conn, host);
            sh.print(rank, text.trim());
            Ok(())
        }
        Command::Silent => {
            // The body: the silent rank, its start number and the reporter's reason.
            let silent = r.i32("silent rank")?;
            let attempt = r.i32("silent rank's attempt")?;
            let reason = r.str("silent reason", max)?;
            let (Ok(silent), Ok(attempt)) = (u32::try_from(silent), u32::try_from(attempt)) else {
                return Err(Bad::Protocol(format!(
                    "silent report from rank {rank} names rank {silent} attempt {attempt}"
                )));
            };
            sh.await_turn(conn, host);
            sh.silent(rank, silent, attempt, reason.trim());
            Ok(())
        }
        Command::Shutdown => {
            // After this worker's earlier prints, which may end the job's log.
            sh.await_turn(conn, host);
            // A worker may finish and shut down before the tracker has read the port it
            // reported on its `start` connection: wait for that negotiation to end.
            let m = lock(&sh.machines);
            let mut m = sh
                .changed
                .wait_timeout_while(m, sh.config.read_timeout, |m| {
                    u32::try_from(rank).is_ok_and(|r| m.classic.is_held(r))
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            let actions = m.classic.shutdown(rank).map_err(Bad::Refused)?;
            sh.classic_actions(&mut m, actions);
            Ok(())
        }
        Command::Start | Command::Recover => start(sh, conn, stream, host, &hello),
    }
}

fn start(
    sh: &Shared,
    conn: ConnId,
    stream: &TcpStream,
    host: &str,
    hello: &Hello,
) -> Result<(), Bad> {
    let inbox = sh.inbox(conn);
    let decided = {
        let mut m = lock(&sh.machines);
        m.classic_start(conn, host, hello).map(|taken| {
            sh.refuse_waiting(taken.refused, MIXED_JSON);
            sh.classic_actions(&mut m, taken.actions);
        })
    };
    // Taken in (or refused): its wait for the batch must not hold back the worker's
    // later prints.
    sh.sequence.settle(conn);
    if decided.is_ok() {
        // A worker's by what it did, not what it claimed: never evicted by the cap.
        sh.cap.started(conn);
    }
    if let Err(reason) = decided {
        refuse(sh, stream);
        return Err(Bad::Refused(reason));
    }
    let started = Instant::now();
    let mut deadline = Some(started + sh.config.batch_timeout);
    let rank = loop {
        match await_decision(sh, stream, &inbox, deadline) {
            Ok(Go::Turn(rank)) => break rank,
            Ok(Go::Refused(reason)) => {
                // Already out of the batch: the machine took it out.
                refuse(sh, stream);
                return Err(Bad::Refused(reason.into()));
            }
            Ok(Go::Peer { .. }) => {
                return Err(Bad::Protocol(
                    "internal: peer frame for a classic worker".into(),
                ));
            }
            Err(why) => {
                let mut m = lock(&sh.machines);
                if m.classic.vanish(conn) {
                    return Err(Bad::Protocol(why.reason(started.elapsed())));
                }
                match (why, m.classic.holds(conn)) {
                    // Its batch is complete: it waits for its turn, however long.
                    (Waited::TimedOut, Some(_)) => deadline = None,
                    (why, held) => {
                        if let Some(rank) = held {
                            let mut actions = Vec::new();
                            m.classic.abandon(conn, rank, &mut actions);
                            sh.classic_actions(&mut m, actions);
                        }
                        return Err(Bad::Protocol(why.reason(started.elapsed())));
                    }
                }
            }
        }
    };
    let mut turn = Turn {
        sh,
        conn,
        rank,
        finished: false,
    };
    turn.negotiate(stream)
}

/// Rank −1: the protocol's only polite refusal (docs/rabit-protocol.md, *Refusals*).
fn refuse(sh: &Shared, stream: &TcpStream) {
    let mut buf = Vec::new();
    for v in [-1, -1, sh.config.workers as i32, 0, -1, -1] {
        put_i32(&mut buf, v);
    }
    let _ = write_all_within(stream, &buf, sh.config.read_timeout, "refusal");
}

/// A connection's turn to negotiate; gives the turn (and a never-linked rank) back if
/// it ends early.
struct Turn<'a> {
    sh: &'a Shared,
    conn: ConnId,
    rank: u32,
    finished: bool,
}

impl Turn<'_> {
    fn negotiate(&mut self, stream: &TcpStream) -> Result<(), Bad> {
        let (sh, timeout) = (self.sh, self.sh.config.read_timeout);
        let (assignment, mut neg) = lock(&sh.machines)
            .classic
            .begin(self.conn, self.rank)
            .map_err(Bad::Protocol)?;
        write_all_within(
            stream,
            &assignment_bytes(&assignment),
            timeout,
            "assignment",
        )?;
        loop {
            let mut r = Deadline::new(stream, timeout);
            let count = r.length("good link count", sh.config.limits.max_list)?;
            let good = (0..count)
                .map(|_| r.i32("good link"))
                .collect::<Result<Vec<i32>, _>>()?;
            let round = lock(&sh.machines)
                .classic
                .round(&mut neg, &good)
                .map_err(Bad::Protocol)?;
            let mut buf = Vec::new();
            put_i32(&mut buf, round.connect.len() as i32);
            put_i32(&mut buf, round.accept as i32);
            for (host, port, rank) in &round.connect {
                put_str(&mut buf, host);
                put_i32(&mut buf, i32::from(*port));
                put_i32(&mut buf, *rank as i32);
            }
            write_all_within(stream, &buf, timeout, "negotiation round")?;
            let errors = Deadline::new(stream, timeout).i32("failed connect count")?;
            if errors < 0 || errors as usize > round.connect.len() {
                return Err(Bad::Protocol(format!(
                    "rank {} reports {errors} failed connects of {}",
                    self.rank,
                    round.connect.len()
                )));
            }
            if errors == 0 {
                break;
            }
        }
        let port = Deadline::new(stream, timeout).i32("listening port")?;
        let mut m = lock(&sh.machines);
        let actions = m.classic.finish(neg, port).map_err(Bad::Protocol)?;
        self.finished = true;
        sh.classic_actions(&mut m, actions);
        Ok(())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut m = lock(&self.sh.machines);
            let mut actions = Vec::new();
            m.classic.abandon(self.conn, self.rank, &mut actions);
            self.sh.classic_actions(&mut m, actions);
        }
    }
}

/// The assignment message (docs/rabit-protocol.md, *The assignment message*).
fn assignment_bytes(a: &Assignment) -> Vec<u8> {
    let mut buf = Vec::new();
    put_i32(&mut buf, a.rank as i32);
    put_i32(&mut buf, a.links.parent);
    put_i32(&mut buf, a.world as i32);
    put_i32(&mut buf, a.links.tree.len() as i32);
    for &t in &a.links.tree {
        put_i32(&mut buf, t as i32);
    }
    put_i32(&mut buf, a.links.prev);
    put_i32(&mut buf, a.links.next);
    buf
}
