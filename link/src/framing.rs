//! The [`StreamLink`](super::StreamLink)'s wire format, as a pure encoder and
//! decoder: bytes in, messages or typed errors out, no sockets and no clocks, so that
//! it can be unit-tested and fuzzed on its own.
//!
//! One message on a connection (little-endian): `"SYC1"`, step `u32`, call `u64`,
//! frame count `u32`, reserved `u32`, then one `u64` length per frame, then the
//! frames' bytes. A connection opens with a hello: `"SYH1"`, the connecting rank
//! `u32`, the world size `u32`.
//!
//! Every length a peer sends is checked before anything is allocated for it: at most
//! [`MAX_FRAMES`] frames, each at most the decoder's `max_frame_bytes`. Frames are
//! allocated one at a time as the previous one completes, so a peer can make the
//! decoder hold, beyond the frames it has actually sent, one buffer of at most
//! `max_frame_bytes`.

use super::Tag;
use bytes::Bytes;

/// First bytes of every message.
pub const MESSAGE_MAGIC: [u8; 4] = *b"SYC1";
/// First bytes of the hello that opens a connection.
pub const HELLO_MAGIC: [u8; 4] = *b"SYH1";
/// Bytes of a message's fixed head, before the frame lengths.
pub const HEAD_LEN: usize = 24;
/// Bytes of a hello.
pub const HELLO_LEN: usize = 12;
/// Most frames one message may claim (the collectives send two).
pub const MAX_FRAMES: usize = 16;

/// Why a stream cannot be decoded. After one, the decoder reports it again on every
/// call: the connection is out of step and nothing after it can be trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A message did not start with [`MESSAGE_MAGIC`].
    #[error("bad magic {0:?}")]
    BadMagic([u8; 4]),
    /// A message claimed more than [`MAX_FRAMES`] frames.
    #[error("{count} frames, at most {MAX_FRAMES}")]
    TooManyFrames {
        /// The claimed count.
        count: u32,
    },
    /// A frame claimed more bytes than the decoder accepts.
    #[error("a frame of {len} bytes, over the limit of {max}")]
    FrameTooLong {
        /// The claimed length.
        len: u64,
        /// The decoder's limit.
        max: usize,
    },
}

/// Why a hello is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The hello did not start with [`HELLO_MAGIC`].
    #[error("bad magic {0:?}")]
    BadMagic([u8; 4]),
    /// The peer named a rank outside this world, or another world size.
    #[error("rank {rank} of {world}, this job has {size}")]
    WrongWorld {
        /// The rank the peer claimed.
        rank: u32,
        /// The world size the peer claimed.
        world: u32,
        /// This world's size.
        size: usize,
    },
}

/// One decoded message: its tag and its frames.
pub type Message = (Tag, Vec<Bytes>);

/// The head of a message carrying `frames` (which follow it on the wire unchanged).
pub fn encode_head(tag: Tag, frames: &[Bytes]) -> Vec<u8> {
    let mut head = Vec::with_capacity(HEAD_LEN + 8 * frames.len());
    head.extend_from_slice(&MESSAGE_MAGIC);
    head.extend_from_slice(&tag.step.to_le_bytes());
    head.extend_from_slice(&tag.call.to_le_bytes());
    head.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    for frame in frames {
        head.extend_from_slice(&(frame.len() as u64).to_le_bytes());
    }
    head
}

/// The hello of rank `rank` in a world of `size`.
pub fn encode_hello(rank: usize, size: usize) -> [u8; HELLO_LEN] {
    let mut hello = [0u8; HELLO_LEN];
    hello[..4].copy_from_slice(&HELLO_MAGIC);
    hello[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    hello[8..].copy_from_slice(&(size as u32).to_le_bytes());
    hello
}

/// The rank a hello names, if it belongs to this world of `size` ranks.
pub fn decode_hello(hello: &[u8; HELLO_LEN], size: usize) -> Result<usize, HelloError> {
    let word = |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
    if hello[..4] != HELLO_MAGIC {
        return Err(HelloError::BadMagic([
            hello[0], hello[1], hello[2], hello[3],
        ]));
    }
    let (rank, world) = (word(4), word(8));
    if world as usize != size || rank as usize >= size {
        return Err(HelloError::WrongWorld { rank, world, size });
    }
    Ok(rank as usize)
}

/// Where the decoder is within the current message.
#[derive(Debug)]
enum State {
    Head {
        buf: [u8; HEAD_LEN],
        got: usize,
    },
    Lens {
        tag: Tag,
        buf: Vec<u8>,
        got: usize,
    },
    Body {
        tag: Tag,
        lens: Vec<usize>,
        frames: Vec<Bytes>,
        cur: Vec<u8>,
        got: usize,
    },
    Failed(FrameError),
}

impl State {
    fn start() -> State {
        State::Head {
            buf: [0; HEAD_LEN],
            got: 0,
        }
    }
}

/// Decodes one connection's byte stream into messages.
///
/// The caller reads the stream straight into [`space`](Decoder::space) and reports
/// how much it read with [`filled`](Decoder::filled), so that a frame's bytes land
/// in their final buffer without a copy; [`feed`](Decoder::feed) does the same from a
/// slice.
#[derive(Debug)]
pub struct Decoder {
    max_frame_bytes: usize,
    state: State,
}

impl Decoder {
    /// A decoder at the start of a stream, refusing frames over `max_frame_bytes`.
    pub fn new(max_frame_bytes: usize) -> Decoder {
        Decoder {
            max_frame_bytes,
            state: State::start(),
        }
    }

    /// Where the stream's next bytes go: fill a prefix of it, then call
    /// [`filled`](Decoder::filled). Never empty, except after an error.
    pub fn space(&mut self) -> &mut [u8] {
        match &mut self.state {
            State::Head { buf, got } => &mut buf[*got..],
            State::Lens { buf, got, .. } => &mut buf[*got..],
            State::Body { cur, got, .. } => &mut cur[*got..],
            State::Failed(_) => &mut [],
        }
    }

    /// The error that stopped this decoder, if one did.
    pub fn error(&self) -> Option<&FrameError> {
        match &self.state {
            State::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the decoder stands between two messages, nothing of the next one read.
    pub fn between_messages(&self) -> bool {
        matches!(self.state, State::Head { got: 0, .. })
    }

    /// Records that the first `n` bytes of [`space`](Decoder::space) hold the
    /// stream's next bytes, and returns the message they complete, if any. A frame
    /// of `len` bytes is read into `buffers(len)`, which must be `len` bytes long
    /// (its contents are overwritten).
    pub fn filled(
        &mut self,
        n: usize,
        buffers: &mut dyn FnMut(usize) -> Vec<u8>,
    ) -> Result<Option<Message>, FrameError> {
        let room = self.space().len();
        debug_assert!(n <= room, "filled {n} bytes of a space of {room}");
        match &mut self.state {
            State::Head { got, .. } | State::Lens { got, .. } | State::Body { got, .. } => {
                *got += n.min(room)
            }
            State::Failed(_) => {}
        }
        self.advance(buffers)
    }

    /// Decodes `bytes`, the stream's next bytes, appending the messages they
    /// complete to `out`. Bytes of an unfinished message are kept for the next call.
    pub fn feed(
        &mut self,
        mut bytes: &[u8],
        buffers: &mut dyn FnMut(usize) -> Vec<u8>,
        out: &mut Vec<Message>,
    ) -> Result<(), FrameError> {
        if let Some(e) = self.error() {
            return Err(e.clone());
        }
        while !bytes.is_empty() {
            let space = self.space();
            let n = space.len().min(bytes.len());
            space[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if let Some(message) = self.filled(n, buffers)? {
                out.push(message);
            }
        }
        Ok(())
    }

    /// Moves on through every part that is complete (or needs no bytes), stopping at
    /// a part that waits for bytes, a complete message, or an error.
    fn advance(
        &mut self,
        buffers: &mut dyn FnMut(usize) -> Vec<u8>,
    ) -> Result<Option<Message>, FrameError> {
        loop {
            let state = std::mem::replace(&mut self.state, State::start());
            match step(state, self.max_frame_bytes, buffers) {
                Ok(Step::Wait(state)) => {
                    self.state = state;
                    return Ok(None);
                }
                Ok(Step::Next(state)) => self.state = state,
                Ok(Step::Done(message)) => return Ok(Some(message)),
                Err(e) => {
                    self.state = State::Failed(e.clone());
                    return Err(e);
                }
            }
        }
    }
}

/// What one look at the decoder's state leads to.
enum Step {
    /// The state needs more bytes.
    Wait(State),
    /// The state is done; go on with this one.
    Next(State),
    /// A message is complete; the next starts from scratch.
    Done(Message),
}

fn step(
    state: State,
    max_frame_bytes: usize,
    buffers: &mut dyn FnMut(usize) -> Vec<u8>,
) -> Result<Step, FrameError> {
    Ok(match state {
        State::Failed(e) => return Err(e),
        State::Head { buf, got } if got < HEAD_LEN => Step::Wait(State::Head { buf, got }),
        State::Head { buf, .. } => {
            let word32 =
                |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
            if buf[..4] != MESSAGE_MAGIC {
                return Err(FrameError::BadMagic([buf[0], buf[1], buf[2], buf[3]]));
            }
            let mut call = [0u8; 8];
            call.copy_from_slice(&buf[8..16]);
            let tag = Tag {
                step: word32(4),
                call: u64::from_le_bytes(call),
            };
            let count = word32(16);
            if count as usize > MAX_FRAMES {
                return Err(FrameError::TooManyFrames { count });
            }
            if count == 0 {
                return Ok(Step::Done((tag, Vec::new())));
            }
            Step::Next(State::Lens {
                tag,
                buf: vec![0; count as usize * 8],
                got: 0,
            })
        }
        State::Lens { tag, buf, got } if got < buf.len() => {
            Step::Wait(State::Lens { tag, buf, got })
        }
        State::Lens { tag, buf, .. } => {
            let mut lens = Vec::with_capacity(buf.len() / 8);
            for chunk in buf.chunks_exact(8) {
                let mut word = [0u8; 8];
                word.copy_from_slice(chunk);
                let len = u64::from_le_bytes(word);
                if len > max_frame_bytes as u64 {
                    return Err(FrameError::FrameTooLong {
                        len,
                        max: max_frame_bytes,
                    });
                }
                lens.push(len as usize);
            }
            Step::Next(body(tag, lens, Vec::new(), buffers))
        }
        State::Body {
            tag,
            lens,
            frames,
            cur,
            got,
        } if got < cur.len() => Step::Wait(State::Body {
            tag,
            lens,
            frames,
            cur,
            got,
        }),
        State::Body {
            tag,
            lens,
            mut frames,
            cur,
            ..
        } => {
            frames.push(Bytes::from(cur));
            if frames.len() == lens.len() {
                Step::Done((tag, frames))
            } else {
                Step::Next(body(tag, lens, frames, buffers))
            }
        }
    })
}

/// The state that reads frame `frames.len()` of a message whose frames are `lens` long.
fn body(
    tag: Tag,
    lens: Vec<usize>,
    frames: Vec<Bytes>,
    buffers: &mut dyn FnMut(usize) -> Vec<u8>,
) -> State {
    let len = lens[frames.len()];
    let mut cur = buffers(len);
    cur.resize(len, 0);
    State::Body {
        tag,
        lens,
        frames,
        cur,
        got: 0,
    }
}

#[cfg(test)]
#[path = "framing_tests.rs"]
mod tests;
