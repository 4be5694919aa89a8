//! The job secret on tracker connections (see [`switchyard_secret`]): with
//! `SWITCHYARD_JOB_SECRET` or `SWITCHYARD_JOB_SECRET_FILE` in the tracker's environment,
//! a connection must pass the secret's challenge-response before its magic. Real
//! rabit/XGBoost workers cannot: jobs with them must leave the secret unset.

use super::accept::Bad;
use crate::common::TRACKER_PURPOSE;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use switchyard_secret::JobSecret;

/// Runs the acceptor's side when the tracker has a secret (read once at start, where
/// an unusable one stops the start).
pub(super) fn check(
    stream: &TcpStream,
    secret: Option<&JobSecret>,
    timeout: Duration,
) -> Result<(), Bad> {
    let Some(secret) = secret else {
        return Ok(());
    };
    let mut own = stream
        .try_clone()
        .map_err(|e| Bad::Protocol(format!("authentication: {e}")))?;
    switchyard_secret::accept(&mut own, secret, TRACKER_PURPOSE, Instant::now() + timeout)
        .map(|_| ())
        .map_err(|e| Bad::Protocol(format!("authentication failed: {}", e.reason)))
}
