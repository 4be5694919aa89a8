//! How a [`Msg`] and the backend's control notes travel as single MPI messages.
//!
//! A data message is one MPI message on the destination socket's tag:
//!
//! ```text
//! u32 source tag | u32 header length | u32 frame count | u64 length per frame
//! | header frame (msg/WIRE.md) | frame 1 | frame 2 | ...
//! ```
//!
//! all little-endian. The sender posts the prefix and the frames as one `hindexed`
//! send, so payload bytes are not copied on the way out (small messages are packed
//! into one buffer instead, which is cheaper than building a datatype); the receiver
//! gets the whole message into one buffer and hands out frames as slices of it.
//!
//! Control notes travel on tag 0: `u8 op | i32 dealer tag | identity bytes`.

use bytes::Bytes;
use switchyard_msg::{DecodeError, Limits, Msg};

/// Messages at most this long are packed into one buffer rather than sent as blocks.
pub(crate) const PACK_BELOW: usize = 16 * 1024;

/// The largest MPI message this backend sends: MPI counts bytes in a C `int`.
pub(crate) const MAX_MESSAGE: usize = i32::MAX as usize;

const FIXED: usize = 12;

/// A data message ready to post.
pub(crate) struct Encoded {
    /// Prefix and header, and for small messages the frames too.
    pub(crate) head: Vec<u8>,
    /// Frames sent in place (empty when packed into `head`).
    pub(crate) frames: Vec<Bytes>,
}

impl Encoded {
    pub(crate) fn blocks(&self) -> Vec<&[u8]> {
        let mut blocks = Vec::with_capacity(1 + self.frames.len());
        blocks.push(self.head.as_slice());
        blocks.extend(self.frames.iter().map(|f| &f[..]));
        blocks
    }
}

/// Lays out `msg` from the socket with tag `source_tag`, or says why it cannot go.
pub(crate) fn encode(msg: &Msg, source_tag: i32) -> Result<Encoded, String> {
    let mut header = Vec::with_capacity(64);
    msg.encode_header_into(&mut header);
    let frames = msg.frames();
    let head_len = FIXED + 8 * frames.len() + header.len();
    let total = head_len + msg.payload_len();
    if total > MAX_MESSAGE {
        return Err(format!(
            "a message of {total} bytes is over the mpi backend's limit of {MAX_MESSAGE} bytes \
             (MPI counts in a C int); split it into several messages"
        ));
    }
    let packed = total <= PACK_BELOW;
    let mut head = Vec::with_capacity(if packed { total } else { head_len });
    head.extend_from_slice(&(source_tag as u32).to_le_bytes());
    head.extend_from_slice(&(header.len() as u32).to_le_bytes());
    head.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for frame in frames {
        head.extend_from_slice(&(frame.len() as u64).to_le_bytes());
    }
    head.extend_from_slice(&header);
    if packed {
        for frame in frames {
            head.extend_from_slice(frame);
        }
        return Ok(Encoded {
            head,
            frames: Vec::new(),
        });
    }
    Ok(Encoded {
        head,
        frames: frames.to_vec(),
    })
}

/// Why a received data message was dropped.
#[derive(Debug)]
pub(crate) enum Malformed {
    Layout(String),
    Decode(DecodeError),
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Malformed::Layout(reason) => f.write_str(reason),
            Malformed::Decode(e) => write!(f, "{e}"),
        }
    }
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(word)
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Reads a data message, checking its layout and every limit; frames are slices of
/// `buffer`, not copies.
pub(crate) fn decode(buffer: Bytes, limits: &Limits) -> Result<(i32, Msg), Malformed> {
    let layout = |reason: String| Malformed::Layout(reason);
    if buffer.len() < FIXED {
        return Err(layout(format!(
            "{} bytes is shorter than the {FIXED}-byte prefix",
            buffer.len()
        )));
    }
    let source_tag = read_u32(&buffer, 0) as i32;
    let header_len = read_u32(&buffer, 4) as usize;
    let count = read_u32(&buffer, 8) as usize;
    if count > limits.max_frames {
        return Err(Malformed::Decode(DecodeError::TooManyFrames {
            count,
            limit: limits.max_frames,
        }));
    }
    let lengths_end = FIXED + 8 * count;
    let header_end = lengths_end
        .checked_add(header_len)
        .filter(|&end| end <= buffer.len())
        .ok_or_else(|| {
            layout(format!(
                "a {header_len}-byte header and {count} frame lengths do not fit in {} bytes",
                buffer.len()
            ))
        })?;
    let mut spans = Vec::with_capacity(count);
    let mut at = header_end;
    for i in 0..count {
        let len = read_u64(&buffer, FIXED + 8 * i);
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| at.checked_add(len))
            .filter(|&end| end <= buffer.len())
            .ok_or_else(|| {
                layout(format!(
                    "frame {} claims {len} bytes, past the end of a {}-byte message",
                    i + 1,
                    buffer.len()
                ))
            })?;
        spans.push((at, end));
        at = end;
    }
    if at != buffer.len() {
        return Err(layout(format!(
            "{} bytes left over after the last frame",
            buffer.len() - at
        )));
    }
    let whole = buffer;
    let frames = spans.iter().map(|&(a, b)| whole.slice(a..b)).collect();
    let msg = Msg::from_header_frame(&whole[lengths_end..header_end], frames, limits)
        .map_err(Malformed::Decode)?;
    Ok((source_tag, msg))
}

/// A note between the progress threads of two ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// A dealer with this tag wants the router of the receiving rank.
    Hello { dealer: i32, identity: Bytes },
    /// The router is bound: the dealer may send.
    Ready { dealer: i32 },
    /// The dealer is gone.
    Bye { dealer: i32 },
}

impl Control {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (op, dealer, identity): (u8, i32, &[u8]) = match self {
            Control::Hello { dealer, identity } => (1, *dealer, identity),
            Control::Ready { dealer } => (2, *dealer, &[]),
            Control::Bye { dealer } => (3, *dealer, &[]),
        };
        let mut out = Vec::with_capacity(5 + identity.len());
        out.push(op);
        out.extend_from_slice(&dealer.to_le_bytes());
        out.extend_from_slice(identity);
        out
    }

    pub(crate) fn decode(buffer: &[u8]) -> Result<Control, String> {
        if buffer.len() < 5 {
            return Err(format!("control note of {} bytes", buffer.len()));
        }
        let dealer = read_u32(buffer, 1) as i32;
        match buffer[0] {
            1 if buffer.len() <= 5 + 255 => Ok(Control::Hello {
                dealer,
                identity: Bytes::copy_from_slice(&buffer[5..]),
            }),
            2 if buffer.len() == 5 => Ok(Control::Ready { dealer }),
            3 if buffer.len() == 5 => Ok(Control::Bye { dealer }),
            op => Err(format!(
                "unknown control note {op} of {} bytes",
                buffer.len()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use switchyard_msg::{Addr, Kind};

    fn joined(e: &Encoded) -> Vec<u8> {
        e.blocks().concat()
    }

    #[test]
    fn round_trip_small_and_large() {
        for sizes in [vec![], vec![0], vec![3, 0, 5], vec![100_000, 7]] {
            let mut msg = Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Put).with_seq(4);
            for (i, n) in sizes.iter().enumerate() {
                msg.push_frame(vec![i as u8; *n]);
            }
            let e = encode(&msg, 17).unwrap();
            let large = sizes.iter().sum::<usize>() > PACK_BELOW;
            assert_eq!(e.frames.is_empty(), !large);
            let (tag, back) = decode(joined(&e).into(), &Limits::default()).unwrap();
            assert_eq!(tag, 17);
            assert_eq!(back, msg);
        }
    }

    #[test]
    fn truncated_or_padded_messages_are_malformed() {
        let msg =
            Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Put).with_frame(vec![1u8; 40]);
        let bytes = joined(&encode(&msg, 2).unwrap());
        for cut in [0, 5, 12, 20, bytes.len() - 1] {
            assert!(
                decode(bytes[..cut].to_vec().into(), &Limits::default()).is_err(),
                "cut {cut}"
            );
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(decode(padded.into(), &Limits::default()).is_err());
        let mut lying = bytes;
        lying[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(lying.into(), &Limits::default()).is_err());
    }

    #[test]
    fn control_round_trip() {
        for note in [
            Control::Hello {
                dealer: 9,
                identity: Bytes::from_static(b"w0"),
            },
            Control::Ready { dealer: 3 },
            Control::Bye { dealer: 32767 },
        ] {
            assert_eq!(Control::decode(&note.encode()).unwrap(), note);
        }
        assert!(Control::decode(&[9, 0, 0, 0, 0]).is_err());
        assert!(Control::decode(&[2]).is_err());
    }
}
