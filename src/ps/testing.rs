//! Pieces of the scheduler's protocol for tests that play a scheduler by hand (one
//! that dies mid-job, say). Not a stable API.

use super::wire::{self, Control, NodeRole};
use switchyard_msg::Msg;

/// The role and endpoint of a registration message, or `None` if `msg` is not one.
pub fn registration(msg: &Msg) -> Option<(NodeRole, String)> {
    match wire::read_control(msg, "test").ok()? {
        Control::Register { role, endpoint } => Some((role, endpoint)),
        _ => None,
    }
}

/// The scheduler's rank assignment.
pub fn assign(rank: u32, num_workers: u32, servers: Vec<String>) -> Msg {
    let note = Control::Assign {
        rank,
        num_workers,
        servers,
    };
    wire::control(wire::SCHEDULER, wire::SCHEDULER, &note)
}
