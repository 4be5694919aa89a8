use bytes::Bytes;
use std::fmt;

/// A dealer's identity as its router sees it (ZeroMQ's routing id): 1 to 255 bytes,
/// not starting with a zero byte (libzmq reserves those for identities it makes up).
///
/// # Examples
///
/// ```
/// use switchyard_transports::PeerId;
/// let p = PeerId::from_index(3);
/// assert_eq!(p.to_string(), "#3");
/// assert_eq!(p, PeerId::new("#3").unwrap());
/// assert!(PeerId::new(vec![0u8, 1]).is_none());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(Bytes);

impl PeerId {
    /// An identity from raw bytes, or `None` if it is empty, longer than 255 bytes, or
    /// starts with a zero byte.
    pub fn new(bytes: impl Into<Bytes>) -> Option<PeerId> {
        let bytes = bytes.into();
        if bytes.is_empty() || bytes.len() > 255 || bytes[0] == 0 {
            return None;
        }
        Some(PeerId(bytes))
    }

    /// The identity `#n`, the form the stub uses for process `n`.
    pub fn from_index(n: u64) -> PeerId {
        PeerId(Bytes::from(format!("#{n}")))
    }

    /// The identity's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    #[cfg(feature = "zmq")]
    pub(crate) fn from_wire(bytes: Bytes) -> PeerId {
        PeerId(bytes)
    }

    #[cfg(feature = "zmq")]
    pub(crate) fn bytes(&self) -> &Bytes {
        &self.0
    }
}

// `Bytes` hashes and compares as its byte slice, so a received identity can be looked
// up in a set of peers without first being copied into a `PeerId`.
impl std::borrow::Borrow<[u8]> for PeerId {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) if text.chars().all(|c| !c.is_control()) => f.write_str(text),
            _ => {
                f.write_str("0x")?;
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerId({self})")
    }
}
