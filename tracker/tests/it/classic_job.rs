//! Classic jobs end to end over real sockets, with hand-written byte clients.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use std::time::Duration;
use support::*;
use switchyard_tracker::{Event, SortBy, Tracker, TrackerConfig};

/// docs/rabit-protocol.md, *Bytes of a world of one*: one worker, task `T0`, every byte
/// as XGBoost 1.7.6 exchanged them.
#[test]
fn appendix_b_bytes_for_a_world_of_one() {
    let t = tracker(1);
    let events = t.events();
    let addr = t.addr();
    let mut st = connect(addr);
    st.write_all(&[0x99, 0xff, 0, 0]).unwrap();
    let mut b = [0u8; 4];
    st.read_exact(&mut b).unwrap();
    assert_eq!(b, [0x99, 0xff, 0, 0]);
    st.write_all(&[0xff; 8]).unwrap();
    st.write_all(&[2, 0, 0, 0, b'T', b'0']).unwrap();
    st.write_all(&[5, 0, 0, 0, b's', b't', b'a', b'r', b't'])
        .unwrap();
    let mut a = [0u8; 24];
    st.read_exact(&mut a).unwrap();
    assert_eq!(
        a,
        [
            0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xff
        ]
    );
    st.write_all(&[0, 0, 0, 0]).unwrap();
    let mut r = [0u8; 8];
    st.read_exact(&mut r).unwrap();
    assert_eq!(r, [0; 8]);
    st.write_all(&[0, 0, 0, 0, 0xa3, 0xeb, 0, 0]).unwrap();
    // The tracker closes after the port.
    assert_eq!(st.read(&mut b).unwrap(), 0);

    let mut p = magic(addr);
    p.write_all(&[0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'T', b'0'])
        .unwrap();
    p.write_all(&s("print")).unwrap();
    p.write_all(&s("  hello from T0 \n")).unwrap();
    let e = expect_event(&events, |e| matches!(e, Event::Print { .. }));
    assert_eq!(
        e,
        Event::Print {
            rank: 0,
            text: "hello from T0".into()
        }
    );
    let mut q = magic(addr);
    q.write_all(&[0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, b'T', b'0'])
        .unwrap();
    q.write_all(&s("shutdown")).unwrap();
    let outcome = t.wait(Some(WAIT)).unwrap();
    assert_eq!(outcome.shut_down, vec![0]);
}

/// docs/rabit-protocol.md, *Bytes of a world of one*, rank 1 of 2: its assignment and
/// its first round name rank 0's port.
#[test]
fn rank_one_of_two_connects_to_rank_zero() {
    let t = tracker(2);
    let addr = t.addr();
    let mut a = hello(addr, -1, -1, "0", "start");
    let mut b = hello(addr, -1, -1, "1", "start");
    assert_eq!(
        read_assignment(&mut a),
        Assignment {
            rank: 0,
            parent: -1,
            world: 2,
            tree: vec![1],
            prev: 1,
            next: 1
        }
    );
    a.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut a), read_i32(&mut a)), (0, 1));
    a.write_all(&le(0)).unwrap();
    a.write_all(&le(4321)).unwrap();
    assert_eq!(
        read_assignment(&mut b),
        Assignment {
            rank: 1,
            parent: 0,
            world: 2,
            tree: vec![0],
            prev: 0,
            next: 0
        }
    );
    b.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut b), read_i32(&mut b)), (1, 0));
    assert_eq!(read_str(&mut b), "127.0.0.1");
    assert_eq!((read_i32(&mut b), read_i32(&mut b)), (4321, 0));
}

#[test]
fn jobs_of_one_to_seven_finish_with_every_link_made() {
    for n in 1..=7u32 {
        let t = tracker(n);
        let events = t.events();
        let got = run_classic_job(t.addr(), n as usize, |i| format!("{i}"));
        for (r, a) in got.iter().enumerate() {
            assert_eq!((a.rank, a.world), (r as i32, n as i32));
            assert_eq!(
                a.prev,
                if n == 1 {
                    -1
                } else {
                    ((r as u32 + n - 1) % n) as i32
                }
            );
        }
        let outcome = t.wait(Some(WAIT)).unwrap();
        assert_eq!(outcome.shut_down, (0..n).collect::<Vec<_>>());
        let assigned = events
            .try_iter()
            .filter(|e| matches!(e, Event::Assigned { .. }))
            .count();
        assert_eq!(assigned, n as usize);
    }
}

/// Numeric task ids sort by value ("2" before "10"), whatever the arrival order.
#[test]
fn task_ids_sort_numerically_for_both_sort_keys() {
    for sort_by in [SortBy::Host, SortBy::Task] {
        let mut config = TrackerConfig::new(3);
        config.sort_by = sort_by;
        let t = Tracker::start(config).unwrap();
        let events = t.events();
        run_classic_job(t.addr(), 3, |i| ["10", "2", "1"][i].to_string());
        t.wait(Some(WAIT)).unwrap();
        let order: Vec<(u32, String)> = events
            .try_iter()
            .filter_map(|e| match e {
                Event::Assigned { rank, task_id, .. } => Some((rank, task_id.unwrap())),
                _ => None,
            })
            .collect();
        let mut order = order;
        order.sort();
        assert_eq!(
            order,
            [(0, "1".into()), (1, "2".into()), (2, "10".into())],
            "{sort_by:?}"
        );
    }
}

/// A worker whose first connect fails takes a second round; the peer it reached in the
/// first round must not keep an expected link (docs/rabit-protocol.md, *Links reached
/// in earlier rounds*), so every shutdown counts.
#[test]
fn retry_rounds_keep_the_bookkeeping_right() {
    let t = tracker(3);
    let addr = t.addr();
    // Ranks 0 and 1 by explicit task order; rank 2 last.
    let w0 = std::thread::spawn(move || start_worker(addr, -1, "0"));
    let w1 = std::thread::spawn(move || start_worker(addr, -1, "1"));
    // Rank 2 (links 0 and 1, both waiting) reports one failure in round 1, then
    // reconnects in round 2.
    let mut st = hello(addr, -1, -1, "2", "start");
    let w0 = w0;
    let a = read_assignment(&mut st);
    assert_eq!(a.rank, 2);
    st.write_all(&le(0)).unwrap();
    let (nc, na) = (read_i32(&mut st), read_i32(&mut st));
    assert_eq!((nc, na), (2, 0));
    let mut peers = Vec::new();
    for i in 0..nc {
        let host = read_str(&mut st);
        let port = read_i32(&mut st);
        let rank = read_i32(&mut st);
        if i == 0 {
            let mut p = std::net::TcpStream::connect(format!("{host}:{port}")).unwrap();
            p.write_all(&le(2)).unwrap();
            assert_eq!(read_i32(&mut p), rank);
            peers.push((rank, p));
        }
    }
    st.write_all(&le(1)).unwrap();
    st.write_all(&le(1)).unwrap();
    st.write_all(&le(peers[0].0)).unwrap();
    let (nc, na) = (read_i32(&mut st), read_i32(&mut st));
    assert_eq!((nc, na), (1, 0));
    let host = read_str(&mut st);
    let port = read_i32(&mut st);
    let rank = read_i32(&mut st);
    let mut p = std::net::TcpStream::connect(format!("{host}:{port}")).unwrap();
    p.write_all(&le(2)).unwrap();
    assert_eq!(read_i32(&mut p), rank);
    st.write_all(&le(0)).unwrap();
    st.write_all(&le(9999)).unwrap();
    let w0 = w0.join().unwrap();
    let w1 = w1.join().unwrap();
    assert_eq!(w0.peers.len() + w1.peers.len(), 4);
    for r in 0..3 {
        shutdown(addr, r, 3);
    }
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down, [0, 1, 2]);
}

#[test]
fn wait_times_out_while_the_job_runs_and_stop_ends_it() {
    let t = tracker(2);
    assert!(matches!(
        t.wait(Some(Duration::from_millis(50))),
        Err(switchyard_tracker::TrackerError::WaitTimedOut { .. })
    ));
    t.stop();
    assert!(matches!(
        t.wait(None),
        Err(switchyard_tracker::TrackerError::Stopped)
    ));
    assert!(
        std::net::TcpStream::connect(t.addr()).is_err(),
        "port closed"
    );
}

/// IPv6: the tracker listens on `::1` and names peers by their IPv6 address text.
#[test]
fn an_ipv6_tracker_serves_a_job() {
    let mut config = TrackerConfig::new(2);
    config.host = "::1".into();
    let Ok(t) = Tracker::start(config) else {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    };
    assert_eq!(t.worker_env()[0].1, "::1");
    let addr = t.addr();
    let a = std::thread::spawn(move || hello(addr, -1, -1, "0", "start"));
    let mut b = hello(addr, -1, -1, "1", "start");
    let mut a = a.join().unwrap();
    assert_eq!(read_assignment(&mut a).rank, 0);
    a.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut a), read_i32(&mut a)), (0, 1));
    a.write_all(&[le(0), le(4321)].concat()).unwrap();
    assert_eq!(read_assignment(&mut b).rank, 1);
    b.write_all(&le(0)).unwrap();
    assert_eq!((read_i32(&mut b), read_i32(&mut b)), (1, 0));
    assert_eq!(read_str(&mut b), "::1");
}

/// A larger world: 64 workers link up and finish (turns are served one at a time).
#[test]
fn a_world_of_64_finishes() {
    let t = tracker(64);
    let started = std::time::Instant::now();
    run_classic_job(t.addr(), 64, |i| format!("{i}"));
    assert_eq!(t.wait(Some(WAIT)).unwrap().shut_down.len(), 64);
    eprintln!("64 workers in {:?}", started.elapsed());
}

/// A worker that dies after bootstrap never sends `shutdown`, and nothing in the
/// protocol tells the tracker: with a job timeout the job fails, naming the rank that
/// never shut down, instead of waiting forever.
#[test]
fn a_job_whose_worker_died_fails_at_the_job_timeout() {
    let mut config = TrackerConfig::new(2);
    config.job_timeout = Some(Duration::from_millis(800));
    let t = Tracker::start(config).unwrap();
    let addr = t.addr();
    let events = t.events();
    let handles: Vec<_> = (0..2)
        .map(|i| std::thread::spawn(move || start_worker(addr, -1, &format!("t{i}"))))
        .collect();
    let workers: Vec<Worker> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for _ in 0..2 {
        expect_event(&events, |e| matches!(e, Event::Linked { .. }));
    }
    // Rank 0 finishes; rank 1 "dies" (its links close, it never says `shutdown`).
    shutdown(addr, 0, 2);
    drop(workers);
    let started = std::time::Instant::now();
    match t.wait(Some(WAIT)) {
        Err(switchyard_tracker::TrackerError::JobFailed { reason }) => {
            assert!(reason.contains("job timeout"), "{reason}");
            assert!(reason.contains("ranks [1] never shut down"), "{reason}");
        }
        other => panic!("expected the job to fail at its timeout, got {other:?}"),
    }
    assert!(started.elapsed() < WAIT);
    // Without a timeout (the default) the job is still waiting for rank 1.
    let t = tracker(1);
    assert!(matches!(
        t.wait(Some(Duration::from_millis(900))),
        Err(switchyard_tracker::TrackerError::WaitTimedOut { .. })
    ));
}

/// A robust engine's silent-rank report is its own command, `switchyard-silent` with
/// the rank and start number as integers, and becomes `Event::Silent`; a print with
/// the same words stays a print (a launcher acts only on the former).
#[test]
fn a_silent_report_is_its_own_event_and_a_print_of_its_words_is_not() {
    let t = tracker(2);
    let events = t.events();
    let addr = t.addr();
    print(
        addr,
        0,
        "switchyard robust: silent rank 1 attempt 0: forged",
    );
    let e = expect_event(&events, |e| {
        matches!(e, Event::Print { .. } | Event::Silent { .. })
    });
    assert!(matches!(e, Event::Print { .. }), "{e:?}");
    let mut st = hello(addr, 0, 2, "0", "switchyard-silent");
    st.write_all(&le(1)).unwrap();
    st.write_all(&le(3)).unwrap();
    st.write_all(&s("no heartbeat for 812 ms")).unwrap();
    let e = expect_event(&events, |e| matches!(e, Event::Silent { .. }));
    assert_eq!(
        e,
        Event::Silent {
            reporter: 0,
            rank: 1,
            attempt: 3,
            reason: "no heartbeat for 812 ms".into()
        }
    );
}
