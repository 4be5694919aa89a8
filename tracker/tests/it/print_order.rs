//! A worker's prints reach the log in the order it sent them, and none is lost when its
//! `shutdown` ends the job: each print is a connection of its own, served on its own
//! thread, so without ordering a short print overtakes a long one before it, and the
//! `shutdown` that follows can end the job before the last print is published.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;
use support::*;
use switchyard_tracker::Event;

/// The text of print `i`: every third one long, so that reading it takes longer than
/// reading the short one after it.
fn text(i: usize) -> String {
    if i % 3 == 0 {
        format!("{i:04} {}", "x".repeat(48 << 10))
    } else {
        format!("{i:04}")
    }
}

fn prints_then_shutdown(json: bool) {
    const PRINTS: usize = 120;
    let t = tracker(1);
    let addr = t.addr();
    let events = t.events();
    let rank = if json {
        run_json_job_without_shutdown(addr)
    } else {
        start_worker(addr, -1, "w0").assignment.rank as u32
    };
    assert_eq!(rank, 0);
    if !json {
        expect_event(&events, |e| matches!(e, Event::Linked { rank: 0 }));
    }
    for i in 0..PRINTS {
        if json {
            json_print(addr, 0, 1, &text(i));
        } else {
            print(addr, 0, &text(i));
        }
    }
    if json {
        json_shutdown(addr, 0, 1);
    } else {
        shutdown(addr, 0, 1);
    }
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0]);
    // Everything published before the job ended is in the channel now: a caller that
    // drains it once `wait` returns (as `switchyard tracker` does) sees every print.
    let mut got = Vec::new();
    let mut shut_down_at = None;
    while let Ok(e) = events.recv_timeout(Duration::ZERO) {
        match e {
            Event::Print { text, .. } => got.push(text),
            Event::Shutdown { .. } => shut_down_at = Some(got.len()),
            _ => {}
        }
    }
    let want: Vec<String> = (0..PRINTS).map(text).collect();
    let short = |v: &[String]| v.iter().map(|t| t[..4].to_string()).collect::<Vec<_>>();
    assert_eq!(short(&got), short(&want), "prints lost or out of order");
    assert_eq!(got, want);
    assert_eq!(
        shut_down_at,
        Some(PRINTS),
        "the shutdown was handled before the prints that came before it"
    );
}

/// A JSON `print` on a new connection.
fn json_print(addr: std::net::SocketAddr, rank: u32, world: u32, text: &str) {
    let cmd = serde_json::json!({ "cmd": 4, "msg": text }).to_string();
    let _ = json_cmd(
        addr,
        &format!(r#"{{"rank":{rank},"task_id":"","world_size":{world}}}"#),
        &cmd,
    );
}

/// One JSON worker through its `start` (peer frame received), without the shutdown.
fn run_json_job_without_shutdown(addr: std::net::SocketAddr) -> u32 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut st = json_start(addr, "w0", port, port);
    let peer = read_frame(&mut st);
    peer["rank"].as_u64().unwrap() as u32
}

#[test]
fn classic_prints_of_one_worker_are_logged_in_order_and_none_is_lost() {
    prints_then_shutdown(false);
}

#[test]
fn json_prints_of_one_worker_are_logged_in_order_and_none_is_lost() {
    prints_then_shutdown(true);
}

/// A stranger on the workers' host that sends the magic and part of a hello, then
/// stalls with its connection open: it holds back that host's prints and `shutdown` by
/// the grace of a connection that has not sent its whole command (a second), not by
/// its read timeout. The partial hello is long enough to name a protocol (eight bytes
/// and more), which once counted as "said who it is".
fn a_stalled_hello_holds_back_prints_at_most_a_grace(json: bool, partial: &[u8]) {
    let mut config = switchyard_tracker::TrackerConfig::new(1);
    // Long enough that waiting for it fails the bound below, short enough that the
    // failure shows quickly.
    config.read_timeout = Duration::from_secs(10);
    let t = switchyard_tracker::Tracker::start(config).unwrap();
    let addr = t.addr();
    let events = t.events();
    let rank = if json {
        run_json_job_without_shutdown(addr)
    } else {
        start_worker(addr, -1, "w0").assignment.rank as u32
    };
    if !json {
        expect_event(&events, |e| matches!(e, Event::Linked { rank: 0 }));
    }
    let mut stranger = magic(addr);
    std::io::Write::write_all(&mut stranger, partial).unwrap();
    // Let the tracker read what the stranger sent before the worker's commands come.
    std::thread::sleep(Duration::from_millis(300));
    let started = std::time::Instant::now();
    if json {
        json_print(addr, rank, 1, "after the stranger");
        json_shutdown(addr, rank, 1);
    } else {
        print(addr, rank as i32, "after the stranger");
        shutdown(addr, rank as i32, 1);
    }
    // A second of grace, and slack for a loaded machine; the read timeout is 10 s.
    let bound = Duration::from_secs(5);
    assert_eq!(t.wait(Some(bound)).unwrap().shut_down, [0]);
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    let mut printed = false;
    while let Ok(e) = events.recv_timeout(Duration::ZERO) {
        printed |= matches!(&e, Event::Print { text, .. } if text == "after the stranger");
    }
    assert!(printed, "the print was lost");
    drop(stranger);
}

#[test]
fn a_classic_hello_stalled_mid_task_id_holds_back_prints_and_shutdown_at_most_a_second() {
    // Rank, world, then a task id of 10 bytes of which 3 come.
    let partial = [le(-1), le(-1), le(10)].concat();
    a_stalled_hello_holds_back_prints_at_most_a_grace(false, &[partial, b"abc".to_vec()].concat());
}

#[test]
fn a_json_hello_stalled_mid_frame_holds_back_prints_and_shutdown_at_most_a_second() {
    // A hello frame of 40 bytes of which 8 come.
    let partial = [le(40).to_vec(), br#"{"rank"#.to_vec()].concat();
    a_stalled_hello_holds_back_prints_at_most_a_grace(true, &partial);
}
