//! The job secret on ZeroMQ tcp links: ZMTP's PLAIN mechanism checked by a ZAP handler.
//!
//! With `SWITCHYARD_JOB_SECRET` or `SWITCHYARD_JOB_SECRET_FILE` set (see
//! [`switchyard_secret`]), every router is a PLAIN server and every dealer a PLAIN
//! client whose password is a key derived from the secret (never the secret itself);
//! a ZAP handler in the process's context accepts exactly that password and logs each
//! refusal with the peer's address (rate-limited per address, as the other warnings a
//! peer can trigger). A peer without a secret (the NULL mechanism) is refused by libzmq
//! at the greeting, before any message and without asking the handler, so that refusal
//! is not logged (libzmq would report it only to a socket monitor, without the peer's
//! address); a wrong password is refused by the handler. `inproc://` has no handshake
//! and needs none (one process).
//!
//! Why PLAIN + ZAP and not CURVE: the libzmq that the `zmq` crate builds has no
//! libsodium, so no CURVE; and PLAIN through ZAP is a hook that needs no change to the
//! message flow. What it does not give: PLAIN sends the derived password in the clear,
//! so someone who can read the traffic could replay it on another ZeroMQ connection of
//! the same job (not on the TCP links, whose challenge-response uses fresh nonces).
//! Sniffing is outside what the secret defends against: confidentiality and on-path
//! attackers need an isolated network or a future CURVE/TLS option.
//!
//! The password is per job: derived from the secret and the job id
//! ([`switchyard_secret::JobId::for_process`], from the environment: `SWITCHYARD_JOB_ID`, which `switchyard
//! launch` sets afresh for each job, else Slurm's, PMIx's/Open MPI's or torchrun's), so
//! that a password recorded in one job logs in to no later job with the same secret.
//! With no job id at all it is derived from the secret alone, the same in every job
//! (the weaker case, logged once at debug level).
//!
//! The secret and the job id are read once per process, on the first socket.

use crate::backend::warn_limit::PeerWarnings;
use std::sync::OnceLock;
use switchyard_secret::{JobId, JobSecret};

/// The PLAIN user name every dealer gives.
pub(super) const USER: &str = "switchyard";
/// Where libzmq sends ZAP requests (fixed by the ZAP protocol, RFC 27).
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The PLAIN password of this process's job secret, `None` without a secret; an
/// unusable secret is an error (fail closed), the same on every call.
pub(super) fn password() -> Result<Option<&'static str>, String> {
    static PASSWORD: OnceLock<Result<Option<String>, String>> = OnceLock::new();
    PASSWORD
        .get_or_init(|| {
            let Some(secret) = JobSecret::from_env().map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            let key = secret
                .derive(&label(JobId::for_process().as_ref()))
                .map_err(|e| e.to_string())?;
            let password: String = key.iter().map(|b| format!("{b:02x}")).collect();
            start_handler(password.clone())?;
            Ok(Some(password))
        })
        .as_ref()
        .map(|p| p.as_deref())
        .map_err(Clone::clone)
}

/// The derivation label of the PLAIN password: per job with a job id.
fn label(job: Option<&JobId>) -> String {
    match job {
        // The id is length-prefixed so that no id can end one label and begin another.
        Some(job) => format!("zmq-plain/job/{}/{}", job.value.len(), job.value),
        None => {
            tracing::debug!(
                "zmq: no job id in the environment; the PLAIN password is the same in every \
                 job with this secret"
            );
            "zmq-plain".to_string()
        }
    }
}

/// Binds the ZAP handler before any socket exists, so that no handshake finds none.
fn start_handler(password: String) -> Result<(), String> {
    let socket = super::context()
        .socket(zmq::REP)
        .map_err(|e| format!("ZAP handler socket: {e}"))?;
    socket
        .bind(ZAP_ENDPOINT)
        .map_err(|e| format!("ZAP handler bind {ZAP_ENDPOINT}: {e}"))?;
    std::thread::Builder::new()
        .name("switchyard-zap".into())
        .spawn(move || serve(&socket, password.as_bytes()))
        .map_err(|e| format!("ZAP handler thread: {e}"))?;
    Ok(())
}

/// Answers ZAP requests for the process's life (the context is never terminated).
/// Refusals are logged per peer address through a [`PeerWarnings`]: a stranger who
/// retries a wrong password in a loop cannot fill the logs.
fn serve(socket: &zmq::Socket, password: &[u8]) {
    let mut warnings = PeerWarnings::<String>::new("zmq ZAP handler");
    while let Ok(request) = socket.recv_multipart(0) {
        // version, request id, domain, address, identity, mechanism, credentials...
        let field = |i: usize| request.get(i).map(Vec::as_slice).unwrap_or_default();
        let accepted = request.len() == 8
            && field(0) == b"1.0"
            && field(5) == b"PLAIN"
            && field(6) == USER.as_bytes()
            && same(field(7), password);
        let (code, text): (&[u8], &[u8]) = if accepted {
            (b"200", b"OK")
        } else {
            let peer = String::from_utf8_lossy(field(3)).into_owned();
            if warnings.admit(&peer) {
                tracing::warn!(
                    %peer,
                    mechanism = %String::from_utf8_lossy(field(5)),
                    "zmq: the peer's job secret is wrong; connection refused"
                );
            }
            (b"400", b"wrong job secret")
        };
        let reply: [&[u8]; 6] = [b"1.0", field(1), code, text, b"", b""];
        if socket.send_multipart(reply, 0).is_err() {
            return;
        }
    }
}

/// Compares in time independent of where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
