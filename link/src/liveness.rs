//! Heartbeats beside the [`StreamLink`](super::StreamLink): telling a peer that is
//! stopped (SIGSTOP) or cut off (a partition, no RST) from one that is merely busy.
//!
//! A dead peer shows up at once as a closed TCP connection, but a silent one does not:
//! its connection stays open and the kernel says nothing. The silence timeout
//! (`CommOptions::timeout`) cannot tell "stopped" from "computing between two
//! calls", so it has to be long. Here every rank runs one thread that sends a small
//! UDP datagram to every peer each interval and records when it last heard each peer.
//! The thread beats whatever the rank's own code is doing, so a rank busy in user code
//! keeps beating; a stopped process, or one whose network is cut, does not. A rank
//! waiting for a message from a peer that has missed its beats for longer than the
//! deadline gives up on it ([`Beats::silent`]).
//!
//! A datagram (little-endian, [`DATAGRAM_LEN`] bytes): `"SYB1"`, the sender's rank
//! `u32`, the sender's tag `u64`. Each rank draws a random tag when the mesh is set up
//! and announces it with its heartbeat port; a datagram whose tag is not its sender's
//! (a stray packet, a beat from an earlier mesh on a reused port) is ignored, and one
//! that is not a datagram of this format at all is ignored and counted.
//!
//! Why UDP and a thread of its own: beats on the TCP connections would queue behind
//! megabytes of collective data and could only be sent by the thread that makes the
//! calls, which is exactly the thread that may be busy for seconds in user code.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// First bytes of every heartbeat datagram.
pub(crate) const BEAT_MAGIC: [u8; 4] = *b"SYB1";
/// Bytes of a heartbeat datagram.
pub(crate) const DATAGRAM_LEN: usize = 16;
/// Bytes of the heartbeat part of a rank's setup message: port `u16`, deadline in
/// milliseconds `u32`, tag `u64` (port 0: this rank runs no heartbeat).
pub(crate) const ANNOUNCE_LEN: usize = 14;
/// The shortest interval between two beats, whatever the deadline: below it the beats
/// would cost more than they tell.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The interval between beats for a deadline: an eighth of it, so that a peer misses
/// several beats (lost datagrams, a late wake-up) before the deadline passes, and at
/// least [`MIN_INTERVAL`].
pub(crate) fn interval_for(deadline: Duration) -> Duration {
    (deadline / 8).max(MIN_INTERVAL)
}

/// A heartbeat datagram from rank `rank` with tag `tag`.
pub(crate) fn encode_beat(rank: usize, tag: u64) -> [u8; DATAGRAM_LEN] {
    let mut out = [0u8; DATAGRAM_LEN];
    out[..4].copy_from_slice(&BEAT_MAGIC);
    // Ranks beyond u32 cannot form a mesh (the hello carries a u32 too).
    out[4..8].copy_from_slice(&(rank as u32).to_le_bytes());
    out[8..].copy_from_slice(&tag.to_le_bytes());
    out
}

/// The sender's rank and tag of a heartbeat datagram, or `None` when `bytes` is not
/// one (wrong length or magic).
pub(crate) fn decode_beat(bytes: &[u8]) -> Option<(usize, u64)> {
    let bytes: &[u8; DATAGRAM_LEN] = bytes.try_into().ok()?;
    if bytes[..4] != BEAT_MAGIC {
        return None;
    }
    let rank = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&bytes[8..]);
    Some((rank, u64::from_le_bytes(tag)))
}

/// What a rank tells its peers about its heartbeat in its setup message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Announce {
    /// The UDP port its beats come from and go to, on the IP of its data listener;
    /// 0 when it runs no heartbeat.
    pub(crate) port: u16,
    /// Its deadline; the beats of every rank follow the shortest one announced.
    pub(crate) deadline: Duration,
    /// The tag its datagrams carry.
    pub(crate) tag: u64,
}

impl Announce {
    /// The announcement of a rank that runs no heartbeat.
    pub(crate) const OFF: Announce = Announce {
        port: 0,
        deadline: Duration::ZERO,
        tag: 0,
    };

    /// Whether the rank runs a heartbeat.
    pub(crate) fn is_on(&self) -> bool {
        self.port != 0
    }

    /// The announcement as the setup message's second frame.
    pub(crate) fn encode(&self) -> [u8; ANNOUNCE_LEN] {
        let mut out = [0u8; ANNOUNCE_LEN];
        out[..2].copy_from_slice(&self.port.to_le_bytes());
        let millis = u32::try_from(self.deadline.as_millis()).unwrap_or(u32::MAX);
        out[2..6].copy_from_slice(&millis.to_le_bytes());
        out[6..].copy_from_slice(&self.tag.to_le_bytes());
        out
    }

    /// The announcement in a setup message's second frame; a missing or malformed one
    /// means the peer runs no heartbeat (it cannot be watched, so it is not).
    pub(crate) fn decode(frame: Option<&[u8]>) -> Announce {
        let Some(bytes) = frame.and_then(|f| <&[u8; ANNOUNCE_LEN]>::try_from(f).ok()) else {
            return Announce::OFF;
        };
        let port = u16::from_le_bytes([bytes[0], bytes[1]]);
        let millis = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&bytes[6..]);
        let deadline = Duration::from_millis(u64::from(millis));
        if port == 0 || deadline.is_zero() {
            return Announce::OFF;
        }
        Announce {
            port,
            deadline,
            tag: u64::from_le_bytes(tag),
        }
    }
}

/// What one received datagram was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// A beat from this rank.
    Beat(usize),
    /// A well-formed beat that is not from a watched peer of this mesh (unknown rank
    /// or wrong tag): a stray or an old generation's; ignored.
    Stray,
    /// Not a heartbeat datagram; ignored and counted.
    Malformed,
}

/// The heartbeat's bookkeeping, shared by the beating thread (which writes) and the
/// link (which reads): when each peer was last heard, and whether this process's own
/// thread has been running, so that a rank that was itself stopped does not blame its
/// peers for the beats it could not hear. Times are nanoseconds since `base`, in
/// atomics, so that neither side ever waits for the other.
#[derive(Debug)]
pub(crate) struct Beats {
    /// When the heartbeat started: a peer not heard since counts from here.
    base: Instant,
    /// The tag each watched peer's beats carry; `None` for this rank and for peers
    /// that run no heartbeat.
    tags: Vec<Option<u64>>,
    /// When each peer's last beat arrived.
    heard: Vec<AtomicU64>,
    /// When the beating thread last woke.
    tick: AtomicU64,
    /// When the beating thread last woke after a stall (a gap of more than
    /// `stall`): every peer's silence counts from then at the earliest.
    resumed: AtomicU64,
    /// Datagrams that were not heartbeats.
    malformed: AtomicU64,
    /// Well-formed beats with a wrong rank or tag.
    stray: AtomicU64,
    /// How long a peer may miss its beats.
    deadline: Duration,
    /// The interval between beats, of every rank of the mesh.
    interval: Duration,
    /// A gap between two wake-ups of the beating thread longer than this is a stall
    /// of this process, not silence of its peers.
    stall: Duration,
}

impl Beats {
    /// Bookkeeping from `base` for peers whose beats carry `tags`, giving up on one
    /// that misses its beats (every `interval`) for longer than `deadline`.
    pub(crate) fn new(
        base: Instant,
        tags: Vec<Option<u64>>,
        deadline: Duration,
        interval: Duration,
    ) -> Beats {
        let heard = tags.iter().map(|_| AtomicU64::new(0)).collect();
        Beats {
            base,
            tags,
            heard,
            tick: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            stray: AtomicU64::new(0),
            deadline,
            interval,
            // The thread wakes at least once an interval; two is a late wake-up under
            // load at worst, more is this process having been stopped or starved.
            stall: interval * 2,
        }
    }

    fn since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn at(&self, nanos: &AtomicU64) -> Instant {
        self.base + Duration::from_nanos(nanos.load(Ordering::Relaxed))
    }

    /// The deadline.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Whether `peer`'s beats are watched.
    pub(crate) fn watches(&self, peer: usize) -> bool {
        self.tags.get(peer).copied().flatten().is_some()
    }

    /// Files one datagram that arrived at `now`.
    pub(crate) fn receive(&self, datagram: &[u8], now: Instant) -> Received {
        let Some((rank, tag)) = decode_beat(datagram) else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return Received::Malformed;
        };
        if self.tags.get(rank).copied().flatten() != Some(tag) {
            self.stray.fetch_add(1, Ordering::Relaxed);
            return Received::Stray;
        }
        self.heard[rank].fetch_max(self.since_base(now), Ordering::Relaxed);
        Received::Beat(rank)
    }

    /// Notes that the beating thread woke at `now`; a gap since its last wake-up longer
    /// than a stall means this process was stopped or starved, and the peers' silence
    /// counts again from now (their beats of the gap may still be in the socket).
    pub(crate) fn ticked(&self, now: Instant) {
        let now = self.since_base(now);
        let last = self.tick.swap(now, Ordering::Relaxed);
        if now.saturating_sub(last) > u64::try_from(self.stall.as_nanos()).unwrap_or(u64::MAX) {
            self.resumed.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// When `peer`'s silence began, for a rank whose data connection last brought a
    /// byte from it at `data`: its next beat was due one interval after the last sign
    /// of life, so that a peer stopped right after a beat is never given less than the
    /// deadline. `None` when `peer` is not watched.
    fn silent_since(&self, peer: usize, data: Instant) -> Option<Instant> {
        if !self.watches(peer) {
            return None;
        }
        let heard = self.at(&self.heard[peer]).max(data);
        Some((heard + self.interval).max(self.at(&self.resumed)))
    }

    /// How long `peer` has missed its beats, when that is longer than the deadline and
    /// this rank can tell (its own beating thread has been running; just after this
    /// process was stopped it cannot). `data`: when the data connection last brought a
    /// byte from `peer`, another sign of life. `None`: `peer` is alive as far as is
    /// known, or not watched.
    pub(crate) fn silent(&self, peer: usize, data: Instant, now: Instant) -> Option<Duration> {
        let since = self.silent_since(peer, data)?;
        if now.saturating_duration_since(self.at(&self.tick)) > self.stall {
            return None;
        }
        let missed = now.saturating_duration_since(since);
        (missed > self.deadline).then(|| now.saturating_duration_since(since - self.interval))
    }

    /// When `peer` will have missed its beats for the deadline if nothing arrives
    /// before; `None` when it is not watched.
    pub(crate) fn due(&self, peer: usize, data: Instant) -> Option<Instant> {
        Some(self.silent_since(peer, data)? + self.deadline)
    }

    /// Datagrams received that were not heartbeats.
    pub(crate) fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Well-formed beats ignored for their rank or tag.
    pub(crate) fn stray(&self) -> u64 {
        self.stray.load(Ordering::Relaxed)
    }
}

/// A running heartbeat: the thread that beats and listens, and its bookkeeping. The
/// thread stops when this is dropped (with the link).
#[derive(Debug)]
pub(crate) struct Liveness {
    beats: Arc<Beats>,
    stop: Arc<AtomicBool>,
    /// Where a datagram wakes the thread when it is told to stop.
    wake: Option<SocketAddr>,
    thread: Option<JoinHandle<()>>,
}

impl Liveness {
    /// Starts rank `rank`'s heartbeat on `socket`: beats every `interval` to each of
    /// `targets` (the watched peers' heartbeat addresses), and files what arrives in
    /// `beats`.
    pub(crate) fn start(
        rank: usize,
        socket: UdpSocket,
        beats: Beats,
        interval: Duration,
        targets: Vec<SocketAddr>,
        tag: u64,
    ) -> std::io::Result<Liveness> {
        socket.set_nonblocking(true)?;
        let wake = socket.local_addr().ok().map(|mut a| {
            // A socket bound to the wildcard is reached on loopback.
            if a.ip().is_unspecified() {
                a.set_ip(match a {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            a
        });
        let beats = Arc::new(beats);
        let stop = Arc::new(AtomicBool::new(false));
        beats.ticked(Instant::now());
        let thread = {
            let (beats, stop) = (Arc::clone(&beats), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("switchyard-heartbeat-{rank}"))
                .spawn(move || beat(&socket, &beats, &stop, interval, &targets, tag, rank))?
        };
        Ok(Liveness {
            beats,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// The bookkeeping.
    pub(crate) fn beats(&self) -> &Beats {
        &self.beats
    }
}

impl Drop for Liveness {
    /// Stops the thread and waits for it: a datagram to its own socket wakes it at
    /// once; without one it notices the flag within an interval anyway.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let (Some(wake), Ok(socket)) = (self.wake, UdpSocket::bind(("127.0.0.1", 0))) {
            let _ = socket.send_to(b"stop", wake);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The heartbeat thread: sends the beat to every target each `interval` and, between
/// beats, sleeps in `poll(2)` until a datagram arrives. No allocation per beat: the
/// datagram and the targets are built once.
fn beat(
    socket: &UdpSocket,
    beats: &Beats,
    stop: &AtomicBool,
    interval: Duration,
    targets: &[SocketAddr],
    tag: u64,
    rank: usize,
) {
    let datagram = encode_beat(rank, tag);
    let mut buf = [0u8; 64];
    let mut next = Instant::now();
    let mut reported = 0;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        beats.ticked(now);
        if now >= next {
            for target in targets {
                // Best effort: a lost beat is what the deadline's margin is for, and a
                // peer that is gone is reported by its closed connection.
                let _ = socket.send_to(&datagram, target);
            }
            next += interval;
            if next <= now {
                // After a stall, beat on from now rather than in a burst.
                next = now + interval;
            }
        }
        loop {
            match socket.recv_from(&mut buf) {
                Ok((len, _)) => {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    beats.receive(&buf[..len], Instant::now());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // WouldBlock, or an error a datagram socket reports for an earlier
                // send (an ICMP port unreachable): nothing more to read now.
                Err(_) => break,
            }
        }
        // Said once per wake-up with news, not per datagram: a flood of junk must not
        // become a flood of log lines.
        let (malformed, stray) = (beats.malformed(), beats.stray());
        if malformed + stray > reported {
            reported = malformed + stray;
            tracing::debug!(rank, malformed, stray, "heartbeat: datagrams ignored");
        }
        let wait = next.saturating_duration_since(Instant::now());
        let mut fd = libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = wait.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
        // SAFETY: `fd` is one valid pollfd, exclusively borrowed for the call.
        unsafe {
            libc::poll(&mut fd, 1, millis);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const DEADLINE: Duration = Duration::from_millis(800);
    const INTERVAL: Duration = Duration::from_millis(100);

    #[test]
    fn a_beat_decodes_to_what_was_encoded() {
        let beat = encode_beat(7, 0x0123_4567_89ab_cdef);
        assert_eq!(beat.len(), DATAGRAM_LEN);
        assert_eq!(&beat[..4], b"SYB1");
        assert_eq!(decode_beat(&beat), Some((7, 0x0123_4567_89ab_cdef)));
        // Wrong length either way, wrong magic (the stream hello's, for one).
        assert_eq!(decode_beat(&beat[..15]), None);
        assert_eq!(decode_beat(&[beat.as_slice(), &[0]].concat()), None);
        let mut hello = beat;
        hello[..4].copy_from_slice(b"SYH1");
        assert_eq!(decode_beat(&hello), None);
        assert_eq!(decode_beat(&[]), None);
    }

    #[test]
    fn an_announcement_decodes_to_what_was_encoded_and_anything_else_is_off() {
        let on = Announce {
            port: 40_001,
            deadline: DEADLINE,
            tag: 99,
        };
        assert!(on.is_on());
        assert_eq!(Announce::decode(Some(&on.encode())), on);
        assert_eq!(
            Announce::decode(Some(&Announce::OFF.encode())),
            Announce::OFF
        );
        assert!(!Announce::decode(None).is_on());
        assert!(!Announce::decode(Some(&on.encode()[..13])).is_on());
        let mut no_deadline = on;
        no_deadline.deadline = Duration::ZERO;
        assert!(!Announce::decode(Some(&no_deadline.encode())).is_on());
    }

    #[test]
    fn the_interval_is_an_eighth_of_the_deadline_and_at_least_ten_ms() {
        assert_eq!(interval_for(DEADLINE), INTERVAL);
        assert_eq!(interval_for(Duration::from_millis(40)), MIN_INTERVAL);
    }

    fn three_ranks(base: Instant) -> Beats {
        Beats::new(base, vec![None, Some(11), Some(22)], DEADLINE, INTERVAL)
    }

    #[test]
    fn beats_are_filed_by_rank_and_strays_and_malformed_ones_are_not() {
        let base = Instant::now();
        let beats = three_ranks(base);
        let at = base + Duration::from_millis(300);
        assert_eq!(beats.receive(&encode_beat(1, 11), at), Received::Beat(1));
        // Rank 2's tag from rank 1, an unwatched rank (this one), a rank outside the
        // world: strays, filed nowhere.
        assert_eq!(beats.receive(&encode_beat(1, 22), at), Received::Stray);
        assert_eq!(beats.receive(&encode_beat(0, 11), at), Received::Stray);
        assert_eq!(beats.receive(&encode_beat(9, 11), at), Received::Stray);
        assert_eq!(beats.receive(b"stop", at), Received::Malformed);
        assert_eq!(beats.receive(&[0u8; DATAGRAM_LEN], at), Received::Malformed);
        assert_eq!((beats.stray(), beats.malformed()), (3, 2));
        assert_eq!(beats.at(&beats.heard[1]), at);
        assert_eq!(beats.at(&beats.heard[2]), base);
        // A late-filed older beat does not move the clock back.
        beats.receive(&encode_beat(1, 11), base + Duration::from_millis(100));
        assert_eq!(beats.at(&beats.heard[1]), at);
    }

    #[test]
    fn a_peer_is_silent_once_it_missed_its_beats_for_the_deadline() {
        let base = Instant::now();
        let beats = three_ranks(base);
        let ms = |n: u64| base + Duration::from_millis(n);
        beats.receive(&encode_beat(1, 11), ms(1000));
        // This rank's own thread runs all along, waking every 10 ms.
        let ticked = std::cell::Cell::new(0);
        let check = |peer: usize, now: Instant| {
            while base + Duration::from_millis(ticked.get()) < now {
                beats.ticked(base + Duration::from_millis(ticked.get()));
                ticked.set(ticked.get() + 10);
            }
            beats.silent(peer, base, now)
        };
        // Rank 1: last beat at 1000, next due at 1100, silent after 1900.
        assert_eq!(beats.due(1, base), Some(ms(1900)));
        assert_eq!(check(1, ms(1050)), None);
        assert_eq!(check(1, ms(1900)), None);
        assert_eq!(check(1, ms(1912)), Some(Duration::from_millis(912)));
        // Rank 2 was never heard: it counts from the start (the setup).
        assert_eq!(check(2, ms(800)), None);
        assert!(check(2, ms(1000)).is_some());
        // A byte on the data connection is a sign of life too.
        assert_eq!(beats.silent(1, ms(1500), ms(1912)), None);
        assert_eq!(beats.due(1, ms(1500)), Some(ms(2400)));
        // This rank is never silent to itself, nor is a peer out of the world.
        assert_eq!(check(0, ms(5000)), None);
        assert_eq!(check(5, ms(5000)), None);
    }

    #[test]
    fn a_rank_that_was_itself_stopped_does_not_blame_its_peers() {
        let base = Instant::now();
        let beats = three_ranks(base);
        let ms = |n: u64| base + Duration::from_millis(n);
        beats.ticked(ms(0));
        beats.receive(&encode_beat(1, 11), ms(50));
        beats.ticked(ms(100));
        // This process is stopped from 100 to 3100: its thread did not run, so at 3100
        // nothing can be said yet...
        assert_eq!(beats.silent(1, base, ms(3100)), None);
        // ...and once the thread runs again the silence counts from its wake-up.
        beats.ticked(ms(3100));
        assert_eq!(beats.silent(1, base, ms(3150)), None);
        for t in (3200..=3900).step_by(100) {
            beats.ticked(ms(t));
        }
        assert_eq!(beats.silent(1, base, ms(3890)), None);
        assert!(beats.silent(1, base, ms(3910)).is_some());
    }

    /// Two heartbeats on loopback hear each other; once one stops, the other finds it
    /// silent after the deadline. A datagram from a stranger is counted, not filed.
    #[test]
    fn two_threads_on_loopback_hear_each_other_until_one_stops() {
        let deadline = Duration::from_millis(200);
        let interval = interval_for(deadline);
        let sockets: Vec<UdpSocket> = (0..2)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
        let tags = [5u64, 6];
        let base = Instant::now();
        let mut running: Vec<Option<Liveness>> = sockets
            .into_iter()
            .enumerate()
            .map(|(rank, socket)| {
                let peer = 1 - rank;
                let mut watched = vec![None, None];
                watched[peer] = Some(tags[peer]);
                let beats = Beats::new(base, watched, deadline, interval);
                Some(
                    Liveness::start(rank, socket, beats, interval, vec![addrs[peer]], tags[rank])
                        .unwrap(),
                )
            })
            .collect();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(b"not a beat", addrs[0]).unwrap();
        stranger.send_to(&encode_beat(1, 7), addrs[0]).unwrap();
        std::thread::sleep(deadline * 2);
        let zero = running[0].as_ref().unwrap();
        assert_eq!(zero.beats().silent(1, base, Instant::now()), None);
        assert_eq!(zero.beats().malformed(), 1);
        assert_eq!(zero.beats().stray(), 1);
        // Rank 1 stops beating (as if stopped); rank 0 notices, never before the
        // deadline (less the one interval by which its last beat may precede the stop).
        let stopped = Instant::now();
        running[1] = None;
        let zero = running[0].as_ref().unwrap();
        let found = loop {
            if zero.beats().silent(1, base, Instant::now()).is_some() {
                break stopped.elapsed();
            }
            assert!(stopped.elapsed() < deadline * 5, "never found silent");
            std::thread::sleep(Duration::from_millis(2));
        };
        assert!(found >= deadline - interval, "{found:?}");
    }
}
