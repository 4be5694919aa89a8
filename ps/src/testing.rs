//! Pieces of the scheduler's protocol for the in-crate tests that play a scheduler by
//! hand (one that dies mid-job, say).

use super::wire::{self, Control, NodeRole};
use switchyard_msg::Msg;

/// The role and endpoint of a registration message, or `None` if `msg` is not one.
pub(crate) fn registration(msg: &Msg) -> Option<(NodeRole, String)> {
    match wire::read_control(msg, "test").ok()? {
        Control::Register { role, endpoint, .. } => Some((role, endpoint)),
        _ => None,
    }
}

/// The scheduler's rank assignment (values over ZeroMQ: no data plane).
pub(crate) fn assign(rank: u32, num_workers: u32, servers: Vec<String>) -> Msg {
    let note = Control::Assign {
        rank,
        num_workers,
        servers,
        data: false,
    };
    wire::control(wire::SCHEDULER, wire::SCHEDULER, &note)
}
