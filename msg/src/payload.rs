//! Typed payload frames: slices of plain numbers and serde values.
//!
//! Numbers travel in the host's native layout, which is little-endian on every
//! platform switchyard builds for (`msg/WIRE.md`, "Payload frames"). Writers cost one
//! copy from a borrowed slice and none from an owned `Vec`; readers either view a
//! frame in place ([`frame_as_slice`], when the data is aligned) or copy it once.
//!
//! # Examples
//!
//! ```
//! use switchyard_msg::payload;
//! # fn main() -> Result<(), switchyard_msg::PayloadError> {
//! let owned = payload::frame_from_vec(vec![1.0f64, 2.0, 3.0]); // no copy
//! let borrowed = payload::frame_from_slice(&[4u32, 5]);         // one copy
//! assert_eq!(payload::frame_to_vec::<f64>(&owned)?, [1.0, 2.0, 3.0]);
//! assert_eq!(payload::frame_as_slice::<u32>(&borrowed)?, &[4, 5]);
//! // 7 bytes are not a whole number of f32s:
//! assert!(payload::frame_to_vec::<f32>(&owned[..7]).is_err());
//! # Ok(())
//! # }
//! ```

#[cfg(target_endian = "big")]
compile_error!("switchyard's payload frames are little-endian; big-endian hosts are not supported");

use crate::PayloadError;
use bytes::Bytes;
use serde::{Serialize, de::DeserializeOwned};

mod sealed {
    pub trait Sealed {}
}

/// A plain number type that can travel as a payload frame: every bit pattern is a
/// valid value and the layout has no padding. Besides Rust's own number types, the
/// `half` crate's [`half::f16`] (IEEE binary16) and [`half::bf16`] (bfloat16) are
/// elements: two bytes each, in native byte order.
pub trait Element: bytemuck::Pod + sealed::Sealed + Send + Sync + 'static {}

macro_rules! elements {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}
elements!(
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    half::f16,
    half::bf16
);

/// A `Vec` of elements seen as bytes, so that [`Bytes`] can own it without copying.
struct ElementVec<T: Element>(Vec<T>);

impl<T: Element> AsRef<[u8]> for ElementVec<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// A frame holding `values`, copied once.
pub fn frame_from_slice<T: Element>(values: &[T]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(values))
}

/// A frame that takes ownership of `values` without copying them.
pub fn frame_from_vec<T: Element>(values: Vec<T>) -> Bytes {
    if values.is_empty() {
        return Bytes::new();
    }
    Bytes::from_owner(ElementVec(values))
}

fn check_len<T: Element>(frame: &[u8]) -> Result<usize, PayloadError> {
    let elem_size = std::mem::size_of::<T>();
    if frame.len() % elem_size != 0 {
        return Err(PayloadError::Length {
            len: frame.len(),
            elem_size,
        });
    }
    Ok(frame.len() / elem_size)
}

/// Views a frame as a slice of `T` in place. Fails if the length is not a whole number
/// of elements or the data is not aligned for `T` (a frame sliced at an odd offset);
/// [`frame_to_vec`] and [`frame_copy_into`] accept any alignment.
pub fn frame_as_slice<T: Element>(frame: &[u8]) -> Result<&[T], PayloadError> {
    if check_len::<T>(frame)? == 0 {
        // An empty buffer's pointer need not be aligned; there is nothing to view.
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(frame).map_err(|_| PayloadError::Misaligned {
        align: std::mem::align_of::<T>(),
    })
}

/// Copies a frame into a new `Vec<T>` (one copy, any alignment).
pub fn frame_to_vec<T: Element>(frame: &[u8]) -> Result<Vec<T>, PayloadError> {
    let count = check_len::<T>(frame)?;
    let mut out = vec![T::zeroed(); count];
    crate::copy::copy_bytes(bytemuck::cast_slice_mut::<T, u8>(&mut out), frame);
    Ok(out)
}

/// Copies a frame into `dst`, which must hold exactly as many elements (one copy, any
/// alignment).
pub fn frame_copy_into<T: Element>(frame: &[u8], dst: &mut [T]) -> Result<(), PayloadError> {
    let count = check_len::<T>(frame)?;
    if count != dst.len() {
        return Err(PayloadError::CountMismatch {
            expected: dst.len(),
            actual: count,
        });
    }
    crate::copy::copy_bytes(bytemuck::cast_slice_mut::<T, u8>(dst), frame);
    Ok(())
}

fn serde_options(limit: usize) -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(limit as u64)
}

/// A frame holding `value` encoded with bincode (fixed-width integers, little-endian).
pub fn frame_from_value<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, PayloadError> {
    use bincode::Options;
    serde_options(usize::MAX)
        .serialize(value)
        .map(Bytes::from)
        .map_err(|err| PayloadError::Serde {
            reason: err.to_string(),
        })
}

/// Decodes a frame written by [`frame_from_value`]. A frame longer than `limit` bytes
/// is refused before decoding, and the decoder reads at most `limit` bytes.
///
/// A length prefix that claims more elements than the frame holds fails with a typed
/// error; before it does, serde may have reserved up to 1 MiB for that sequence (its
/// cautious pre-allocation), never more.
pub fn frame_to_value<T: DeserializeOwned>(frame: &[u8], limit: usize) -> Result<T, PayloadError> {
    use bincode::Options;
    if frame.len() > limit {
        return Err(PayloadError::Serde {
            reason: format!(
                "value frame of {} bytes is over the limit of {limit}",
                frame.len()
            ),
        });
    }
    serde_options(limit)
        .reject_trailing_bytes()
        .deserialize(frame)
        .map_err(|err| PayloadError::Serde {
            reason: err.to_string(),
        })
}
