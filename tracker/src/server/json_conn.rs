//! One JSON connection (XGBoost 2.1+): hello frame, command frame, and for `start` the
//! `{"world_size"}` reply, the wait for the batch and the peer frame.

use super::accept::{Bad, await_decision};
use super::machines::MIXED_CLASSIC;
use super::shared::{Go, Shared, lock};
use crate::common::ConnId;
use crate::json::Hello;
use crate::wire::{Deadline, WireError, put_i32, put_json, write_all_within};
use serde_json::Value;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long signalling one worker's error port may take.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) fn session(
    sh: &Shared,
    conn: ConnId,
    stream: &TcpStream,
    host: &str,
    hello_len: i32,
    head: [u8; 4],
    r: &mut Deadline<'_>,
) -> Result<(), Bad> {
    let cap = sh.config.limits.max_frame;
    let len = usize::try_from(hello_len)
        .ok()
        .filter(|&l| l >= head.len())
        .ok_or_else(|| Bad::Protocol(format!("hello frame length {hello_len}")))?;
    if len > cap {
        return Err(WireError::TooLong {
            what: "hello frame",
            len: len as i64,
            cap,
        }
        .into());
    }
    let mut body = head.to_vec();
    body.extend(r.exact("hello frame", len - head.len())?);
    let hello: Hello = serde_json::from_slice(&body).map_err(|e| bad_json("hello frame", e))?;
    let cmd: Value = r.json("command frame", cap)?;
    let command = int(&cmd, "cmd")?;
    if command != 1 {
        // A print, shutdown or error comes after this worker's earlier commands.
        sh.await_turn(conn, host);
    }
    match command {
        1 => start(sh, conn, stream, host, &hello, &cmd),
        2 => {
            let mut m = lock(&sh.machines);
            let actions = m.json.shutdown(hello.rank).map_err(Bad::Refused)?;
            sh.json_actions(&mut m, actions);
            Ok(())
        }
        3 => {
            let code = int(&cmd, "code")?;
            let msg = text(&cmd, "msg")?;
            let targets = {
                let mut m = lock(&sh.machines);
                let actions = m.json.error(hello.rank, code, msg);
                sh.json_actions(&mut m, actions)
            };
            signal_error(&targets);
            sh.signalled();
            Ok(())
        }
        4 => {
            let msg = text(&cmd, "msg")?;
            sh.print(i32::try_from(hello.rank).unwrap_or(-1), msg.trim());
            Ok(())
        }
        other => Err(Bad::Protocol(format!("unknown command {other}"))),
    }
}

fn bad_json(what: &'static str, e: serde_json::Error) -> Bad {
    WireError::BadJson {
        what,
        reason: e.to_string(),
    }
    .into()
}

/// An integer field (a float or a string is refused, as XGBoost's own parser would).
fn int(v: &Value, key: &str) -> Result<i64, Bad> {
    v.get(key)
        .and_then(Value::as_i64)
        .ok_or_else(|| Bad::Protocol(format!("command frame without an integer {key:?}: {v}")))
}

fn text<'v>(v: &'v Value, key: &str) -> Result<&'v str, Bad> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| Bad::Protocol(format!("command frame without a string {key:?}: {v}")))
}

fn start(
    sh: &Shared,
    conn: ConnId,
    stream: &TcpStream,
    host: &str,
    hello: &Hello,
    cmd: &Value,
) -> Result<(), Bad> {
    let port = int(cmd, "port")?;
    let error_port = int(cmd, "error_port")?;
    let timeout = sh.config.read_timeout;
    let inbox = sh.inbox(conn);
    let taken = {
        let mut m = lock(&sh.machines);
        m.json_start(conn, host, hello, port, error_port)
            .map(|taken| {
                sh.refuse_waiting(taken.refused, MIXED_CLASSIC);
                // A `start` signals no error: nothing to send after unlocking.
                sh.json_actions(&mut m, taken.actions);
            })
    };
    // Taken in (or refused): its wait for the batch must not hold back the worker's
    // later prints.
    sh.sequence.settle(conn);
    if taken.is_ok() {
        // A worker's by what it did, not what it claimed: never evicted by the cap.
        sh.cap.started(conn);
    }
    taken.map_err(Bad::Refused)?;
    let mut reply = Vec::new();
    put_json(
        &mut reply,
        &serde_json::json!({ "world_size": sh.config.workers }),
    );
    if let Err(e) = write_all_within(stream, &reply, timeout, "world size reply") {
        lock(&sh.machines).json.vanish(conn);
        return Err(e.into());
    }
    let started = Instant::now();
    let go = match await_decision(sh, stream, &inbox, Some(started + sh.config.batch_timeout)) {
        Ok(go) => go,
        Err(why) => {
            let left = lock(&sh.machines).json.vanish(conn);
            match inbox.rx.try_recv() {
                // Its peer frame came meanwhile: try to deliver it.
                Ok(go) if !left => go,
                _ => return Err(Bad::Protocol(why.reason(started.elapsed()))),
            }
        }
    };
    let (host, port, rank) = match go {
        Go::Peer { host, port, rank } => (host, port, rank),
        // Already out of the batch (the machine took it out): closed without a frame.
        Go::Refused(reason) => return Err(Bad::Refused(reason.into())),
        Go::Turn(_) => {
            return Err(Bad::Protocol(
                "internal: classic turn for a JSON worker".into(),
            ));
        }
    };
    let mut frame = Vec::new();
    put_json(
        &mut frame,
        &serde_json::json!({ "host": host, "port": port, "rank": rank }),
    );
    if let Err(e) = write_all_within(stream, &frame, timeout, "peer frame") {
        // Its predecessor already has this worker's address: the ring cannot form.
        let reason = format!("the worker before rank {rank} left after its batch formed ({e})");
        let targets = {
            let mut m = lock(&sh.machines);
            let actions = m.json.error(-1, 0, &reason);
            sh.json_actions(&mut m, actions)
        };
        signal_error(&targets);
        sh.signalled();
        return Err(Bad::Protocol(reason));
    }
    Ok(())
}

/// Tells each worker's error listener that the job failed: i32 `1`
/// (docs/xgboost-protocol.md, *Errors and the error port*).
fn signal_error(targets: &[(String, u16)]) {
    let mut one = Vec::new();
    put_i32(&mut one, 1);
    for (host, port) in targets {
        let Ok(ip) = host.parse::<IpAddr>() else {
            tracing::warn!(%host, "cannot signal a worker: not an IP address");
            continue;
        };
        let addr = SocketAddr::new(ip, *port);
        let sent = TcpStream::connect_timeout(&addr, SIGNAL_TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|s| {
                write_all_within(&s, &one, SIGNAL_TIMEOUT, "error signal")
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = sent {
            tracing::warn!(%addr, error = %e, "cannot signal a worker's error port");
        }
    }
}
