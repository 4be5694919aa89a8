//! The JSON-protocol client against scripted fake trackers (frames of
//! XGBoost's JSON tracker protocol) and against XGBoost 3.x's own tracker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;
use switchyard_tracker::client::json::JsonClient;
use switchyard_tracker::client::{ClientConfig, ClientError};

const LIMIT: Duration = Duration::from_secs(20);

fn config() -> ClientConfig {
    ClientConfig::default().with_timeout(LIMIT)
}

/// A fake tracker's side of one connection.
struct Conn(TcpStream);

impl Conn {
    fn accept(l: &TcpListener) -> Conn {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        Conn(s)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.0.read_exact(&mut b).unwrap();
        b
    }
    /// One frame, as raw text (to check the exact bytes) and parsed.
    fn frame(&mut self) -> (String, Value) {
        let n = i32::from_le_bytes(self.bytes(4).try_into().unwrap()) as usize;
        let text = String::from_utf8(self.bytes(n)).unwrap();
        let value = serde_json::from_str(&text).unwrap();
        (text, value)
    }
    fn put_frame(&mut self, v: &Value) {
        let body = serde_json::to_vec(v).unwrap();
        self.0
            .write_all(&(body.len() as i32).to_le_bytes())
            .unwrap();
        self.0.write_all(&body).unwrap();
    }
    /// Magic both ways (ours first, as the reference may), then hello and command.
    fn hello(&mut self) -> (String, Value) {
        self.0.write_all(&[0x99, 0xff, 0, 0]).unwrap();
        assert_eq!(self.bytes(4), [0x99, 0xff, 0, 0]);
        let (hello, _) = self.frame();
        let (_, cmd) = self.frame();
        (hello, cmd)
    }
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

#[test]
fn a_world_of_one_sends_the_reference_frames_and_bootstraps_its_ring() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        let (hello, cmd) = c.hello();
        assert_eq!(hello, r#"{"rank":0,"task_id":"w0","world_size":-1}"#);
        assert_eq!(cmd["cmd"], 1);
        let peer_port = cmd["port"].as_i64().unwrap();
        assert!(peer_port > 0 && cmd["error_port"].as_i64().unwrap() > 0);
        c.put_frame(&json!({"world_size": 1}));
        c.put_frame(&json!({"host": "127.0.0.1", "port": peer_port, "rank": 0}));
        let mut c = Conn::accept(&l);
        let (hello, cmd) = c.hello();
        assert_eq!(hello, r#"{"rank":0,"task_id":"w0","world_size":1}"#);
        assert_eq!(cmd, json!({"cmd": 4, "msg": "rank 0/1 done"}));
        drop(c); // a print returns when the tracker closes
        let mut c = Conn::accept(&l);
        let (_, cmd) = c.hello();
        assert_eq!(cmd, json!({"cmd": 2}));
    });
    let client = JsonClient::new("127.0.0.1", port, Some("w0".into()), config()).unwrap();
    let mut joined = client.start().unwrap();
    assert_eq!((joined.rank, joined.world), (0, 1));
    // The ring of one: what goes to the successor comes back from the predecessor.
    joined.successor.write_all(b"x").unwrap();
    let mut b = [0u8];
    joined.predecessor.set_read_timeout(Some(LIMIT)).unwrap();
    joined.predecessor.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"x");
    joined.session.print("rank 0/1 done").unwrap();
    joined.session.shutdown().unwrap();
    tracker.join().unwrap();
}

/// Three workers under a fake tracker; each derives its rank from its successor's
/// and its ring links reach the right neighbours.
#[test]
fn three_workers_derive_their_ranks_and_link_a_ring() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut conns: Vec<(Conn, i64, String)> = (0..3)
            .map(|_| {
                let mut c = Conn::accept(&l);
                let (hello, cmd) = c.hello();
                let task: Value = serde_json::from_str(&hello).unwrap();
                c.put_frame(&json!({"world_size": 3}));
                (
                    c,
                    cmd["port"].as_i64().unwrap(),
                    task["task_id"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        conns.sort_by(|a, b| a.2.cmp(&b.2));
        let ports: Vec<i64> = conns.iter().map(|c| c.1).collect();
        for (r, (c, _, _)) in conns.iter_mut().enumerate() {
            let next = (r + 1) % 3;
            c.put_frame(&json!({"host": "127.0.0.1", "port": ports[next], "rank": next}));
        }
    });
    let workers: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|task| {
            thread::spawn(move || {
                let client =
                    JsonClient::new("127.0.0.1", port, Some(task.into()), config()).unwrap();
                let mut j = client.start().unwrap();
                let me = j.rank as u8;
                j.successor.write_all(&[me]).unwrap();
                j.predecessor.set_read_timeout(Some(LIMIT)).unwrap();
                let mut b = [0u8];
                j.predecessor.read_exact(&mut b).unwrap();
                assert_eq!(b[0], (me + 2) % 3, "the predecessor of {me}");
                (task, j.rank, j.world)
            })
        })
        .collect();
    let mut got: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    got.sort();
    assert_eq!(got, [("a", 0, 3), ("b", 1, 3), ("c", 2, 3)]);
    tracker.join().unwrap();
}

/// The test plays rank 1 of 2 by hand: the client's ring link carries exactly the bytes
/// of docs/xgboost-protocol.md, *Bytes of the ring bootstrap* (two 64-byte host slots,
/// then two port slots, own slot first).
#[test]
fn the_ring_bootstrap_bytes_match_the_reference() {
    let (l, port) = listener();
    let (me, my_port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        let (_, cmd) = c.hello();
        c.put_frame(&json!({"world_size": 2}));
        c.put_frame(&json!({"host": "127.0.0.1", "port": my_port, "rank": 1}));
        cmd["port"].as_i64().unwrap() as u16
    });
    let client = thread::spawn(move || {
        let client = JsonClient::new("127.0.0.1", port, None, config()).unwrap();
        client.start().unwrap()
    });
    let client_port = tracker.join().unwrap();
    let slot = |host: &str| {
        let mut s = host.as_bytes().to_vec();
        s.resize(64, 0);
        s
    };
    // As rank 1: link to rank 0 (our successor) and send slots 1, 0.
    let mut out = TcpStream::connect(("127.0.0.1", client_port)).unwrap();
    let mut bytes = [slot("127.0.0.1"), slot("127.0.0.1")].concat();
    bytes.extend_from_slice(&i32::from(client_port).to_le_bytes());
    bytes.extend_from_slice(&i32::from(my_port).to_le_bytes());
    out.write_all(&bytes).unwrap();
    let mut inbound = Conn::accept(&me);
    let got = inbound.bytes(2 * 64 + 8);
    let mut expected = [slot("127.0.0.1"), slot("127.0.0.1")].concat();
    expected.extend_from_slice(&i32::from(my_port).to_le_bytes());
    expected.extend_from_slice(&i32::from(client_port).to_le_bytes());
    assert_eq!(got, expected);
    let joined = client.join().unwrap();
    assert_eq!((joined.rank, joined.world), (0, 2));
}

#[test]
fn a_tracker_that_closes_instead_of_answering_is_an_error() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        c.hello();
    });
    let client = JsonClient::new("127.0.0.1", port, None, config()).unwrap();
    let err = client.start().unwrap_err();
    assert!(
        matches!(err, ClientError::Tracker { step: "start", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("closed"), "{err}");
    tracker.join().unwrap();
}

#[test]
fn a_bad_world_size_and_a_bad_peer_frame_are_typed_errors() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        c.hello();
        c.put_frame(&json!({"world_size": 0}));
        let mut c = Conn::accept(&l);
        c.hello();
        c.put_frame(&json!({"world_size": 2}));
        c.put_frame(&json!({"host": "127.0.0.1", "port": 5, "rank": 7}));
        let mut c = Conn::accept(&l);
        c.hello();
        c.put_frame(&json!({"world_size": 2}));
        c.put_frame(&json!({"host": "127.0.0.1", "port": 5.5, "rank": 1}));
    });
    let client = JsonClient::new("127.0.0.1", port, None, config()).unwrap();
    let err = client.start().unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::BadReply {
                what: "world size",
                ..
            }
        ),
        "{err}"
    );
    let err = client.start().unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::BadReply {
                what: "peer frame",
                ..
            }
        ),
        "{err}"
    );
    let err = client.start().unwrap_err();
    assert!(err.to_string().contains("bad JSON in peer frame"), "{err}");
    tracker.join().unwrap();
}

#[test]
fn an_error_signal_on_the_error_port_is_noticed() {
    let (l, port) = listener();
    let tracker = thread::spawn(move || {
        let mut c = Conn::accept(&l);
        let (_, cmd) = c.hello();
        let peer_port = cmd["port"].as_i64().unwrap();
        c.put_frame(&json!({"world_size": 1}));
        c.put_frame(&json!({"host": "127.0.0.1", "port": peer_port, "rank": 0}));
        cmd["error_port"].as_i64().unwrap() as u16
    });
    let client = JsonClient::new("127.0.0.1", port, None, config()).unwrap();
    let joined = client.start().unwrap();
    let error_port = tracker.join().unwrap();
    assert!(!joined.session.error_signalled());
    let mut s = TcpStream::connect(("127.0.0.1", error_port)).unwrap();
    s.write_all(&(-1i32).to_le_bytes()).unwrap();
    drop(s);
    assert!(
        joined.session.wait_error_signal(LIMIT),
        "the signal was not noticed"
    );
    assert!(joined.session.error_signalled());
}

/// Kills the child on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three switchyard workers under XGBoost 3.x's own tracker: ranks from the task
/// ids, a ring whose links reach the right neighbours, and a job that ends after the
/// shutdowns.
#[test]
fn three_workers_under_xgboost_3_tracker() {
    let python = match std::env::var("SWITCHYARD_XGB3_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            assert!(
                std::env::var("SWITCHYARD_REQUIRE_XGBOOST").as_deref() != Ok("1"),
                "SWITCHYARD_REQUIRE_XGBOOST=1 but SWITCHYARD_XGB3_PYTHON is not set"
            );
            eprintln!("skipped: SWITCHYARD_XGB3_PYTHON is not set");
            return;
        }
    };
    let script = r#"
from xgboost.tracker import RabitTracker
t = RabitTracker(n_workers=3, host_ip="127.0.0.1", port=0, sortby="task")
t.start()
print("PORT", t.worker_args()["dmlc_tracker_port"], flush=True)
t.wait_for(60)
print("JOINED", flush=True)
"#;
    let mut child = Command::new(python)
        .args(["-u", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut child = Guard(child);
    let first = lines.next().unwrap().unwrap();
    let port: u16 = first.strip_prefix("PORT ").unwrap().trim().parse().unwrap();
    let workers: Vec<_> = ["w0", "w1", "w2"]
        .into_iter()
        .map(|task| {
            thread::spawn(move || {
                let client =
                    JsonClient::new("127.0.0.1", port, Some(task.into()), config()).unwrap();
                let mut j = client.start().unwrap();
                j.successor.write_all(&j.rank.to_le_bytes()).unwrap();
                j.predecessor.set_read_timeout(Some(LIMIT)).unwrap();
                let mut b = [0u8; 4];
                j.predecessor.read_exact(&mut b).unwrap();
                assert_eq!(u32::from_le_bytes(b), (j.rank + 2) % 3);
                (task, j.rank, j.world, j.session)
            })
        })
        .collect();
    let got: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (task, rank, world, _) in &got {
        assert_eq!((*task, *world), (["w0", "w1", "w2"][*rank as usize], 3));
    }
    for (_, _, _, session) in got {
        session.shutdown().unwrap();
    }
    // A line arrives (JOINED) only if the tracker ended its job; a hang ends with
    // the guard's kill when the 60 s wait_for raises.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l == "JOINED"), "{rest:?}");
    assert!(child.0.wait().unwrap().success());
}
