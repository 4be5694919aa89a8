//! The launcher's side of the [`rendezvous`](super::rendezvous): collect every rank's
//! endpoint, answer everyone, then keep answering restarted ranks until the job ends.
//!
//! Each generation of communicators (see [`rendezvous`](super::rendezvous)) is gathered
//! apart. A rank that checks in again at a generation (a restarted process) replaces
//! its endpoint; once every rank has checked in at least once at a generation, each
//! later check-in at it is answered at once with the current list. Every check-in is
//! reported to the caller, whose supervision loop counts it as the rank having joined.
//! Those decisions are the [`Gathering`]'s (in [`rendezvous_state`](super::rendezvous_state)),
//! fed each check-in; this module only accepts, reads, writes and logs.
//!
//! The launcher tells it, through [`RankExits`], which ranks ended for good: a
//! generation that misses one of them is refused at once to every rank waiting at it,
//! naming the exited ranks, instead of leaving them to their timeouts.
//!
//! With a job secret in the launcher's environment (which its processes inherit), every
//! connection must first pass the secret's challenge-response; one that fails is logged
//! with its address and the reason, closed, and serving goes on. Handshakes run
//! concurrently, each on its own thread within its own deadline (see
//! [`handshakes`](switchyard_net::handshakes)), so idle connections delay no rank.

use super::BootstrapError;
use super::rendezvous::{AUTH_PURPOSE, CheckIn, read_check_in, write_endpoints, write_refusal};
use super::rendezvous_state::{Answer, Gathering, Joined, Refusal, Step, Unformable, check_claim};
use crossbeam_channel::{Receiver, Sender};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchyard_net::handshakes::{self, Handshakes, accept_all};
use switchyard_secret::JobSecret;

/// How long one client may take to send its check-in. Each connection's check-in is
/// read on a thread of its own, so a silent client holds up nobody else.
const CHECK_IN_LIMIT: Duration = Duration::from_secs(5);
/// How long the serving loop waits for a handshake to end before it accepts again.
const POLL: Duration = Duration::from_millis(5);
/// How long writing the endpoint list to one client may take.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// The launcher's end of the [`rendezvous`](super::rendezvous): `switchyard launch`
/// binds one per job, tells its processes the address (`SWITCHYARD_RENDEZVOUS`) and
/// serves it until the job ends.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
/// use switchyard_bootstrap::{RendezvousServer, rendezvous};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let server = RendezvousServer::bind("127.0.0.1", 1)?;
/// let addr = format!("127.0.0.1:{}", server.port());
/// let done = Arc::new(AtomicBool::new(false));
/// server.spawn(done.clone(), |rank| println!("rank {rank} checked in"))?;
/// let endpoints = rendezvous::exchange(&addr, 0, 1, "tcp://a:1", Duration::from_secs(10))?;
/// assert_eq!(endpoints, ["tcp://a:1"]);
/// done.store(true, Ordering::SeqCst);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RendezvousServer {
    listener: TcpListener,
    addr: String,
    port: u16,
    world: u32,
    exits: (Sender<Exit>, Receiver<Exit>),
}

/// A rank that ended for good, and how.
type Exit = (u32, String);

/// Tells a [`RendezvousServer`] which ranks ended for good, so that a communicator
/// they never formed (one that only some ranks ask for) is refused at once to the
/// ranks waiting for it, naming the exited ranks, instead of waiting out their
/// timeouts. Made by [`RendezvousServer::exits`]; clones tell the same server.
#[derive(Debug, Clone)]
pub struct RankExits {
    tx: Sender<Exit>,
}

impl RankExits {
    /// Rank `rank` ended and will not be started again; `how` says how, for the
    /// refusal (`finished (exit status: 0)`). A server that stopped ignores it.
    pub fn exited(&self, rank: u32, how: &str) {
        let _ = self.tx.send((rank, how.to_string()));
    }
}

impl RendezvousServer {
    /// Listens on `host` at a port the OS picks, for a job of `world` workers.
    pub fn bind(host: &str, world: u32) -> Result<RendezvousServer, BootstrapError> {
        let addr = format!("{host}:0");
        let failed = |e: std::io::Error| BootstrapError::Rendezvous {
            addr: addr.clone(),
            reason: e.to_string(),
        };
        let listener = TcpListener::bind((host, 0)).map_err(failed)?;
        let port = listener.local_addr().map_err(failed)?.port();
        Ok(RendezvousServer {
            listener,
            addr,
            port,
            world,
            exits: crossbeam_channel::unbounded(),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The handle through which the launcher reports ranks that ended for good.
    pub fn exits(&self) -> RankExits {
        RankExits {
            tx: self.exits.0.clone(),
        }
    }

    /// Serves on a background thread until `done` is set, with the job secret of this
    /// process's environment, if any (an unusable one is an error: fail closed).
    /// `on_check_in(rank)` runs for every check-in, a restarted rank's again: the
    /// launcher counts it as the rank having joined.
    pub fn spawn(
        self,
        done: Arc<AtomicBool>,
        on_check_in: impl Fn(u32) + Send + 'static,
    ) -> Result<(), BootstrapError> {
        let failed = |reason: String| BootstrapError::Rendezvous {
            addr: self.addr.clone(),
            reason,
        };
        let secret = JobSecret::from_env().map_err(|e| failed(e.to_string()))?;
        let serving = Serving {
            world: self.world,
            secret,
            exits: self.exits.1,
        };
        spawn_serving(self.listener, serving, on_check_in, done).map_err(|e| failed(e.to_string()))
    }
}

/// What a serving loop knows besides its listener.
struct Serving {
    world: u32,
    /// The job secret (`None`: no authentication).
    secret: Option<JobSecret>,
    /// Ranks that ended for good, from [`RankExits`].
    exits: Receiver<Exit>,
}

/// Serves `listener` on a background thread until `done` is set, with the job secret
/// given (`None`: no authentication) and no exits reported.
#[cfg(test)]
fn spawn_with_secret(
    listener: TcpListener,
    world: u32,
    on_check_in: impl Fn(u32) + Send + 'static,
    done: Arc<AtomicBool>,
    secret: Option<JobSecret>,
) -> Result<(), std::io::Error> {
    let serving = Serving {
        world,
        secret,
        exits: crossbeam_channel::never(),
    };
    spawn_serving(listener, serving, on_check_in, done)
}

/// Serves `listener` on a background thread until `done` is set.
fn spawn_serving(
    listener: TcpListener,
    serving: Serving,
    on_check_in: impl Fn(u32) + Send + 'static,
    done: Arc<AtomicBool>,
) -> Result<(), std::io::Error> {
    listener.set_nonblocking(true)?;
    std::thread::spawn(move || serve(listener, serving, &on_check_in, &done));
    Ok(())
}

/// The job secret's proof (with a secret) and the check-in of one connection, within
/// [`CHECK_IN_LIMIT`]; a check-in for another rank than the proof claimed is refused.
fn handshake(
    mut stream: TcpStream,
    secret: Option<&JobSecret>,
) -> Result<(TcpStream, CheckIn), String> {
    let by = Instant::now() + CHECK_IN_LIMIT;
    let claimed = match secret {
        None => None,
        Some(secret) => Some(
            switchyard_secret::accept(&mut stream, secret, AUTH_PURPOSE, by)
                .map_err(|e| format!("authentication failed: {}", e.reason))?,
        ),
    };
    let check_in = read_check_in(&mut stream, by).map_err(|e| format!("bad check-in: {e}"))?;
    check_claim(claimed, &check_in)?;
    Ok((stream, check_in))
}

/// Accepts, reads each check-in, takes each exit, and does what the [`Gathering`]
/// decides, until `done`.
fn serve(listener: TcpListener, serving: Serving, on_check_in: &dyn Fn(u32), done: &AtomicBool) {
    let Serving {
        world,
        secret,
        exits,
    } = serving;
    let mut gathering = Gathering::new(world);
    let mut handshakes = Handshakes::new(handshakes::DEFAULT_LIMIT);
    while !done.load(Ordering::SeqCst) {
        for (rank, how) in exits.try_iter() {
            let refused = gathering.on_exit(rank, how);
            if !refused.is_empty() {
                tracing::info!(
                    rank,
                    "rendezvous: rank exited; refusing the communicators it never formed"
                );
            }
            for unformable in refused {
                refuse(unformable);
            }
        }
        accept_all(&listener, &mut handshakes, {
            let secret = secret.clone();
            move |s, _| handshake(s, secret.as_ref())
        });
        let Some(finished) = handshakes.next(POLL) else {
            continue;
        };
        let peer = finished.peer;
        match finished.result {
            Ok((stream, check_in)) => {
                perform(
                    gathering.on_check_in(check_in, stream),
                    peer,
                    world,
                    on_check_in,
                );
            }
            Err(reason) => {
                tracing::warn!(%peer, %reason, "rendezvous: connection refused; closed");
            }
        }
    }
}

/// Logs, reports and sends what one check-in's [`Step`] says; the connections it
/// hands back unanswered are closed when dropped here.
fn perform(step: Step<TcpStream>, peer: SocketAddr, world: u32, on_check_in: &dyn Fn(u32)) {
    let joined = match step {
        Step::Refused { conn, refusal } => {
            match refusal {
                Refusal::WrongWorld { claimed } => {
                    tracing::warn!(%peer, claimed, world, "rendezvous: wrong world size; closed");
                }
                Refusal::RankOutside { rank } => {
                    tracing::warn!(%peer, rank, world, "rendezvous: rank outside the job; closed");
                }
                Refusal::TooManyGenerations { generation } => {
                    tracing::warn!(%peer, generation, "rendezvous: too many generations of communicators; closed");
                }
            }
            drop(conn);
            return;
        }
        Step::Joined(joined) => joined,
    };
    let Joined {
        rank,
        generation,
        replaced,
        completed,
        superseded,
        answers,
        unformable,
    } = joined;
    if replaced {
        tracing::info!(%peer, rank, generation, "rendezvous: rank checked in again (restarted); endpoint replaced");
    }
    on_check_in(rank);
    drop(superseded);
    if completed {
        tracing::debug!(generation, "rendezvous: every rank checked in; answering");
    }
    for answer in answers {
        send(answer);
    }
    for refused in unformable {
        refuse(refused);
    }
}

/// Tells one waiting rank that its generation cannot form, within [`ANSWER_LIMIT`].
fn refuse(unformable: Unformable<TcpStream>) {
    let Unformable {
        mut conn,
        rank,
        generation,
        exited,
    } = unformable;
    let ranks: Vec<u32> = exited.iter().map(|(r, _)| *r).collect();
    tracing::warn!(rank, generation, exited = ?ranks, "rendezvous: communicator refused: ranks it needs exited without forming it");
    if let Err(e) = write_refusal(
        &mut conn,
        generation,
        &exited,
        Instant::now() + ANSWER_LIMIT,
    ) {
        tracing::warn!(rank, error = %e, "rendezvous: could not send the refusal");
    }
}

/// Sends one endpoint list, within [`ANSWER_LIMIT`] of starting to (so a slow reader
/// delays the next one by that much at most).
fn send(answer: Answer<TcpStream>) {
    let Answer {
        mut conn,
        rank,
        endpoints,
    } = answer;
    if let Err(e) = write_endpoints(&mut conn, &endpoints, Instant::now() + ANSWER_LIMIT) {
        tracing::warn!(rank, error = %e, "rendezvous: could not send the endpoint list");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rendezvous::exchange;

    const LIMIT: Duration = Duration::from_secs(10);

    #[test]
    fn a_restarted_rank_checks_in_again_and_gets_the_current_list() {
        let server = RendezvousServer::bind("127.0.0.1", 2).unwrap();
        let addr = format!("127.0.0.1:{}", server.port());
        let (tx, notices) = crossbeam_channel::unbounded();
        let done = Arc::new(AtomicBool::new(false));
        server.spawn(done.clone(), reporting(tx)).unwrap();

        let a = addr.clone();
        let zero = std::thread::spawn(move || exchange(&a, 0, 2, "tcp://a:1", LIMIT));
        let one = exchange(&addr, 1, 2, "tcp://b:1", LIMIT).unwrap();
        assert_eq!(one, ["tcp://a:1", "tcp://b:1"]);
        assert_eq!(zero.join().unwrap().unwrap(), one);

        // Rank 1 restarted on a new port: answered at once, with its new endpoint.
        let again = exchange(&addr, 1, 2, "tcp://b:2", LIMIT).unwrap();
        assert_eq!(again, ["tcp://a:1", "tcp://b:2"]);
        // A wrong world size is refused (closed), and serving goes on.
        assert!(exchange(&addr, 0, 3, "tcp://x:1", LIMIT).is_err());
        assert_eq!(
            exchange(&addr, 0, 2, "tcp://a:3", LIMIT).unwrap()[0],
            "tcp://a:3"
        );
        done.store(true, Ordering::SeqCst);

        let ranks: Vec<u32> = notices.try_iter().collect();
        assert_eq!(ranks.len(), 4, "{ranks:?}");
        assert_eq!(ranks.iter().filter(|r| **r == 1).count(), 2, "{ranks:?}");
    }
}

/// A check-in callback that sends each rank to `tx`, for tests to count.
#[cfg(test)]
fn reporting(tx: crossbeam_channel::Sender<u32>) -> impl Fn(u32) + Send + 'static {
    move |rank| {
        let _ = tx.send(rank);
    }
}

#[cfg(test)]
mod generation_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rendezvous::exchange_generation;

    const LIMIT: Duration = Duration::from_secs(10);

    fn serving(secret: Option<JobSecret>) -> (String, Arc<AtomicBool>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, _notices) = crossbeam_channel::unbounded();
        let done = Arc::new(AtomicBool::new(false));
        spawn_with_secret(listener, 2, reporting(tx), done.clone(), secret).unwrap();
        (addr, done)
    }

    /// Both ranks of a 2-rank job exchange at `generation`, `tag` in their endpoints.
    fn both(addr: &str, generation: u32, tag: &str) -> Vec<String> {
        let a = addr.to_string();
        let t = tag.to_string();
        let zero = std::thread::spawn(move || {
            exchange_generation(&a, (0, 2, generation), &format!("a{t}"), LIMIT, None)
        });
        // Rank 0 waits for rank 1 at its generation: it is not answered with a list
        // of another generation.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!zero.is_finished(), "rank 0 was answered alone");
        let one =
            exchange_generation(addr, (1, 2, generation), &format!("b{tag}"), LIMIT, None).unwrap();
        assert_eq!(zero.join().unwrap().unwrap(), one);
        one
    }

    /// A second communicator of the same processes gathers the second endpoints (the
    /// launcher answered the old ones at once before, issue 20 item 12).
    #[test]
    fn each_generation_gathers_its_own_endpoints() {
        let (addr, done) = serving(None);
        assert_eq!(both(&addr, 0, "0"), ["a0", "b0"]);
        assert_eq!(both(&addr, 1, "1"), ["a1", "b1"]);
        assert_eq!(both(&addr, 2, "2"), ["a2", "b2"]);
        done.store(true, Ordering::SeqCst);
    }

    /// Idle connections opened before the ranks check in hold up no rank, with and
    /// without the job secret (each cost 5 s before, and three ended the job).
    #[test]
    fn idle_connections_delay_no_check_in() {
        let key = JobSecret::new(b"0123456789abcdef0123456789abcdef".to_vec(), "test").unwrap();
        for secret in [None, Some(key)] {
            let (addr, done) = serving(secret.clone());
            let idle: Vec<TcpStream> = (0..20)
                .map(|_| TcpStream::connect(&addr).unwrap())
                .collect();
            let started = Instant::now();
            let a = addr.clone();
            let s = secret.clone();
            let zero = std::thread::spawn(move || {
                crate::rendezvous::exchange_with_secret(&a, 0, 2, "a", LIMIT, s.as_ref())
            });
            let one =
                crate::rendezvous::exchange_with_secret(&addr, 1, 2, "b", LIMIT, secret.as_ref())
                    .unwrap();
            assert_eq!(zero.join().unwrap().unwrap(), one);
            assert!(
                // One idle connection would cost CHECK_IN_LIMIT (5 s).
                started.elapsed() < Duration::from_secs(4),
                "the ranks waited {:?} behind idle connections",
                started.elapsed()
            );
            drop(idle);
            done.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod exit_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rendezvous::exchange_generation;

    const LIMIT: Duration = Duration::from_secs(20);

    /// A second communicator that rank 0 asks for after rank 1 exited without it is
    /// refused at once, naming rank 1 and how it ended; one asked for before the exit
    /// is refused as soon as the exit is reported. Before, each waited its whole
    /// timeout and failed "no magic within ...".
    #[test]
    fn a_communicator_an_exited_rank_never_formed_is_refused_at_once() {
        let server = RendezvousServer::bind("127.0.0.1", 2).unwrap();
        let addr = format!("127.0.0.1:{}", server.port());
        let exits = server.exits();
        let done = Arc::new(AtomicBool::new(false));
        let (tx, joined) = crossbeam_channel::unbounded();
        server.spawn(done.clone(), reporting(tx)).unwrap();
        let a = addr.clone();
        let zero = std::thread::spawn(move || exchange_generation(&a, (0, 2, 0), "a", LIMIT, None));
        exchange_generation(&addr, (1, 2, 0), "b", LIMIT, None).unwrap();
        zero.join().unwrap().unwrap();
        assert_eq!(joined.try_iter().count(), 2);

        // Rank 0 waits at generation 1 before rank 1's exit is known.
        let started = Instant::now();
        let a = addr.clone();
        let waiting =
            std::thread::spawn(move || exchange_generation(&a, (0, 2, 1), "a1", LIMIT, None));
        // Reported as joined: its check-in was read and waits for rank 1.
        assert_eq!(joined.recv_timeout(LIMIT), Ok(0));
        exits.exited(1, "finished (exit status: 0)");
        let err = waiting.join().unwrap().unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, BootstrapError::RanksExited { ranks, generation: 1, .. } if ranks == &[1]),
            "{text}"
        );
        for needle in [
            "ranks [1] exited",
            "rank 1 finished (exit status: 0)",
            "communicator number 2",
        ] {
            assert!(text.contains(needle), "no {needle:?} in {text}");
        }
        // A third communicator asked for after the exit: refused at once too.
        let err = exchange_generation(&addr, (0, 2, 2), "a2", LIMIT, None).unwrap_err();
        assert!(matches!(err, BootstrapError::RanksExited { .. }), "{err}");
        assert!(
            started.elapsed() < LIMIT / 2,
            "took {:?}",
            started.elapsed()
        );
        done.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod secret_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rendezvous::exchange_with_secret;

    const LIMIT: Duration = Duration::from_secs(10);

    fn key(text: &str) -> JobSecret {
        JobSecret::new(text.as_bytes().to_vec(), "test").unwrap()
    }

    /// Strangers without the secret, with a wrong one, and one claiming another rank
    /// than it checks in as are refused; the job's ranks still get their endpoints.
    #[test]
    fn with_a_job_secret_only_its_holders_check_in() {
        let good = key("0123456789abcdef0123456789abcdef");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, notices) = crossbeam_channel::unbounded();
        let done = Arc::new(AtomicBool::new(false));
        spawn_with_secret(listener, 2, reporting(tx), done.clone(), Some(good.clone())).unwrap();

        let a = addr.clone();
        let g = good.clone();
        let zero = std::thread::spawn(move || {
            exchange_with_secret(&a, 0, 2, "tcp://a:1", LIMIT, Some(&g))
        });
        // No secret: the process is told the launcher expects one.
        let none = exchange_with_secret(&addr, 1, 2, "tcp://evil:1", LIMIT, None).unwrap_err();
        assert!(none.to_string().contains("expects a job secret"), "{none}");
        // A wrong secret: refused (closed during the handshake).
        let wrong = key("fedcba9876543210fedcba9876543210");
        let err =
            exchange_with_secret(&addr, 1, 2, "tcp://evil:2", LIMIT, Some(&wrong)).unwrap_err();
        assert!(err.to_string().contains("authentication"), "{err}");
        // The real rank 1: both ranks get the real endpoints, no stranger's.
        let one = exchange_with_secret(&addr, 1, 2, "tcp://b:1", LIMIT, Some(&good)).unwrap();
        assert_eq!(one, ["tcp://a:1", "tcp://b:1"]);
        assert_eq!(zero.join().unwrap().unwrap(), one);
        done.store(true, Ordering::SeqCst);
        let joined = notices.try_iter().count();
        assert_eq!(joined, 2, "only the two real ranks joined");
    }

    /// A holder of the secret that authenticates as one rank and checks in as another
    /// is closed; the real ranks still check in.
    #[test]
    fn a_check_in_must_name_the_authenticated_rank() {
        let good = key("0123456789abcdef0123456789abcdef");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, notices) = crossbeam_channel::unbounded();
        let done = Arc::new(AtomicBool::new(false));
        spawn_with_secret(listener, 2, reporting(tx), done.clone(), Some(good.clone())).unwrap();

        let mut liar = TcpStream::connect(&addr).unwrap();
        switchyard_secret::connect(&mut liar, &good, AUTH_PURPOSE, 1, Instant::now() + LIMIT)
            .unwrap();
        let mut check_in = MAGIC_CHECK_IN.to_vec();
        check_in.extend_from_slice(&0u32.to_le_bytes()); // rank 0, not 1
        check_in.extend_from_slice(&2u32.to_le_bytes());
        check_in.extend_from_slice(&3u32.to_le_bytes());
        check_in.extend_from_slice(b"x:1");
        std::io::Write::write_all(&mut liar, &check_in).unwrap();
        liar.set_read_timeout(Some(LIMIT)).unwrap();
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut liar, &mut answer);
        assert!(answer.is_empty(), "the liar was answered");

        let a = addr.clone();
        let g = good.clone();
        let zero = std::thread::spawn(move || {
            exchange_with_secret(&a, 0, 2, "tcp://a:1", LIMIT, Some(&g))
        });
        let one = exchange_with_secret(&addr, 1, 2, "tcp://b:1", LIMIT, Some(&good)).unwrap();
        assert_eq!(one, ["tcp://a:1", "tcp://b:1"]);
        assert_eq!(zero.join().unwrap().unwrap(), one);
        done.store(true, Ordering::SeqCst);
        assert_eq!(notices.try_iter().count(), 2);
    }

    const MAGIC_CHECK_IN: [u8; 4] = crate::rendezvous::MAGIC;

    /// A process with a secret facing a launcher without one is told so within the
    /// handshake's limit, not left hanging.
    #[test]
    fn a_secret_on_the_process_side_only_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, _notices) = crossbeam_channel::unbounded();
        let done = Arc::new(AtomicBool::new(false));
        spawn_with_secret(listener, 1, reporting(tx), done.clone(), None).unwrap();
        let good = key("0123456789abcdef0123456789abcdef");
        let start = Instant::now();
        let err = exchange_with_secret(
            &addr,
            0,
            1,
            "tcp://a:1",
            Duration::from_millis(500),
            Some(&good),
        )
        .unwrap_err();
        assert!(err.to_string().contains("authentication"), "{err}");
        // Told apart from a wait without a deadline (the timeout is 500 ms).
        assert!(start.elapsed() < Duration::from_secs(15));
        done.store(true, Ordering::SeqCst);
    }
}
