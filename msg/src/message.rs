use crate::codec::{decode_header_with_count, encode_header_into, encode_header_with_count};
use crate::{Addr, DecodeError, Header, Kind, Limits, Target};
use bytes::Bytes;

/// A message: a [`Header`] and its payload frames.
///
/// Frames are reference-counted [`Bytes`]: cloning a `Msg` or forwarding it copies
/// only the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    /// Source, destination, kind, target, sequence and step number.
    pub header: Header,
    frames: Vec<Bytes>,
}

impl Msg {
    /// An empty message from `src` to `dst` of kind `kind`.
    pub fn new(src: Addr, dst: Addr, kind: Kind) -> Self {
        Msg {
            header: Header::new(src, dst, kind),
            frames: Vec::new(),
        }
    }

    /// A message with the given header and payload frames.
    pub fn from_parts(header: Header, frames: Vec<Bytes>) -> Self {
        Msg { header, frames }
    }

    /// Sets the target and returns the message.
    pub fn with_target(mut self, target: Target) -> Self {
        self.header.target = target;
        self
    }

    /// Sets the sequence number and returns the message.
    pub fn with_seq(mut self, seq: u64) -> Self {
        self.header.seq = seq;
        self
    }

    /// Sets the step number and returns the message (see [`Header::step`]).
    pub fn with_step(mut self, step: u32) -> Self {
        self.header.step = step;
        self
    }

    /// Appends a payload frame and returns the message.
    pub fn with_frame(mut self, frame: impl Into<Bytes>) -> Self {
        self.frames.push(frame.into());
        self
    }

    /// Appends a payload frame.
    pub fn push_frame(&mut self, frame: impl Into<Bytes>) {
        self.frames.push(frame.into());
    }

    /// The payload frames.
    pub fn frames(&self) -> &[Bytes] {
        &self.frames
    }

    /// The payload frames, mutably (to take, replace or reorder them).
    pub fn frames_mut(&mut self) -> &mut Vec<Bytes> {
        &mut self.frames
    }

    /// Total payload bytes over all frames.
    pub fn payload_len(&self) -> usize {
        self.frames.iter().map(Bytes::len).sum()
    }

    /// The header and frames, separated.
    pub fn into_parts(self) -> (Header, Vec<Bytes>) {
        (self.header, self.frames)
    }

    /// A reply skeleton: source and destination swapped, same target, sequence and
    /// step number, kind `kind`, no frames.
    ///
    /// ```
    /// use switchyard_msg::{Addr, Kind, Msg};
    /// let get = Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Get).with_seq(9);
    /// let reply = get.reply(Kind::Put);
    /// assert_eq!(reply.header.dst, Addr::worker(0, 1));
    /// assert_eq!(reply.header.seq, 9);
    /// ```
    pub fn reply(&self, kind: Kind) -> Msg {
        let mut header = self.header;
        header.src = self.header.dst;
        header.dst = self.header.src;
        header.kind = kind;
        Msg {
            header,
            frames: Vec::new(),
        }
    }

    /// The wire form: the encoded header as frame 0, then the payload frames
    /// (`msg/WIRE.md`). Payload frames are shared, not copied.
    pub fn to_wire(&self) -> Vec<Bytes> {
        let mut wire = Vec::with_capacity(self.frames.len() + 1);
        wire.push(self.encode_header());
        wire.extend(self.frames.iter().cloned());
        wire
    }

    /// Frame 0 of the wire form: the encoded header, which records the number of
    /// payload frames that follow.
    pub fn encode_header(&self) -> Bytes {
        Bytes::from(encode_header_with_count(&self.header, self.frames.len()))
    }

    /// Writes frame 0 of the wire form into `out`, replacing its contents, so that a
    /// transport can reuse one buffer for every message it sends.
    pub fn encode_header_into(&self, out: &mut Vec<u8>) {
        out.clear();
        self.append_header_to(out);
    }

    /// Appends frame 0 of the wire form to `out`, after what it holds: for a
    /// transport that lays a prefix of its own and the header in one buffer.
    ///
    /// ```
    /// use switchyard_msg::{Addr, Kind, Msg};
    /// let msg = Msg::new(Addr::worker(0, 1), Addr::server(0, 0), Kind::Put);
    /// let mut out = b"prefix".to_vec();
    /// msg.append_header_to(&mut out);
    /// assert_eq!(&out[..6], b"prefix");
    /// assert_eq!(&out[6..], &msg.encode_header()[..]);
    /// ```
    pub fn append_header_to(&self, out: &mut Vec<u8>) {
        encode_header_into(&self.header, self.frames.len(), out);
    }

    /// Reads a message from its header frame and its payload frames, checking every
    /// limit in `limits` (the same checks as [`Msg::from_wire`], for transports that
    /// receive the header frame separately).
    pub fn from_header_frame(
        header: &[u8],
        frames: Vec<Bytes>,
        limits: &Limits,
    ) -> Result<Msg, DecodeError> {
        if frames.len() > limits.max_frames {
            return Err(DecodeError::TooManyFrames {
                count: frames.len(),
                limit: limits.max_frames,
            });
        }
        let (header, declared) = decode_header_with_count(header, limits)?;
        if declared != frames.len() {
            return Err(DecodeError::FrameCountMismatch {
                declared,
                actual: frames.len(),
            });
        }
        if let Some((index, frame)) = frames
            .iter()
            .enumerate()
            .find(|(_, f)| f.len() > limits.max_frame_bytes)
        {
            return Err(DecodeError::FrameTooLarge {
                index: index + 1,
                len: frame.len(),
                limit: limits.max_frame_bytes,
            });
        }
        Ok(Msg { header, frames })
    }

    /// Reads a message from its wire form, checking every limit in `limits`.
    ///
    /// Fails, without panicking, on no frames, a bad prefix or header, a frame count
    /// that differs from the header's, or a frame over the limits.
    pub fn from_wire(mut wire: Vec<Bytes>, limits: &Limits) -> Result<Msg, DecodeError> {
        if wire.is_empty() {
            return Err(DecodeError::NoFrames);
        }
        let header = wire.remove(0);
        Msg::from_header_frame(&header, wire, limits)
    }
}
