//! The JSON join's decisions, apart from its sockets: whether the tracker's frames
//! name a world and a successor this worker can use, which rank that makes it, and
//! the ring bootstrap's allgather (docs/xgboost-protocol.md, *The ring bootstrap*) as
//! a sequence of slot exchanges with a check at the end.
//!
//! The driver in [`super`] reads the frames, connects, accepts, and moves each
//! [`Exchange`]'s bytes; what it sends and what it expects back is decided here, so a
//! whole ring can be run in a unit test by handing each worker's slot to the next.

use crate::client::ClientError;
use crate::client::error::At;
use std::net::SocketAddr;

/// Bytes of one host slot in the ring bootstrap (XGBoost's `HOST_NAME_MAX`).
pub(super) const HOST_SLOT: usize = 64;

/// The world size the tracker sent, checked.
pub(super) fn world(at: SocketAddr, world_size: i64) -> Result<u32, ClientError> {
    u32::try_from(world_size)
        .ok()
        .filter(|&w| w > 0)
        .ok_or_else(|| At(at).bad("world size", format!("{world_size}")))
}

/// This worker's place in the ring, from the tracker's frame naming its successor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Place {
    /// This worker's rank: the successor's minus one.
    pub(super) rank: u32,
    /// The successor's host, as sent (shorter than a host slot).
    pub(super) next_host: String,
    /// The successor's listening port.
    pub(super) next_port: u16,
}

/// The successor frame's fields (`host`, `port`, `rank`) checked against `world`.
pub(super) fn place(
    at: SocketAddr,
    world: u32,
    host: String,
    port: i64,
    rank: i64,
) -> Result<Place, ClientError> {
    let next_rank = u32::try_from(rank)
        .ok()
        .filter(|&r| r < world)
        .ok_or_else(|| At(at).bad("peer frame", format!("rank {rank} of {world}")))?;
    let next_port = u16::try_from(port)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| At(at).bad("peer frame", format!("port {port}")))?;
    if host.len() >= HOST_SLOT {
        return Err(At(at).bad("peer frame", format!("host text of {} bytes", host.len())));
    }
    Ok(Place {
        rank: (next_rank + world - 1) % world,
        next_host: host,
        next_port,
    })
}

/// One step of the ring bootstrap: send `send` to the successor, then read `len`
/// bytes from the predecessor and feed them to [`RingBootstrap::on_received`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Exchange {
    /// The slot to send.
    pub(super) send: Vec<u8>,
    /// Bytes of the slot to read.
    pub(super) len: usize,
    /// Which slots these are, for errors.
    pub(super) what: &'static str,
}

/// The ring bootstrap's allgather, first of host slots then of port slots; slot `s`
/// describes rank `s + 1` (each worker fills its own slot with its successor).
#[derive(Clone, Debug)]
pub(super) struct RingBootstrap {
    rank: usize,
    hosts: Vec<[u8; HOST_SLOT]>,
    ports: Vec<[u8; 4]>,
    own_port: u16,
    /// Exchanges done: the first `n` move host slots, the next `n` port slots.
    done: usize,
}

impl RingBootstrap {
    /// The bootstrap of `place` in a world of `world`, for a worker listening on
    /// `own_port`.
    pub(super) fn new(place: &Place, world: u32, own_port: u16) -> RingBootstrap {
        let (n, r) = (world as usize, place.rank as usize);
        let mut hosts = vec![[0u8; HOST_SLOT]; n];
        let host = place.next_host.as_bytes();
        hosts[r][..host.len()].copy_from_slice(host);
        let mut ports = vec![[0u8; 4]; n];
        ports[r] = i32::from(place.next_port).to_le_bytes();
        RingBootstrap {
            rank: r,
            hosts,
            ports,
            own_port,
            done: 0,
        }
    }

    fn n(&self) -> usize {
        self.hosts.len()
    }

    /// The rank the slots come from.
    pub(super) fn predecessor(&self) -> u32 {
        ((self.rank + self.n() - 1) % self.n()) as u32
    }

    /// The slot sent and the slot received in exchange `k` of a round of `n`.
    fn slots(&self, k: usize) -> (usize, usize) {
        let (n, r) = (self.n(), self.rank);
        ((r + n - k) % n, (r + n - k - 1) % n)
    }

    /// The next exchange, or `None` once both allgathers are done.
    pub(super) fn next(&self) -> Option<Exchange> {
        let n = self.n();
        if self.done < n {
            let (send, _) = self.slots(self.done);
            Some(Exchange {
                send: self.hosts[send].to_vec(),
                len: HOST_SLOT,
                what: "host slot",
            })
        } else if self.done < 2 * n {
            let (send, _) = self.slots(self.done - n);
            Some(Exchange {
                send: self.ports[send].to_vec(),
                len: 4,
                what: "port slot",
            })
        } else {
            None
        }
    }

    /// The slot the predecessor sent in the current exchange (`len` bytes as
    /// [`next`](Self::next) said; anything else is ignored).
    pub(super) fn on_received(&mut self, slot: &[u8]) {
        let n = self.n();
        if self.done < n {
            let (_, recv) = self.slots(self.done);
            let Ok(slot) = <[u8; HOST_SLOT]>::try_from(slot) else {
                return;
            };
            self.hosts[recv] = slot;
        } else if self.done < 2 * n {
            let (_, recv) = self.slots(self.done - n);
            let Ok(slot) = <[u8; 4]>::try_from(slot) else {
                return;
            };
            self.ports[recv] = slot;
        } else {
            return;
        }
        self.done += 1;
    }

    /// The port the ring says this worker listens on (the predecessor's slot).
    fn own_slot_port(&self) -> i32 {
        let n = self.n();
        i32::from_le_bytes(self.ports[(self.rank + n - 1) % n])
    }

    /// Checks that the slot describing this worker carries its own port.
    pub(super) fn finish(&self, at: SocketAddr) -> Result<(), ClientError> {
        let mine = self.own_slot_port();
        if mine != i32::from(self.own_port) {
            return Err(At(at).bad(
                "ring bootstrap",
                format!(
                    "this worker's slot says port {mine}, it listens on {}",
                    self.own_port
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
