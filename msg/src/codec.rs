//! The header codec: a 4-byte prefix, then the header fields, fixed-width and
//! little-endian, each enum as a `u32` tag (`msg/WIRE.md`). The tags are spelled out
//! here, in one place, for both directions.

use crate::{Addr, DecodeError, Header, Kind, Limits, Role, Target};

/// The first two bytes of every header frame: ASCII `"SY"`.
pub const MAGIC: [u8; 2] = *b"SY";
/// The header wire version this build writes and reads.
///
/// Version 2 added the `step` field. A frame of any other version, older or newer,
/// is refused with [`DecodeError::UnsupportedVersion`]: the layouts differ, so there is
/// no guessing. Appending an enum variant does not change the version (see
/// [`DecodeError::UnknownTag`]).
pub const WIRE_VERSION: u8 = 2;
/// Length of the magic/version/flags prefix in front of the header body.
pub const WIRE_PREFIX_LEN: usize = 4;

/// Appends an address: group, id, role tag (`msg/WIRE.md`, "Addr").
fn put_addr(out: &mut Vec<u8>, addr: &Addr) {
    let role: u32 = match addr.role {
        Role::Server => 0,
        Role::Worker => 1,
        Role::Stub => 2,
    };
    for word in [addr.group, addr.id, role] {
        out.extend_from_slice(&word.to_le_bytes());
    }
}

/// The tag of `Kind::User`, the only kind with a field.
const USER_TAG: u32 = 11;

/// Appends a kind's tag, and `User`'s u16 (`msg/WIRE.md`, "Kind").
fn put_kind(out: &mut Vec<u8>, kind: Kind) {
    let tag: u32 = match kind {
        Kind::Get => 0,
        Kind::Put => 1,
        Kind::Update => 2,
        Kind::Sync => 3,
        Kind::FeaBlob => 4,
        Kind::GradBlob => 5,
        Kind::Hello => 6,
        Kind::Ready => 7,
        Kind::Stop => 8,
        Kind::Undeliverable => 9,
        Kind::Collective => 10,
        Kind::User(_) => USER_TAG,
    };
    out.extend_from_slice(&tag.to_le_bytes());
    if let Kind::User(value) = kind {
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// Appends a target's tag and fields (`msg/WIRE.md`, "Target").
fn put_target(out: &mut Vec<u8>, target: Target) {
    let (tag, fields): (u32, &[u32]) = match target {
        Target::None => (0, &[]),
        Target::Param(id) => (1, &[id]),
        Target::Blob { layer, blob } => (2, &[layer, blob]),
    };
    out.extend_from_slice(&tag.to_le_bytes());
    for field in fields {
        out.extend_from_slice(&field.to_le_bytes());
    }
}

/// Encodes a header that declares `frames` payload frames.
pub(crate) fn encode_header_with_count(header: &Header, frames: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_header_into(header, frames, &mut out);
    out
}

/// Appends the encoded header to `out`.
///
/// The fields are written by hand rather than by serde so that each enum's wire tag
/// is stated here, next to its decoder, and not implied by declaration order; the
/// bytes equal bincode's fixed-int little-endian encoding of `(header, count)` (a unit
/// test checks that), which is how `msg/WIRE.md` describes them to other languages.
pub(crate) fn encode_header_into(header: &Header, frames: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.push(WIRE_VERSION);
    out.push(0);
    put_addr(out, &header.src);
    put_addr(out, &header.dst);
    put_kind(out, header.kind);
    put_target(out, header.target);
    out.extend_from_slice(&header.seq.to_le_bytes());
    out.extend_from_slice(&header.step.to_le_bytes());
    // More than u32::MAX frames cannot be sent (and no limit admits them); saturating
    // keeps the encoder total, and a receiver refuses the count as too many.
    let count = u32::try_from(frames).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
}

/// Reads fixed-width little-endian fields from a header body. Running out of bytes
/// is `Truncated` with the whole body's length, whatever field it happened in.
struct Body<'a> {
    rest: &'a [u8],
    len: usize,
}

impl Body<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (word, rest) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated { len: self.len })?;
        self.rest = rest;
        Ok(*word)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.take().map(u64::from_le_bytes)
    }

    fn addr(&mut self, role_field: &'static str) -> Result<Addr, DecodeError> {
        let group = self.u32()?;
        let id = self.u32()?;
        let role = match self.u32()? {
            0 => Role::Server,
            1 => Role::Worker,
            2 => Role::Stub,
            tag => return Err(unknown(role_field, tag)),
        };
        Ok(Addr { group, id, role })
    }

    fn kind(&mut self) -> Result<Kind, DecodeError> {
        Ok(match self.u32()? {
            0 => Kind::Get,
            1 => Kind::Put,
            2 => Kind::Update,
            3 => Kind::Sync,
            4 => Kind::FeaBlob,
            5 => Kind::GradBlob,
            6 => Kind::Hello,
            7 => Kind::Ready,
            8 => Kind::Stop,
            9 => Kind::Undeliverable,
            10 => Kind::Collective,
            USER_TAG => Kind::User(self.u16()?),
            tag => return Err(unknown("kind", tag)),
        })
    }

    fn target(&mut self) -> Result<Target, DecodeError> {
        Ok(match self.u32()? {
            0 => Target::None,
            1 => Target::Param(self.u32()?),
            2 => Target::Blob {
                layer: self.u32()?,
                blob: self.u32()?,
            },
            tag => return Err(unknown("target", tag)),
        })
    }
}

fn unknown(field: &'static str, tag: u32) -> DecodeError {
    DecodeError::UnknownTag { field, tag }
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
    // The frame is already within `max_header_bytes` and every field has a fixed
    // width, so reading needs no size limit of its own (bincode's limit, used before,
    // turned a truncated header under a small limit into a size-limit error).
    let rest = &frame[WIRE_PREFIX_LEN..];
    let mut body = Body {
        rest,
        len: rest.len(),
    };
    let header = Header {
        src: body.addr("src.role")?,
        dst: body.addr("dst.role")?,
        kind: body.kind()?,
        target: body.target()?,
        seq: body.u64()?,
        step: body.u32()?,
    };
    let count = body.u32()? as usize;
    if !body.rest.is_empty() {
        return Err(DecodeError::TrailingBytes {
            extra: body.rest.len(),
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use bincode::Options;

    fn roles() -> [Role; 3] {
        [Role::Server, Role::Worker, Role::Stub]
    }

    fn kinds() -> [Kind; 12] {
        [
            Kind::Get,
            Kind::Put,
            Kind::Update,
            Kind::Sync,
            Kind::FeaBlob,
            Kind::GradBlob,
            Kind::Hello,
            Kind::Ready,
            Kind::Stop,
            Kind::Undeliverable,
            Kind::Collective,
            Kind::User(0xbeef),
        ]
    }

    fn targets() -> [Target; 3] {
        [
            Target::None,
            Target::Param(7),
            Target::Blob { layer: 5, blob: 6 },
        ]
    }

    /// The tags are the position of each variant in its declaration, which is what
    /// serde gives a payload that carries an `Addr` or a `Header`: the hand-written
    /// codec and bincode agree byte for byte on every variant.
    #[test]
    fn hand_written_body_is_bincode_fixint_little_endian() {
        let bincode = bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .with_little_endian();
        for role in roles() {
            for kind in kinds() {
                for target in targets() {
                    let src = Addr {
                        group: 1,
                        id: 2,
                        role,
                    };
                    let header = Header {
                        target,
                        seq: u64::MAX - 1,
                        step: 0x0102_0304,
                        ..Header::new(src, Addr::stub(9), kind)
                    };
                    let ours = encode_header_with_count(&header, 3);
                    let theirs = bincode.serialize(&(header, 3u32)).unwrap_or_default();
                    assert_eq!(&ours[..WIRE_PREFIX_LEN], &[b'S', b'Y', WIRE_VERSION, 0]);
                    assert_eq!(&ours[WIRE_PREFIX_LEN..], &theirs[..], "{header:?}");
                    assert_eq!(
                        decode_header_with_count(&ours, &Limits::default()),
                        Ok((header, 3))
                    );
                }
            }
        }
    }

    /// The tag tables of `msg/WIRE.md`: a tag, once given, never changes.
    #[test]
    fn wire_tags_are_fixed() {
        let tag_at = |header: &Header, at: usize| {
            let frame = encode_header(header);
            u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]])
        };
        for (tag, role) in (0u32..).zip(roles()) {
            let header = Header::new(
                Addr::stub(0),
                Addr {
                    group: 0,
                    id: 0,
                    role,
                },
                Kind::Get,
            );
            assert_eq!(tag_at(&header, 24), tag, "{role:?}");
        }
        for (tag, kind) in (0u32..).zip(kinds()) {
            let header = Header::new(Addr::stub(0), Addr::stub(0), kind);
            assert_eq!(tag_at(&header, 28), tag, "{kind:?}");
        }
        for (tag, target) in (0u32..).zip(targets()) {
            let header = Header {
                target,
                ..Header::new(Addr::stub(0), Addr::stub(0), Kind::Get)
            };
            assert_eq!(tag_at(&header, 32), tag, "{target:?}");
        }
    }
}
