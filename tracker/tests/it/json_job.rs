//! JSON-protocol jobs (XGBoost 2.1+) end to end, with hand-written byte clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use support::*;
use switchyard_tracker::{Event, SortBy, Tracker, TrackerConfig};

/// docs/xgboost-protocol.md, *Bytes of a start*: the bytes of `w1`'s and `w0`'s
/// `start`, and the tracker's answers.
#[test]
fn appendix_a_start_bytes() {
    let t = tracker(2);
    let addr = t.addr();
    let w1 = [
        "99 ff 00 00 29 00 00 00 7b 22 72 61 6e 6b 22 3a",
        "30 2c 22 74 61 73 6b 5f 69 64 22 3a 22 77 31 22",
        "2c 22 77 6f 72 6c 64 5f 73 69 7a 65 22 3a 2d 31",
        "7d 29 00 00 00 7b 22 63 6d 64 22 3a 31 2c 22 65",
        "72 72 6f 72 5f 70 6f 72 74 22 3a 34 34 38 30 37",
        "2c 22 70 6f 72 74 22 3a 33 36 32 37 37 7d",
    ];
    let bytes: Vec<u8> = w1
        .join(" ")
        .split(' ')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    assert_eq!(bytes.len(), 94);
    let mut a = connect(addr);
    a.write_all(&bytes).unwrap();
    let mut reply = [0u8; 24];
    a.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[..4], [0x99, 0xff, 0, 0]);
    assert_eq!(&reply[4..8], [0x10, 0, 0, 0]);
    assert_eq!(&reply[8..], b"{\"world_size\":2}");
    let mut b = json_start(addr, "w0", 60277, 42511);
    // w0 sorts first: rank 0; its successor is w1 (rank 1, port 36277).
    let mut peer = [0u8; 4 + 42];
    a.read_exact(&mut peer).unwrap();
    assert_eq!(&peer[..4], [0x2a, 0, 0, 0]);
    assert_eq!(
        &peer[4..],
        b"{\"host\":\"127.0.0.1\",\"port\":60277,\"rank\":0}"
    );
    assert_eq!(
        a.read(&mut [0u8; 1]).unwrap(),
        0,
        "closed after the peer frame"
    );
    assert_eq!(
        read_frame(&mut b),
        serde_json::json!({"host": "127.0.0.1", "port": 36277, "rank": 1})
    );
}

/// docs/xgboost-protocol.md, *Bytes of a print and a shutdown*: `print` and `shutdown`
/// get only the magic, then a close.
#[test]
fn appendix_a_print_and_shutdown() {
    let t = tracker(1);
    let events = t.events();
    let addr = t.addr();
    let mut s0 = json_start(addr, "w0", 5000, 0);
    assert_eq!(read_frame(&mut s0)["rank"], 0);
    let mut p = json_cmd(
        addr,
        r#"{"rank":0,"task_id":"w0","world_size":1}"#,
        r#"{"cmd":4,"msg":"rank 0/2 task w0 done"}"#,
    );
    assert_eq!(p.read(&mut [0u8; 1]).unwrap(), 0);
    assert_eq!(
        expect_event(&events, |e| matches!(e, Event::Print { .. })),
        Event::Print {
            rank: 0,
            text: "rank 0/2 task w0 done".into()
        }
    );
    json_shutdown(addr, 0, 1);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0]);
}

#[test]
fn jobs_of_one_to_five_get_ranks_in_task_order() {
    for n in 1..=5 {
        let t = tracker(n);
        let ranks = run_json_job(t.addr(), n, |i| format!("w{i}"));
        for (i, (task, rank)) in ranks.iter().enumerate() {
            assert_eq!((task.clone(), *rank), (format!("w{i}"), i as u32));
        }
        assert_eq!(
            t.wait(Some(WAIT)).unwrap().shut_down,
            (0..n).collect::<Vec<_>>()
        );
    }
}

#[test]
fn numeric_task_ids_sort_by_value() {
    let mut config = TrackerConfig::new(3);
    config.sort_by = SortBy::Task;
    let t = Tracker::start(config).unwrap();
    let ranks = run_json_job(t.addr(), 3, |i| ["1", "10", "2"][i as usize].to_string());
    let tasks: Vec<&str> = ranks.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(tasks, ["1", "2", "10"]);
    t.wait(Some(WAIT)).unwrap();
}
