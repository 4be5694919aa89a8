//! The mesh set-up's decisions, without sockets or clocks: which peer to read, to
//! connect to or to wait for next, which accepted connection to keep, when the set-up
//! is complete or has failed, and whom a failure blames. The time is passed in.
//!
//! The shell (`setup.rs`) does what each [`Step`] says and reports back what came of
//! it; the simulation (`sim_tests.rs`) drives the same machine over a simulated
//! network and clock. The order is fixed: every peer's setup message is read before
//! any connection is made, a rank connects to the peers above it, one after another,
//! and only then accepts the peers below it, so the lower rank of a pair always
//! connects and the other always accepts: a pair never gets two connections, and no
//! rank waits for a connection its peer is not going to make.
//!
//! Nothing is retried. A peer's data listener is bound before its address is sent, so
//! a refused connection means the peer's process is gone, and a connection that fails
//! later (a reset, a refused job secret) is not going to work better the second time;
//! a rank that reports it at once lets the others learn it from its notice instead of
//! at their deadlines.

use crate::blame::{PROBE_WAIT, Seen};
use crate::framing::{HELLO_LEN, decode_hello};
use crate::{LinkError, Topology};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long an accepted connection may take to prove the job secret and say hello:
/// long enough for a loaded peer, short enough that a stranger which says nothing
/// holds no slot for long.
pub(super) const HELLO_LIMIT: Duration = Duration::from_secs(5);

/// How often the wait for the lower ranks' connections looks for abort notices: a
/// rank below that gave up never connects, and its notice says why.
pub(super) const ABORT_LOOK: Duration = Duration::from_millis(20);

/// What the shell does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Send this rank's setup message to each of these peers, in this order, each by
    /// the deadline; then [`MeshSteps::announced`].
    Announce(Vec<usize>),
    /// Read this peer's setup message, by the deadline; then
    /// [`MeshSteps::heard_from`] with the data address it announced.
    Read(usize),
    /// Every setup message is in: start what needs every peer's address (the
    /// heartbeat), then [`MeshSteps::proceed`].
    Heard,
    /// Connect to `peer` at `addr`, waiting at most `wait`, prove the job secret and
    /// say hello, all by the deadline; then [`MeshSteps::connected`].
    Connect {
        /// The peer above this rank.
        peer: usize,
        /// Its data listener.
        addr: SocketAddr,
        /// How long the TCP connect may take (at least 1 ms, so that a rank at its
        /// deadline still gets an answer from a listener that is there).
        wait: Duration,
    },
    /// Read the abort notices that came; then [`MeshSteps::looked`].
    LookForAborts,
    /// Accept the connections waiting, each handshake bounded by
    /// [`hello_by`], and wait for the next handshake to end, until `until` at most;
    /// give its outcome to [`MeshSteps::hello`], then [`MeshSteps::poll`].
    Accept {
        /// When the machine needs to look again, with or without a handshake.
        until: Instant,
    },
    /// Every connection is made.
    Linked,
    /// The set-up failed, for this reason (see [`Blame`] for what to tell the peers).
    Failed(LinkError),
}

/// What to do with an accepted connection whose handshake ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hello {
    /// Keep it: it is rank `.0`'s connection.
    Take(usize),
    /// Close it: a valid hello, but from a rank this one does not wait for (a rank
    /// that connects the other way, one already linked, a replay, a stranger's
    /// claim).
    Unexpected(usize),
    /// Close it: the handshake failed (no hello by its deadline, another job's hello,
    /// a refused secret).
    Bad(String),
}

/// Where the set-up is: each event is expected in one phase only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Announcing,
    /// Reading the setup message of this peer.
    Reading(usize),
    Heard,
    /// Connecting to this peer.
    Connecting(usize),
    Accepting,
    Over,
}

/// A hand-made break of one decision, for the simulation's proof that it finds
/// such a break (`sim_tests.rs`); only the tests make one.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Break {
    /// A hello from a rank already linked is taken again, replacing the first
    /// connection (the duplicate check removed).
    TakeDuplicates,
    /// At the deadline the first rank below is blamed, whether its connection came
    /// or not (the absence check removed).
    BlameAnyBelow,
    /// A connection that timed out is blamed as one that closed (the design before
    /// the simulation found what it costs, see [`MeshSteps::blame`]).
    TimeoutAsGone,
}

/// Why a connection to a peer failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unreached {
    /// In words, for the error.
    pub(super) reason: String,
    /// It ran out of time: the peer's listener, or its side of the job secret's
    /// handshake, did not answer. A silence, not a closed door.
    pub(super) timed_out: bool,
}

/// One rank's mesh set-up: rank `rank` of `size`, connected as `topology` says.
#[derive(Debug)]
pub(super) struct MeshSteps {
    rank: usize,
    size: usize,
    topology: Topology,
    timeout: Duration,
    deadline: Instant,
    phase: Phase,
    /// Each peer's data address, as announced (this rank's own stays empty).
    addrs: Vec<String>,
    /// Which peers this rank holds a connection to.
    linked: Vec<bool>,
    /// When the abort notices were last looked at.
    looked: Instant,
    /// The peer whose connection timed out, if that is how the set-up failed.
    timed_out: Option<usize>,
    /// Always `None` but in the simulation's proof.
    broken: Option<Break>,
}

impl MeshSteps {
    /// The set-up of rank `rank` of `size` under `topology`, started at `now`, giving
    /// up `timeout` later.
    pub(super) fn new(
        rank: usize,
        size: usize,
        topology: Topology,
        timeout: Duration,
        now: Instant,
    ) -> MeshSteps {
        MeshSteps {
            rank,
            size,
            topology,
            timeout,
            deadline: now + timeout,
            phase: Phase::Start,
            addrs: vec![String::new(); size],
            linked: vec![false; size],
            looked: now,
            timed_out: None,
            broken: None,
        }
    }

    /// The same machine with one decision broken by hand.
    #[cfg(test)]
    pub(super) fn broken(mut self, how: Option<Break>) -> MeshSteps {
        self.broken = how;
        self
    }

    fn is_broken(&self, how: Break) -> bool {
        self.broken == Some(how)
    }

    /// Which pairs of ranks get a connection.
    pub(super) fn topology(&self) -> Topology {
        self.topology
    }

    /// When the set-up gives up: every wait of the shell ends by then.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The address `peer` announced (empty before its setup message came).
    pub(super) fn addr(&self, peer: usize) -> &str {
        &self.addrs[peer]
    }

    /// The first step: announce to every peer, connected or not, since every rank
    /// needs every address for the host groups and the heartbeat.
    pub(super) fn start(&mut self) -> Step {
        self.phase = Phase::Announcing;
        Step::Announce((0..self.size).filter(|&p| p != self.rank).collect())
    }

    /// The setup messages went out.
    pub(super) fn announced(&mut self) -> Step {
        debug_assert_eq!(self.phase, Phase::Announcing);
        self.read_after(None)
    }

    /// `peer`'s setup message came, announcing `addr`.
    pub(super) fn heard_from(&mut self, peer: usize, addr: String) -> Step {
        debug_assert_eq!(self.phase, Phase::Reading(peer));
        self.addrs[peer] = addr;
        self.read_after(Some(peer))
    }

    /// Reads the peers in rank order: a wait on a silent peer names that peer, and
    /// the messages of the others wait in the control link meanwhile.
    fn read_after(&mut self, peer: Option<usize>) -> Step {
        let from = peer.map_or(0, |p| p + 1);
        match (from..self.size).find(|&p| p != self.rank) {
            Some(next) => {
                self.phase = Phase::Reading(next);
                Step::Read(next)
            }
            None => {
                self.phase = Phase::Heard;
                Step::Heard
            }
        }
    }

    /// What was started on [`Step::Heard`] runs: on to the connections.
    pub(super) fn proceed(&mut self, now: Instant) -> Step {
        debug_assert_eq!(self.phase, Phase::Heard);
        self.connect_after(None, now)
    }

    /// Connects upwards, in rank order; then accepts from below.
    fn connect_after(&mut self, peer: Option<usize>, now: Instant) -> Step {
        let from = peer.map_or(self.rank + 1, |p| p + 1);
        let next = (from..self.size).find(|&p| self.topology.connects(self.rank, p));
        let Some(peer) = next else {
            self.phase = Phase::Accepting;
            self.looked = now;
            return self.poll(now);
        };
        self.phase = Phase::Connecting(peer);
        let Ok(addr) = self.addrs[peer].parse::<SocketAddr>() else {
            // A peer that announces something else is misconfigured or not of this
            // job: the failure is this rank's to report, not a silence to blame.
            self.phase = Phase::Over;
            return Step::Failed(LinkError::Transport {
                rank: self.rank,
                reason: format!("rank {peer} sent a bad address {:?}", self.addrs[peer]),
            });
        };
        let wait = self
            .deadline
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        Step::Connect { peer, addr, wait }
    }

    /// The connection to `peer` is made, authenticated and greeted, or failed: the
    /// set-up fails on the peer.
    pub(super) fn connected(
        &mut self,
        peer: usize,
        result: Result<(), Unreached>,
        now: Instant,
    ) -> Step {
        debug_assert_eq!(self.phase, Phase::Connecting(peer));
        match result {
            Ok(()) => {
                self.linked[peer] = true;
                self.connect_after(Some(peer), now)
            }
            Err(Unreached { reason, timed_out }) => {
                self.phase = Phase::Over;
                self.timed_out = timed_out.then_some(peer);
                Step::Failed(LinkError::Lost {
                    rank: peer,
                    endpoint: format!("tcp://{}", self.addrs[peer]),
                    reason,
                })
            }
        }
    }

    /// The abort notices were looked at and none came.
    pub(super) fn looked(&mut self, now: Instant) -> Step {
        self.looked = now;
        self.poll(now)
    }

    /// Whether an accepted connection whose handshake ended with `claimed` (the rank
    /// its hello named, or why the handshake failed) is kept. Only a rank below that
    /// connects to this one and is not linked yet: anything else is closed, and the
    /// wait goes on.
    pub(super) fn hello(&mut self, claimed: Result<usize, String>) -> Hello {
        let peer = match claimed {
            Ok(peer) => peer,
            Err(reason) => return Hello::Bad(reason),
        };
        let expected = peer < self.rank && self.topology.connects(peer, self.rank);
        let duplicate = self.linked[peer] && !self.is_broken(Break::TakeDuplicates);
        if self.phase != Phase::Accepting || !expected || duplicate {
            return Hello::Unexpected(peer);
        }
        self.linked[peer] = true;
        Hello::Take(peer)
    }

    /// Whom this set-up's failure `e` blames: [`Blame::of`], except that a connection
    /// that timed out is a silence (the peer may be waiting itself, and will say for
    /// whom), not a closed connection. A rank whose connect to a stopped peer blocks
    /// (with a job secret, until its deadline) is itself silent to the ranks below it,
    /// which give up on it; taken as closed, the chain of their notices that comes
    /// back to it would make it report that the peers gave up waiting for it, and
    /// name itself instead of the stopped peer.
    pub(super) fn blame(&self, e: &LinkError) -> Blame {
        match (Blame::of(self.rank, e), e) {
            (Blame::Peer { rank, .. }, LinkError::Lost { .. })
                if self.timed_out == Some(rank) && !self.is_broken(Break::TimeoutAsGone) =>
            {
                Blame::Peer {
                    rank,
                    seen: Seen::Silent,
                }
            }
            (blame, _) => blame,
        }
    }

    /// What to do now, while accepting: done once every rank below connected; a
    /// look at the abort notices every [`ABORT_LOOK`]; failed at the deadline,
    /// blaming the lowest rank whose connection did not come (the others below may
    /// wait on it too, through the chain of connects).
    pub(super) fn poll(&mut self, now: Instant) -> Step {
        debug_assert_eq!(self.phase, Phase::Accepting);
        let below = |p: &usize| self.topology.connects(*p, self.rank);
        if (0..self.rank).filter(below).all(|p| self.linked[p]) {
            self.phase = Phase::Over;
            return Step::Linked;
        }
        if now.saturating_duration_since(self.looked) >= ABORT_LOOK {
            return Step::LookForAborts;
        }
        if now >= self.deadline {
            let any = self.is_broken(Break::BlameAnyBelow);
            let absent = (0..self.rank)
                .filter(below)
                .find(|&p| any || !self.linked[p]);
            self.phase = Phase::Over;
            return Step::Failed(LinkError::Timeout {
                rank: absent.unwrap_or(0),
                waited: self.timeout,
            });
        }
        Step::Accept {
            until: self.deadline.min(self.looked + ABORT_LOOK),
        }
    }
}

/// The deadline of the handshake of a connection accepted at `now`, in a set-up that
/// gives up at `deadline`.
pub(super) fn hello_by(deadline: Instant, now: Instant) -> Instant {
    deadline.min(now + HELLO_LIMIT)
}

/// The rank a connection's `hello` names, checked against this world of `size`
/// ranks and, with a job secret, against the rank the connector authenticated as
/// (`claimed`): a rank that proved one identity cannot say hello as another.
pub(super) fn check_hello(
    hello: &[u8; HELLO_LEN],
    size: usize,
    claimed: Option<u32>,
) -> Result<usize, String> {
    let peer = decode_hello(hello, size).map_err(|e| e.to_string())?;
    match claimed {
        Some(claimed) if claimed as usize != peer => Err(format!(
            "hello from rank {peer} after authenticating as rank {claimed}"
        )),
        _ => Ok(peer),
    }
}

/// Whom a failed set-up blames, which decides what this rank tells its peers and in
/// which order (see `blame.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blame {
    /// The failure began on this rank (a misconfiguration, a local error): its notice
    /// blames no one, and there is nothing to explain.
    Own,
    /// The wait on `rank` failed as `seen`: the notices are followed from it.
    Peer {
        /// The peer the wait failed on.
        rank: usize,
        /// How.
        seen: Seen,
    },
}

impl Blame {
    /// The blame of rank `me`'s failure `e`.
    pub(super) fn of(me: usize, e: &LinkError) -> Blame {
        let (rank, seen) = match e {
            LinkError::Timeout { rank, .. } => (*rank, Seen::Silent),
            LinkError::Lost { rank, .. } => (*rank, Seen::Gone),
            LinkError::Aborted { rank, .. } => (*rank, Seen::Aborted),
            _ => return Blame::Own,
        };
        if rank == me {
            return Blame::Own;
        }
        Blame::Peer { rank, seen }
    }

    /// Whether this rank's notice goes out before it follows the others': when it
    /// failed on a peer's notice it is a link in a chain, and the ranks waiting for it
    /// follow the chain on through it at once. A rank that failed on a silence or a
    /// closed connection first waits to see whether the blamed rank explains itself,
    /// so that its notice blames where the chain really ends.
    pub(super) fn notice_first(self) -> bool {
        matches!(
            self,
            Blame::Peer {
                seen: Seen::Aborted,
                ..
            }
        )
    }
}

/// How long a rank that failed at `now` follows the notices: a blamed peer that is
/// alive is waiting for someone itself and says for whom within its own timeout.
pub(super) fn explain_limit(now: Instant, timeout: Duration) -> Instant {
    now + timeout + PROBE_WAIT
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::framing::encode_hello;

    const T: Duration = Duration::from_secs(5);

    /// Rank 1 of 3 on a mesh: announces to 0 and 2, reads 0 then 2, connects to 2,
    /// accepts 0; a hello from 2 (which it connected to) or a second from 0 is closed.
    #[test]
    fn a_middle_rank_reads_connects_up_and_accepts_down() {
        let now = Instant::now();
        let mut s = MeshSteps::new(1, 3, Topology::Mesh, T, now);
        assert_eq!(s.start(), Step::Announce(vec![0, 2]));
        assert_eq!(s.announced(), Step::Read(0));
        assert_eq!(s.heard_from(0, "127.0.0.1:1".into()), Step::Read(2));
        assert_eq!(s.heard_from(2, "127.0.0.1:2".into()), Step::Heard);
        let Step::Connect {
            peer: 2,
            addr,
            wait,
        } = s.proceed(now)
        else {
            panic!("connect to 2 expected")
        };
        assert_eq!((addr.port(), wait), (2, T));
        assert!(matches!(s.connected(2, Ok(()), now), Step::Accept { .. }));
        assert_eq!(s.hello(Ok(2)), Hello::Unexpected(2));
        assert_eq!(s.hello(Err("eof".into())), Hello::Bad("eof".into()));
        assert_eq!(s.hello(Ok(0)), Hello::Take(0));
        assert_eq!(s.hello(Ok(0)), Hello::Unexpected(0));
        assert_eq!(s.poll(now), Step::Linked);
    }

    /// At the deadline the lowest absent rank is blamed, after a look at the notices.
    #[test]
    fn the_deadline_blames_the_lowest_absent_rank() {
        let now = Instant::now();
        let mut s = MeshSteps::new(3, 4, Topology::Mesh, T, now);
        s.start();
        let mut step = s.announced();
        while let Step::Read(p) = step {
            step = s.heard_from(p, format!("127.0.0.1:{}", p + 1));
        }
        assert!(matches!(s.proceed(now), Step::Accept { .. }));
        assert_eq!(s.hello(Ok(0)), Hello::Take(0));
        let late = now + T;
        assert_eq!(s.poll(late), Step::LookForAborts);
        assert_eq!(
            s.looked(late),
            Step::Failed(LinkError::Timeout { rank: 1, waited: T })
        );
    }

    /// A bad address fails on this rank; a failed connect blames the peer.
    #[test]
    fn a_bad_address_is_own_and_a_failed_connect_blames_the_peer() {
        let now = Instant::now();
        let mut s = MeshSteps::new(0, 2, Topology::Mesh, T, now);
        s.start();
        s.announced();
        s.heard_from(1, "nowhere".into());
        let Step::Failed(e) = s.proceed(now) else {
            panic!("failure expected")
        };
        assert_eq!(Blame::of(0, &e), Blame::Own);
        let mut s = MeshSteps::new(0, 2, Topology::Mesh, T, now);
        s.start();
        s.announced();
        s.heard_from(1, "127.0.0.1:9".into());
        s.proceed(now);
        let refused = Unreached {
            reason: "refused".into(),
            timed_out: false,
        };
        let Step::Failed(e) = s.connected(1, Err(refused), now) else {
            panic!("failure expected")
        };
        let blame = s.blame(&e);
        assert_eq!(
            blame,
            Blame::Peer {
                rank: 1,
                seen: Seen::Gone
            }
        );
        assert!(!blame.notice_first());
    }

    /// A connect that timed out blames the peer as silent, not gone.
    #[test]
    fn a_connect_that_timed_out_is_a_silence() {
        let now = Instant::now();
        let mut s = MeshSteps::new(0, 2, Topology::Mesh, T, now);
        s.start();
        s.announced();
        s.heard_from(1, "127.0.0.1:9".into());
        s.proceed(now);
        let late = Unreached {
            reason: "timed out".into(),
            timed_out: true,
        };
        let Step::Failed(e) = s.connected(1, Err(late), now + T) else {
            panic!("failure expected")
        };
        assert!(matches!(e, LinkError::Lost { rank: 1, .. }), "{e:?}");
        assert_eq!(
            s.blame(&e),
            Blame::Peer {
                rank: 1,
                seen: Seen::Silent
            }
        );
    }

    /// A hello must name a rank of this world, and the rank that authenticated.
    #[test]
    fn a_hello_is_checked_against_the_world_and_the_secret() {
        assert_eq!(check_hello(&encode_hello(1, 3), 3, None), Ok(1));
        assert_eq!(check_hello(&encode_hello(1, 3), 3, Some(1)), Ok(1));
        assert!(check_hello(&encode_hello(1, 3), 3, Some(0)).is_err());
        assert!(check_hello(&encode_hello(1, 4), 3, None).is_err());
        assert!(check_hello(&[0; HELLO_LEN], 3, None).is_err());
    }
}
