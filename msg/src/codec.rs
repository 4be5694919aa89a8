//! The header codec: a 4-byte prefix, then the header fields in bincode's fixed-width
//! little-endian form (`msg/WIRE.md`).

use crate::{DecodeError, Header};
use bincode::Options;

/// The first two bytes of every header frame: ASCII `"SY"`.
pub const MAGIC: [u8; 2] = *b"SY";
/// The header wire version this build writes and reads.
pub const WIRE_VERSION: u8 = 1;
/// Length of the magic/version/flags prefix in front of the header body.
pub const WIRE_PREFIX_LEN: usize = 4;

/// Size limits a decoder enforces before it trusts or allocates anything.
///
/// The defaults suit ML payloads on one cluster: a header frame is at most 256 bytes
/// (a version 1 header frame is 48 to 58), a message has at most 1024 payload frames, and a
/// frame at most 1 GiB. The ZeroMQ backend also hands `max_frame_bytes` to libzmq as
/// `ZMQ_MAXMSGSIZE`, so an oversized frame is refused before it is buffered.
///
/// # Examples
///
/// ```
/// use switchyard_msg::Limits;
/// let limits = Limits::default().with_max_frames(8);
/// assert_eq!(limits.max_frames, 8);
/// assert_eq!(limits.max_header_bytes, 256);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest header frame accepted, prefix included.
    pub max_header_bytes: usize,
    /// Most payload frames in one message.
    pub max_frames: usize,
    /// Largest payload frame accepted.
    pub max_frame_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 256,
            max_frames: 1024,
            max_frame_bytes: 1 << 30,
        }
    }
}

impl Limits {
    /// Sets [`Limits::max_header_bytes`].
    pub fn with_max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes;
        self
    }

    /// Sets [`Limits::max_frames`].
    pub fn with_max_frames(mut self, frames: usize) -> Self {
        self.max_frames = frames;
        self
    }

    /// Sets [`Limits::max_frame_bytes`].
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }
}

fn options(limit: usize) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(limit as u64)
        .allow_trailing_bytes()
}

/// Encodes a header that declares `frames` payload frames.
pub(crate) fn encode_header_with_count(header: &Header, frames: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_header_into(header, frames, &mut out);
    out
}

/// Appends the encoded header to `out`.
pub(crate) fn encode_header_into(header: &Header, frames: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(WIRE_VERSION);
    out.push(0);
    // A header has only fixed-size fields, so serialising into a Vec cannot fail; the
    // fallback keeps the function total without an unwrap.
    let count = u32::try_from(frames).unwrap_or(u32::MAX);
    if options(usize::MAX)
        .serialize_into(&mut *out, &(header, count))
        .is_err()
    {
        out.truncate(start + WIRE_PREFIX_LEN);
    }
}

/// Decodes a header frame into the header and the payload frame count it declares.
pub(crate) fn decode_header_with_count(
    frame: &[u8],
    limits: &Limits,
) -> Result<(Header, usize), DecodeError> {
    if frame.len() > limits.max_header_bytes {
        return Err(DecodeError::HeaderTooLarge {
            len: frame.len(),
            limit: limits.max_header_bytes,
        });
    }
    if frame.len() < WIRE_PREFIX_LEN {
        return Err(DecodeError::ShortPrefix {
            len: frame.len(),
            prefix: WIRE_PREFIX_LEN,
        });
    }
    let found = [frame[0], frame[1]];
    if found != MAGIC {
        return Err(DecodeError::BadMagic {
            found,
            expected: MAGIC,
        });
    }
    if frame[2] != WIRE_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: frame[2],
            supported: WIRE_VERSION,
        });
    }
    if frame[3] != 0 {
        return Err(DecodeError::ReservedFlags { found: frame[3] });
    }
    let body = &frame[WIRE_PREFIX_LEN..];
    let mut reader = body;
    let decoded: Result<(Header, u32), _> =
        options(limits.max_header_bytes).deserialize_from(&mut reader);
    let (header, count) = decoded.map_err(|err| match *err {
        bincode::ErrorKind::Io(ref io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            DecodeError::Truncated { len: body.len() }
        }
        other => DecodeError::Malformed {
            reason: other.to_string(),
        },
    })?;
    if !reader.is_empty() {
        return Err(DecodeError::TrailingBytes {
            extra: reader.len(),
        });
    }
    let count = count as usize;
    if count > limits.max_frames {
        return Err(DecodeError::TooManyFrames {
            count,
            limit: limits.max_frames,
        });
    }
    Ok((header, count))
}

/// Encodes a header frame for a message without payload frames.
///
/// Use [`crate::Msg::encode_header`] for a message with frames: the header records
/// how many follow.
pub fn encode_header(header: &Header) -> Vec<u8> {
    encode_header_with_count(header, 0)
}

/// Decodes a header frame, returning the header and the number of payload frames it
/// declares. Never panics; never allocates more than `limits.max_header_bytes`.
///
/// # Examples
///
/// ```
/// use switchyard_msg::{decode_header, DecodeError, Limits};
/// let err = decode_header(b"XY\x01\x00", &Limits::default()).unwrap_err();
/// assert!(matches!(err, DecodeError::BadMagic { .. }));
/// ```
pub fn decode_header(frame: &[u8], limits: &Limits) -> Result<(Header, usize), DecodeError> {
    decode_header_with_count(frame, limits)
}
