//! The collectives' TCP data path framing (`link/src/framing.rs`),
//! through `switchyard::fuzzing`.

use super::{label, SLACK};
use crate::alloc::measure;
use bytes::Bytes;
use switchyard::fuzzing::{
    decode_stream_frames, decode_stream_frames_chunked, decode_stream_hello, encode_stream_frame,
    Tag, FUZZ_MAX_FRAME_BYTES,
};

/// A frame limit small enough that the driver's inputs cross it.
const SMALL_FRAME: usize = 4096;
/// Bytes of a message head; bytes 20..24 are its reserved word.
const HEAD_LEN: usize = 24;
/// The world the hello decoder checks against.
const WORLD: usize = 4;

/// Decodes `data` as the start of a connection's stream: the same messages (or the
/// same error) however the bytes are chunked, each message re-encoding to its bytes
/// (but for the reserved word, which the decoder does not check), and no more
/// allocated than the frames sent, one frame the stream claims, and a little per
/// byte. The first 12 bytes are also decoded as a connection's hello.
pub fn stream_frames(data: &[u8]) -> String {
    let (whole, usage) = measure(|| decode_stream_frames_chunked(data, 0, SMALL_FRAME));
    let bound = SMALL_FRAME + 64 * data.len() + SLACK;
    assert!(
        usage.total <= bound,
        "decoding allocated {usage:?}, over {bound}"
    );
    for chunk in [1, 7] {
        let chunked = decode_stream_frames_chunked(data, chunk, SMALL_FRAME);
        assert_eq!(chunked, whole, "{chunk}-byte chunks decode differently");
    }
    // Under the link's own limit a claimed frame may cost up to that limit, never
    // what the stream claims beyond it.
    let (large, usage) = measure(|| decode_stream_frames(data));
    let bound = FUZZ_MAX_FRAME_BYTES + 64 * data.len() + SLACK;
    assert!(
        usage.largest <= FUZZ_MAX_FRAME_BYTES + SLACK && usage.total <= bound,
        "decoding under the link's limit allocated {usage:?}, over {bound}"
    );
    if let Ok(messages) = &whole {
        // What a smaller limit accepts, a larger one accepts alike.
        assert_eq!(
            large.as_ref(),
            Ok(messages),
            "a larger frame limit decodes differently"
        );
    }
    let frames = match &whole {
        Ok(messages) => {
            check_reencoding(data, messages);
            format!("ok {}", messages.len().min(3))
        }
        Err(why) => {
            assert!(!why.is_empty(), "a stream refused without a reason");
            label(why)
        }
    };
    let hello = match decode_stream_hello(data, WORLD) {
        None => "short".to_string(),
        Some(Ok(rank)) => {
            assert!(rank < WORLD, "hello accepted rank {rank} of {WORLD}");
            "hello ok".to_string()
        }
        Some(Err(why)) => {
            assert!(!why.is_empty(), "a hello refused without a reason");
            label(&why)
        }
    };
    format!("{frames} | {hello}")
}

/// Each decoded message, encoded again, is the next stretch of `data` (what is left
/// after the last one is an unfinished message). The reserved word is skipped.
fn check_reencoding(data: &[u8], messages: &[(Tag, Vec<Bytes>)]) {
    let mut at = 0;
    for (tag, frames) in messages {
        let again = encode_stream_frame(*tag, frames);
        let end = at + again.len();
        assert!(end <= data.len(), "{tag:?} encodes past the input");
        let sent = &data[at..end];
        assert_eq!(&again[..20], &sent[..20], "{tag:?}: head differs");
        assert_eq!(
            &again[HEAD_LEN..],
            &sent[HEAD_LEN..],
            "{tag:?}: lengths or frames differ"
        );
        at = end;
    }
}

/// Messages with 0, 1 and 2 frames back to back, hellos, and near misses.
pub(super) fn seeds() -> Vec<Vec<u8>> {
    let tag = |call, step| Tag { call, step };
    let one = encode_stream_frame(tag(1, 0), &[Bytes::from_static(b"0123456789abcdef")]);
    let two = encode_stream_frame(
        tag(7, 3),
        &[
            Bytes::from_static(&[1, 2, 3, 4]),
            Bytes::from_static(&[0xff; 32]),
        ],
    );
    let none = encode_stream_frame(tag(u64::MAX, u32::MAX), &[]);
    let mut hello = b"SYH1".to_vec();
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&(WORLD as u32).to_le_bytes());
    let mut stream = one.clone();
    stream.extend_from_slice(&two);
    stream.extend_from_slice(&none);
    let mut claims_too_much = one.clone();
    claims_too_much[HEAD_LEN..HEAD_LEN + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let unfinished = two[..two.len() - 5].to_vec();
    vec![one, two, none, stream, hello, claims_too_much, unfinished]
}
