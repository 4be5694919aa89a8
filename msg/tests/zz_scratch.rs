//! scratch
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
use switchyard_msg::*;
fn hex(b: &[u8]) -> String { b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ") }
#[test]
fn scratch() {
    let m = Msg::new(Addr::worker(0, 3), Addr::server(0, 1), Kind::Update)
        .with_target(Target::Param(7)).with_seq(42)
        .with_frame(payload::frame_from_vec(vec![0.5f32, -1.0, 2.0]));
    let w = m.to_wire();
    println!("EX1 len {} : {}", w[0].len(), hex(&w[0]));
    println!("EX1 frame1 : {}", hex(&w[1]));
    let m2 = Msg::new(Addr::stub(0), Addr::stub(0), Kind::Hello);
    let w = m2.to_wire();
    println!("HELLO len {} : {}", w[0].len(), hex(&w[0]));
    let m3 = Msg::new(Addr::worker(1, 2), Addr::server(3, 4), Kind::User(0x1234))
        .with_target(Target::Blob { layer: 5, blob: 6 }).with_seq(u64::MAX)
        .with_frame(bytes::Bytes::new()).with_frame(bytes::Bytes::new());
    let w = m3.to_wire();
    println!("USER len {} : {}", w[0].len(), hex(&w[0]));
    let e = payload::frame_from_vec(Vec::<f64>::new());
    println!("empty ptr {:p} as_slice f64 {:?} f32 {:?} u8 {:?}", e.as_ptr(), payload::frame_as_slice::<f64>(&e), payload::frame_as_slice::<f32>(&e), payload::frame_as_slice::<u8>(&e));
    let e2 = bytes::Bytes::copy_from_slice(&[]);
    println!("empty2 ptr {:p} {:?}", e2.as_ptr(), payload::frame_as_slice::<f64>(&e2));
    let big = (1u64 << 62).to_le_bytes();
    println!("{:?}", payload::frame_to_value::<Vec<u64>>(&big, 4096));
    println!("{:?}", payload::frame_to_value::<String>(&big, 4096));
    let mut bad = encode_header(&m2.header); bad[4+8] = 3;
    println!("{:?}", decode_header(&bad, &Limits::default()));
    for e in [DecodeError::NoFrames] { println!("{e}"); }
}
