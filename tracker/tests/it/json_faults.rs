//! The weaknesses of XGBoost 3.x's tracker that a tracker can fix: the bad client is dropped with a reason and a good job is still
//! served (or, for `error`, the job fails as it should and the tracker still answers).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;
use support::*;
use switchyard_tracker::{Event, Tracker, TrackerConfig, TrackerError};

fn quick(n: u32) -> Tracker {
    let mut config = TrackerConfig::new(n);
    // Short enough for the stalled-client tests, long enough for a loaded CI machine.
    config.read_timeout = Duration::from_secs(2);
    Tracker::start(config).unwrap()
}

fn good_job(t: &Tracker, n: u32) {
    run_json_job(t.addr(), n, |i| format!("good-{i}"));
    assert_eq!(
        t.wait(Some(WAIT)).unwrap().shut_down,
        (0..n).collect::<Vec<_>>()
    );
}

fn dropped(events: &crossbeam_channel::Receiver<Event>, needle: &str) -> String {
    match expect_event(
        events,
        |e| matches!(e, Event::Dropped { reason, .. } if reason.contains(needle)),
    ) {
        Event::Dropped { reason, .. } => reason,
        _ => unreachable!(),
    }
}

fn closed(st: &mut std::net::TcpStream) {
    let mut b = [0u8; 1];
    assert_eq!(st.read(&mut b).unwrap_or(0), 0, "expected a close");
}

const HELLO: &str = r#"{"rank":0,"task_id":"x","world_size":-1}"#;

/// docs/xgboost-protocol.md, *Silent clients*: a silent client does not hold the
/// tracker.
#[test]
fn item_1_a_silent_client_blocks_nobody() {
    let t = quick(2);
    let events = t.events();
    let _silent = connect(t.addr());
    let mut half = magic(t.addr());
    half.write_all(&frame(HELLO)).unwrap();
    good_job(&t, 2);
    dropped(&events, "within");
}

/// docs/xgboost-protocol.md, *Malformed JSON*: bad JSON and wrong JSON types drop only
/// the connection.
#[test]
fn item_2_bad_json_and_wrong_types_are_dropped() {
    let t = quick(2);
    let events = t.events();
    let addr = t.addr();
    let mut st = magic(addr);
    st.write_all(&frame("{\"this is not json")).unwrap();
    dropped(&events, "bad JSON in hello frame");
    let _a = json_cmd(
        addr,
        r#"{"rank":"0","task_id":"x","world_size":-1}"#,
        r#"{"cmd":4,"msg":"m"}"#,
    );
    dropped(&events, "bad JSON in hello frame");
    let _b = json_cmd(
        addr,
        r#"{"rank":0,"task_id":"x","world_size":-1}"#,
        r#"{"cmd":1.0}"#,
    );
    dropped(&events, "integer \"cmd\"");
    let _c = json_cmd(addr, HELLO, r#"{"cmd":1,"port":"7000","error_port":0}"#);
    dropped(&events, "integer \"port\"");
    let _d = json_cmd(addr, HELLO, r#"{"cmd":4,"msg":5}"#);
    dropped(&events, "string \"msg\"");
    let _e = json_cmd(addr, HELLO, "[]");
    dropped(&events, "integer \"cmd\"");
    good_job(&t, 2);
}

/// docs/xgboost-protocol.md, *Unknown commands*: an unknown command drops the
/// connection.
#[test]
fn item_3_unknown_commands_are_dropped() {
    let t = quick(1);
    let events = t.events();
    let _a = json_cmd(t.addr(), HELLO, r#"{"cmd":7}"#);
    dropped(&events, "unknown command 7");
    let _b = json_cmd(t.addr(), HELLO, r#"{"cmd":0}"#);
    dropped(&events, "unknown command 0");
    good_job(&t, 1);
}

/// docs/xgboost-protocol.md, *Negative lengths* and *Unbounded frames*: negative and
/// huge lengths are refused before anything is read.
#[test]
fn items_4_and_5_negative_and_huge_lengths_are_refused() {
    let t = quick(1);
    let events = t.events();
    let addr = t.addr();
    let mut a = magic(addr);
    a.write_all(&[&le(-5)[..], b"{\"ra"].concat()).unwrap();
    dropped(&events, "hello frame length -5");
    let mut b = magic(addr);
    b.write_all(&[&le(i32::MAX)[..], b"{\"ra"].concat())
        .unwrap();
    dropped(&events, "over the cap");
    let mut c = magic(addr);
    c.write_all(&[&frame(HELLO)[..], &le(-5)].concat()).unwrap();
    dropped(&events, "negative length -5 for command frame");
    let mut d = magic(addr);
    d.write_all(&[&frame(HELLO)[..], &le(i32::MAX)].concat())
        .unwrap();
    dropped(&events, "over the cap");
    for st in [&mut a, &mut b, &mut c, &mut d] {
        closed(st);
    }
    good_job(&t, 1);
}

/// docs/xgboost-protocol.md, *Workers that vanish while pending*: a pending `start`
/// that vanishes leaves the batch; no crash, a replacement completes it.
#[test]
fn item_6_a_vanished_pending_start_is_replaced() {
    let t = quick(2);
    let events = t.events();
    drop(json_start(t.addr(), "gone", 7000, 0));
    dropped(&events, "closed while waiting for its batch");
    good_job(&t, 2);
}

/// docs/xgboost-protocol.md, *Unchecked shutdowns*: shutdowns before any `start`, or
/// from ranks outside the world, do not count.
#[test]
fn item_7_stray_shutdowns_do_not_end_the_job() {
    let t = quick(2);
    let events = t.events();
    let _a = json_cmd(
        t.addr(),
        r#"{"rank":7,"task_id":"nobody","world_size":99}"#,
        r#"{"cmd":2}"#,
    );
    dropped(&events, "before the batch");
    let _b = json_cmd(
        t.addr(),
        r#"{"rank":0,"task_id":"nobody","world_size":2}"#,
        r#"{"cmd":2}"#,
    );
    dropped(&events, "before the batch");
    assert!(t.wait(Some(Duration::from_millis(200))).is_err());
    good_job(&t, 2);
}

/// docs/xgboost-protocol.md, *A start after bootstrap*: a `start` after bootstrap is
/// refused; the job goes on and ends normally.
#[test]
fn item_8_a_start_after_bootstrap_is_refused() {
    let t = quick(2);
    let events = t.events();
    let addr = t.addr();
    let h: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                read_frame(&mut json_start(addr, &format!("w{i}"), 7000 + i, 0))
            })
        })
        .collect();
    for h in h {
        h.join().unwrap();
    }
    let mut late = json_cmd(addr, HELLO, r#"{"cmd":1,"error_port":0,"port":7009}"#);
    dropped(&events, "after the job's batch");
    closed(&mut late);
    json_shutdown(addr, 0, 2);
    json_shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

/// docs/xgboost-protocol.md, *An error path that stops nobody*: `error` sends i32 1 to
/// every worker's error port, the reporter's host included, and the job fails; the
/// tracker still answers afterwards.
#[test]
fn item_9_an_error_stops_every_worker_and_fails_the_job() {
    let t = quick(2);
    let events = t.events();
    let addr = t.addr();
    let listeners: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let h: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            std::thread::spawn(move || {
                read_frame(&mut json_start(addr, &format!("w{i}"), 7000 + i as u16, p))
            })
        })
        .collect();
    for h in h {
        h.join().unwrap();
    }
    let _err = json_cmd(
        addr,
        r#"{"rank":1,"task_id":"w1","world_size":2}"#,
        r#"{"cmd":3,"code":5,"msg":"out of memory"}"#,
    );
    for l in &listeners {
        let mut s = accept_within(l);
        s.set_read_timeout(Some(WAIT)).unwrap();
        assert_eq!(read_i32(&mut s), 1);
    }
    match t.wait(Some(WAIT)) {
        Err(TrackerError::JobFailed { reason }) => {
            assert!(reason.contains("out of memory"), "{reason}")
        }
        other => panic!("expected a failed job, got {other:?}"),
    }
    // Still serving: a print is heard.
    let _p = json_cmd(
        addr,
        r#"{"rank":0,"task_id":"w0","world_size":2}"#,
        r#"{"cmd":4,"msg":"after"}"#,
    );
    expect_event(
        &events,
        |e| matches!(e, Event::Print { text, .. } if text == "after"),
    );
}

/// Bad `start` fields: another world size, port 0.
#[test]
fn bad_start_fields_are_refused() {
    let t = quick(1);
    let events = t.events();
    let mut a = json_cmd(
        t.addr(),
        r#"{"rank":0,"task_id":"x","world_size":5}"#,
        r#"{"cmd":1,"error_port":0,"port":7000}"#,
    );
    dropped(&events, "world_size 5");
    closed(&mut a);
    let mut b = json_cmd(t.addr(), HELLO, r#"{"cmd":1,"error_port":0,"port":0}"#);
    dropped(&events, "port 0");
    closed(&mut b);
    good_job(&t, 1);
}
