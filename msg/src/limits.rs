//! The limits a receiver applies to what a peer sends (`msg/WIRE.md` section 4).

/// Size limits a decoder enforces before it trusts or allocates anything.
///
/// The defaults suit ML payloads on one cluster: a header frame is at most 256 bytes
/// (a version 2 header frame is 52 to 62), a message has at most 1024 payload frames,
/// and a frame at most 1 GiB. The ZeroMQ backend also hands `max_frame_bytes` to libzmq as
/// `ZMQ_MAXMSGSIZE`, so an oversized frame is refused before it is buffered.
///
/// # Examples
///
/// ```
/// use switchyard_msg::Limits;
/// let limits = Limits::default().with_max_frames(8);
/// assert_eq!(limits.max_frames, 8);
/// assert_eq!(limits.max_header_bytes, 256);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest header frame accepted, prefix included.
    pub max_header_bytes: usize,
    /// Most payload frames in one message.
    pub max_frames: usize,
    /// Largest payload frame accepted.
    pub max_frame_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 256,
            max_frames: 1024,
            max_frame_bytes: 1 << 30,
        }
    }
}

impl Limits {
    /// Sets [`Limits::max_header_bytes`].
    pub fn with_max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes;
        self
    }

    /// Sets [`Limits::max_frames`].
    pub fn with_max_frames(mut self, frames: usize) -> Self {
        self.max_frames = frames;
        self
    }

    /// Sets [`Limits::max_frame_bytes`].
    pub fn with_max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }
}
