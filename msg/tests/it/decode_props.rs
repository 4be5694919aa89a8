//! Properties of the wire decoder and the typed payload helpers: encode/decode round trips, no panic on arbitrary bytes, every
//! truncation and every reserved-field violation a typed error, one flipped byte a
//! valid header or a typed error, limits on frame counts and sizes, non-empty `Display`
//! strings that name the field, and the payload helpers' length, alignment, NaN/inf,
//! empty-frame and huge-length-prefix cases.
//!
//! Cases per property: `PROPTEST_CASES` (default 256). The RNG seed is fixed unless
//! `PROPTEST_RNG_SEED` is set, so a run is deterministic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use switchyard_msg::{
    Addr, DecodeError, Header, Kind, Limits, MAGIC, Msg, PayloadError, Role, Target,
    WIRE_PREFIX_LEN, WIRE_VERSION, decode_header, encode_header, payload,
};

/// Offsets into a header frame (prefix included), from `msg/WIRE.md`.
const SRC_ROLE: usize = 12;
const DST_ROLE: usize = 24;
const KIND_TAG: usize = 28;
/// Target tag offset when the kind is not `User`.
const TARGET_TAG: usize = 32;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut config = ProptestConfig::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x5359_0100);
    }
    config
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Server), Just(Role::Worker), Just(Role::Stub)]
}

fn addr() -> impl Strategy<Value = Addr> {
    (any::<u32>(), any::<u32>(), role()).prop_map(|(group, id, role)| Addr { group, id, role })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Get),
        Just(Kind::Put),
        Just(Kind::Update),
        Just(Kind::Sync),
        Just(Kind::FeaBlob),
        Just(Kind::GradBlob),
        Just(Kind::Hello),
        Just(Kind::Ready),
        Just(Kind::Stop),
        Just(Kind::Undeliverable),
        Just(Kind::Collective),
        any::<u16>().prop_map(Kind::User),
    ]
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        Just(Target::None),
        any::<u32>().prop_map(Target::Param),
        (any::<u32>(), any::<u32>()).prop_map(|(layer, blob)| Target::Blob { layer, blob }),
    ]
}

fn header() -> impl Strategy<Value = Header> {
    (addr(), addr(), kind(), target(), any::<u64>(), any::<u32>()).prop_map(
        |(src, dst, kind, target, seq, step)| Header {
            src,
            dst,
            kind,
            target,
            seq,
            step,
        },
    )
}

fn frames() -> impl Strategy<Value = Vec<Bytes>> {
    prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from),
        0..8,
    )
}

fn msg() -> impl Strategy<Value = Msg> {
    (header(), frames()).prop_map(|(header, frames)| Msg::from_parts(header, frames))
}

/// The header frame of `msg` as an owned, mutable byte vector.
fn header_bytes(msg: &Msg) -> Vec<u8> {
    msg.encode_header().to_vec()
}

/// `wire` with frame 0 replaced by `frame0`.
fn with_frame0(msg: &Msg, frame0: Vec<u8>) -> Vec<Bytes> {
    let mut wire = msg.to_wire();
    wire[0] = Bytes::from(frame0);
    wire
}

/// The size of a version 2 header frame for `header` (prefix included).
fn expected_len(header: &Header) -> usize {
    let kind = match header.kind {
        Kind::User(_) => 6,
        _ => 4,
    };
    let target = match header.target {
        Target::None => 4,
        Target::Param(_) => 8,
        Target::Blob { .. } => 12,
        other => panic!("the strategies make no {other:?}"),
    };
    WIRE_PREFIX_LEN + 12 + 12 + kind + target + 8 + 4 + 4
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn roundtrip(msg in msg()) {
        let wire = msg.to_wire();
        prop_assert_eq!(wire.len(), msg.frames().len() + 1);
        prop_assert_eq!(wire[0].len(), expected_len(&msg.header));
        prop_assert_eq!(&wire[0][..WIRE_PREFIX_LEN], &[b'S', b'Y', 2, 0][..]);
        let back = Msg::from_wire(wire, &Limits::default()).unwrap();
        prop_assert_eq!(&back, &msg);
        let (header, count) = decode_header(&msg.encode_header(), &Limits::default()).unwrap();
        prop_assert_eq!(header, msg.header);
        prop_assert_eq!(count, msg.frames().len());
    }

    #[test]
    fn encode_header_declares_no_frames(header in header()) {
        let frame = encode_header(&header);
        prop_assert_eq!(decode_header(&frame, &Limits::default()), Ok((header, 0)));
        prop_assert_eq!(Bytes::from(frame), Msg::from_parts(header, Vec::new()).encode_header());
    }

    #[test]
    fn arbitrary_bytes_never_panic(frame in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_header(&frame, &Limits::default());
        let _ = Msg::from_wire(vec![Bytes::from(frame)], &Limits::default());
    }

    #[test]
    fn arbitrary_frames_never_panic(
        wire in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..80), 0..6),
    ) {
        let wire: Vec<Bytes> = wire.into_iter().map(Bytes::from).collect();
        let _ = Msg::from_wire(wire, &Limits::default());
    }

    /// Random bodies behind a valid prefix reach the field decoder; whatever decodes
    /// re-encodes to the same bytes (the encoding is canonical).
    #[test]
    fn arbitrary_body_is_error_or_canonical(body in prop::collection::vec(any::<u8>(), 0..70)) {
        let mut frame = vec![b'S', b'Y', WIRE_VERSION, 0];
        frame.extend_from_slice(&body);
        if let Ok((header, count)) = decode_header(&frame, &Limits::default()) {
            let again = Msg::from_parts(header, vec![Bytes::new(); count]).encode_header();
            prop_assert_eq!(&again[..], &frame[..]);
        }
    }

    #[test]
    fn truncation_at_every_offset_is_an_error(msg in msg()) {
        let full = header_bytes(&msg);
        for cut in 0..full.len() {
            let short = &full[..cut];
            let err = decode_header(short, &Limits::default()).unwrap_err();
            if cut < WIRE_PREFIX_LEN {
                prop_assert_eq!(err, DecodeError::ShortPrefix { len: cut, prefix: WIRE_PREFIX_LEN });
            } else {
                prop_assert_eq!(err, DecodeError::Truncated { len: cut - WIRE_PREFIX_LEN });
            }
            prop_assert!(Msg::from_wire(with_frame0(&msg, short.to_vec()), &Limits::default()).is_err());
        }
    }

    /// A header limit below the header's size does not change what a cut-short frame
    /// is: `ShortPrefix` or `Truncated`, never a complaint about a size limit; only a
    /// frame over the limit is `HeaderTooLarge`.
    #[test]
    fn truncation_under_a_small_header_limit_is_truncated(msg in msg(), limit in 0usize..70) {
        let full = header_bytes(&msg);
        let limits = Limits::default().with_max_header_bytes(limit);
        for cut in 0..=full.len() {
            let got = decode_header(&full[..cut], &limits);
            if cut > limit {
                prop_assert_eq!(got, Err(DecodeError::HeaderTooLarge { len: cut, limit }));
            } else if cut < WIRE_PREFIX_LEN {
                prop_assert_eq!(got, Err(DecodeError::ShortPrefix { len: cut, prefix: WIRE_PREFIX_LEN }));
            } else if cut < full.len() {
                prop_assert_eq!(got, Err(DecodeError::Truncated { len: cut - WIRE_PREFIX_LEN }));
            } else {
                prop_assert_eq!(got, Ok((msg.header, msg.frames().len())));
            }
        }
    }

    #[test]
    fn one_flipped_byte_is_valid_or_typed_error(
        msg in msg(),
        index in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let mut frame = header_bytes(&msg);
        let at = index.index(frame.len());
        frame[at] ^= mask;
        match decode_header(&frame, &Limits::default()) {
            Ok((header, count)) => {
                // A flip past the prefix that still decodes is a different, canonical
                // header (or a different frame count).
                prop_assert!(at >= WIRE_PREFIX_LEN);
                prop_assert!(header != msg.header || count != msg.frames().len());
                let again = Msg::from_parts(header, vec![Bytes::new(); count]).encode_header();
                prop_assert_eq!(&again[..], &frame[..]);
            }
            Err(err) => {
                prop_assert!(!err.to_string().is_empty());
                match at {
                    0 | 1 => prop_assert!(matches!(err, DecodeError::BadMagic { .. }), "{err:?}"),
                    2 => prop_assert!(matches!(err, DecodeError::UnsupportedVersion { .. }), "{err:?}"),
                    3 => prop_assert!(matches!(err, DecodeError::ReservedFlags { .. }), "{err:?}"),
                    _ => {}
                }
            }
        }
        let _ = Msg::from_wire(with_frame0(&msg, frame), &Limits::default());
    }

    #[test]
    fn trailing_bytes_are_rejected(msg in msg(), extra in prop::collection::vec(any::<u8>(), 1..16)) {
        let mut frame = header_bytes(&msg);
        frame.extend_from_slice(&extra);
        prop_assert_eq!(
            decode_header(&frame, &Limits::default()),
            Err(DecodeError::TrailingBytes { extra: extra.len() })
        );
        prop_assert_eq!(
            Msg::from_wire(with_frame0(&msg, frame), &Limits::default()),
            Err(DecodeError::TrailingBytes { extra: extra.len() })
        );
    }

    #[test]
    fn wrong_magic_is_bad_magic(msg in msg(), magic in any::<[u8; 2]>()) {
        prop_assume!(magic != MAGIC);
        let mut frame = header_bytes(&msg);
        frame[..2].copy_from_slice(&magic);
        prop_assert_eq!(
            Msg::from_wire(with_frame0(&msg, frame), &Limits::default()),
            Err(DecodeError::BadMagic { found: magic, expected: MAGIC })
        );
    }

    #[test]
    fn other_versions_are_unsupported(msg in msg(), version in any::<u8>()) {
        prop_assume!(version != WIRE_VERSION);
        let mut frame = header_bytes(&msg);
        frame[2] = version;
        prop_assert_eq!(
            Msg::from_wire(with_frame0(&msg, frame), &Limits::default()),
            Err(DecodeError::UnsupportedVersion { found: version, supported: WIRE_VERSION })
        );
    }

    #[test]
    fn nonzero_flags_are_rejected(msg in msg(), flags in 1u8..=255) {
        let mut frame = header_bytes(&msg);
        frame[3] = flags;
        prop_assert_eq!(
            Msg::from_wire(with_frame0(&msg, frame), &Limits::default()),
            Err(DecodeError::ReservedFlags { found: flags })
        );
    }

    #[test]
    fn frame_count_must_match(msg in msg(), actual in 0usize..12) {
        let declared = msg.frames().len();
        prop_assume!(actual != declared);
        let mut wire = msg.to_wire();
        wire.resize(actual + 1, Bytes::from_static(b"x"));
        prop_assert_eq!(
            Msg::from_wire(wire, &Limits::default()),
            Err(DecodeError::FrameCountMismatch { declared, actual })
        );
    }

    #[test]
    fn too_many_frames(header in header(), count in 5usize..40) {
        let limits = Limits::default().with_max_frames(4);
        let msg = Msg::from_parts(header, vec![Bytes::new(); count]);
        // More frames arrived than allowed ...
        prop_assert_eq!(
            Msg::from_wire(msg.to_wire(), &limits),
            Err(DecodeError::TooManyFrames { count, limit: 4 })
        );
        // ... or the header declares more than allowed, whatever arrived.
        let mut wire = msg.to_wire();
        wire.truncate(3);
        prop_assert_eq!(
            Msg::from_wire(wire, &limits),
            Err(DecodeError::TooManyFrames { count, limit: 4 })
        );
        prop_assert_eq!(
            decode_header(&msg.encode_header(), &limits),
            Err(DecodeError::TooManyFrames { count, limit: 4 })
        );
    }

    #[test]
    fn float_bits_roundtrip(bits32 in prop::collection::vec(any::<u32>(), 0..32),
                            bits64 in prop::collection::vec(any::<u64>(), 0..32)) {
        let f32s: Vec<f32> = bits32.iter().copied().map(f32::from_bits).collect();
        let f64s: Vec<f64> = bits64.iter().copied().map(f64::from_bits).collect();
        let back32 = payload::frame_to_vec::<f32>(&payload::frame_from_vec(f32s.clone())).unwrap();
        let back64 = payload::frame_to_vec::<f64>(&payload::frame_from_slice(&f64s)).unwrap();
        prop_assert_eq!(back32.iter().map(|f| f.to_bits()).collect::<Vec<_>>(), bits32);
        prop_assert_eq!(back64.iter().map(|f| f.to_bits()).collect::<Vec<_>>(), bits64);
    }
}

fn sample() -> Msg {
    Msg::new(Addr::worker(0, 3), Addr::server(0, 1), Kind::Update)
        .with_target(Target::Param(7))
        .with_seq(42)
        .with_frame(payload::frame_from_vec(vec![0.5f32, -1.0, 2.0]))
}

/// The update example in `msg/WIRE.md`, byte for byte.
#[test]
fn wire_md_example_bytes() {
    let expected: [u8; 56] = [
        0x53, 0x59, 0x02, 0x00, // "SY", version 2, flags 0
        0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
        0x00, // src worker(0,3)
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, // dst server(0,1)
        0x02, 0x00, 0x00, 0x00, // kind Update
        0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, // target Param(7)
        0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // seq 42
        0x00, 0x00, 0x00, 0x00, // step 0
        0x01, 0x00, 0x00, 0x00, // one payload frame
    ];
    let wire = sample().to_wire();
    assert_eq!(&wire[0][..], &expected[..]);
    assert_eq!(
        &wire[1][..],
        &[
            0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0xbf, 0x00, 0x00, 0x00, 0x40
        ][..]
    );
}

/// The HELLO and user-kind examples in `msg/WIRE.md`, byte for byte.
#[test]
fn wire_md_hello_and_user_examples() {
    let hello = Msg::new(Addr::stub(0), Addr::stub(0), Kind::Hello);
    let mut expected = vec![0x53, 0x59, 0x02, 0x00];
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
    expected.extend_from_slice(&[6, 0, 0, 0]);
    expected.extend_from_slice(&[0, 0, 0, 0]);
    expected.extend_from_slice(&[0; 8]);
    expected.extend_from_slice(&[0; 4]); // step
    expected.extend_from_slice(&[0; 4]);
    assert_eq!(&hello.encode_header()[..], &expected[..]);
    assert_eq!(expected.len(), 52);
    let ready = hello.reply(Kind::Ready);
    expected[KIND_TAG] = 7;
    assert_eq!(&ready.encode_header()[..], &expected[..]);

    let user = Msg::new(Addr::worker(1, 2), Addr::server(3, 4), Kind::User(0x1234))
        .with_target(Target::Blob { layer: 5, blob: 6 })
        .with_seq(u64::MAX)
        .with_step(0x0102_0304)
        .with_frame(Bytes::new())
        .with_frame(Bytes::new());
    let mut expected = vec![0x53, 0x59, 0x02, 0x00];
    expected.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0]);
    expected.extend_from_slice(&[3, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
    expected.extend_from_slice(&[0x0b, 0, 0, 0, 0x34, 0x12]);
    expected.extend_from_slice(&[2, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0]);
    expected.extend_from_slice(&[0xff; 8]);
    expected.extend_from_slice(&[4, 3, 2, 1]);
    expected.extend_from_slice(&[2, 0, 0, 0]);
    let wire = user.to_wire();
    assert_eq!(wire.len(), 3);
    assert_eq!(&wire[0][..], &expected[..]);
    assert_eq!(expected.len(), 62);
    assert!(wire[1].is_empty() && wire[2].is_empty());
}

/// A tag past the tables (a variant a newer peer added) is a typed error naming the
/// field and the tag.
#[test]
fn bad_enum_tags_are_malformed() {
    let frame = header_bytes(&sample());
    for (offset, value, field) in [
        (SRC_ROLE, 3u8, "src.role"),
        (DST_ROLE, 3, "dst.role"),
        (KIND_TAG, 12, "kind"),
        (TARGET_TAG, 3, "target"),
    ] {
        let mut bad = frame.clone();
        bad[offset] = value;
        let err = decode_header(&bad, &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            DecodeError::UnknownTag {
                field,
                tag: u32::from(value)
            },
            "offset {offset}"
        );
        let text = err.to_string();
        assert!(text.contains("variant") && text.contains(field), "{text}");
    }
    // A high byte of a tag set makes the tag huge, not a small known one.
    let mut bad = frame.clone();
    bad[KIND_TAG + 3] = 0x80;
    assert_eq!(
        decode_header(&bad, &Limits::default()),
        Err(DecodeError::UnknownTag {
            field: "kind",
            tag: 0x8000_0002
        })
    );
}

/// Under a limit of 40 to 43 bytes, a header cut inside `seq` (offsets 40..48) is
/// `Truncated` (the input ran out), not `Malformed("the size limit has been reached")`.
#[test]
fn truncated_header_under_a_small_limit() {
    let frame = header_bytes(&sample());
    for limit in 40..44 {
        let limits = Limits::default().with_max_header_bytes(limit);
        for cut in 40..=limit {
            let err = decode_header(&frame[..cut], &limits).unwrap_err();
            assert_eq!(
                err,
                DecodeError::Truncated { len: cut - 4 },
                "limit {limit}"
            );
            assert!(err.to_string().contains("truncated"), "{err}");
            assert_eq!(
                Msg::from_wire(with_frame0(&sample(), frame[..cut].to_vec()), &limits),
                Err(DecodeError::Truncated { len: cut - 4 })
            );
        }
    }
}

/// A peer still on wire version 1 (no `step` field): the update example of the old
/// WIRE.md, byte for byte, is refused as an unsupported version, not misread.
#[test]
fn version_1_peer_is_unsupported_version() {
    let v1: [u8; 52] = [
        0x53, 0x59, 0x01, 0x00, // "SY", version 1, flags 0
        0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // src
        0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // dst
        0x02, 0x00, 0x00, 0x00, // kind Update
        0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, // target Param(7)
        0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // seq 42
        0x01, 0x00, 0x00, 0x00, // one payload frame
    ];
    let old = DecodeError::UnsupportedVersion {
        found: 1,
        supported: 2,
    };
    assert_eq!(WIRE_VERSION, 2);
    assert_eq!(decode_header(&v1, &Limits::default()), Err(old.clone()));
    let wire = vec![Bytes::copy_from_slice(&v1), Bytes::from_static(b"x")];
    assert_eq!(Msg::from_wire(wire, &Limits::default()), Err(old.clone()));
    let text = old.to_string();
    assert!(
        text.contains("version 1") && text.contains("version 2"),
        "{text}"
    );
}

/// The step travels in its own field (offset 48 when the target is `Param`), leaves
/// the target alone, and a reply keeps it.
#[test]
fn step_has_its_own_field() {
    let msg = sample().with_step(0xdead_beef);
    assert_eq!(msg.header.target, Target::Param(7));
    let frame = header_bytes(&msg);
    assert_eq!(&frame[48..52], &0xdead_beefu32.to_le_bytes());
    assert_eq!(&header_bytes(&sample())[48..52], &[0; 4]);
    let back = Msg::from_wire(msg.to_wire(), &Limits::default()).unwrap();
    assert_eq!(back.header.step, 0xdead_beef);
    assert_eq!(back.reply(Kind::Put).header.step, 0xdead_beef);
    assert_eq!(Header::new(Addr::stub(0), Addr::stub(1), Kind::Get).step, 0);
}

#[test]
fn limits_on_sizes() {
    assert_eq!(
        Msg::from_wire(Vec::new(), &Limits::default()),
        Err(DecodeError::NoFrames)
    );
    let big = Bytes::from(vec![0u8; 257]);
    assert_eq!(
        Msg::from_wire(vec![big], &Limits::default()),
        Err(DecodeError::HeaderTooLarge {
            len: 257,
            limit: 256
        })
    );
    let limits = Limits::default().with_max_frame_bytes(16);
    let msg = sample().with_frame(vec![0u8; 16]).with_frame(vec![0u8; 17]);
    assert_eq!(
        Msg::from_wire(msg.to_wire(), &limits),
        Err(DecodeError::FrameTooLarge {
            index: 3,
            len: 17,
            limit: 16
        })
    );
    let many = Msg::from_parts(sample().header, vec![Bytes::new(); 2000]);
    assert_eq!(
        Msg::from_wire(many.to_wire(), &Limits::default()),
        Err(DecodeError::TooManyFrames {
            count: 2000,
            limit: 1024
        })
    );
    let ok = Msg::from_parts(sample().header, vec![Bytes::new(); 1024]);
    assert_eq!(
        Msg::from_wire(ok.to_wire(), &Limits::default()).as_ref(),
        Ok(&ok)
    );
}

#[test]
fn decode_error_display_names_the_thing() {
    let msg = sample();
    let frame = header_bytes(&msg);
    let mut cases: Vec<(DecodeError, &str)> = Vec::new();
    let mut run = |wire: Vec<Bytes>, limits: Limits, word: &'static str| {
        cases.push((Msg::from_wire(wire, &limits).unwrap_err(), word));
    };
    let d = Limits::default();
    run(Vec::new(), d, "no frames");
    run(vec![Bytes::from_static(b"SY")], d, "prefix");
    run(with_frame0(&msg, b"XY\x01\x00".to_vec()), d, "magic");
    run(with_frame0(&msg, b"SY\x01\x00".to_vec()), d, "version");
    run(with_frame0(&msg, b"SY\x02\x01".to_vec()), d, "flags");
    run(vec![Bytes::from(vec![0u8; 300])], d, "max_header_bytes");
    run(with_frame0(&msg, frame[..20].to_vec()), d, "truncated");
    let mut long = frame.clone();
    long.push(0);
    run(with_frame0(&msg, long), d, "trailing");
    let mut tag = frame.clone();
    tag[KIND_TAG] = 200;
    run(with_frame0(&msg, tag), d, "malformed");
    let mut wire = msg.to_wire();
    wire.push(Bytes::new());
    run(wire, d, "declares 1 payload frames but 2 arrived");
    run(
        Msg::from_parts(msg.header, vec![Bytes::new(); 3]).to_wire(),
        d.with_max_frames(2),
        "max_frames",
    );
    run(msg.to_wire(), d.with_max_frame_bytes(4), "max_frame_bytes");
    assert_eq!(cases.len(), 12);
    for (err, word) in cases {
        let text = err.to_string();
        assert!(!text.is_empty());
        assert!(text.contains(word), "{text:?} should name {word:?}");
    }
}

#[test]
fn payload_error_display_names_the_thing() {
    let aligned = payload::frame_from_vec(vec![0u64; 3]);
    let cases = [
        (
            payload::frame_to_vec::<f32>(&[0u8; 7]).unwrap_err(),
            "4-byte",
        ),
        (
            payload::frame_as_slice::<f64>(&aligned.slice(1..17)).unwrap_err(),
            "aligned",
        ),
        (
            payload::frame_copy_into::<u64>(&aligned, &mut [0u64; 2]).unwrap_err(),
            "destination",
        ),
        (
            payload::frame_to_value::<u64>(&[1, 2], 64).unwrap_err(),
            "serde",
        ),
    ];
    for (err, word) in cases {
        let text = err.to_string();
        assert!(text.contains(word), "{text:?} should name {word:?}");
    }
}

#[test]
fn seven_bytes_are_not_f32s() {
    let frame = [0u8; 7];
    let length = PayloadError::Length {
        len: 7,
        elem_size: 4,
    };
    assert_eq!(payload::frame_to_vec::<f32>(&frame), Err(length.clone()));
    assert_eq!(payload::frame_as_slice::<f32>(&frame), Err(length.clone()));
    assert_eq!(
        payload::frame_copy_into::<f32>(&frame, &mut [0.0; 2]),
        Err(length)
    );
    assert!(matches!(
        payload::frame_to_vec::<f64>(&frame),
        Err(PayloadError::Length {
            len: 7,
            elem_size: 8
        })
    ));
    assert_eq!(payload::frame_to_vec::<u8>(&frame), Ok(vec![0; 7]));
}

/// A buffer whose start is 8-byte aligned, so that offset 1 is certainly not.
#[repr(C, align(8))]
struct Aligned([u8; 41]);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[test]
fn misaligned_slice_is_an_error_in_place_but_copies() {
    let values = [1.5f64, -2.25, f64::INFINITY, 1e-310];
    let mut raw = [0u8; 41];
    for (i, v) in values.iter().enumerate() {
        raw[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let buffer = Bytes::from_owner(Aligned(raw));
    assert_eq!(buffer.as_ptr() as usize % 8, 0);
    let frame = buffer.slice(1..33);
    assert_eq!(frame.as_ptr() as usize % 8, 1);
    assert_eq!(
        payload::frame_as_slice::<f64>(&frame),
        Err(PayloadError::Misaligned { align: 8 })
    );
    assert_eq!(
        payload::frame_as_slice::<u32>(&frame),
        Err(PayloadError::Misaligned { align: 4 })
    );
    assert_eq!(payload::frame_to_vec::<f64>(&frame), Ok(values.to_vec()));
    let mut dst = [0.0f64; 4];
    payload::frame_copy_into(&frame, &mut dst).unwrap();
    assert_eq!(dst, values);
    // Bytes need no alignment.
    assert_eq!(payload::frame_as_slice::<u8>(&frame).unwrap().len(), 32);
    // The aligned part of the same buffer is viewed in place.
    let aligned = buffer.slice(8..40);
    assert_eq!(payload::frame_as_slice::<f64>(&aligned).unwrap().len(), 4);
}

#[test]
fn nan_and_infinities_roundtrip_bit_exactly() {
    let f32s = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001), // signalling NaN
        f32::from_bits(0xffc1_2345), // negative NaN with a payload
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::from_bits(1), // smallest subnormal
    ];
    let f64s = [
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::from_bits(0xfff8_dead_beef_0001),
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        f64::from_bits(1),
    ];
    let msg = sample()
        .with_frame(payload::frame_from_slice(&f32s))
        .with_frame(payload::frame_from_vec(f64s.to_vec()));
    let back = Msg::from_wire(msg.to_wire(), &Limits::default()).unwrap();
    let got32 = payload::frame_to_vec::<f32>(&back.frames()[1]).unwrap();
    let got64 = payload::frame_to_vec::<f64>(&back.frames()[2]).unwrap();
    let view32 = payload::frame_as_slice::<f32>(&back.frames()[1]).unwrap();
    let bits32 = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let bits64 = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits32(&got32), bits32(&f32s));
    assert_eq!(bits32(view32), bits32(&f32s));
    assert_eq!(bits64(&got64), bits64(&f64s));
    let value: Vec<f64> =
        payload::frame_to_value(&payload::frame_from_value(&f64s.to_vec()).unwrap(), 4096).unwrap();
    assert_eq!(bits64(&value), bits64(&f64s));
}

#[test]
fn empty_frames() {
    let empty = payload::frame_from_vec(Vec::<f32>::new());
    assert!(empty.is_empty());
    assert!(payload::frame_from_slice::<f64>(&[]).is_empty());
    assert_eq!(payload::frame_to_vec::<f32>(&empty), Ok(Vec::new()));
    assert_eq!(payload::frame_to_vec::<u64>(&empty), Ok(Vec::new()));
    assert_eq!(payload::frame_copy_into::<f64>(&empty, &mut []), Ok(()));
    assert_eq!(
        payload::frame_copy_into::<f64>(&empty, &mut [0.0]),
        Err(PayloadError::CountMismatch {
            expected: 1,
            actual: 0
        })
    );
    assert_eq!(payload::frame_as_slice::<u8>(&empty), Ok(&[][..]));
    // A serde value needs at least its own bytes.
    assert!(matches!(
        payload::frame_to_value::<u32>(&empty, 64),
        Err(PayloadError::Serde { .. })
    ));
    let msg = sample().with_frame(Bytes::new()).with_frame(empty);
    let back = Msg::from_wire(msg.to_wire(), &Limits::default()).unwrap();
    assert_eq!(back, msg);
    assert!(back.frames()[1].is_empty() && back.frames()[2].is_empty());
}

/// An empty frame is a whole number of elements of any type, so viewing it in place
/// should give an empty slice. It does not: `Bytes::new()` (what
/// `payload::frame_from_vec` returns for an empty `Vec`, and what an empty received
/// frame becomes) points at address 1, and `bytemuck::try_cast_slice` checks the
/// pointer's alignment before the length, so `frame_as_slice` reports `Misaligned`.
#[test]
fn empty_frame_views_as_empty_slice() {
    let empty = payload::frame_from_vec(Vec::<f64>::new());
    assert_eq!(payload::frame_as_slice::<f64>(&empty), Ok(&[][..]));
    assert_eq!(payload::frame_as_slice::<f32>(&Bytes::new()), Ok(&[][..]));
}

#[test]
fn huge_length_prefix_fails_without_allocating_it() {
    let claim = (1u64 << 62).to_le_bytes();
    assert!(matches!(
        payload::frame_to_value::<Vec<u64>>(&claim, 4096),
        Err(PayloadError::Serde { .. })
    ));
    assert!(matches!(
        payload::frame_to_value::<Vec<u8>>(&claim, 4096),
        Err(PayloadError::Serde { .. })
    ));
    assert!(matches!(
        payload::frame_to_value::<String>(&claim, 4096),
        Err(PayloadError::Serde { .. })
    ));
    // The claim followed by some real elements still fails at the limit or the end.
    let mut more = claim.to_vec();
    more.extend_from_slice(&[7u8; 8 * 600]);
    assert!(matches!(
        payload::frame_to_value::<Vec<u64>>(&more, 4096),
        Err(PayloadError::Serde { .. })
    ));
    // An honest value within the limit decodes.
    let value: Vec<u32> = (0..100).collect();
    let frame = payload::frame_from_value(&value).unwrap();
    assert_eq!(payload::frame_to_value::<Vec<u32>>(&frame, 4096), Ok(value));
    // Trailing bytes after a serde value are rejected too.
    let mut trailing = frame.to_vec();
    trailing.push(0);
    assert!(payload::frame_to_value::<Vec<u32>>(&trailing, 4096).is_err());
}

/// `frame_to_value`'s `limit` refuses a value whose encoding is over it. (bincode 1.3
/// drops its own size limit when decoding from a slice, so the length is checked
/// before decoding.)
#[test]
fn frame_to_value_enforces_limit() {
    let value: Vec<u32> = (0..100).collect();
    let frame = payload::frame_from_value(&value).unwrap();
    assert_eq!(frame.len(), 408);
    assert!(payload::frame_to_value::<Vec<u32>>(&frame, 100).is_err());
}
