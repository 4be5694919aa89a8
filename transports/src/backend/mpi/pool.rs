//! Receive buffers that go back to a pool when the last frame cut from them is
//! dropped, so that a steady stream of messages reuses the same memory instead of
//! asking the allocator (and, past glibc's mmap threshold, the kernel: fresh pages
//! and their faults) for a new buffer per message.
//!
//! Buffers come in power-of-two size classes from 256 B. A class keeps at most
//! [`KEEP`] idle buffers and never more than [`KEEP_BYTES`] of them (at least one), and
//! messages larger than [`LARGEST_POOLED`] get a buffer of their own: a pool holds
//! memory the process is not using, so it stays small.

use bytes::Bytes;
use std::sync::Mutex;

/// The smallest class: 2^8 = 256 bytes.
const SMALLEST_SHIFT: u32 = 8;
/// Messages above this size are not pooled (64 MiB).
const LARGEST_POOLED: usize = 64 << 20;
const CLASSES: usize = (LARGEST_POOLED.trailing_zeros() - SMALLEST_SHIFT + 1) as usize;
/// Idle buffers a class keeps at most.
const KEEP: usize = 16;
/// Idle bytes a class keeps at most (it keeps one buffer even when that is larger).
const KEEP_BYTES: usize = 64 << 20;

static POOL: [Mutex<Vec<Vec<u8>>>; CLASSES] = [const { Mutex::new(Vec::new()) }; CLASSES];

/// The class of a buffer that holds `len` bytes, or `None` past the largest.
fn class_of(len: usize) -> Option<usize> {
    if len > LARGEST_POOLED {
        return None;
    }
    let bits = len.max(1).next_power_of_two().trailing_zeros();
    Some(bits.saturating_sub(SMALLEST_SHIFT) as usize)
}

fn class_bytes(class: usize) -> usize {
    1 << (class as u32 + SMALLEST_SHIFT)
}

/// An empty buffer with room for at least `len` bytes: an idle one of its class if
/// there is one.
pub(crate) fn take(len: usize) -> Vec<u8> {
    let Some(class) = class_of(len) else {
        return Vec::with_capacity(len);
    };
    let idle = POOL[class].lock().unwrap_or_else(|p| p.into_inner()).pop();
    idle.unwrap_or_else(|| Vec::with_capacity(class_bytes(class)))
}

/// `buffer` as shared bytes that return it to the pool once every slice of it is gone.
pub(crate) fn share(buffer: Vec<u8>) -> Bytes {
    if class_of(buffer.capacity()).is_some_and(|c| class_bytes(c) == buffer.capacity()) {
        Bytes::from_owner(Pooled(buffer))
    } else {
        Bytes::from(buffer)
    }
}

/// A buffer of the pool lent out as [`Bytes`].
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut buffer = std::mem::take(&mut self.0);
        let Some(class) = class_of(buffer.capacity()) else {
            return;
        };
        let keep = (KEEP_BYTES / class_bytes(class)).clamp(1, KEEP);
        let mut idle = POOL[class].lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < keep {
            buffer.clear();
            idle.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_from_256_bytes() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(256), Some(0));
        assert_eq!(class_of(257), Some(1));
        assert_eq!(class_bytes(class_of(1 << 20).unwrap_or(0)), 1 << 20);
        assert_eq!(class_of(LARGEST_POOLED), Some(CLASSES - 1));
        assert_eq!(class_of(LARGEST_POOLED + 1), None);
    }

    #[test]
    fn a_buffer_comes_back_once_its_last_slice_is_dropped() {
        // A class no other test uses, so that parallel tests cannot take the buffer.
        let len = (3 << 20) + 5;
        let mut buffer = take(len);
        buffer.extend(std::iter::repeat_n(7u8, len));
        let address = buffer.as_ptr();
        let whole = share(buffer);
        let slice = whole.slice(10..20);
        drop(whole);
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        let again = take(len);
        assert_eq!(again.as_ptr(), address, "the same buffer is lent again");
        assert!(again.is_empty() && again.capacity() >= len);
    }
}
