//! One port, both protocols: after the magic the tracker tells a classic hello from a
//! JSON one (JSON doc §11, last paragraph).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
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
