//! What the progress thread and the sockets' own threads share: why the engine
//! stopped, the malformed-message count, the identities of the router's dealers, and
//! the gate that keeps every thread out of MPI once it is finalized.

use super::ffi::MpiError;
use crate::PeerId;
use crate::backend::warn_limit::PeerWarnings;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use switchyard_msg::fast_hash::FastMap;

/// A thread's leave to call MPI (see [`Shared::enter`]): MPI is not finalized while
/// one is held.
pub(crate) struct Open<'a>(#[allow(dead_code)] RwLockReadGuard<'a, bool>);

pub(crate) struct Shared {
    /// The progress thread is napping: a command must wake it.
    pub(crate) sleeping: AtomicBool,
    failure: Mutex<Option<String>>,
    malformed: AtomicU64,
    /// Limits the malformed-message warnings per source rank (`malformed` stays exact).
    warnings: Mutex<PeerWarnings<i32>>,
    /// Every dealer that said hello to this rank, by (rank, dealer tag): a router that
    /// receives on its own thread names the sender with it. Entries stay after a bye,
    /// so that data a dealer sent before leaving still names it.
    identities: Mutex<FastMap<(i32, i32), PeerId>>,
    /// `true` while MPI may be called. A socket's thread holds it shared for each of
    /// its MPI calls; the progress thread takes it whole and sets it `false` before
    /// `MPI_Finalize`, so that no thread is inside MPI then or enters it after.
    open: RwLock<bool>,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared {
            sleeping: AtomicBool::new(false),
            failure: Mutex::new(None),
            malformed: AtomicU64::new(0),
            warnings: Mutex::new(PeerWarnings::new("mpi")),
            identities: Mutex::new(FastMap::default()),
            open: RwLock::new(true),
        }
    }

    /// Why the engine stopped, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn fail(&self, reason: String) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
    }

    /// Counts a dropped message and logs it within the per-rank limits.
    pub(crate) fn drop_malformed(&self, source: i32, reason: &dyn std::fmt::Display) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
        let admitted = self
            .warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(&source);
        if admitted {
            tracing::warn!(source_rank = source, %reason, "mpi: dropped a malformed message");
        }
    }

    pub(crate) fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    pub(crate) fn name_dealer(&self, rank: i32, tag: i32, identity: PeerId) {
        self.identities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((rank, tag), identity);
    }

    pub(crate) fn dealer_named(&self, rank: i32, tag: i32) -> Option<PeerId> {
        self.identities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(rank, tag))
            .cloned()
    }

    /// Lets the calling thread make MPI calls until the guard is dropped, unless MPI
    /// is finalized (then says why).
    pub(crate) fn enter(&self) -> Result<Open<'_>, String> {
        let open = self.open.read().unwrap_or_else(|p| p.into_inner());
        if !*open {
            return Err(self
                .failure()
                .unwrap_or_else(|| "MPI was finalized at exit".into()));
        }
        Ok(Open(open))
    }

    /// Runs MPI calls on the calling thread, unless MPI is finalized (then says why).
    pub(crate) fn while_open<R>(
        &self,
        calls: impl FnOnce() -> Result<R, MpiError>,
    ) -> Result<R, String> {
        let _open = self.enter()?;
        calls().map_err(|e| e.to_string())
    }

    /// Closes the gate: once this returns no other thread is in MPI, and none enters.
    pub(crate) fn close(&self) -> RwLockWriteGuard<'_, bool> {
        let mut open = self.open.write().unwrap_or_else(|p| p.into_inner());
        *open = false;
        open
    }
}
