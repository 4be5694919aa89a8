use thiserror::Error;

/// Why a message's wire form was refused. Each variant names the field or limit.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The message had no frames at all, so no header.
    #[error("message has no frames; frame 0 must hold the header")]
    NoFrames,
    /// Frame 0 is shorter than the 4-byte prefix.
    #[error("header frame is {len} bytes, shorter than the {prefix}-byte magic/version prefix")]
    ShortPrefix {
        /// Length of frame 0.
        len: usize,
        /// Length of the prefix.
        prefix: usize,
    },
    /// The first two bytes are not the switchyard magic.
    #[error(
        "bad magic {found:02x?} in header frame (expected {expected:02x?}): not a switchyard message"
    )]
    BadMagic {
        /// The bytes found.
        found: [u8; 2],
        /// The magic expected.
        expected: [u8; 2],
    },
    /// The wire version is one this build does not speak.
    #[error("header wire version {found} is not supported (this build speaks version {supported})")]
    UnsupportedVersion {
        /// Version found.
        found: u8,
        /// Version supported.
        supported: u8,
    },
    /// The reserved flags byte is not zero.
    #[error("reserved flags byte is {found:#04x}, must be 0 in this wire version")]
    ReservedFlags {
        /// Byte found.
        found: u8,
    },
    /// Frame 0 is longer than the header limit.
    #[error("header frame is {len} bytes, over the limit of {limit} (Limits::max_header_bytes)")]
    HeaderTooLarge {
        /// Length of frame 0.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The header body ended before all fields were read.
    #[error("header truncated: {len} body bytes are not a whole header")]
    Truncated {
        /// Body length.
        len: usize,
    },
    /// The header body has bytes after the last field.
    #[error("header has {extra} trailing bytes after the last field")]
    TrailingBytes {
        /// Bytes left over.
        extra: usize,
    },
    /// A role, kind or target tag this build does not know. Tags are only ever
    /// appended, so this is what a peer with a newer switchyard gets for a variant
    /// added since; messages that use only known variants still interoperate.
    #[error("malformed header: unknown {field} variant {tag} (sent by a newer switchyard?)")]
    UnknownTag {
        /// The field holding the tag: `"src.role"`, `"dst.role"`, `"kind"` or
        /// `"target"`.
        field: &'static str,
        /// The tag found.
        tag: u32,
    },
    /// A field holds a value outside its range. The header decoder of wire version 2
    /// reports unknown tags as [`DecodeError::UnknownTag`] and produces no other
    /// malformed field; the variant stays for code that matches on it.
    #[error("malformed header: {reason}")]
    Malformed {
        /// What the decoder found wrong.
        reason: String,
    },
    /// The header declares a different number of payload frames than arrived.
    #[error("header declares {declared} payload frames but {actual} arrived")]
    FrameCountMismatch {
        /// Frames the header declares.
        declared: usize,
        /// Frames that arrived.
        actual: usize,
    },
    /// More payload frames than the limit.
    #[error("{count} payload frames, over the limit of {limit} (Limits::max_frames)")]
    TooManyFrames {
        /// Frames that arrived or were declared.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// One payload frame is over the size limit.
    #[error(
        "payload frame {index} is {len} bytes, over the limit of {limit} (Limits::max_frame_bytes)"
    )]
    FrameTooLarge {
        /// Wire index of the frame (1 is the first payload frame).
        index: usize,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
}

/// Why a payload frame could not be read as the requested type.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The frame's length is not a multiple of the element size.
    #[error("frame of {len} bytes is not a whole number of {elem_size}-byte elements")]
    Length {
        /// Frame length.
        len: usize,
        /// Size of one element.
        elem_size: usize,
    },
    /// The frame's data is not aligned for the element type, so it cannot be viewed
    /// in place; use a copying reader such as [`crate::payload::frame_to_vec`].
    #[error("frame data is not {align}-byte aligned; view it with a copying reader instead")]
    Misaligned {
        /// Alignment required.
        align: usize,
    },
    /// The frame holds a different number of elements than the destination slice.
    #[error("frame holds {actual} elements but the destination has room for {expected}")]
    CountMismatch {
        /// Elements the destination holds.
        expected: usize,
        /// Elements in the frame.
        actual: usize,
    },
    /// A serde value could not be encoded or decoded.
    #[error("serde payload: {reason}")]
    Serde {
        /// What bincode reported.
        reason: String,
    },
}
