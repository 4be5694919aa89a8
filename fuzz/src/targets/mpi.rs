//! The MPI backend's wire (`transports/src/backend/mpi/wire.rs`): data messages and
//! the control notes between progress threads, through
//! `switchyard_transports::fuzzing`.

use super::{label, SLACK};
use crate::alloc::measure;
use bytes::Bytes;
use switchyard_msg::{Addr, Kind, Limits, Msg, Target};
use switchyard_transports::fuzzing::{
    decode_mpi_message, encode_mpi_message, round_trip_mpi_control,
};

/// Limits small enough that the driver's inputs reach every one of them.
fn limits() -> Limits {
    Limits::default()
        .with_max_frames(8)
        .with_max_frame_bytes(1024)
}

/// Decodes `data` both as a data message and as a control note. Either decoder may
/// refuse it with a non-empty reason; what one accepts must re-encode to exactly
/// `data`. Decoding a data message allocates no more than the header limit and a
/// few words per allowed frame: the frames are slices of the received buffer.
pub fn mpi_wire(data: &[u8]) -> String {
    let limits = limits();
    let buffer = data.to_vec();
    let (result, usage) = measure(|| decode_mpi_message(buffer, &limits));
    let bound = limits.max_header_bytes + 64 * limits.max_frames + SLACK;
    assert!(
        usage.total <= bound,
        "decode_mpi_message allocated {usage:?}, over {bound}"
    );
    let message = match result {
        Ok((tag, msg)) => {
            let again = encode_mpi_message(&msg, tag)
                .unwrap_or_else(|why| panic!("{msg:?} decoded but does not encode: {why}"));
            assert_eq!(
                again, data,
                "{msg:?} from tag {tag} does not re-encode to its bytes"
            );
            format!("ok frames {}", msg.frames().len().min(3))
        }
        Err(why) => {
            assert!(!why.is_empty(), "a data message refused without a reason");
            label(&why)
        }
    };
    let control = match round_trip_mpi_control(data) {
        Ok(again) => {
            assert_eq!(
                again, data,
                "a control note does not re-encode to its bytes"
            );
            let op = match data.first() {
                Some(1) => "hello",
                Some(2) => "ready",
                _ => "bye",
            };
            format!("note {op}")
        }
        Err(why) => {
            assert!(!why.is_empty(), "a control note refused without a reason");
            label(&why)
        }
    };
    format!("{message} | {control}")
}

/// Data messages with 0 to 3 frames from a few socket tags, control notes of each
/// kind, and near misses.
pub(super) fn seeds() -> Vec<Vec<u8>> {
    let msg = |frames: &[&'static [u8]]| {
        frames.iter().fold(
            Msg::new(Addr::worker(1, 2), Addr::server(0, 1), Kind::Update)
                .with_target(Target::Param(7))
                .with_seq(42)
                .with_step(3),
            |msg, frame| msg.with_frame(Bytes::from_static(frame)),
        )
    };
    let mut seeds = Vec::new();
    for (tag, frames) in [
        (1, &[][..]),
        (7, &[&b"gradient"[..]][..]),
        (-1, &[&b""[..], &b"abc"[..], &[0u8; 40][..]][..]),
    ] {
        if let Ok(bytes) = encode_mpi_message(&msg(frames), tag) {
            seeds.push(bytes);
        }
    }
    let mut hello = vec![1];
    hello.extend_from_slice(&5i32.to_le_bytes());
    hello.extend_from_slice(b"0/worker(1,2)");
    seeds.push(hello);
    seeds.push([&[2u8][..], &9i32.to_le_bytes()].concat());
    seeds.push([&[3u8][..], &9i32.to_le_bytes()].concat());
    // A message whose second frame claims more bytes than follow.
    if let Some(good) = seeds.get(2) {
        let mut bad = good.clone();
        bad[12 + 8] = 0xff;
        seeds.push(bad);
    }
    seeds
}
