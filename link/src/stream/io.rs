//! The stream link's non-blocking I/O: writing queued frames with `writev`, reading
//! into each peer's decoder, and waiting in `poll(2)` while every peer's reads go on
//! (so that ranks writing to each other in a cycle never all block).

use super::{
    BESIDE_GRACE, BESIDE_REPROBE, CONTROL_CHECK, Outbound, Peer, SLOW_YIELD, SLOW_YIELD_MEMORY,
    STEP_ASIDE_EVERY, StreamLink,
};
use crate::LinkError;
use crate::Tag;
use crate::framing::encode_head;
use bytes::Bytes;
use std::io::{ErrorKind, IoSlice};
use std::time::Instant;

impl StreamLink {
    pub(super) fn peer(&mut self, rank: usize) -> Result<&mut Peer, LinkError> {
        match self.peers.get_mut(rank) {
            Some(Some(peer)) => Ok(peer),
            _ => Err(LinkError::Transport {
                rank,
                reason: format!("no connection to rank {rank}"),
            }),
        }
    }

    /// Writes what `rank`'s connection accepts without blocking. Returns whether
    /// anything was written.
    pub(super) fn flush(&mut self, rank: usize) -> Result<bool, LinkError> {
        let pool = &mut self.pool;
        let Some(Some(peer)) = self.peers.get_mut(rank) else {
            return Err(LinkError::Transport {
                rank,
                reason: format!("no connection to rank {rank}"),
            });
        };
        let mut progressed = false;
        if peer.closed.is_some() {
            // Whatever was queued for a peer that left can no longer matter to it.
            peer.outbound.clear();
            peer.queued = 0;
            return Ok(false);
        }
        while let Some(out) = peer.outbound.front_mut() {
            let mut slices = Vec::with_capacity(out.parts.len() - out.part);
            slices.push(IoSlice::new(&out.parts[out.part][out.offset..]));
            for part in &out.parts[out.part + 1..] {
                slices.push(IoSlice::new(part));
            }
            match peer.pipe.write_vectored(&slices) {
                Ok(0) => return Err(peer.io_error(rank, ErrorKind::WriteZero.into())),
                Ok(mut written) => {
                    progressed = true;
                    peer.drained = Instant::now();
                    peer.queued -= written;
                    while written > 0 {
                        let left = out.parts[out.part].len() - out.offset;
                        if written >= left {
                            written -= left;
                            out.part += 1;
                            out.offset = 0;
                        } else {
                            out.offset += written;
                            written = 0;
                        }
                    }
                    // Empty frames are skipped too, so that the message counts as done.
                    while out.part < out.parts.len() && out.parts[out.part].len() == out.offset {
                        out.part += 1;
                        out.offset = 0;
                    }
                    if out.part == out.parts.len() {
                        if let Some(done) = peer.outbound.pop_front() {
                            for part in done.parts {
                                pool.give(part);
                            }
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = Some(e.to_string());
                    peer.outbound.clear();
                    peer.queued = 0;
                    return Err(peer.io_error(rank, e));
                }
            }
        }
        Ok(progressed)
    }

    /// Reads what `rank`'s connection has without blocking, filing complete messages
    /// under their tag. Returns whether anything was read.
    pub(super) fn pump(&mut self, rank: usize) -> Result<bool, LinkError> {
        let Some(Some(peer)) = self.peers.get_mut(rank) else {
            return Err(LinkError::Transport {
                rank,
                reason: format!("no connection to rank {rank}"),
            });
        };
        let (pool, pending) = (&mut self.pool, &mut self.pending);
        let malformed = |endpoint: String, reason: String| LinkError::Transport {
            rank,
            reason: format!("malformed stream from {endpoint}: {reason}"),
        };
        let mut progressed = false;
        while peer.closed.is_none() {
            if let Some(e) = peer.inbound.error() {
                return Err(malformed(peer.endpoint(), e.to_string()));
            }
            let read = match peer.pipe.read(peer.inbound.space()) {
                Ok(0) => {
                    peer.closed = Some(if peer.inbound.between_messages() {
                        "connection closed by the peer".into()
                    } else {
                        "connection closed by the peer in the middle of a message".into()
                    });
                    return Ok(true);
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(progressed),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    peer.closed = Some(e.to_string());
                    return Ok(true);
                }
            };
            progressed = true;
            peer.heard = Instant::now();
            let message = peer
                .inbound
                .filled(read, &mut |len| pool.take(len))
                .map_err(|e| malformed(peer.endpoint(), e.to_string()))?;
            if let Some((tag, frames)) = message {
                pending.push(rank, tag, frames);
            }
        }
        Ok(progressed)
    }

    /// One pass over every connection: write what can be written, read what is there.
    pub(super) fn progress(&mut self) -> Result<bool, LinkError> {
        let mut progressed = false;
        for rank in 0..self.size {
            if self.peers[rank].is_none() {
                continue;
            }
            // A failed write closes that peer; it matters only once this rank sends
            // to it or waits for it, which report it.
            progressed |= self.flush(rank).unwrap_or(true);
            progressed |= self.pump(rank)?;
        }
        Ok(progressed)
    }

    /// [`StreamLink::progress`] where a failing connection ends only itself: a
    /// malformed stream from one peer closes that peer, with the reason.
    pub(super) fn progress_each(&mut self) -> bool {
        let mut progressed = false;
        for rank in 0..self.size {
            if self.peers[rank].is_none() {
                continue;
            }
            progressed |= self.flush(rank).unwrap_or(true);
            match self.pump(rank) {
                Ok(read) => progressed |= read,
                Err(e) => {
                    if let Some(Some(peer)) = self.peers.get_mut(rank) {
                        peer.closed = Some(e.to_string());
                    }
                    progressed = true;
                }
            }
        }
        progressed
    }

    /// Sleeps in `poll(2)` until a connection is readable (or writable, where output
    /// waits), `until`, or [`CONTROL_CHECK`] passes. A shared-memory peer is asked to
    /// wake this rank first; if its ring already has work, there is no sleep.
    pub(super) fn sleep(&mut self, until: Instant) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.peers.len());
        let mut ready = false;
        for peer in self.peers.iter_mut().flatten() {
            if peer.closed.is_some() {
                continue;
            }
            let waiting_to_write = !peer.outbound.is_empty();
            match peer.pipe.prepare_sleep(waiting_to_write) {
                Some((fd, events)) => fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                }),
                None => ready = true,
            }
        }
        if !ready {
            let wait = until
                .saturating_duration_since(Instant::now())
                .min(CONTROL_CHECK);
            let millis = wait.as_millis().max(1) as libc::c_int;
            // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
            // pollfds for the duration of the call.
            unsafe {
                libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis);
            }
        }
        for peer in self.peers.iter_mut().flatten() {
            peer.pipe.end_sleep();
        }
    }

    /// Queues a message for `to` and writes what its connection takes at once.
    pub(super) fn queue(
        &mut self,
        to: usize,
        tag: Tag,
        frames: Vec<Bytes>,
    ) -> Result<(), LinkError> {
        let head = encode_head(tag, &frames);
        let mut parts = Vec::with_capacity(frames.len() + 1);
        parts.push(Bytes::from(head));
        parts.extend(frames);
        let bytes: usize = parts.iter().map(Bytes::len).sum();
        let peer = self.peer(to)?;
        if let Some(reason) = &peer.closed {
            return Err(LinkError::Lost {
                rank: to,
                endpoint: peer.endpoint(),
                reason: reason.clone(),
            });
        }
        peer.outbound.push_back(Outbound {
            parts,
            part: 0,
            offset: 0,
        });
        peer.queued += bytes;
        self.flush(to)?;
        Ok(())
    }

    /// One pass of a spinning wait for the rank of board slot `slot` (`None`: for
    /// any message, the peers on the board counted together); false when the wait
    /// should stop spinning and sleep now.
    ///
    /// - With more ranks on this host than cores (as under `switchyard launch` on a
    ///   laptop) the peer waited for may need this very core: the pass yields it, as
    ///   OpenMPI does when oversubscribed.
    /// - When the peer was last seen on this rank's processor (with `None`: every
    ///   peer), the scheduler put both on one core, and the peer cannot send until
    ///   this rank gives the core up. The higher rank of the two moves to another
    ///   processor it may use (`step_aside`, at most every `STEP_ASIDE_EVERY`), after
    ///   which both spin on cores of their own, as MPI's ranks do. Where it cannot
    ///   move (the lower rank, or a thread pinned to one processor), for the first
    ///   `BESIDE_GRACE` of that (again
    ///   every `BESIDE_REPROBE`) the pass spins as usual: a peer kept waiting for
    ///   the core is what the scheduler moves to an idle core, where one is; a rank
    ///   that sleeps at once keeps both on one core on an idle host (8 B allreduces
    ///   at 6 us instead of 0.4). After it the pass yields: both ranks stay
    ///   runnable, and the peer runs at once. But a yield that takes longer than
    ///   `SLOW_YIELD` let other work on the core run its time slice first: then,
    ///   and for `SLOW_YIELD_MEMORY` after, such waits sleep at once instead, to be
    ///   woken by the peer's send (a rank that slept runs before the busy work).
    /// - Otherwise the pass spins in place: a yield is a system call, and the wait
    ///   ends sooner without.
    pub(super) fn spin_pass(&self, slot: Option<usize>) -> bool {
        if self.oversubscribed {
            std::thread::yield_now();
            return true;
        }
        let beside = self
            .board
            .as_ref()
            .is_some_and(|board| board.shares_processor_with(slot));
        let before = Instant::now();
        if beside && self.step_aside(slot, before) {
            return true;
        }
        if beside {
            // Seen beside since when: reset after `BESIDE_REPROBE`, so that the grace
            // below comes back once in a while.
            let since = match self.beside_since.get() {
                Some(since) if before - since < BESIDE_REPROBE => since,
                _ => {
                    self.beside_since.set(Some(before));
                    before
                }
            };
            if before - since >= BESIDE_GRACE {
                return self.yield_to_peer(before);
            }
        } else {
            self.beside_since.set(None);
        }
        for _ in 0..32 {
            std::hint::spin_loop();
        }
        true
    }

    /// [`StreamLink::spin_pass`] for a peer on this rank's core: the higher of the
    /// two ranks moves to another of the processors it may use (at most once per
    /// `STEP_ASIDE_EVERY`), so that both run at once; true when it moved.
    fn step_aside(&self, slot: Option<usize>, now: Instant) -> bool {
        let Some(board) = self.board.as_ref() else {
            return false;
        };
        if self
            .stepped_aside_at
            .get()
            .is_some_and(|at| now - at < STEP_ASIDE_EVERY)
            || !board.gives_way_to_a_lower_rank(slot)
        {
            return false;
        }
        self.stepped_aside_at.set(Some(now));
        if !crate::processor::step_aside() {
            return false;
        }
        // Noted at once, so that the peer stops giving its core up.
        board.shares_processor_with(slot);
        self.beside_since.set(None);
        true
    }

    /// [`StreamLink::spin_pass`] for a peer on this rank's core, past the grace:
    /// yields, unless a recent yield was slow; false to sleep now.
    fn yield_to_peer(&self, before: Instant) -> bool {
        if self
            .slow_yields_until
            .get()
            .is_some_and(|until| before < until)
        {
            return false;
        }
        std::thread::yield_now();
        let after = Instant::now();
        if after - before > SLOW_YIELD {
            self.slow_yields_until.set(Some(after + SLOW_YIELD_MEMORY));
        }
        true
    }

    /// Waits for progress on any connection until `deadline`, spinning first, and
    /// watching the control link for abort notices. `Ok(false)` at the deadline.
    pub(super) fn wait(&mut self, deadline: Instant) -> Result<bool, LinkError> {
        let spin_until = Instant::now() + self.spin;
        loop {
            // Looked at on the busy path too: a wait that always finds progress
            // would otherwise never see it.
            self.interrupted()?;
            if self.progress()? {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now < spin_until && self.spin_pass(None) {
                continue;
            }
            self.control.check_aborts()?;
            // A peer in this call on the host board while this rank waits for its
            // messages would never send one: said now, not at the deadline.
            if let Some(refused) = self.board_refusal() {
                return Err(refused);
            }
            self.sleep(deadline);
        }
    }
}
