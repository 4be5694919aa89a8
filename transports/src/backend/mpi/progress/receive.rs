//! What the progress thread receives: control notes between ranks (which keep the
//! table of peers), and data for this rank's router and dealers.

use super::{BATCH, PeerState, Progress, RouterEnd};
use crate::PeerId;
use crate::backend::Inbound;
use crate::backend::mpi::credits::{Credits, MpiRoute};
use crate::backend::mpi::engine::{CONTROL_TAG, ROUTER_TAG};
use crate::backend::mpi::ffi::{self, MpiError};
use crate::backend::mpi::wire::Control;

impl Progress {
    /// A new router inherits every dealer that said hello and has not said goodbye,
    /// as a restarted ZeroMQ router is reconnected to by its dealers. This rank's
    /// own dealers are exact (their closes are applied in command order, before a
    /// later bind); a dealer on another rank whose bye is still in flight is
    /// inherited and then disconnected when the bye arrives, as a ZeroMQ router sees
    /// a peer that connects and leaves.
    pub(super) fn bind_router(&mut self, router: RouterEnd) -> Result<(), MpiError> {
        let mut ready = Vec::new();
        for (&(rank, tag), peer) in self.peers.iter_mut() {
            if !peer.readied {
                peer.readied = true;
                ready.push((rank, tag));
            }
            if peer.live {
                let _ = router.events.send(Inbound::Connect {
                    peer: peer.identity.clone(),
                    route: MpiRoute {
                        rank,
                        tag,
                        credits: peer.credits.clone(),
                    },
                });
            }
        }
        router.turn.serve();
        self.router = Some(router);
        for (rank, tag) in ready {
            self.send_control(rank, &Control::Ready { dealer: tag })?;
        }
        Ok(())
    }

    fn drop_malformed(&self, source: i32, reason: &dyn std::fmt::Display) {
        self.shared.drop_malformed(source, reason);
    }

    pub(super) fn receive_control(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        while let Some(matched) = ffi::probe(self.comms.data, None, Some(CONTROL_TAG))? {
            worked = true;
            let source = matched.source;
            let buffer = ffi::receive(matched)?;
            match Control::decode(&buffer) {
                Ok(note) => self.apply(source, note)?,
                Err(reason) => self.drop_malformed(source, &reason),
            }
        }
        Ok(worked)
    }

    fn apply(&mut self, source: i32, note: Control) -> Result<(), MpiError> {
        match note {
            Control::Hello { dealer, identity } => {
                if source == self.rank && !self.dealers.contains_key(&dealer) {
                    // One of this process's dealers that closed (its connect timed
                    // out) before its hello came back through the loopback: no bye
                    // will follow (see `CloseDealer`), so nothing may connect.
                    // Tags are never reused, so the tag names that dealer alone.
                    return Ok(());
                }
                let Some(identity) = PeerId::new(identity) else {
                    self.drop_malformed(source, &"hello with an invalid identity");
                    return Ok(());
                };
                self.shared.name_dealer(source, dealer, identity.clone());
                let hwm = self.router.as_ref().map_or(1000, |r| r.hwm);
                let credits = Credits::new(hwm);
                let readied = self.router.is_some();
                if let Some(router) = &self.router {
                    let _ = router.events.send(Inbound::Connect {
                        peer: identity.clone(),
                        route: MpiRoute {
                            rank: source,
                            tag: dealer,
                            credits: credits.clone(),
                        },
                    });
                }
                self.peers.insert(
                    (source, dealer),
                    PeerState {
                        identity,
                        readied,
                        live: true,
                        credits,
                    },
                );
                if readied {
                    self.send_control(source, &Control::Ready { dealer })?;
                }
            }
            Control::Ready { dealer } => {
                if let Some(end) = self.dealers.get_mut(&dealer) {
                    if end.router == source {
                        if let Some(connected) = end.connected.take() {
                            let _ = connected.send(());
                        }
                    }
                }
            }
            Control::Bye { dealer } => self.forget(source, dealer),
        }
        Ok(())
    }

    /// A dealer left: the router (this one and any bound later) forgets it. Its
    /// entry stays, so that data it sent before leaving still names it.
    pub(super) fn forget(&mut self, source: i32, dealer: i32) {
        let Some(peer) = self.peers.get_mut(&(source, dealer)) else {
            return;
        };
        if !peer.live {
            return;
        }
        peer.live = false;
        let identity = peer.identity.clone();
        // A dealer that reconnected under the same identity keeps its place.
        let replaced = self
            .peers
            .values()
            .any(|p| p.live && p.identity == identity);
        if let (Some(router), false) = (&self.router, replaced) {
            let _ = router.events.send(Inbound::Disconnect { peer: identity });
        }
    }

    /// Receives for this rank's router, unless its own thread is receiving.
    pub(super) fn receive_for_router(&mut self) -> Result<bool, MpiError> {
        let Some(router) = &self.router else {
            return Ok(false);
        };
        let turn = router.turn.clone();
        let Some(_turn) = turn.try_take() else {
            return Ok(false);
        };
        let mut worked = false;
        for _ in 0..BATCH {
            let Some(router) = &self.router else {
                break;
            };
            if router.events.len() >= router.hwm || turn.wanted() {
                break;
            }
            let Some(matched) = ffi::probe(self.comms.data, None, Some(ROUTER_TAG))? else {
                break;
            };
            worked = true;
            let source = matched.source;
            match self
                .comms
                .receive_data(matched, ROUTER_TAG, &router.limits)?
            {
                Ok((dealer, msg)) => match self.peers.get(&(source, dealer)) {
                    Some(peer) => {
                        let _ = router.events.send(Inbound::Data {
                            peer: peer.identity.clone(),
                            msg,
                        });
                    }
                    None => self.drop_malformed(
                        source,
                        &format_args!("data from dealer tag {dealer}, which never said hello"),
                    ),
                },
                Err(reason) => self.drop_malformed(source, &reason),
            }
        }
        Ok(worked)
    }

    pub(super) fn receive_for_dealers(&mut self) -> Result<bool, MpiError> {
        let mut worked = false;
        let mut malformed = Vec::new();
        for (&tag, end) in &self.dealers {
            // A dealer whose thread is receiving takes its own messages.
            let Some(_turn) = end.turn.try_take() else {
                continue;
            };
            for _ in 0..BATCH {
                if end.inbox.len() >= end.hwm || end.turn.wanted() {
                    break;
                }
                let Some(matched) = ffi::probe(self.comms.data, Some(end.router), Some(tag))?
                else {
                    break;
                };
                worked = true;
                match self.comms.receive_data(matched, tag, &end.limits)? {
                    Ok((_, msg)) => {
                        let _ = end.inbox.send(msg);
                    }
                    Err(reason) => malformed.push((end.router, reason)),
                }
            }
        }
        for (source, reason) in malformed {
            self.drop_malformed(source, &reason);
        }
        Ok(worked)
    }
}
