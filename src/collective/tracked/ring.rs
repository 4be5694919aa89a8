//! The mesh endpoint exchange over the tracker's ring links.
//!
//! Every rank's endpoint, in rank order, passed round the ring: at step `k` a rank
//! sends entry `rank − k` to its successor and receives entry `rank − k − 1` from its
//! predecessor. An entry is the 8-byte identity of the sender's attempt to form the
//! mesh (a random number drawn for each attempt), then the endpoint as an `i32` byte
//! count and the bytes.
//!
//! The ring goes round once more than an allgather needs (`world` steps, not
//! `world − 1`): at the last step each rank gets its own entry back. The tracker links
//! each rank to whichever attempt of its neighbours negotiated, so while ranks fail
//! and retry, a rank's predecessor may be linked, through its own predecessors, to an
//! attempt of some rank that has since died and been replaced: the endpoints that reach
//! this rank then name attempts that no longer form one ring with it, and a mesh
//! connected to them cannot form. A rank whose own entry comes back unchanged knows
//! that the `world` attempts behind it close the ring through it, so that every rank
//! of that ring holds the same endpoints; any other entry fails the exchange at once.
//!
//! While it waits, every other link of the join is watched ([`WatchedLinks`]): a peer
//! that leaves fails the exchange at once, not at its limit. Once its exchange is
//! over, a rank tells its peers so ([`WatchedLinks::finish`]); a peer can only finish
//! on the ring of this rank's own attempt (its ring came round through this attempt),
//! so that is never taken for a failure.

use super::ring_steps::{Entry, Next, NotBack, RingSteps};
use crate::bootstrap::{BootstrapError, EndpointExchange};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use switchyard_tracker::client::classic::WatchedLinks;
use switchyard_tracker::wire::{self, Deadline};

/// Longest mesh endpoint accepted from a peer during the ring allgather.
const MAX_ENDPOINT: usize = 4096;

/// The tracker's ring as an [`EndpointExchange`]: built once the tracker has assigned
/// the rank and linked its ring neighbours, used for one exchange, then dropped with
/// the tracker links before the mesh connects.
#[derive(Debug)]
pub(super) struct TrackerRing {
    /// Stream to the ring successor (send side).
    next: TcpStream,
    /// Stream from the ring predecessor (receive side).
    prev: TcpStream,
    /// The predecessor's rank, when the join's links are watched.
    prev_rank: Option<u32>,
    /// Every link of the join (the ring's too), watched while the exchange waits, told
    /// that this rank is done once it is over, and closed with the ring.
    links: WatchedLinks,
    /// This attempt's identity, sent with its endpoint.
    attempt: u64,
}

impl TrackerRing {
    /// The ring of a join: `next` and `prev` its ring streams, `prev_rank` the
    /// predecessor's rank and `links` every link of the join (classic joins), to watch.
    pub(super) fn new(
        next: TcpStream,
        prev: TcpStream,
        prev_rank: Option<u32>,
        links: WatchedLinks,
    ) -> TrackerRing {
        TrackerRing {
            next,
            prev,
            prev_rank,
            links,
            attempt: switchyard_net::tag::random_tag(),
        }
    }
}

impl EndpointExchange for TrackerRing {
    fn exchange(
        &mut self,
        rank: u32,
        world: u32,
        mine: &str,
        limit: Duration,
    ) -> Result<Vec<String>, BootstrapError> {
        let n = world as usize;
        let r = rank as usize;
        let until = Instant::now() + limit;
        let failed = |side: &str, of: usize, reason: String| BootstrapError::Protocol {
            peer: format!("ring {side} (rank {})", of % n),
            reason,
        };
        let (mut steps, mut out) = RingSteps::new(r, n, self.attempt, mine);
        loop {
            #[cfg(test)]
            super::hook::at(super::hook::Point::Ring(steps.step()));
            let mut frame = Vec::with_capacity(12 + out.1.len());
            frame.extend_from_slice(&out.0.to_le_bytes());
            wire::put_str(&mut frame, &out.1);
            let left = until.saturating_duration_since(Instant::now());
            wire::write_all_within(&self.next, &frame, left, "mesh endpoint")
                .map_err(|e| failed("successor", r + 1, format!("sending to it: {e}")))?;
            // A peer that left fails the exchange now, not at its limit.
            self.links
                .wait_readable(&self.prev, self.prev_rank, until)
                .map_err(|e| BootstrapError::Protocol {
                    peer: "of a tracker link".into(),
                    reason: e.to_string(),
                })?;
            let got = read_entry(&self.prev, until)
                .map_err(|e| failed("predecessor", r + n - 1, format!("receiving from it: {e}")))?;
            match steps.on_frame(got) {
                Ok(Next::Send(entry)) => out = entry,
                Ok(Next::Over(all)) => {
                    self.links.finish();
                    return Ok(all);
                }
                Err(NotBack { got }) => {
                    return Err(failed(
                        "predecessor",
                        r + n - 1,
                        format!(
                            "this rank's own endpoint did not come back round the ring ({:?} \
                             of attempt {:#x} came instead of {mine:?} of attempt {:#x}): the \
                             ring's links join attempts of ranks that have since left",
                            got.1, got.0, self.attempt
                        ),
                    ));
                }
            }
        }
    }
}

/// One entry from `stream`, all of it by `until`.
fn read_entry(stream: &TcpStream, until: Instant) -> Result<Entry, wire::WireError> {
    let left = until.saturating_duration_since(Instant::now());
    let mut r = Deadline::new(stream, left);
    let mut attempt = [0u8; 8];
    r.read_exact(&mut attempt, "mesh endpoint's attempt")?;
    let endpoint = r.str("mesh endpoint", MAX_ENDPOINT)?;
    Ok((u64::from_le_bytes(attempt), endpoint))
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
