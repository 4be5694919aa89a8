//! Entry points for the fuzz targets in `fuzz/`: the decoders that read what a peer
//! sends, callable from outside the crate.
//!
//! **Not a stable API.** Hidden from the documentation; names and signatures may
//! change in any release. Programs should not use it.

use bytes::Bytes;
/// The tag of a framed message.
pub use switchyard_link::Tag;
use switchyard_link::framing::{self, Decoder};

/// The frame limit of [`decode_stream_frames`]: large enough for every structure of
/// the format, small enough that a fuzzer's claimed lengths stay cheap.
pub const FUZZ_MAX_FRAME_BYTES: usize = 1 << 20;

/// The messages the collectives' TCP data path decodes from `bytes`, the start of a
/// connection's stream, with frames of at most [`FUZZ_MAX_FRAME_BYTES`]. Bytes of an
/// unfinished last message are ignored; an `Err` is what the link would report.
pub fn decode_stream_frames(bytes: &[u8]) -> Result<Vec<(Tag, Vec<Bytes>)>, String> {
    decode_stream_frames_chunked(bytes, 0, FUZZ_MAX_FRAME_BYTES)
}

/// [`decode_stream_frames`] with the stream arriving `chunk` bytes at a time (0: all
/// at once), as reads from a socket do, and frames of at most `max_frame_bytes`.
/// Every chunking of the same bytes must decode alike.
pub fn decode_stream_frames_chunked(
    bytes: &[u8],
    chunk: usize,
    max_frame_bytes: usize,
) -> Result<Vec<(Tag, Vec<Bytes>)>, String> {
    let mut decoder = Decoder::new(max_frame_bytes);
    let mut out = Vec::new();
    let chunk = if chunk == 0 {
        bytes.len().max(1)
    } else {
        chunk
    };
    for piece in bytes.chunks(chunk) {
        decoder
            .feed(piece, &mut |len| vec![0; len], &mut out)
            .map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The bytes of one message with `tag` and `frames` on the TCP data path.
pub fn encode_stream_frame(tag: Tag, frames: &[Bytes]) -> Vec<u8> {
    let mut bytes = framing::encode_head(tag, frames);
    for frame in frames {
        bytes.extend_from_slice(frame);
    }
    bytes
}

/// The rank a connection's opening hello names, checked against a world of
/// `world_size` ranks; `None` for fewer than 12 bytes.
pub fn decode_stream_hello(bytes: &[u8], world_size: usize) -> Option<Result<usize, String>> {
    let hello: &[u8; framing::HELLO_LEN] = bytes.get(..framing::HELLO_LEN)?.try_into().ok()?;
    Some(framing::decode_hello(hello, world_size).map_err(|e| e.to_string()))
}
