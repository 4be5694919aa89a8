//! The header decoder (`switchyard_msg::decode_header`, `msg/WIRE.md` section 4).

use super::{label, SLACK};
use crate::alloc::measure;
use bytes::Bytes;
use switchyard_msg::{Addr, DecodeError, Header, Kind, Limits, Msg, Role, Target};

/// Decodes `data` as a header frame and checks what the wire document promises: no
/// panic, a typed error with a non-empty message or a header that re-encodes to the
/// same bytes, at most `max_header_bytes` plus a small constant allocated, the same
/// answer under a header limit equal to the frame's length (the limit may only refuse
/// a frame as too large), and the same answer from `Msg::from_wire`.
pub fn decode_header(data: &[u8]) -> String {
    let limits = Limits::default();
    let (result, usage) = measure(|| switchyard_msg::decode_header(data, &limits));
    let bound = limits.max_header_bytes + SLACK;
    assert!(
        usage.total <= bound,
        "decode_header allocated {usage:?}, over {bound}"
    );
    if data.len() <= limits.max_header_bytes {
        let tight = Limits::default().with_max_header_bytes(data.len());
        let again = switchyard_msg::decode_header(data, &tight);
        assert_eq!(
            again, result,
            "a header limit of the frame's length changed the answer"
        );
    }
    let whole = Msg::from_wire(vec![Bytes::copy_from_slice(data)], &limits);
    match (&result, &whole) {
        (Ok((header, 0)), Ok(msg)) => assert_eq!(&msg.header, header),
        (
            Ok((_, declared)),
            Err(DecodeError::FrameCountMismatch {
                declared: d,
                actual: 0,
            }),
        ) => {
            assert_eq!(declared, d)
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!("decode_header said {result:?} but Msg::from_wire {whole:?}"),
    }
    match result {
        Ok((header, count)) => {
            let again = Msg::from_parts(header, vec![Bytes::new(); count]).encode_header();
            assert_eq!(
                &again[..],
                data,
                "{header:?} does not re-encode to its bytes"
            );
            label(&format!("ok {:?} {:?}", header.kind, header.target))
        }
        Err(err) => {
            assert!(!err.to_string().is_empty(), "{err:?} has no message");
            label(&format!("{err:?}"))
        }
    }
}

/// Every role, kind and target once, a few step and frame counts, and near misses:
/// a version 1 frame, a cut-short one, an unknown tag.
pub(super) fn seeds() -> Vec<Vec<u8>> {
    let kinds = [
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
        Kind::User(0x1234),
    ];
    let targets = [
        Target::None,
        Target::Param(7),
        Target::Blob { layer: 5, blob: 6 },
    ];
    let roles = [Role::Server, Role::Worker, Role::Stub];
    let mut seeds = Vec::new();
    for (i, kind) in kinds.into_iter().enumerate() {
        let src = Addr {
            group: i as u32,
            id: 3,
            role: roles[i % 3],
        };
        let header = Header {
            target: targets[i % 3],
            seq: 42 + i as u64,
            step: (i as u32) << 8,
            ..Header::new(src, Addr::server(0, 1), kind)
        };
        seeds.push(
            Msg::from_parts(header, vec![Bytes::new(); i % 3])
                .encode_header()
                .to_vec(),
        );
    }
    let good = seeds[2].clone();
    let mut v1 = good.clone();
    v1[2] = 1;
    v1.truncate(good.len() - 8);
    v1.extend_from_slice(&good[good.len() - 4..]);
    seeds.push(v1);
    seeds.push(good[..good.len() - 5].to_vec());
    let mut unknown = good;
    unknown[28] = 12;
    seeds.push(unknown);
    seeds
}
