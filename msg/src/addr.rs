use serde::{Deserialize, Serialize};
use std::fmt;

/// What a thread is: Singa's flag 0 (server), 1 (worker) or 2 (stub).
///
/// On the wire a role is a little-endian `u32` tag, given with each variant below
/// (`msg/WIRE.md`, "Addr"). The enum is `#[non_exhaustive]` so that a scheduler role
/// (the parameter server's) can be added with the next free tag without breaking a
/// `match` downstream; a build that does not know a tag refuses the message with
/// [`crate::DecodeError::UnknownTag`] instead of guessing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Role {
    /// A server thread holding parameter shards (wire value 0).
    Server,
    /// A worker thread computing gradients (wire value 1).
    Worker,
    /// A process's stub (wire value 2): control messages are addressed to it.
    Stub,
}

/// The address of one thread in the job: its group, its id within the group, its role.
///
/// Addresses are plain values; the stub's address table says which process hosts each
/// one.
///
/// # Examples
///
/// ```
/// use switchyard_msg::{Addr, Role};
/// let a = Addr::worker(1, 2);
/// assert_eq!(a, Addr { group: 1, id: 2, role: Role::Worker });
/// assert_eq!(a.to_string(), "worker(1,2)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Addr {
    /// Worker or server group.
    pub group: u32,
    /// Index of the thread inside its group.
    pub id: u32,
    /// What the thread is.
    pub role: Role,
}

impl Addr {
    /// The address of worker `id` in worker group `group`.
    pub const fn worker(group: u32, id: u32) -> Self {
        Addr {
            group,
            id,
            role: Role::Worker,
        }
    }

    /// The address of server `id` in server group `group`.
    pub const fn server(group: u32, id: u32) -> Self {
        Addr {
            group,
            id,
            role: Role::Server,
        }
    }

    /// The address of the stub of process `process`.
    pub const fn stub(process: u32) -> Self {
        Addr {
            group: process,
            id: 0,
            role: Role::Stub,
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            Role::Server => "server",
            Role::Worker => "worker",
            Role::Stub => "stub",
        };
        write!(f, "{role}({},{})", self.group, self.id)
    }
}
