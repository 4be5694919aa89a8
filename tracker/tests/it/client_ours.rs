//! Both clients against switchyard's own tracker (`Tracker::start`): ranks, the
//! reference link maps, links that reach the right peers, prints as events, and a job
//! that ends after the shutdowns.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::thread;
use std::time::Duration;
use switchyard_tracker::client::ClientConfig;
use switchyard_tracker::client::classic::ClassicClient;
use switchyard_tracker::client::json::JsonClient;
use switchyard_tracker::testing::link_maps;
use switchyard_tracker::{Event, Tracker, TrackerConfig};

const LIMIT: Duration = Duration::from_secs(30);

fn config() -> ClientConfig {
    ClientConfig::default().with_timeout(LIMIT)
}

fn classic_job(n: u32) {
    let tracker = Tracker::start(TrackerConfig::new(n)).unwrap();
    let events = tracker.events();
    let port = tracker.addr().port();
    let workers: Vec<_> = (0..n)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    ClassicClient::new("127.0.0.1", port, Some(i.to_string()), config()).unwrap();
                let mut j = client.start(None, None).unwrap();
                let me = j.rank;
                for s in j.links.values_mut() {
                    s.write_all(&me.to_le_bytes()).unwrap();
                }
                for (&peer, s) in j.links.iter_mut() {
                    s.set_read_timeout(Some(LIMIT)).unwrap();
                    let mut b = [0u8; 4];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(u32::from_le_bytes(b), peer);
                }
                j.session.print(&format!("rank {me} linked")).unwrap();
                (i, j)
            })
        })
        .collect();
    let joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let maps = link_maps(n as usize);
    for (i, j) in &joined {
        // Task ids "0".."n-1" compare numerically: task i is rank i.
        assert_eq!((j.rank, j.world), (*i, n));
        let m = &maps[j.rank as usize];
        assert_eq!(j.tree, m.tree);
        assert_eq!(j.links.keys().copied().collect::<Vec<_>>(), m.link_set());
    }
    let sessions: Vec<_> = joined.into_iter().map(|(_, j)| j.session).collect();
    for s in &sessions {
        s.shutdown().unwrap();
    }
    let outcome = tracker.wait(Some(LIMIT)).unwrap();
    assert_eq!(outcome.shut_down.len(), n as usize);
    let prints = prints(&events, n as usize, LIMIT).len();
    assert_eq!(prints, n as usize);
}

/// The first `n` prints among the tracker's events, waiting at most `limit`: the
/// tracker serves connections concurrently, so a worker's `print` may be handled after
/// its `shutdown` ended the job.
fn prints(events: &crossbeam_channel::Receiver<Event>, n: usize, limit: Duration) -> Vec<String> {
    let until = std::time::Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < n {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Print { text, .. }) => out.push(text),
            Ok(_) => {}
            Err(e) => panic!("{} of {n} prints within {limit:?}: {e}", out.len()),
        }
    }
    out
}

#[test]
fn classic_jobs_of_one_to_five() {
    for n in 1..=5 {
        classic_job(n);
    }
}

#[test]
fn json_job_of_four() {
    let n = 4;
    let tracker = Tracker::start(TrackerConfig::new(n)).unwrap();
    let port = tracker.addr().port();
    let workers: Vec<_> = (0..n)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    JsonClient::new("127.0.0.1", port, Some(format!("w{i}")), config()).unwrap();
                let mut j = client.start().unwrap();
                j.successor.write_all(&j.rank.to_le_bytes()).unwrap();
                j.predecessor.set_read_timeout(Some(LIMIT)).unwrap();
                let mut b = [0u8; 4];
                j.predecessor.read_exact(&mut b).unwrap();
                assert_eq!(u32::from_le_bytes(b), (j.rank + n - 1) % n);
                j.session.print("json worker done").unwrap();
                (i, j.rank, j.world, j.session)
            })
        })
        .collect();
    let joined: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (i, rank, world, _) in &joined {
        assert_eq!((rank, world), (i, &n));
    }
    for (_, _, _, s) in joined {
        s.shutdown().unwrap();
        assert!(!s.error_signalled());
    }
    let outcome = tracker.wait(Some(LIMIT)).unwrap();
    assert_eq!(outcome.shut_down.len(), n as usize);
}

/// An `error` from one JSON worker reaches every worker's error port through
/// switchyard's tracker, and the job ends as failed.
#[test]
fn json_error_reaches_every_worker_and_fails_the_job() {
    let n = 2;
    let tracker = Tracker::start(TrackerConfig::new(n)).unwrap();
    let port = tracker.addr().port();
    let workers: Vec<_> = (0..n)
        .map(|i| {
            thread::spawn(move || {
                let client =
                    JsonClient::new("127.0.0.1", port, Some(format!("w{i}")), config()).unwrap();
                client.start().unwrap().session
            })
        })
        .collect();
    let sessions: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    sessions[1].signal_error(7, "rank 1 gives up").unwrap();
    assert!(tracker.wait(Some(LIMIT)).is_err(), "the job should fail");
    for s in &sessions {
        assert!(s.wait_error_signal(LIMIT), "rank {} was not told", s.rank());
    }
}
