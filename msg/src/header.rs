use crate::Addr;
use serde::{Deserialize, Serialize};

/// What a message is about.
///
/// The first six are Singa's: four about parameters and two about layer data. The
/// framework's own control kinds follow, and [`Kind::User`] leaves room for an
/// application's kinds. Each variant's wire tag is given below (`msg/WIRE.md`, "Kind");
/// tags are never reused or renumbered, and a new kind is appended with the next free
/// tag (declaration order follows the tags, so serde's variant index agrees). A build
/// that does not know a tag refuses the message with [`crate::DecodeError::UnknownTag`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Kind {
    /// Ask a server for the current value of a parameter (wire 0).
    Get,
    /// Store a parameter's value on a server (wire 1).
    Put,
    /// Send a gradient to a server, or a server's updated value back (wire 2).
    Update,
    /// Synchronise parameters between server groups (wire 3).
    Sync,
    /// A layer's feature blob for the neighbouring layer (wire 4).
    FeaBlob,
    /// A layer's gradient blob for the neighbouring layer (wire 5).
    GradBlob,
    /// Transport control: a dealer announcing itself to a router (wire 6).
    Hello,
    /// Transport control: a router's answer to [`Kind::Hello`] (wire 7).
    Ready,
    /// Ask the receiving thread to finish (wire 8).
    Stop,
    /// A message the stub could not deliver, returned to its sender (wire 9).
    /// Its target and sequence number are those of the original message.
    Undeliverable,
    /// Collective-operation traffic (wire 10).
    Collective,
    /// An application-defined kind (wire 11, followed by the `u16`).
    User(u16),
}

/// What inside the receiver a message refers to.
///
/// On the wire a `u32` tag, given with each variant, followed by the variant's fields
/// (`msg/WIRE.md`, "Target"). The enum is `#[non_exhaustive]` so that new targets (the
/// parameter server's key ranges) can be appended with the next free tag; a build that
/// does not know a tag cannot tell how many bytes its fields take, so it refuses the
/// message with [`crate::DecodeError::UnknownTag`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Target {
    /// Nothing in particular (wire 0).
    #[default]
    None,
    /// A parameter, by id (wire 1).
    Param(u32),
    /// A blob of a layer: layer id, then blob id within the layer (wire 2).
    Blob {
        /// Layer id.
        layer: u32,
        /// Blob id within the layer.
        blob: u32,
    },
}

/// Everything about a message except its payload.
///
/// # Examples
///
/// ```
/// use switchyard_msg::{Addr, Header, Kind, Target};
/// let h = Header::new(Addr::worker(0, 0), Addr::server(0, 0), Kind::Get);
/// assert_eq!(h.target, Target::None);
/// assert_eq!(h.seq, 0);
/// assert_eq!(h.with_step(3).step, 3);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Header {
    /// Sender.
    pub src: Addr,
    /// Receiver.
    pub dst: Addr,
    /// What the message is about.
    pub kind: Kind,
    /// What inside the receiver it refers to.
    pub target: Target,
    /// A sequence number chosen by the sender; it wraps from `u64::MAX` to 0 and the
    /// framework never interprets it.
    pub seq: u64,
    /// A step within the exchange that `seq` numbers, such as a collective's step
    /// within one call, so that `target` is left for what a message refers to; 0 when
    /// unused. The transports never interpret it.
    pub step: u32,
}

impl Header {
    /// A header from `src` to `dst` of kind `kind`, with no target, sequence 0 and
    /// step 0.
    pub const fn new(src: Addr, dst: Addr, kind: Kind) -> Self {
        Header {
            src,
            dst,
            kind,
            target: Target::None,
            seq: 0,
            step: 0,
        }
    }

    /// Sets the step and returns the header.
    pub const fn with_step(mut self, step: u32) -> Self {
        self.step = step;
        self
    }
}
