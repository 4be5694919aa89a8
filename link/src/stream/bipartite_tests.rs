//! The parameter server's shape of the stream link: servers and workers connected
//! across, not within, sides; messages taken from whichever rank sent them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::{BoundLink, Link, LinkError, StreamLink, Tag};
use bytes::Bytes;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use switchyard_transports::SocketOptions;

const TIMEOUT: Duration = Duration::from_secs(10);
const TAG: Tag = Tag { call: 1, step: 0 };

/// Opens a bipartite world of `servers` + `workers` ranks on threads; `before` runs
/// with every data listener's address before any rank starts.
fn open_world(servers: usize, workers: usize, before: impl FnOnce(&[String])) -> Vec<StreamLink> {
    let size = servers + workers;
    let bound: Vec<BoundLink> = (0..size)
        .map(|r| BoundLink::bind(r, size, "tcp://127.0.0.1:0", SocketOptions::default()).unwrap())
        .collect();
    let endpoints: Vec<String> = bound.iter().map(|b| b.endpoint().to_string()).collect();
    let listeners: Vec<TcpListener> = (0..size)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    before(&addrs);
    let threads: Vec<_> = bound
        .into_iter()
        .zip(listeners)
        .map(|(link, listener)| {
            let endpoints = endpoints.clone();
            std::thread::spawn(move || {
                let control = link.connect(&endpoints, TIMEOUT).unwrap();
                StreamLink::open_bipartite(control, listener, None, servers, TIMEOUT, 1 << 20, None)
                    .unwrap()
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn servers_hear_every_worker_and_workers_are_not_connected_to_each_other() {
    let (servers, workers) = (2, 3);
    let mut links = open_world(servers, workers, |_| {});
    let mut worker_links = links.split_off(servers);
    for (w, link) in worker_links.iter_mut().enumerate() {
        for s in 0..servers {
            let frames = vec![Bytes::from(format!("w{w}->s{s}"))];
            link.send_nowait(s, TAG, frames).unwrap();
        }
        // No connection within a side.
        let other = servers + (w + 1) % workers;
        assert!(matches!(
            link.send_nowait(other, TAG, vec![Bytes::new()]),
            Err(LinkError::Transport { .. })
        ));
    }
    for (s, link) in links.iter_mut().enumerate() {
        let mut heard = Vec::new();
        while heard.len() < workers {
            let (from, frames) = link
                .recv_any(TAG, Instant::now() + TIMEOUT)
                .unwrap()
                .expect("a message before the deadline");
            assert_eq!(frames[0], format!("w{}->s{s}", from - servers));
            heard.push(from);
            link.send_nowait(from, TAG, vec![Bytes::from(format!("s{s}"))])
                .unwrap();
        }
        heard.sort_unstable();
        assert_eq!(heard, [2, 3, 4]);
        // Nothing more: the wait ends at its deadline.
        let soon = Instant::now() + Duration::from_millis(30);
        assert!(link.recv_any(TAG, soon).unwrap().is_none());
    }
    for link in &mut worker_links {
        for _ in 0..servers {
            let (from, _) = link
                .recv_any(TAG, Instant::now() + TIMEOUT)
                .unwrap()
                .unwrap();
            assert!(from < servers);
        }
    }
    // A worker that leaves ends its connection quietly; the server goes on.
    drop(worker_links.remove(0));
    let server = &mut links[0];
    let until = Instant::now() + TIMEOUT;
    while server.closed(servers).is_none() && Instant::now() < until {
        assert!(
            server
                .recv_any(TAG, Instant::now() + Duration::from_millis(20))
                .unwrap()
                .is_none()
        );
    }
    assert!(server.closed(servers).is_some());
    assert!(server.closed(servers + 1).is_none());
    worker_links[0]
        .send_nowait(0, TAG, vec![Bytes::from_static(b"still here")])
        .unwrap();
    let (from, frames) = server
        .recv_any(TAG, Instant::now() + TIMEOUT)
        .unwrap()
        .unwrap();
    assert_eq!((from, &frames[0][..]), (servers + 1, &b"still here"[..]));
}

/// Strangers on a server's data port while the world forms, one silent, one sending
/// a hello that claims a worker's rank and then garbage, one claiming a server's
/// rank (a pair this shape never connects): every rank still opens, to the right peers.
#[test]
fn strangers_on_the_data_port_do_not_take_a_ranks_place() {
    let mut strangers = Vec::new();
    let links = open_world(1, 2, |addrs| {
        let server = &addrs[0];
        strangers.push(TcpStream::connect(server).unwrap());
        let mut fake = TcpStream::connect(server).unwrap();
        // A hello claiming rank 9 of a world of 3: refused.
        fake.write_all(&crate::framing::encode_hello(9, 3)).unwrap();
        strangers.push(fake);
        let mut same_side = TcpStream::connect(&addrs[2]).unwrap();
        // Rank 2 (a worker) accepts nobody: rank 1 is a worker too.
        same_side
            .write_all(&crate::framing::encode_hello(1, 3))
            .unwrap();
        strangers.push(same_side);
    });
    let mut links = links;
    let mut worker = links.pop().unwrap();
    worker
        .send_nowait(0, TAG, vec![Bytes::from_static(b"hi")])
        .unwrap();
    let (from, frames) = links[0]
        .recv_any(TAG, Instant::now() + TIMEOUT)
        .unwrap()
        .unwrap();
    assert_eq!((from, &frames[0][..]), (2, &b"hi"[..]));
    assert_eq!(links[0].world_size(), 3);
    drop(strangers);
}
