//! Buffers of values a server reuses: the values of each request it decodes, and the
//! snapshots of a key's value that its replies carry.
//!
//! A fresh buffer of a large key's size (a 1 MiB gradient) costs a page fault per page
//! on first touch, and a server made one per request and one per reply. Buffers of
//! [`POOLED_BYTES`] and more go back to the pool once their values are summed in, or
//! once the last reply that carried them has been sent (a snapshot is shared by
//! every reply of its round and by libzmq until it is on the wire), and the next
//! request or reply takes one from there. Smaller buffers come from the allocator,
//! where they cost less than the pool's lock; from [`POOLED_BYTES`] (4 KiB) a
//! zero-filled allocation costs more (a request of 16 keys of 1 KiB spent 5% of a
//! round's instructions in `calloc`).

use super::Value;
use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// The smallest buffer worth keeping, in bytes.
pub(crate) const POOLED_BYTES: usize = 4 << 10;

/// At most this many buffers wait in the pool: a job's requests in flight, not more
/// (a server answers a round before it reads much further).
const KEEP: usize = 16;

/// A server's pool of value buffers; clones share it.
pub(crate) struct ValuePool<T> {
    spare: Arc<Mutex<Vec<Vec<T>>>>,
    /// Frames that requests' values were summed from, done with: the server gives
    /// them back to the data plane, which receives into them again.
    spent: Arc<Mutex<Vec<Bytes>>>,
}

impl<T> Clone for ValuePool<T> {
    fn clone(&self) -> Self {
        ValuePool {
            spare: Arc::clone(&self.spare),
            spent: Arc::clone(&self.spent),
        }
    }
}

impl<T> Default for ValuePool<T> {
    fn default() -> Self {
        ValuePool {
            spare: Arc::new(Mutex::new(Vec::new())),
            spent: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<T: Value> ValuePool<T> {
    /// A buffer of `len` values whose contents are unspecified: the caller writes
    /// every one of them.
    pub(crate) fn take(&self, len: usize) -> Vec<T> {
        if !worth_pooling::<T>(len) {
            return vec![T::default(); len];
        }
        // The smallest buffer that fits, so that a small request does not take the
        // buffer a large one needs.
        let reused = self.spare.lock().ok().and_then(|mut spare| {
            let (at, _) = (spare.iter().enumerate())
                .filter(|(_, b)| b.capacity() >= len)
                .min_by_key(|(_, b)| b.capacity())?;
            Some(spare.swap_remove(at))
        });
        let mut buffer = reused.unwrap_or_default();
        // Only a grown tail is written here; a reused buffer of this size is not.
        buffer.resize(len, T::default());
        buffer
    }

    /// Takes `buffer` back for a later [`ValuePool::take`] (small ones are dropped).
    pub(crate) fn give(&self, buffer: Vec<T>) {
        if !worth_pooling::<T>(buffer.capacity()) {
            return;
        }
        if let Ok(mut spare) = self.spare.lock() {
            if spare.len() < KEEP {
                spare.push(buffer);
            }
        }
    }

    /// Keeps a frame of request values the store is done with, for
    /// [`ValuePool::take_spent`] (at most [`KEEP`]; more are dropped).
    pub(crate) fn spend(&self, frame: Bytes) {
        if let Ok(mut spent) = self.spent.lock() {
            if spent.len() < KEEP {
                spent.push(frame);
            }
        }
    }

    /// The frames [`ValuePool::spend`] kept, taken out.
    pub(crate) fn take_spent(&self) -> Vec<Bytes> {
        self.spent
            .lock()
            .map(|mut spent| std::mem::take(&mut *spent))
            .unwrap_or_default()
    }

    /// A frame holding a copy of `values`, in a pooled buffer that comes back to
    /// the pool when the frame and every clone of it are dropped.
    pub(crate) fn frame_of(&self, values: &[T]) -> Bytes {
        if !worth_pooling::<T>(values.len()) {
            return switchyard_msg::payload::frame_from_slice(values);
        }
        let mut buffer = self.take(values.len());
        switchyard_msg::copy::copy_elements(&mut buffer, values);
        Bytes::from_owner(Pooled {
            values: buffer,
            pool: self.clone(),
        })
    }

    /// Buffers waiting in the pool (for tests).
    #[cfg(test)]
    pub(crate) fn spare(&self) -> usize {
        self.spare.lock().map_or(0, |s| s.len())
    }
}

/// Whether a buffer of `len` values goes through the pool.
fn worth_pooling<T>(len: usize) -> bool {
    len.saturating_mul(std::mem::size_of::<T>()) >= POOLED_BYTES
}

/// A pooled buffer owned by a frame.
struct Pooled<T: Value> {
    values: Vec<T>,
    pool: ValuePool<T>,
}

impl<T: Value> AsRef<[u8]> for Pooled<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values)
    }
}

impl<T: Value> Drop for Pooled<T> {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.values));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_and_small_ones_do_not() {
        let pool = ValuePool::<f32>::default();
        let big = pool.take(1 << 16);
        let address = big.as_ptr();
        pool.give(big);
        pool.give(vec![0.0; 10]);
        assert_eq!(pool.spare(), 1);
        let again = pool.take(1 << 15);
        assert_eq!((again.as_ptr(), again.len()), (address, 1 << 15));
        assert_eq!(pool.spare(), 0);
    }

    #[test]
    fn a_request_takes_the_smallest_buffer_that_fits() {
        let pool = ValuePool::<f32>::default();
        pool.give(Vec::with_capacity(1 << 18));
        pool.give(Vec::with_capacity(1 << 15));
        pool.give(Vec::with_capacity(1 << 17));
        assert_eq!(pool.take(25_000).capacity(), 1 << 15);
        assert_eq!(pool.take(150_000).capacity(), 1 << 18);
        assert_eq!(pool.spare(), 1);
    }

    #[test]
    fn a_frames_buffer_returns_when_its_last_clone_drops() {
        let pool = ValuePool::<f64>::default();
        let values: Vec<f64> = (0..20_000).map(f64::from).collect();
        let frame = pool.frame_of(&values);
        let clone = frame.clone();
        assert_eq!(frame.as_ref(), bytemuck::cast_slice::<f64, u8>(&values));
        drop(frame);
        assert_eq!(pool.spare(), 0);
        drop(clone);
        assert_eq!(pool.spare(), 1);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers() {
        let pool = ValuePool::<i64>::default();
        for _ in 0..KEEP + 5 {
            pool.give(vec![0; 1 << 14]);
        }
        assert_eq!(pool.spare(), KEEP);
    }
}
