//! The handshake over real loopback TCP: right secret, wrong secret, no secret on either
//! side, replay, truncation at every offset, and many strangers in a row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use switchyard_secret::{AuthFailure, JobSecret, MAGIC, accept, connect};

const PURPOSE: &str = "test";
const LIMIT: Duration = Duration::from_secs(5);

fn secret(text: &str) -> JobSecret {
    JobSecret::new(text.as_bytes().to_vec(), "test").unwrap()
}

/// A listener whose next `count` accepted connections run the acceptor's side; the
/// thread returns each outcome.
fn acceptor(key: JobSecret, count: usize) -> (String, JoinHandle<Vec<Result<u32, AuthFailure>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        (0..count)
            .map(|_| {
                let (mut stream, _) = listener.accept().unwrap();
                accept(&mut stream, &key, PURPOSE, Instant::now() + LIMIT).map_err(|e| e.reason)
            })
            .collect()
    });
    (addr, handle)
}

fn dial(addr: &str) -> TcpStream {
    TcpStream::connect(addr).unwrap()
}

#[test]
fn the_right_secret_passes_both_ways_and_the_claimed_rank_arrives() {
    let key = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(key.clone(), 1);
    let mut stream = dial(&addr);
    connect(&mut stream, &key, PURPOSE, 7, Instant::now() + LIMIT).unwrap();
    assert_eq!(server.join().unwrap(), [Ok(7)]);
    // The stream is usable afterwards, with no timeouts left set.
    assert_eq!(stream.read_timeout().unwrap(), None);
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides() {
    let (addr, server) = acceptor(secret("0123456789abcdef0123456789abcdef"), 1);
    let mut stream = dial(&addr);
    let wrong = secret("fedcba9876543210fedcba9876543210");
    let err = connect(&mut stream, &wrong, PURPOSE, 0, Instant::now() + LIMIT).unwrap_err();
    assert_eq!(err.reason, AuthFailure::Closed, "{err}");
    assert!(err.to_string().contains(&addr), "{err}");
    assert_eq!(server.join().unwrap(), [Err(AuthFailure::BadConnectorTag)]);
}

#[test]
fn another_purpose_is_refused() {
    let key = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(key.clone(), 1);
    let mut stream = dial(&addr);
    assert!(connect(&mut stream, &key, "other", 0, Instant::now() + LIMIT).is_err());
    assert_eq!(server.join().unwrap(), [Err(AuthFailure::BadConnectorTag)]);
}

#[test]
fn a_peer_without_the_secret_sees_the_challenge_and_is_refused() {
    let (addr, server) = acceptor(secret("0123456789abcdef0123456789abcdef"), 1);
    let mut stream = dial(&addr);
    // A client speaking its own protocol straight away (68 bytes, the reply's size).
    stream.write_all(&[b'x'; 68]).unwrap();
    let mut opening = [0u8; 8];
    stream.read_exact(&mut opening).unwrap();
    assert_eq!(opening, MAGIC);
    assert!(switchyard_secret::looks_like_challenge(&opening));
    assert_eq!(server.join().unwrap(), [Err(AuthFailure::BadConnectorTag)]);
}

#[test]
fn a_listener_without_the_secret_is_found_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        // rabit's magic, as a tracker without a secret would answer.
        stream.write_all(&[0x99, 0xff, 0, 0, 0, 0, 0, 0]).unwrap();
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink);
    });
    let mut stream = dial(&addr);
    let key = secret("0123456789abcdef0123456789abcdef");
    let err = connect(&mut stream, &key, PURPOSE, 0, Instant::now() + LIMIT).unwrap_err();
    assert_eq!(err.reason, AuthFailure::PeerNotAuthenticating);
    drop(stream);
    server.join().unwrap();
}

#[test]
fn a_silent_listener_is_a_timeout_not_a_hang() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut stream = dial(&addr);
    let key = secret("0123456789abcdef0123456789abcdef");
    let start = Instant::now();
    let err = connect(
        &mut stream,
        &key,
        PURPOSE,
        0,
        Instant::now() + Duration::from_millis(200),
    )
    .unwrap_err();
    assert!(matches!(err.reason, AuthFailure::Timeout(_)), "{err}");
    // Given up at the 200 ms deadline; the bound leaves a loaded runner room.
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(listener);
}

/// A man in the middle records a good connector's reply to one challenge and plays
/// it back on a new connection: the new nonce makes it worthless.
#[test]
fn a_replayed_reply_is_refused() {
    let key = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(key.clone(), 2);
    // Recording: relay a real connector through this thread.
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = relay.local_addr().unwrap().to_string();
    let good = std::thread::spawn(move || {
        let mut stream = dial(&relay_addr);
        connect(&mut stream, &key, PURPOSE, 3, Instant::now() + LIMIT)
    });
    let (mut client, _) = relay.accept().unwrap();
    let mut upstream = dial(&addr);
    let mut opening = [0u8; 40];
    upstream.read_exact(&mut opening).unwrap();
    client.write_all(&opening).unwrap();
    let mut reply = [0u8; 68];
    client.read_exact(&mut reply).unwrap();
    upstream.write_all(&reply).unwrap();
    let mut tag_a = [0u8; 32];
    upstream.read_exact(&mut tag_a).unwrap();
    client.write_all(&tag_a).unwrap();
    good.join().unwrap().unwrap();
    // Replay on a fresh connection.
    let mut again = dial(&addr);
    again.read_exact(&mut opening).unwrap();
    again.write_all(&reply).unwrap();
    let mut rest = Vec::new();
    again.set_read_timeout(Some(LIMIT)).unwrap();
    let _ = again.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the acceptor answered a replay");
    assert_eq!(
        server.join().unwrap(),
        [Ok(3), Err(AuthFailure::BadConnectorTag)]
    );
}

/// A reply cut at every offset ends in an error (closed), never a panic or a hang.
#[test]
fn a_handshake_cut_at_every_offset_is_an_error() {
    let key = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(key.clone(), 68);
    for cut in 0..68 {
        let mut stream = dial(&addr);
        let mut opening = [0u8; 40];
        stream.read_exact(&mut opening).unwrap();
        stream.write_all(&vec![0u8; cut]).unwrap();
    }
    let outcomes = server.join().unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Err(AuthFailure::Closed)),
        "{outcomes:?}"
    );
}

/// Many strangers in a row, then a real peer: each stranger costs one short handshake.
#[test]
fn strangers_do_not_stop_a_real_peer() {
    let key = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(key.clone(), 51);
    for _ in 0..50 {
        let mut stream = dial(&addr);
        stream.write_all(&[0u8; 68]).unwrap();
    }
    let mut stream = dial(&addr);
    connect(&mut stream, &key, PURPOSE, 1, Instant::now() + LIMIT).unwrap();
    let outcomes = server.join().unwrap();
    assert_eq!(outcomes.last(), Some(&Ok(1)));
    assert_eq!(
        outcomes.iter().filter(|o| o.is_err()).count(),
        50,
        "{outcomes:?}"
    );
}

#[test]
fn the_secret_comes_from_one_variable_or_a_file_and_fails_closed() {
    assert!(JobSecret::from_vars(None, None).unwrap().is_none());
    assert!(
        JobSecret::from_vars(Some("0123456789abcdef".into()), None)
            .unwrap()
            .is_some()
    );
    let short = JobSecret::from_vars(Some("short".into()), None).unwrap_err();
    assert!(
        short.to_string().contains("SWITCHYARD_JOB_SECRET"),
        "{short}"
    );
    assert!(JobSecret::from_vars(Some(String::new()), None).is_err());
    assert!(JobSecret::from_vars(Some("a".repeat(20)), Some("/x".into())).is_err());
    let missing = JobSecret::from_vars(None, Some("/nonexistent/secret".into())).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/secret"),
        "{missing}"
    );

    let dir = std::env::temp_dir().join(format!("switchyard-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("secret");
    std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
    let from_file = JobSecret::from_vars(None, Some(path.to_string_lossy().into_owned()))
        .unwrap()
        .unwrap();
    // The file's trailing newline is not part of the secret: both forms agree.
    let from_text = secret("0123456789abcdef0123456789abcdef");
    let (addr, server) = acceptor(from_text, 1);
    connect(
        &mut dial(&addr),
        &from_file,
        PURPOSE,
        0,
        Instant::now() + LIMIT,
    )
    .unwrap();
    assert_eq!(server.join().unwrap(), [Ok(0)]);
    std::fs::remove_dir_all(&dir).unwrap();

    let (generated, text) = JobSecret::generate().unwrap();
    assert_eq!(text.len(), 64);
    // Debug never shows the secret.
    assert!(!format!("{generated:?}").contains(&text));
}
