//! The framing on its own: round trips in any chunking, typed errors, caps.
#![allow(clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;

fn message(tag: Tag, frames: &[Bytes]) -> Vec<u8> {
    let mut bytes = encode_head(tag, frames);
    for frame in frames {
        bytes.extend_from_slice(frame);
    }
    bytes
}

fn decode_in(bytes: &[u8], chunk: usize, max: usize) -> Result<Vec<Message>, FrameError> {
    let mut decoder = Decoder::new(max);
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk.max(1)) {
        decoder.feed(piece, &mut |len| vec![0xAA; len], &mut out)?;
    }
    Ok(out)
}

#[test]
fn messages_round_trip_whatever_the_chunking() {
    let sent: Vec<Message> = vec![
        (Tag { call: 1, step: 0 }, vec![]),
        (
            Tag { call: 2, step: 7 },
            vec![Bytes::from_static(b"meta"), Bytes::new()],
        ),
        (
            Tag {
                call: u64::MAX,
                step: u32::MAX,
            },
            (0..MAX_FRAMES)
                .map(|i| Bytes::from(vec![i as u8; i * 3]))
                .collect(),
        ),
        (Tag { call: 3, step: 1 }, vec![Bytes::from(vec![5u8; 5000])]),
    ];
    let stream: Vec<u8> = sent.iter().flat_map(|(t, f)| message(*t, f)).collect();
    for chunk in [1, 2, 7, 24, 25, 4096, stream.len()] {
        assert_eq!(
            decode_in(&stream, chunk, 5000).unwrap(),
            sent,
            "chunk {chunk}"
        );
    }
}

#[test]
fn reading_into_space_tells_where_a_message_stands() {
    let bytes = message(Tag { call: 9, step: 2 }, &[Bytes::from_static(b"abc")]);
    let mut decoder = Decoder::new(16);
    assert!(decoder.between_messages());
    let mut taken = Vec::new();
    let mut at = 0;
    let mut done = None;
    while at < bytes.len() {
        let space = decoder.space();
        assert!(!space.is_empty());
        let n = space.len().min(5).min(bytes.len() - at);
        space[..n].copy_from_slice(&bytes[at..at + n]);
        at += n;
        assert!(done.is_none(), "a message before its last byte");
        done = decoder
            .filled(n, &mut |len| {
                taken.push(len);
                vec![0; len]
            })
            .unwrap();
        if at < bytes.len() {
            assert!(!decoder.between_messages());
        }
    }
    assert_eq!(taken, [3]);
    assert_eq!(
        done,
        Some((Tag { call: 9, step: 2 }, vec![Bytes::from_static(b"abc")]))
    );
    assert!(decoder.between_messages());
}

#[test]
fn bad_input_is_a_typed_error_that_sticks() {
    let mut wrong = message(Tag { call: 1, step: 1 }, &[]);
    wrong[0] = b'X';
    assert_eq!(
        decode_in(&wrong, 3, 16),
        Err(FrameError::BadMagic(*b"XYC1"))
    );

    let mut many = message(Tag { call: 1, step: 1 }, &[]);
    many[16..20].copy_from_slice(&(MAX_FRAMES as u32 + 1).to_le_bytes());
    assert_eq!(
        decode_in(&many, 100, 16),
        Err(FrameError::TooManyFrames { count: 17 })
    );
    many[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode_in(&many, 100, 16),
        Err(FrameError::TooManyFrames { count: u32::MAX })
    );

    let long = message(Tag { call: 1, step: 1 }, &[Bytes::from(vec![0u8; 17])]);
    let mut decoder = Decoder::new(16);
    let mut out = Vec::new();
    let err = decoder
        .feed(&long, &mut |len| panic!("allocated {len} bytes"), &mut out)
        .unwrap_err();
    assert_eq!(err, FrameError::FrameTooLong { len: 17, max: 16 });
    assert_eq!(err.to_string(), "a frame of 17 bytes, over the limit of 16");
    assert!(decoder.space().is_empty());
    assert_eq!(decoder.error(), Some(&err));
    let good = message(Tag { call: 2, step: 0 }, &[]);
    assert_eq!(decoder.feed(&good, &mut |_| Vec::new(), &mut out), Err(err));
    assert!(out.is_empty());
}

#[test]
fn hellos_round_trip_and_foreign_ones_are_refused() {
    assert_eq!(decode_hello(&encode_hello(2, 5), 5), Ok(2));
    assert_eq!(
        decode_hello(&encode_hello(2, 5), 4),
        Err(HelloError::WrongWorld {
            rank: 2,
            world: 5,
            size: 4
        })
    );
    assert!(decode_hello(&encode_hello(5, 5), 5).is_err());
    let mut wrong = encode_hello(0, 2);
    wrong[3] = b'0';
    assert_eq!(decode_hello(&wrong, 2), Err(HelloError::BadMagic(*b"SYH0")));
}

proptest! {
    #[test]
    fn any_messages_round_trip_in_any_chunks(
        messages in proptest::collection::vec(
            (any::<u64>(), any::<u32>(),
             proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..5)),
            0..6),
        chunk in 1usize..64,
    ) {
        let sent: Vec<Message> = messages
            .into_iter()
            .map(|(call, step, frames)| {
                (Tag { call, step }, frames.into_iter().map(Bytes::from).collect())
            })
            .collect();
        let stream: Vec<u8> = sent.iter().flat_map(|(t, f)| message(*t, f)).collect();
        prop_assert_eq!(decode_in(&stream, chunk, 40).unwrap(), sent);
    }

    #[test]
    fn any_bytes_decode_alike_in_any_chunks_and_never_allocate_over_the_cap(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
        magic in any::<bool>(),
        chunk in 1usize..50,
    ) {
        // Half the inputs get past the magic, to reach the counts and lengths.
        let mut bytes = if magic { MESSAGE_MAGIC.to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        let whole = decode_in(&bytes, bytes.len(), 64);
        prop_assert_eq!(&decode_in(&bytes, chunk, 64), &whole);
        let mut decoder = Decoder::new(64);
        let mut out = Vec::new();
        let _ = decoder.feed(&bytes, &mut |len| {
            assert!(len <= 64, "allocated {len}");
            vec![0; len]
        }, &mut out);
    }
}
