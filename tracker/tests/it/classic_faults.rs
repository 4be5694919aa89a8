//! Every weakness of the reference rabit tracker that a tracker can fix (silent and
//! stalled clients, broken lengths, bad input, vanished and duplicate workers, stray
//! shutdowns, floods): the bad client is dropped or refused with a reason, and
//! each test ends with a good job still served to the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use std::time::Duration;
use support::*;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

fn quick(n: u32) -> Tracker {
    let mut config = TrackerConfig::new(n);
    // Short enough for the stalled-client tests, long enough for a loaded CI machine.
    config.read_timeout = Duration::from_secs(2);
    Tracker::start(config).unwrap()
}

fn good_job(t: &Tracker, n: u32) {
    run_classic_job(t.addr(), n as usize, |i| format!("good-{i}"));
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
        Event::Dropped { peer, reason } => {
            assert!(peer.starts_with("127.0.0.1:"), "{peer}");
            reason
        }
        _ => unreachable!(),
    }
}

fn refused(st: &mut std::net::TcpStream) {
    let a = read_assignment(st);
    assert_eq!(a.rank, -1, "expected the polite refusal, got {a:?}");
}

/// docs/rabit-protocol.md, *Silent and stalled clients*: a silent client, and one that
/// stops mid-message, hold up nobody.
#[test]
fn item_1_silent_and_stalled_clients_block_nobody() {
    let t = quick(2);
    let events = t.events();
    let silent = connect(t.addr());
    let mut stalled = magic(t.addr());
    stalled.write_all(&le(-1)).unwrap();
    good_job(&t, 2);
    dropped(&events, "within");
    drop(silent);
}

/// Connections past `max_connections`: idle ones that never said who they are are
/// closed to make room, oldest first, so that real workers are served at once rather
/// than refused until the strangers time out (30 s here, longer than a worker waits).
#[test]
fn idle_strangers_past_the_connection_cap_make_room_for_workers() {
    let mut config = TrackerConfig::new(2);
    config.max_connections = 8;
    let t = Tracker::start(config).unwrap();
    let events = t.events();
    let idle: Vec<_> = (0..8).map(|_| connect(t.addr())).collect();
    // Let every stranger be accepted and counted before the workers come.
    std::thread::sleep(Duration::from_millis(200));
    let started = std::time::Instant::now();
    good_job(&t, 2);
    // Before the strangers' 30 s timeout would have made room.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the workers waited {:?}",
        started.elapsed()
    );
    dropped(&events, "closed to make room");
    drop(idle);
}

/// Connections past `max_connections` that send a whole classic `print` hello and then
/// stall (what they claim to be costs nothing without a secret) are evicted like idle
/// ones: a connection counts as a worker's only once its `start` was given a place in
/// the job, so the real workers are served at once instead of refused.
#[test]
fn stalled_print_hellos_past_the_connection_cap_make_room_for_workers() {
    let mut config = TrackerConfig::new(2);
    config.max_connections = 8;
    let t = Tracker::start(config).unwrap();
    let events = t.events();
    let stalled: Vec<_> = (0..8)
        .map(|_| hello(t.addr(), 0, -1, "NULL", "print"))
        .collect();
    // Let the tracker read every stranger's hello before the workers come.
    std::thread::sleep(Duration::from_millis(300));
    good_job(&t, 2);
    let reason = dropped(&events, "closed to make room");
    assert!(reason.contains("had not started a rank"), "{reason}");
    drop(stalled);
}

/// A cap below what the job needs: with every open connection a worker's `start`, the
/// newcomer is refused, saying so.
#[test]
fn a_cap_full_of_worker_starts_refuses_the_newcomer_saying_why() {
    let mut config = TrackerConfig::new(3);
    config.max_connections = 2;
    let t = Tracker::start(config).unwrap();
    let events = t.events();
    // Two JSON `start`s wait for their batch, answered with the world size once taken
    // in: workers' by what they did.
    let _starts = [
        json_start(t.addr(), "w0", 40000, 0),
        json_start(t.addr(), "w1", 40001, 0),
    ];
    let mut newcomer = connect(t.addr());
    let reason = dropped(&events, "connections open");
    assert!(reason.contains("every one a worker's start"), "{reason}");
    let mut b = [0u8; 1];
    assert_eq!(newcomer.read(&mut b).unwrap_or(0), 0, "{reason}");
}

/// docs/rabit-protocol.md, *Connections closed mid-message*: a peer closing mid-message
/// is an end of stream, not a spin.
#[test]
fn item_2_a_close_mid_message_drops_only_that_connection() {
    let t = quick(2);
    let events = t.events();
    let mut st = magic(t.addr());
    st.write_all(&le(-1)).unwrap();
    st.write_all(&le(-1)).unwrap();
    st.write_all(&le(10)).unwrap();
    st.write_all(b"abc").unwrap();
    drop(st);
    assert!(dropped(&events, "closed").contains("task id"));
    good_job(&t, 2);
}

/// docs/rabit-protocol.md, *Unbounded lengths*: lengths are capped, negative ones
/// refused.
#[test]
fn item_3_huge_and_negative_lengths_are_refused() {
    let t = quick(2);
    let events = t.events();
    let mut st = magic(t.addr());
    st.write_all(&[le(-1), le(-1), le(i32::MAX)].concat())
        .unwrap();
    assert!(dropped(&events, "over the cap").contains("task id"));
    let mut st2 = magic(t.addr());
    st2.write_all(&[le(0), le(1), le(-5)].concat()).unwrap();
    dropped(&events, "negative length -5");
    good_job(&t, 2);
    drop((st, st2));
}

/// docs/rabit-protocol.md, *Asserts as validation*: what the reference asserts on is a
/// dropped connection or a polite refusal.
#[test]
fn item_4_bad_input_is_refused_not_fatal() {
    let t = quick(2);
    let events = t.events();
    let addr = t.addr();
    // Wrong magic.
    let mut st = connect(addr);
    st.write_all(&le(0x1234)).unwrap();
    dropped(&events, "wrong magic");
    // Unknown command.
    let _st = hello(addr, -1, -1, "NULL", "null");
    dropped(&events, "unknown command \"null\"");
    // Invalid UTF-8 in the task id.
    let mut st = magic(addr);
    st.write_all(&[le(-1), le(-1), le(2)].concat()).unwrap();
    st.write_all(&[0xff, 0xfe]).unwrap();
    dropped(&events, "not UTF-8");
    // recover before any start, recover without a rank, a rank >= n, another world size.
    refused(&mut hello(addr, 0, 2, "x", "recover"));
    dropped(&events, "never joined");
    refused(&mut hello(addr, -1, 2, "x", "recover"));
    refused(&mut hello(addr, 5, 2, "x", "start"));
    dropped(&events, "not below the world size 2");
    refused(&mut hello(addr, -1, 3, "x", "start"));
    dropped(&events, "world size 3");
    // A good-link rank outside the link set drops the worker; its rank goes back.
    let mut a = hello(addr, -1, -1, "0", "start");
    let mut b = hello(addr, -1, -1, "1", "start");
    let asg = read_assignment(&mut a);
    assert_eq!(asg.rank, 0);
    a.write_all(&[le(1), le(7)].concat()).unwrap();
    dropped(&events, "not one of its links");
    drop(a);
    // The survivor (rank 1) goes on; a newcomer takes rank 0 and the job finishes.
    let w1 = std::thread::spawn(move || {
        let asg = read_assignment(&mut b);
        assert_eq!(asg.rank, 1);
        b.write_all(&le(0)).unwrap();
        assert_eq!((read_i32(&mut b), read_i32(&mut b)), (0, 1));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        b.write_all(&le(0)).unwrap();
        b.write_all(&le(i32::from(l.local_addr().unwrap().port())))
            .unwrap();
        let mut p = accept_within(&l);
        p.write_all(&le(1)).unwrap();
        assert_eq!(read_i32(&mut p), 0);
    });
    let w0 = start_worker(addr, -1, "new-0");
    assert_eq!(w0.assignment.rank, 0);
    w1.join().unwrap();
    // A second shutdown from one rank does not count twice.
    shutdown(addr, 0, 2);
    shutdown(addr, 0, 2);
    dropped(&events, "second shutdown from rank 0");
    // A start from an unknown task after every rank is out is refused.
    refused(&mut hello(addr, -1, -1, "late", "start"));
    dropped(&events, "every rank is handed out");
    shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

/// docs/rabit-protocol.md, *Workers that vanish while pending*: a pending worker that
/// vanishes leaves the batch; a replacement completes it.
#[test]
fn item_5_a_vanished_pending_worker_is_replaced() {
    let t = quick(2);
    let events = t.events();
    let st = hello(t.addr(), -1, -1, "gone", "start");
    // Its thread sees the end of stream within a poll.
    drop(st);
    dropped(&events, "closed while waiting for its batch");
    good_job(&t, 2);
}

/// docs/rabit-protocol.md, *Links reached in earlier rounds*: covered byte by byte in
/// `classic_job.rs` (`retry_rounds_keep_the_bookkeeping_right`); here with a dead first
/// peer port as in the reference's check: the worker takes a second round and the job
/// finishes.
#[test]
fn item_6_a_second_round_leaves_no_expected_link_behind() {
    let t = quick(2);
    let addr = t.addr();
    let w0 = std::thread::spawn(move || start_worker(addr, -1, "0"));
    let mut b = hello(addr, -1, -1, "1", "start");
    assert_eq!(read_assignment(&mut b).rank, 1);
    b.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut b), read_i32(&mut b)), (1, 0));
    let (host, port, rank) = (read_str(&mut b), read_i32(&mut b), read_i32(&mut b));
    // Pretend the connect failed; the second round names the same peer.
    b.write_all(&le(1)).unwrap();
    b.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut b), read_i32(&mut b)), (1, 0));
    assert_eq!(
        (read_str(&mut b), read_i32(&mut b), read_i32(&mut b)),
        (host.clone(), port, rank)
    );
    let mut p = std::net::TcpStream::connect(format!("{host}:{port}")).unwrap();
    p.write_all(&le(1)).unwrap();
    assert_eq!(read_i32(&mut p), 0);
    b.write_all(&[le(0), le(0)].concat()).unwrap();
    w0.join().unwrap();
    shutdown(addr, 0, 2);
    shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

/// docs/rabit-protocol.md, *Unchecked shutdowns*: shutdowns from ranks that never
/// joined do not end the job.
#[test]
fn item_7_stray_shutdowns_do_not_end_the_job() {
    let t = quick(2);
    let events = t.events();
    shutdown(t.addr(), 7, 99);
    dropped(&events, "rank 7");
    shutdown(t.addr(), 1, 2);
    dropped(&events, "rank 1, which never finished");
    assert!(t.wait(Some(Duration::from_millis(200))).is_err());
    good_job(&t, 2);
}

/// docs/rabit-protocol.md, *Trusted task ids*: a task id whose holder is still
/// negotiating is not handed out again.
#[test]
fn item_8_a_duplicate_task_id_is_refused_while_its_holder_negotiates() {
    let t = quick(1);
    let events = t.events();
    let addr = t.addr();
    let mut holder = hello(addr, -1, -1, "same", "start");
    assert_eq!(read_assignment(&mut holder).rank, 0);
    refused(&mut hello(addr, -1, -1, "same", "start"));
    dropped(&events, "held by a connection");
    holder.write_all(&[le(0)].concat()).unwrap();
    assert_eq!((read_i32(&mut holder), read_i32(&mut holder)), (0, 0));
    holder.write_all(&[le(0), le(0)].concat()).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(holder.read(&mut b).unwrap(), 0);
    shutdown(addr, 0, 1);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0]);
    // Shut down: its rank is not handed out again.
    refused(&mut hello(addr, 0, 1, "same", "start"));
    dropped(&events, "already shut down");
}

/// docs/rabit-protocol.md, *Explicit ranks outside the batch*: an explicit rank is
/// taken out of the batch; nobody else gets it.
#[test]
fn item_9_an_explicit_rank_is_not_handed_out_twice() {
    let t = quick(2);
    let addr = t.addr();
    let explicit = std::thread::spawn(move || start_worker(addr, 1, "x"));
    let other = start_worker(addr, -1, "y");
    let explicit = explicit.join().unwrap();
    assert_eq!((explicit.assignment.rank, other.assignment.rank), (1, 0));
    shutdown(addr, 0, 2);
    shutdown(addr, 1, 2);
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1]);
}

/// docs/rabit-protocol.md, *Wrong magic parsed as a hello*: a wrong magic is never
/// parsed as a hello.
#[test]
fn item_13_bytes_after_a_wrong_magic_are_not_read_as_a_hello() {
    let t = quick(1);
    let events = t.events();
    let mut st = connect(t.addr());
    st.write_all(&[&le(0x99ff)[..], &le(-1), &le(-1), &s("NULL"), &s("start")].concat())
        .unwrap();
    dropped(&events, "wrong magic");
    let mut b = [0u8; 4];
    assert!(
        st.read(&mut b).map_or(true, |n| n == 0),
        "no magic, no assignment"
    );
    good_job(&t, 1);
}

/// A `start` that waits longer than the batch timeout is dropped; others are served.
#[test]
fn a_start_waiting_past_the_batch_timeout_is_dropped() {
    let mut config = TrackerConfig::new(2);
    config.batch_timeout = Duration::from_millis(300);
    let t = Tracker::start(config).unwrap();
    let events = t.events();
    let mut st = hello(t.addr(), -1, -1, "early", "start");
    dropped(&events, "not complete after");
    let mut b = [0u8; 4];
    assert_eq!(st.read(&mut b).unwrap_or(0), 0, "closed without an answer");
    good_job(&t, 2);
}
