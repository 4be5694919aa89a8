//! Frame buffers to reuse.
//!
//! Receiving into fresh allocations costs a page fault and a zero-fill per page, the
//! largest item in a profile of 4 MiB allreduces; a ring reuses the same few
//! piece-sized buffers over and over.

use bytes::Bytes;

/// Most buffers the pool keeps.
const POOL_BUFFERS: usize = 64;
/// Frames smaller than this are not worth keeping.
const POOL_MIN: usize = 4096;

/// Buffers of frames that were sent or consumed, ready to be filled again. Holds at
/// most [`POOL_BUFFERS`] buffers, none smaller than [`POOL_MIN`] bytes.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: Vec<Vec<u8>>,
}

impl Pool {
    /// A buffer of `len` bytes, recycled where one large enough is kept. Its contents
    /// are unspecified: the caller overwrites all of it.
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        if len >= POOL_MIN {
            if let Some(at) = self.free.iter().rposition(|b| b.capacity() >= len) {
                let mut buffer = self.free.swap_remove(at);
                // Shrinking is free; growing within the capacity zero-fills the growth only.
                buffer.resize(len, 0);
                return buffer;
            }
        }
        vec![0; len]
    }

    /// Keeps `frame`'s memory for a later [`take`](Pool::take), if nobody else holds
    /// the frame and the pool has room.
    pub(crate) fn give(&mut self, frame: Bytes) {
        if frame.len() < POOL_MIN || self.free.len() >= POOL_BUFFERS {
            return;
        }
        // Only a frame nobody else holds comes back; a shared one just drops.
        if let Ok(unique) = frame.try_into_mut() {
            self.free.push(Vec::from(unique));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_large_frame_comes_back_and_a_shared_or_small_one_does_not() {
        let mut pool = Pool::default();
        let frame = Bytes::from(vec![7u8; 8192]);
        let ptr = frame.as_ptr();
        pool.give(frame);
        let again = pool.take(5000);
        assert_eq!(again.len(), 5000);
        assert_eq!(again.as_ptr(), ptr);

        let shared = Bytes::from(vec![1u8; 8192]);
        let _other = shared.clone();
        pool.give(shared);
        pool.give(Bytes::from(vec![1u8; POOL_MIN - 1]));
        assert!(pool.free.is_empty());
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_buffers() {
        let mut pool = Pool::default();
        for _ in 0..POOL_BUFFERS + 10 {
            pool.give(Bytes::from(vec![0u8; POOL_MIN]));
        }
        assert_eq!(pool.free.len(), POOL_BUFFERS);
    }
}
