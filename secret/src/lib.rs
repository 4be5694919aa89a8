//! The optional job secret: a key shared by every process of one job, and the
//! HMAC-SHA256 challenge-response that a plain TCP connection runs first when it is set,
//! so that a stranger who reaches a port cannot join the job or take a rank.
//!
//! # Where the secret comes from
//! [`JobSecret::from_env`]: `SWITCHYARD_JOB_SECRET_FILE=path` (preferred: a file only its
//! owner can read) or `SWITCHYARD_JOB_SECRET=text`. The secret is the bytes of the text
//! (the file's content without trailing white space), at least [`MIN_SECRET_LEN`] bytes:
//! 64 hex digits from [`JobSecret::generate`] are a good choice. Neither set: no
//! authentication (the default; real rabit/XGBoost workers cannot authenticate, so a job
//! with XGBoost workers must leave it unset). Both set, empty, too short or an unreadable
//! file: an error, never a silent fall-back to no authentication (fail closed).
//!
//! # The handshake (mutual; fixed sizes, so a stranger costs at most 76 bytes of reading)
//! 1. Acceptor -> [`MAGIC`] (8 bytes) + `nonce_a` (32 random bytes).
//! 2. Connector -> `nonce_c` (32) + claimed rank (u32 LE) + `tag_c` (32) =
//!    HMAC(K, "switchyard/v1/connector" ‖ purpose ‖ nonce_a ‖ nonce_c ‖ rank).
//! 3. The acceptor checks `tag_c` in constant time; on a mismatch it closes without a
//!    word. Else it sends `tag_a` = HMAC(K, "switchyard/v1/acceptor" ‖ purpose ‖ nonce_a
//!    ‖ nonce_c ‖ rank), which the connector checks: a rogue listener is found out too.
//!
//! Why this shape: the role labels stop a reflected tag from passing as the other side's;
//! fresh nonces on both sides stop a recorded reply from passing on a new connection; the
//! claimed rank inside the tag stops a stranger from taking a rank; the purpose (which
//! link kind: "rendezvous", "stream", ...) stops a tag from one kind of link being
//! replayed on another. Every read of the handshake runs under a deadline of at most
//! [`HANDSHAKE_LIMIT`]. The secret is never printed ([`JobSecret`]'s `Debug` hides it).
//!
//! Why HMAC-SHA256 from RustCrypto's `hmac` + `sha2`: pure Rust (no C library to build),
//! widely reviewed, and `Mac::verify_slice` compares in constant time. Confidentiality is
//! not a goal: after the handshake the bytes travel in the clear.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod job_id;
pub use job_id::{ENV_JOB_ID, JobId};

/// The variable holding the secret itself.
pub const ENV_SECRET: &str = "SWITCHYARD_JOB_SECRET";
/// The variable holding the path of a file with the secret.
pub const ENV_SECRET_FILE: &str = "SWITCHYARD_JOB_SECRET_FILE";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// The longest secret file read, in bytes.
pub const MAX_SECRET_LEN: usize = 4096;
/// The acceptor's opening bytes: distinct from every protocol's magic we speak, so that
/// a peer without the secret sees at once that this side expects one.
pub const MAGIC: [u8; 8] = *b"SYAUTH1\0";
/// The longest a handshake may take, whatever deadline the caller gives.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 32;
const CONNECTOR_LABEL: &[u8] = b"switchyard/v1/connector";
const ACCEPTOR_LABEL: &[u8] = b"switchyard/v1/acceptor";

/// Why the secret could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// Both variables are set: which one is meant is unclear.
    #[error("both {ENV_SECRET} and {ENV_SECRET_FILE} are set; set only one")]
    Both,
    /// The secret is shorter than [`MIN_SECRET_LEN`] (empty included).
    #[error(
        "the job secret from {source_name} has {len} bytes; at least {MIN_SECRET_LEN} are needed"
    )]
    TooShort {
        /// Where it came from (a variable or a file path).
        source_name: String,
        /// Its length.
        len: usize,
    },
    /// The secret file could not be read or is too large.
    #[error("job secret file {path}: {reason}")]
    File {
        /// The path.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// No random bytes could be had.
    #[error("no random bytes for a job secret or nonce: {0}")]
    Random(String),
}

/// A job's shared secret. `Debug` prints no byte of it.
#[derive(Clone)]
pub struct JobSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(<hidden>)")
    }
}

impl JobSecret {
    /// A secret from its bytes, named `source_name` in errors.
    pub fn new(bytes: impl Into<Vec<u8>>, source_name: &str) -> Result<JobSecret, SecretError> {
        let key = bytes.into();
        if key.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort {
                source_name: source_name.to_string(),
                len: key.len(),
            });
        }
        Ok(JobSecret { key })
    }

    /// A fresh secret: 32 random bytes as 64 lowercase hex digits, and that text.
    pub fn generate() -> Result<(JobSecret, String), SecretError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| SecretError::Random(e.to_string()))?;
        let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let secret = JobSecret::new(text.as_bytes().to_vec(), "a generated secret")?;
        Ok((secret, text))
    }

    /// The secret named by this process's environment ([`ENV_SECRET_FILE`] or
    /// [`ENV_SECRET`]); `None` when neither is set.
    pub fn from_env() -> Result<Option<JobSecret>, SecretError> {
        JobSecret::from_vars(
            std::env::var_os(ENV_SECRET).map(|v| v.to_string_lossy().into_owned()),
            std::env::var_os(ENV_SECRET_FILE).map(|v| v.to_string_lossy().into_owned()),
        )
    }

    /// [`from_env`](JobSecret::from_env) with the two variables' values given.
    pub fn from_vars(
        secret: Option<String>,
        file: Option<String>,
    ) -> Result<Option<JobSecret>, SecretError> {
        match (secret, file) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(SecretError::Both),
            (Some(text), None) => JobSecret::new(text.trim_end().as_bytes(), ENV_SECRET).map(Some),
            (None, Some(path)) => JobSecret::from_file(&path).map(Some),
        }
    }

    /// The secret in the file at `path` (content without trailing white space).
    pub fn from_file(path: &str) -> Result<JobSecret, SecretError> {
        let file_err = |reason: String| SecretError::File {
            path: path.to_string(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| file_err(e.to_string()))?;
        warn_if_others_can_read(&file, path);
        let mut bytes = Vec::new();
        file.take(MAX_SECRET_LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| file_err(e.to_string()))?;
        if bytes.len() > MAX_SECRET_LEN {
            return Err(file_err(format!("longer than {MAX_SECRET_LEN} bytes")));
        }
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        JobSecret::new(bytes, path)
    }

    /// A 32-byte key for `label`, derived from the secret (HMAC-SHA256 of the label):
    /// a credential for a mechanism that cannot run this crate's handshake, such as
    /// ZeroMQ's PLAIN, so that the secret itself never goes on the wire.
    pub fn derive(&self, label: &str) -> Result<[u8; 32], AuthFailure> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .map_err(|e| AuthFailure::Io(format!("HMAC key: {e}")))?;
        mac.update(b"switchyard/v1/derive/");
        mac.update(label.as_bytes());
        Ok(mac.finalize().into_bytes().into())
    }

    fn tag(
        &self,
        label: &[u8],
        purpose: &str,
        nonces: &[u8],
        rank: u32,
    ) -> Result<Hmac<Sha256>, AuthFailure> {
        // HMAC takes keys of every length; the error exists only in the trait's shape.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .map_err(|e| AuthFailure::Io(format!("HMAC key: {e}")))?;
        mac.update(label);
        // Length-prefixed so that no two (label, purpose) pairs hash alike.
        mac.update(&(purpose.len() as u32).to_le_bytes());
        mac.update(purpose.as_bytes());
        mac.update(nonces);
        mac.update(&rank.to_le_bytes());
        Ok(mac)
    }
}

#[cfg(unix)]
fn warn_if_others_can_read(file: &std::fs::File, path: &str) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = file.metadata() {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path,
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "job secret file can be read by others than its owner (chmod 600 it)"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_others_can_read(_file: &std::fs::File, _path: &str) {}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthFailure {
    /// The acceptor did not open with [`MAGIC`]: it does not use a job secret.
    #[error(
        "the peer does not expect authentication (set the same job secret on every process, or none)"
    )]
    PeerNotAuthenticating,
    /// The connector's tag did not match: a wrong secret, no secret, or a replay.
    #[error("the peer's proof of the job secret is wrong (wrong or missing secret)")]
    BadConnectorTag,
    /// The acceptor's tag did not match: it does not know the secret.
    #[error("the listening side's proof of the job secret is wrong (wrong secret)")]
    BadAcceptorTag,
    /// The peer closed the connection mid-handshake; for a connector, what an acceptor
    /// that refused it does.
    #[error(
        "the peer closed the connection during authentication (it refused our secret or expects none)"
    )]
    Closed,
    /// The handshake did not finish in time.
    #[error("authentication did not finish within {0:?}")]
    Timeout(Duration),
    /// Another I/O error.
    #[error("I/O error during authentication: {0}")]
    Io(String),
    /// No random bytes for a nonce.
    #[error("no random bytes for a nonce: {0}")]
    Random(String),
}

/// A failed handshake with the peer at `peer`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("authentication with {peer} failed: {reason}")]
pub struct AuthError {
    /// The peer's address.
    pub peer: String,
    /// Why.
    pub reason: AuthFailure,
}

/// A stream with its deadline: every read and write gets the time left.
struct Timed<'a> {
    stream: &'a mut TcpStream,
    deadline: Instant,
    limit: Duration,
}

impl Timed<'_> {
    fn arm(&mut self) -> Result<(), AuthFailure> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AuthFailure::Timeout(self.limit));
        }
        self.stream
            .set_read_timeout(Some(left))
            .and_then(|_| self.stream.set_write_timeout(Some(left)))
            .map_err(|e| AuthFailure::Io(e.to_string()))
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), AuthFailure> {
        self.arm()?;
        self.stream.read_exact(buf).map_err(|e| self.io(e))
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), AuthFailure> {
        self.arm()?;
        self.stream.write_all(buf).map_err(|e| self.io(e))
    }

    fn io(&self, e: std::io::Error) -> AuthFailure {
        use std::io::ErrorKind::*;
        match e.kind() {
            WouldBlock | TimedOut => AuthFailure::Timeout(self.limit),
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => AuthFailure::Closed,
            _ => AuthFailure::Io(e.to_string()),
        }
    }

    /// Puts the stream's timeouts back to none (blocking without limit), as the caller
    /// had them before.
    fn finish(self) -> Result<(), AuthFailure> {
        self.stream
            .set_read_timeout(None)
            .and_then(|_| self.stream.set_write_timeout(None))
            .map_err(|e| AuthFailure::Io(e.to_string()))
    }
}

fn timed(stream: &mut TcpStream, deadline: Instant) -> Timed<'_> {
    let limit = HANDSHAKE_LIMIT.min(deadline.saturating_duration_since(Instant::now()));
    Timed {
        stream,
        deadline: Instant::now() + limit,
        limit,
    }
}

fn peer_name(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn nonce() -> Result<[u8; NONCE_LEN], AuthFailure> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| AuthFailure::Random(e.to_string()))?;
    Ok(n)
}

/// Runs the acceptor's side on a freshly accepted `stream` (blocking mode), for links
/// of kind `purpose`; returns the rank the connector claimed, which the caller should
/// hold the connector to. Finishes by `deadline` or [`HANDSHAKE_LIMIT`], whichever is
/// first; the stream's timeouts are cleared afterwards. On an error the caller closes.
pub fn accept(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    deadline: Instant,
) -> Result<u32, AuthError> {
    let peer = peer_name(stream);
    accept_inner(stream, secret, purpose, deadline).map_err(|reason| AuthError { peer, reason })
}

fn accept_inner(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    deadline: Instant,
) -> Result<u32, AuthFailure> {
    let mut io = timed(stream, deadline);
    let nonce_a = nonce()?;
    let mut opening = [0u8; MAGIC.len() + NONCE_LEN];
    opening[..MAGIC.len()].copy_from_slice(&MAGIC);
    opening[MAGIC.len()..].copy_from_slice(&nonce_a);
    io.write(&opening)?;
    let mut reply = [0u8; NONCE_LEN + 4 + TAG_LEN];
    io.read(&mut reply)?;
    let (nonce_c, rest) = reply.split_at(NONCE_LEN);
    let (rank_bytes, tag_c) = rest.split_at(4);
    let rank = u32::from_le_bytes([rank_bytes[0], rank_bytes[1], rank_bytes[2], rank_bytes[3]]);
    let nonces = [&nonce_a[..], nonce_c].concat();
    secret
        .tag(CONNECTOR_LABEL, purpose, &nonces, rank)?
        .verify_slice(tag_c)
        .map_err(|_| AuthFailure::BadConnectorTag)?;
    let tag_a = secret
        .tag(ACCEPTOR_LABEL, purpose, &nonces, rank)?
        .finalize()
        .into_bytes();
    io.write(&tag_a)?;
    io.finish()?;
    Ok(rank)
}

/// Runs the connector's side on a freshly connected `stream` (blocking mode), for links
/// of kind `purpose`, claiming `rank` (use `u32::MAX` where no rank applies). Finishes
/// by `deadline` or [`HANDSHAKE_LIMIT`], whichever is first; the stream's timeouts are
/// cleared afterwards.
pub fn connect(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    rank: u32,
    deadline: Instant,
) -> Result<(), AuthError> {
    let peer = peer_name(stream);
    connect_inner(stream, secret, purpose, rank, deadline)
        .map_err(|reason| AuthError { peer, reason })
}

fn connect_inner(
    stream: &mut TcpStream,
    secret: &JobSecret,
    purpose: &str,
    rank: u32,
    deadline: Instant,
) -> Result<(), AuthFailure> {
    let mut io = timed(stream, deadline);
    let mut opening = [0u8; MAGIC.len() + NONCE_LEN];
    io.read(&mut opening[..MAGIC.len()])?;
    if opening[..MAGIC.len()] != MAGIC {
        return Err(AuthFailure::PeerNotAuthenticating);
    }
    io.read(&mut opening[MAGIC.len()..])?;
    let nonce_c = nonce()?;
    let nonces = [&opening[MAGIC.len()..], &nonce_c[..]].concat();
    let tag_c = secret
        .tag(CONNECTOR_LABEL, purpose, &nonces, rank)?
        .finalize()
        .into_bytes();
    let mut reply = Vec::with_capacity(NONCE_LEN + 4 + TAG_LEN);
    reply.extend_from_slice(&nonce_c);
    reply.extend_from_slice(&rank.to_le_bytes());
    reply.extend_from_slice(&tag_c);
    io.write(&reply)?;
    let mut tag_a = [0u8; TAG_LEN];
    io.read(&mut tag_a)?;
    secret
        .tag(ACCEPTOR_LABEL, purpose, &nonces, rank)?
        .verify_slice(&tag_a)
        .map_err(|_| AuthFailure::BadAcceptorTag)?;
    io.finish()
}

/// True when `bytes` start like the acceptor's opening: a protocol reader that finds
/// this where it expected its own magic can say "the peer expects a job secret".
pub fn looks_like_challenge(bytes: &[u8]) -> bool {
    let n = bytes.len().min(MAGIC.len());
    n >= 4 && bytes[..n] == MAGIC[..n]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The acceptor's tag over the same nonces and rank never passes as the
    /// connector's: a reflected tag is worthless.
    #[test]
    fn the_role_labels_keep_the_two_tags_apart() {
        let key = JobSecret::new(b"0123456789abcdef".to_vec(), "test").unwrap();
        let nonces = [7u8; 64];
        let acceptor_tag = key
            .tag(ACCEPTOR_LABEL, "p", &nonces, 1)
            .unwrap()
            .finalize()
            .into_bytes();
        assert!(
            key.tag(CONNECTOR_LABEL, "p", &nonces, 1)
                .unwrap()
                .verify_slice(&acceptor_tag)
                .is_err()
        );
        // And the claimed rank is bound: rank 1's tag does not pass for rank 2.
        let rank_one = key
            .tag(CONNECTOR_LABEL, "p", &nonces, 1)
            .unwrap()
            .finalize()
            .into_bytes();
        assert!(
            key.tag(CONNECTOR_LABEL, "p", &nonces, 2)
                .unwrap()
                .verify_slice(&rank_one)
                .is_err()
        );
    }
}
