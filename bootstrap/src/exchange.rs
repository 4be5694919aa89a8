//! The endpoint exchange behind every mesh set-up: each rank hands in the endpoint it
//! bound and gets every rank's back, in rank order.
//!
//! The launcher's star ([`LauncherExchange`]), the unique id's ring
//! ([`UniqueIdExchange`]), the tracker's ring (built inside the collectives once the
//! tracker has assigned rank and neighbours) and the in-memory board
//! ([`MemoryExchange`]) all keep this one promise, so that the facade's
//! `Communicator::join` binds, exchanges and connects the same way whichever of them a
//! job uses. A program with its own way of
//! passing strings between ranks (a key-value store, a shared file system) brings it as
//! an [`EndpointExchange`] through [`Bootstrap::from_exchange`](super::Bootstrap::from_exchange).

use super::BootstrapError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Swaps this rank's endpoint for every rank's: the role a key-value store plays in
/// other frameworks' rendezvous.
///
/// An implementation promises that a call returns `world` endpoints, rank `r`'s at
/// index `r` and `endpoint` at index `rank`, or an error once `timeout` has passed
/// without them. Calls are rounds: the n-th call of every rank is gathered with the
/// n-th calls of the others, so that a process may form one mesh after another.
pub trait EndpointExchange: Send + std::fmt::Debug {
    /// Hands in this rank's endpoint; returns every rank's, in rank order, within
    /// `timeout`.
    ///
    /// # Errors
    ///
    /// The exchange could not be reached, broke off, or not every rank handed in
    /// within `timeout` (the error names who, where the exchange knows).
    fn exchange(
        &mut self,
        rank: u32,
        world: u32,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError>;

    /// The `host:port` whose route decides the address a rank binds (see
    /// [`bind_address`](super::bind_address)); `None`: loopback, for ranks of one
    /// machine.
    fn root_hint(&self) -> Option<(String, u16)> {
        None
    }
}

/// An [`EndpointExchange`] carried by a [`Bootstrap`](super::Bootstrap)
/// ([`Rendezvous::Exchange`](super::Rendezvous::Exchange)): shared by the bootstrap's
/// clones, and equal only to itself (clones of one handle compare equal).
#[derive(Clone)]
pub struct SharedExchange(Arc<Mutex<dyn EndpointExchange>>);

impl SharedExchange {
    pub(crate) fn new(exchange: impl EndpointExchange + 'static) -> SharedExchange {
        SharedExchange(Arc::new(Mutex::new(exchange)))
    }

    /// The exchange, locked; a panic in another rank's use does not poison it for
    /// this one.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, dyn EndpointExchange + 'static> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for SharedExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedExchange")
            .field(&*self.lock())
            .finish()
    }
}

impl PartialEq for SharedExchange {
    fn eq(&self, other: &SharedExchange) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedExchange {}

/// How many endpoint exchanges this process made through the launcher's rendezvous:
/// the generation of its next one. Process-wide, since each `Bootstrap::from_env`
/// makes a new bootstrap while the launcher counts the process's communicators.
static LAUNCHER_GENERATION: AtomicU32 = AtomicU32::new(0);

/// The launcher's star (`switchyard launch`): each rank checks in at the rendezvous
/// and waits there for every rank's endpoint (see [`rendezvous`](super::rendezvous)).
/// Each use is this process's next generation, proving the job secret of the
/// environment when one is set.
#[derive(Debug, Clone)]
pub struct LauncherExchange {
    /// The rendezvous's `host:port`.
    addr: String,
}

impl LauncherExchange {
    /// The exchange through the launcher's rendezvous at `addr` (`host:port`, as
    /// `SWITCHYARD_RENDEZVOUS` gives it).
    pub fn new(addr: impl Into<String>) -> LauncherExchange {
        LauncherExchange { addr: addr.into() }
    }
}

impl EndpointExchange for LauncherExchange {
    fn exchange(
        &mut self,
        rank: u32,
        world: u32,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        // Each exchange is this process's next communicator: the launcher gathers it
        // with the other ranks' of the same number.
        let generation = LAUNCHER_GENERATION.fetch_add(1, Ordering::SeqCst);
        let secret =
            switchyard_secret::JobSecret::from_env().map_err(|e| BootstrapError::Rendezvous {
                addr: self.addr.clone(),
                reason: e.to_string(),
            })?;
        super::rendezvous::exchange_generation(
            &self.addr,
            (rank, world, generation),
            endpoint,
            timeout,
            secret.as_ref(),
        )
    }

    fn root_hint(&self) -> Option<(String, u16)> {
        super::env::split_host_port(&self.addr).ok()
    }
}

/// The unique id's ring: rank 0 serves the root, every rank learns its ring
/// neighbours there and the endpoints go round the ring (see
/// [`unique_id`](super::unique_id)). Its ring listener binds on the address that
/// routes to the root, as the mesh does.
#[derive(Debug, Clone)]
pub struct UniqueIdExchange {
    id: super::UniqueId,
}

impl UniqueIdExchange {
    /// The exchange of the job of `id`, rooted at rank 0's process.
    pub fn new(id: super::UniqueId) -> UniqueIdExchange {
        UniqueIdExchange { id }
    }
}

impl EndpointExchange for UniqueIdExchange {
    fn exchange(
        &mut self,
        rank: u32,
        world: u32,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        let root = self.id.root();
        let ip = super::bind_address(&root.ip().to_string(), root.port())?;
        super::unique_id::exchange(&self.id, rank, world, ip, endpoint, timeout).map_err(|e| {
            BootstrapError::Rendezvous {
                addr: root.to_string(),
                reason: e.to_string(),
            }
        })
    }

    fn root_hint(&self) -> Option<(String, u16)> {
        let root = self.id.root();
        Some((root.ip().to_string(), root.port()))
    }
}

/// An [`EndpointExchange`] for ranks that are threads of one process: a board every
/// clone shares. Endpoints bind on loopback.
///
/// Each rank's n-th use is gathered with the n-th uses of the others, so one board
/// serves a communicator after another. A wait ends at its timeout with an error
/// naming the ranks that never handed in.
///
/// The facade's `Communicator::join` shows two ranks forming a mesh through one.
#[derive(Clone, Debug)]
pub struct MemoryExchange {
    board: Arc<(Mutex<Board>, Condvar)>,
}

/// The rounds in progress and how far each rank has come.
#[derive(Debug)]
struct Board {
    /// How many uses each rank has made: the round of its next one.
    uses: Vec<u64>,
    /// Rounds not yet collected by every rank.
    rounds: HashMap<u64, Round>,
}

#[derive(Debug)]
struct Round {
    endpoints: Vec<Option<String>>,
    /// How many ranks have taken the full list away.
    collected: usize,
}

impl MemoryExchange {
    /// A board for `world` ranks.
    pub fn new(world: usize) -> MemoryExchange {
        MemoryExchange {
            board: Arc::new((
                Mutex::new(Board {
                    uses: vec![0; world],
                    rounds: HashMap::new(),
                }),
                Condvar::new(),
            )),
        }
    }
}

/// How the in-memory board is named in its errors.
const MEMORY: &str = "the in-memory exchange";

impl EndpointExchange for MemoryExchange {
    fn exchange(
        &mut self,
        rank: u32,
        world: u32,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        let until = Instant::now() + timeout;
        let (lock, changed) = &*self.board;
        let mut board = lock.lock().unwrap_or_else(|p| p.into_inner());
        let n = board.uses.len();
        let (r, w) = (rank as usize, world as usize);
        if w != n || r >= n {
            return Err(BootstrapError::Rendezvous {
                addr: MEMORY.into(),
                reason: format!("rank {rank} of {world} handed in on a board for {n} ranks"),
            });
        }
        let round = board.uses[r];
        board.uses[r] += 1;
        board
            .rounds
            .entry(round)
            .or_insert_with(|| Round {
                endpoints: vec![None; n],
                collected: 0,
            })
            .endpoints[r] = Some(endpoint.to_string());
        changed.notify_all();
        loop {
            let Some(this) = board.rounds.get_mut(&round) else {
                unreachable!("a round stays until its last rank collects it");
            };
            if this.endpoints.iter().all(Option::is_some) {
                let all: Vec<String> = this.endpoints.iter().flatten().cloned().collect();
                this.collected += 1;
                if this.collected == n {
                    board.rounds.remove(&round);
                }
                return Ok(all);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<String> = this
                    .endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                return Err(BootstrapError::Rendezvous {
                    addr: MEMORY.into(),
                    reason: format!(
                        "rank{} {} never handed in an endpoint within {timeout:?}",
                        if missing.len() == 1 { "" } else { "s" },
                        missing.join(", ")
                    ),
                });
            }
            board = changed
                .wait_timeout(board, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn on_threads(
        board: &MemoryExchange,
        ranks: std::ops::Range<u32>,
        world: u32,
        timeout: Duration,
    ) -> Vec<Result<Vec<String>, BootstrapError>> {
        let threads: Vec<_> = ranks
            .map(|rank| {
                let mut board = board.clone();
                std::thread::spawn(move || {
                    board.exchange(rank, world, &format!("ep-{rank}"), timeout)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_every_endpoint_in_rank_order_and_again() {
        let board = MemoryExchange::new(3);
        let want: Vec<String> = (0..3).map(|r| format!("ep-{r}")).collect();
        for _round in 0..2 {
            for got in on_threads(&board, 0..3, 3, Duration::from_secs(10)) {
                assert_eq!(got.unwrap(), want);
            }
        }
        assert!(board.board.0.lock().unwrap().rounds.is_empty());
    }

    #[test]
    fn a_missing_rank_is_named_at_the_timeout() {
        let board = MemoryExchange::new(4);
        let started = Instant::now();
        let got = on_threads(&board, 0..2, 4, Duration::from_millis(200));
        assert!(started.elapsed() >= Duration::from_millis(200));
        for result in got {
            let text = result.unwrap_err().to_string();
            assert!(text.contains("ranks 2, 3 never handed in"), "{text}");
            assert!(text.contains(MEMORY), "{text}");
        }
    }

    #[test]
    fn a_rank_outside_the_board_is_refused() {
        let mut board = MemoryExchange::new(2);
        let text = board
            .exchange(0, 3, "ep", Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(text.contains("rank 0 of 3"), "{text}");
    }
}
