//! One port, both protocols: after the magic the tracker tells a classic hello from a
//! JSON one (docs/xgboost-protocol.md, *Telling the protocols apart*).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use support::*;
use switchyard_tracker::Event;

/// Waits for prints of every text in `want`, in any order (each connection is served
/// on its own thread).
fn prints(events: &crossbeam_channel::Receiver<Event>, want: &[&str]) {
    let mut seen: Vec<String> = Vec::new();
    while !want.iter().all(|w| seen.iter().any(|s| s == w)) {
        if let Event::Print { text, .. } =
            expect_event(events, |e| matches!(e, Event::Print { .. }))
        {
            seen.push(text);
        }
    }
}

#[test]
fn classic_and_json_clients_share_a_port_and_a_classic_job_finishes() {
    let t = tracker(2);
    let events = t.events();
    let addr = t.addr();
    print(addr, 0, "classic hello");
    let _j = json_cmd(
        addr,
        r#"{"rank":1,"task_id":"","world_size":2}"#,
        r#"{"cmd":4,"msg":"json hello"}"#,
    );
    prints(&events, &["classic hello", "json hello"]);
    run_classic_job(addr, 2, |i| i.to_string());
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

#[test]
fn a_json_job_finishes_while_classic_clients_print() {
    let t = tracker(3);
    let events = t.events();
    let addr = t.addr();
    let printer = std::thread::spawn(move || {
        for i in 0..5 {
            print(addr, i, &format!("classic {i}"));
        }
    });
    run_json_job(addr, 3, |i| format!("w{i}"));
    printer.join().unwrap();
    prints(&events, &["classic 4"]);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1, 2]);
}

/// A classic world size whose low bytes look like `{"` (a world of 8827 or more) is
/// taken for JSON and then fails to parse: it is dropped, not misread.
#[test]
fn a_classic_world_that_looks_like_json_is_dropped_cleanly() {
    let t = tracker(1);
    let events = t.events();
    let mut st = magic(t.addr());
    st.write_all(&[le(-1), [b'{', b'"', 0, 0]].concat())
        .unwrap();
    st.write_all(&[0u8; 8]).unwrap();
    expect_event(&events, |e| matches!(e, Event::Dropped { .. }));
    run_classic_job(t.addr(), 1, |_| "x".into());
    t.wait(Some(WAIT)).unwrap();
}

/// Waits for a dropped connection whose reason contains every one of `words`.
fn dropped_saying(events: &crossbeam_channel::Receiver<Event>, words: &[&str]) -> String {
    match expect_event(
        events,
        |e| matches!(e, Event::Dropped { reason, .. } if words.iter().all(|w| reason.contains(w))),
    ) {
        Event::Dropped { reason, .. } => reason,
        _ => unreachable!(),
    }
}

/// Reads to the end of `st`: closed by the tracker without another byte.
fn closed_without_a_reply(st: &mut std::net::TcpStream, reason: &str) {
    st.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(st.read(&mut b).unwrap_or(0), 0, "{reason}");
}

/// XGBoost 1.7 and 3.x workers mixed in one job (or a JSON client joining a job of
/// classic workers) would wait in two batches that never fill, silently, until the
/// batch timeout. The job takes the protocol of the first workers given ranks: the
/// other protocol's waiting `start` is refused then, and a later one at once, each with
/// the reason, and the job goes on.
#[test]
fn a_json_worker_in_a_classic_job_is_refused_once_the_classic_workers_have_ranks() {
    let t = tracker(2);
    let events = t.events();
    let addr = t.addr();
    // The first classic worker's `start`, sent from here so that it reaches the tracker
    // before anything after it; it waits for its batch.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let st = hello(addr, -1, -1, "0", "start");
    // A print from the same host is carried out only after that `start` was taken in.
    print(addr, -1, "marker");
    expect_event(
        &events,
        |e| matches!(e, Event::Print { text, .. } if text == "marker"),
    );
    // A JSON `start` waits too: a `start` without a rank decides nothing.
    let mut waiting = json_start(addr, "x", 1, 1);
    // The second classic worker fills the batch: ranks are given, the JSON one refused.
    let first = std::thread::spawn(move || finish_join(st, &listener, Vec::new()));
    let second = std::thread::spawn(move || start_worker(addr, -1, "1"));
    let reason = dropped_saying(&events, &["JSON", "classic", "one XGBoost generation"]);
    closed_without_a_reply(&mut waiting, &reason);
    // A later JSON `start` is refused at once, before the world size reply.
    let mut late = json_cmd(
        addr,
        r#"{"rank":-1,"task_id":"y","world_size":-1}"#,
        r#"{"cmd":1,"error_port":1,"port":1}"#,
    );
    let reason = dropped_saying(&events, &["JSON", "classic", "one XGBoost generation"]);
    closed_without_a_reply(&mut late, &reason);
    // The classic job goes on.
    let (first, second) = (first.join().unwrap(), second.join().unwrap());
    shutdown(addr, first.assignment.rank, 2);
    shutdown(addr, second.assignment.rank, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

#[test]
fn a_classic_worker_in_a_json_job_is_refused_once_the_json_workers_have_ranks() {
    let t = tracker(2);
    let events = t.events();
    let addr = t.addr();
    // Answered with the world size once the tracker has taken it in.
    let mut first = json_start(addr, "w0", 40000, 0);
    let mut waiting = hello(addr, -1, -1, "c0", "start");
    // Carried out only after that classic `start` was taken in: it waits, without a rank.
    print(addr, -1, "marker");
    expect_event(
        &events,
        |e| matches!(e, Event::Print { text, .. } if text == "marker"),
    );
    // The batch forms: rank −1, the classic protocol's refusal, for the waiting one.
    let mut second = json_start(addr, "w1", 40001, 0);
    assert_eq!(read_i32(&mut waiting), -1);
    dropped_saying(&events, &["classic", "JSON", "one XGBoost generation"]);
    // A later classic `start` is refused at once.
    let mut late = hello(addr, -1, -1, "c1", "start");
    assert_eq!(read_i32(&mut late), -1);
    dropped_saying(&events, &["classic", "JSON", "one XGBoost generation"]);
    // The JSON job goes on.
    read_frame(&mut first);
    read_frame(&mut second);
    json_shutdown(addr, 0, 2);
    json_shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

/// A stranger's classic `start` (about 40 bytes; jobs of XGBoost workers run without a
/// secret) is not given a rank until its batch fills, so it does not decide the job's
/// protocol: the JSON workers that come after it are served, and once they have their
/// ranks the stranger is refused, saying why.
#[test]
fn a_strangers_classic_start_does_not_lock_a_json_job_out() {
    let t = tracker(2);
    let events = t.events();
    let addr = t.addr();
    let mut stranger = hello(addr, -1, -1, "NULL", "start");
    // A print from the same host is carried out only after that `start` was taken in.
    print(addr, -1, "marker");
    expect_event(
        &events,
        |e| matches!(e, Event::Print { text, .. } if text == "marker"),
    );
    let ranks = run_json_job(addr, 2, |i| format!("w{i}"));
    assert_eq!(ranks.len(), 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
    // Rank −1: the classic protocol's refusal.
    assert_eq!(read_i32(&mut stranger), -1);
    dropped_saying(&events, &["classic", "JSON", "one XGBoost generation"]);
}
