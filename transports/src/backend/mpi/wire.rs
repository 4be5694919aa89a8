//! How a [`Msg`] and the backend's control notes travel as MPI messages.
//!
//! A data message of at most [`PACK_BELOW`] bytes is one MPI message on the
//! destination socket's tag:
//!
//! ```text
//! u32 source tag | u32 header length | u32 frame count | u64 length per frame
//! | header frame (msg/WIRE.md) | frame 1 | frame 2 | ...
//! ```
//!
//! all little-endian; the receiver gets it into one buffer and hands out frames as
//! slices of it. A larger message goes as that head without the frames, its frame
//! count's top bit ([`SPLIT`]) set, followed by each frame as an MPI message of its
//! own, sent from the caller's buffer: on the frames communicator of its direction
//! (to a router, to a dealer), with the dealer's tag, so that no other socket's
//! traffic can come between. Each piece is then contiguous, and MPI moves a large one
//! by its single-copy protocol (the receiver reads the sender's memory), which needs
//! nothing more of the sending process; one send of scattered blocks (a `hindexed`
//! datatype, as this backend sent large messages before) goes through MPI's pipelined
//! protocol instead, which moves data only while the sender calls into MPI.
//!
//! Control notes travel on tag 0: `u8 op | i32 dealer tag | identity bytes`.

use bytes::Bytes;
use switchyard_msg::{DecodeError, Limits, Msg};

/// Messages at most this long are packed into one buffer rather than sent as a head
/// and frames.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) const PACK_BELOW: usize = 16 * 1024;

/// The largest MPI message this backend sends: MPI counts bytes in a C `int`.
pub(crate) const MAX_MESSAGE: usize = i32::MAX as usize;

const FIXED: usize = 12;

/// The frame count's top bit: the frames follow the head as messages of their own.
pub(crate) const SPLIT: u32 = 1 << 31;

/// A data message ready to post.
pub(crate) struct Encoded {
    /// Prefix and header, and for small messages the frames too.
    pub(crate) head: Vec<u8>,
    /// Frames sent as messages of their own after the head (empty when packed).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) frames: Vec<Bytes>,
}

/// Lays out `msg` from the socket with tag `source_tag`, or says why it cannot go.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn encode(msg: &Msg, source_tag: i32) -> Result<Encoded, String> {
    encode_packing_below(msg, source_tag, PACK_BELOW)
}

/// [`encode`], packing messages of at most `pack_below` bytes.
pub(crate) fn encode_packing_below(
    msg: &Msg,
    source_tag: i32,
    pack_below: usize,
) -> Result<Encoded, String> {
    let frames = msg.frames();
    let lengths_end = FIXED + 8 * frames.len();
    // Most headers fit in 64 bytes; the buffer grows for one that does not.
    let payload = msg.payload_len();
    let guess = lengths_end + 64;
    let packed_guess = guess + payload <= pack_below;
    let mut head = Vec::with_capacity(if packed_guess { guess + payload } else { guess });
    head.extend_from_slice(&(source_tag as u32).to_le_bytes());
    head.extend_from_slice(&[0; 4]);
    head.extend_from_slice(&[0; 4]);
    for frame in frames {
        head.extend_from_slice(&(frame.len() as u64).to_le_bytes());
    }
    // The header goes straight into the head; its length is filled in after.
    msg.append_header_to(&mut head);
    let header_len = head.len() - lengths_end;
    let total = head.len() + payload;
    if total > MAX_MESSAGE {
        return Err(format!(
            "a message of {total} bytes is over the mpi backend's limit of {MAX_MESSAGE} bytes \
             (MPI counts in a C int); split it into several messages"
        ));
    }
    let packed = total <= pack_below;
    // Limits keep a count far below the top bit; a larger one could not be sent.
    let count = u32::try_from(frames.len())
        .ok()
        .filter(|&c| c < SPLIT)
        .ok_or_else(|| format!("{} frames is too many for one message", frames.len()))?;
    let count = if packed { count } else { count | SPLIT };
    head[4..8].copy_from_slice(&(header_len as u32).to_le_bytes());
    head[8..12].copy_from_slice(&count.to_le_bytes());
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

/// A received data message: the sending socket's tag and the message, or why it is
/// dropped.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) type Decoded = Result<(i32, Msg), Malformed>;

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

/// The head of a message whose frames follow as messages of their own: the number
/// of them to receive, and the sending dealer's tag (the head's source tag).
pub(crate) fn frames_to_follow(head: &[u8]) -> Option<(usize, i32)> {
    if head.len() < FIXED {
        return None;
    }
    let count = read_u32(head, 8);
    (count & SPLIT != 0).then(|| ((count & !SPLIT) as usize, read_u32(head, 0) as i32))
}

/// Where a message's prefix says its parts are.
struct Layout {
    source_tag: i32,
    count: usize,
    lengths_end: usize,
    header_end: usize,
}

/// Reads and checks a head's prefix against `limits` and the head's length.
fn layout(head: &[u8], limits: &Limits) -> Result<Layout, Malformed> {
    if head.len() < FIXED {
        return Err(Malformed::Layout(format!(
            "{} bytes is shorter than the {FIXED}-byte prefix",
            head.len()
        )));
    }
    let source_tag = read_u32(head, 0) as i32;
    let header_len = read_u32(head, 4) as usize;
    let count = (read_u32(head, 8) & !SPLIT) as usize;
    if count > limits.max_frames {
        return Err(Malformed::Decode(DecodeError::TooManyFrames {
            count,
            limit: limits.max_frames,
        }));
    }
    let lengths_end = FIXED + 8 * count;
    let header_end = lengths_end
        .checked_add(header_len)
        .filter(|&end| end <= head.len())
        .ok_or_else(|| {
            Malformed::Layout(format!(
                "a {header_len}-byte header and {count} frame lengths do not fit in {} bytes",
                head.len()
            ))
        })?;
    Ok(Layout {
        source_tag,
        count,
        lengths_end,
        header_end,
    })
}

/// Reads a data message, checking its layout and every limit; frames are slices of
/// `buffer`, not copies.
pub(crate) fn decode(buffer: Bytes, limits: &Limits) -> Result<(i32, Msg), Malformed> {
    if frames_to_follow(&buffer).is_some() {
        return Err(Malformed::Layout(
            "a head whose frames follow as messages of their own, read alone".into(),
        ));
    }
    let Layout {
        source_tag,
        count,
        lengths_end,
        header_end,
    } = layout(&buffer, limits)?;
    let mut frames = Vec::with_capacity(count);
    let mut at = header_end;
    for i in 0..count {
        let len = read_u64(&buffer, FIXED + 8 * i);
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| at.checked_add(len))
            .filter(|&end| end <= buffer.len())
            .ok_or_else(|| {
                Malformed::Layout(format!(
                    "frame {} claims {len} bytes, past the end of a {}-byte message",
                    i + 1,
                    buffer.len()
                ))
            })?;
        frames.push(buffer.slice(at..end));
        at = end;
    }
    if at != buffer.len() {
        return Err(Malformed::Layout(format!(
            "{} bytes left over after the last frame",
            buffer.len() - at
        )));
    }
    let msg = Msg::from_header_frame(&buffer[lengths_end..header_end], frames, limits)
        .map_err(Malformed::Decode)?;
    Ok((source_tag, msg))
}

/// Reads a message sent as a head and its frames, each checked against the length
/// the head gives it.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn decode_split(
    head: Bytes,
    frames: Vec<Bytes>,
    limits: &Limits,
) -> Result<(i32, Msg), Malformed> {
    let Layout {
        source_tag,
        count,
        lengths_end,
        header_end,
    } = layout(&head, limits)?;
    if header_end != head.len() {
        return Err(Malformed::Layout(format!(
            "{} bytes after the header of a head whose frames follow",
            head.len() - header_end
        )));
    }
    if frames.len() != count {
        return Err(Malformed::Layout(format!(
            "{} frames followed a head that announced {count}",
            frames.len()
        )));
    }
    for (i, frame) in frames.iter().enumerate() {
        let claimed = read_u64(&head, FIXED + 8 * i);
        if claimed != frame.len() as u64 {
            return Err(Malformed::Layout(format!(
                "frame {} is {} bytes where its head claims {claimed}",
                i + 1,
                frame.len()
            )));
        }
    }
    let msg = Msg::from_header_frame(&head[lengths_end..header_end], frames, limits)
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
        assert!(e.frames.is_empty(), "a packed message");
        e.head.clone()
    }

    fn large() -> Msg {
        Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Put)
            .with_frame(vec![1u8; 100_000])
            .with_frame(vec![2u8; 7])
    }

    #[test]
    fn round_trip_small_and_large() {
        for sizes in [
            vec![],
            vec![0],
            vec![3, 0, 5],
            vec![100_000, 7],
            vec![0, 20_000],
        ] {
            let mut msg = Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Put).with_seq(4);
            for (i, n) in sizes.iter().enumerate() {
                msg.push_frame(vec![i as u8; *n]);
            }
            let e = encode(&msg, 17).unwrap();
            let large = sizes.iter().sum::<usize>() > PACK_BELOW;
            assert_eq!(e.frames.is_empty(), !large);
            let (tag, back) = if large {
                assert_eq!(frames_to_follow(&e.head), Some((sizes.len(), 17)));
                decode_split(e.head.into(), e.frames, &Limits::default()).unwrap()
            } else {
                assert_eq!(frames_to_follow(&e.head), None);
                decode(joined(&e).into(), &Limits::default()).unwrap()
            };
            assert_eq!(tag, 17);
            assert_eq!(back, msg);
        }
    }

    #[test]
    fn a_split_message_is_checked_against_its_head() {
        let e = encode(&large(), 3).unwrap();
        let head = Bytes::from(e.head.clone());
        let limits = Limits::default();
        // The head alone, a frame missing, a frame of the wrong length, a frame too many.
        assert!(decode(head.clone(), &limits).is_err());
        assert!(decode_split(head.clone(), e.frames[..1].to_vec(), &limits).is_err());
        let wrong = vec![e.frames[0].clone(), Bytes::from_static(b"12345678")];
        let reason = decode_split(head.clone(), wrong, &limits)
            .unwrap_err()
            .to_string();
        assert!(reason.contains("frame 2 is 8 bytes"), "{reason}");
        let mut extra = e.frames.clone();
        extra.push(Bytes::new());
        assert!(decode_split(head.clone(), extra, &limits).is_err());
        // A head with bytes after its header.
        let mut padded = e.head.clone();
        padded.push(0);
        assert!(decode_split(padded.into(), e.frames.clone(), &limits).is_err());
        assert!(decode_split(head, e.frames, &limits).is_ok());
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
