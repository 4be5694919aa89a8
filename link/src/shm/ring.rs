//! A byte ring with one writer and one reader, in memory two processes share.
//!
//! Each side keeps its own position (bytes written, bytes read: counters that only
//! grow) and publishes it with a release store; the other side reads it with an
//! acquire load, so the bytes below a published head are complete when the reader
//! sees the head. A side about to sleep raises its flag (`reader_sleeping`,
//! `writer_waiting`) and looks at the ring once more; the other side, after moving its
//! position, takes the flag down and asks its caller to wake the sleeper. Both sides
//! put a sequentially consistent fence between their store and their load, so that
//! at least one of them sees the other's (the sleeper sees the new data, or the mover
//! sees the flag): a wake-up is never lost.
//!
//! The peer is another process and might write nonsense into the control block: a
//! position that would put more than the ring's capacity between head and tail is
//! reported as [`RingError`], never used as an index.

use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};
use std::io::IoSlice;
use switchyard_msg::copy::copy_bytes_raw;

/// One cache line, so that the writer's and the reader's fields never share one.
const LINE: usize = 64;

/// The control block of one ring, at a fixed place in the shared segment. Every field
/// on its own cache line.
///
/// Its methods are the protocol: the ends below add the bytes, and the loom models
/// (`ring_loom.rs`) run the same methods over bytes of their own.
#[repr(C)]
pub(super) struct Control {
    /// Bytes written so far (only the writer stores it).
    head: AtomicU64,
    _head_line: [u8; LINE - 8],
    /// Bytes read so far (only the reader stores it).
    tail: AtomicU64,
    _tail_line: [u8; LINE - 8],
    /// 1 while the reader may be asleep waiting for bytes.
    reader_sleeping: AtomicU32,
    _reader_line: [u8; LINE - 4],
    /// 1 while the writer may be asleep waiting for room.
    writer_waiting: AtomicU32,
    _writer_line: [u8; LINE - 4],
}

/// Bytes one [`Control`] takes in the segment.
pub(super) const CONTROL_BYTES: usize = std::mem::size_of::<Control>();

#[cfg(not(all(test, loom)))]
const _: () = assert!(CONTROL_BYTES == 4 * LINE);

/// A peer's control block that cannot be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "shared-memory ring corrupt: head {head} and tail {tail} are more than {capacity} bytes apart"
)]
pub(crate) struct RingError {
    head: u64,
    tail: u64,
    capacity: usize,
}

impl Control {
    /// A control block of loom's atomics, for the models.
    #[cfg(all(test, loom))]
    fn new() -> Control {
        Control {
            head: AtomicU64::new(0),
            _head_line: [0; LINE - 8],
            tail: AtomicU64::new(0),
            _tail_line: [0; LINE - 8],
            reader_sleeping: AtomicU32::new(0),
            _reader_line: [0; LINE - 4],
            writer_waiting: AtomicU32::new(0),
            _writer_line: [0; LINE - 4],
        }
    }

    /// The writer's move, `head` being the bytes it has written so far: `copy` gets
    /// the stream position to write at and the room there, copies what it will and
    /// says how much; then that is published. Returns the bytes copied and whether
    /// the reader was asleep and must be woken.
    fn write(
        &self,
        head: &mut u64,
        capacity: usize,
        copy: impl FnOnce(u64, usize) -> usize,
    ) -> Result<(usize, bool), RingError> {
        let tail = self.tail.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        if used > capacity as u64 {
            return Err(RingError {
                head: *head,
                tail,
                capacity,
            });
        }
        let written = copy(*head, capacity - used as usize);
        if written == 0 {
            return Ok((0, false));
        }
        *head = head.wrapping_add(written as u64);
        self.head.store(*head, Ordering::Release);
        Ok((written, take_flag(&self.reader_sleeping)))
    }

    /// The reader's move, `tail` being the bytes it has read so far: `copy` gets the
    /// stream position to read at and how many bytes (at most `most`, at least 1) to
    /// copy out; then their room is freed. Returns the bytes copied (0 when the ring
    /// is empty) and whether the writer was asleep waiting for room and must be woken.
    fn read(
        &self,
        tail: &mut u64,
        capacity: usize,
        most: usize,
        copy: impl FnOnce(u64, usize),
    ) -> Result<(usize, bool), RingError> {
        let head = self.head.load(Ordering::Acquire);
        let waiting = head.wrapping_sub(*tail);
        if waiting > capacity as u64 {
            return Err(RingError {
                head,
                tail: *tail,
                capacity,
            });
        }
        let n = (waiting as usize).min(most);
        if n == 0 {
            return Ok((0, false));
        }
        copy(*tail, n);
        *tail = tail.wrapping_add(n as u64);
        self.tail.store(*tail, Ordering::Release);
        Ok((n, take_flag(&self.writer_waiting)))
    }

    /// Whether bytes past `tail` are waiting.
    fn has_data(&self, tail: u64) -> bool {
        self.head.load(Ordering::Acquire) != tail
    }

    /// Raises the reader's flag before a sleep and says whether bytes past `tail`
    /// arrived after all (then the reader must not sleep).
    fn reader_prepare_sleep(&self, tail: u64) -> bool {
        // A swap, not a store: the raise must come after the other side's last
        // take-down (`take_flag`'s swap) in the flag's modification order. C11 gives
        // a store that too (coherence), but loom keeps that order partial and finds
        // a lost wake-up at four preemptions; a read-modify-write it orders. On x86
        // it is the same instruction (a sequentially consistent store is an xchg).
        self.reader_sleeping.swap(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.has_data(tail)
    }

    /// Lowers the reader's flag after a sleep.
    fn reader_end_sleep(&self) {
        self.reader_sleeping.store(0, Ordering::Relaxed);
    }

    /// Raises the writer's flag before a sleep and says whether there is room after
    /// `head` after all (then the writer must not sleep).
    fn writer_prepare_sleep(&self, head: u64, capacity: usize) -> bool {
        // A swap for the reason given in `reader_prepare_sleep`.
        self.writer_waiting.swap(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let tail = self.tail.load(Ordering::Acquire);
        head.wrapping_sub(tail) < capacity as u64
    }

    /// Lowers the writer's flag after a sleep.
    fn writer_end_sleep(&self) {
        self.writer_waiting.store(0, Ordering::Relaxed);
    }
}

/// The memory of one ring: its control block and `capacity` data bytes.
#[derive(Clone, Copy)]
pub(super) struct RingMemory {
    control: *const Control,
    data: *mut u8,
    capacity: usize,
}

impl RingMemory {
    /// The ring whose control block is at `control` and data at `data`.
    ///
    /// # Safety
    ///
    /// `control` points to [`CONTROL_BYTES`] bytes aligned to 8 and `data` to
    /// `capacity` bytes, both valid for reads and writes for as long as the ends made
    /// from this value are used, and touched by nobody but one [`Writer`] and one
    /// [`Reader`] (possibly in another process). `capacity` is a power of two.
    pub(super) unsafe fn new(control: *mut u8, data: *mut u8, capacity: usize) -> RingMemory {
        debug_assert!(capacity.is_power_of_two());
        debug_assert_eq!(control as usize % 8, 0);
        RingMemory {
            control: control.cast::<Control>(),
            data,
            capacity,
        }
    }

    fn control(&self) -> &Control {
        // SAFETY: valid and aligned for the lifetime of the ends (`new`'s contract);
        // every field is an atomic or padding, so shared access from two processes is
        // sound.
        unsafe { &*self.control }
    }

    /// The writing end, starting where the ring's head is.
    pub(super) fn writer(self) -> Writer {
        let head = self.control().head.load(Ordering::Acquire);
        Writer { ring: self, head }
    }

    /// The reading end, starting where the ring's tail is.
    pub(super) fn reader(self) -> Reader {
        let tail = self.control().tail.load(Ordering::Acquire);
        Reader { ring: self, tail }
    }

    /// Copies `bytes` to stream position `at`, wrapping at the end of the data.
    fn copy_in(self, at: u64, bytes: &[u8]) {
        let offset = (at as usize) & (self.capacity - 1);
        let first = bytes.len().min(self.capacity - offset);
        // SAFETY: `offset + first <= capacity` and `bytes.len() - first <= offset`, so
        // both copies stay inside the data area; the range lies between the published
        // head and the tail plus the capacity, which the reader does not read until
        // the writer publishes it.
        unsafe {
            copy_bytes_raw(bytes.as_ptr(), self.data.add(offset), first);
            copy_bytes_raw(bytes.as_ptr().add(first), self.data, bytes.len() - first);
        }
    }

    /// Copies the `buf.len()` bytes at stream position `at` into `buf`, wrapping at
    /// the end of the data.
    fn copy_out(self, at: u64, buf: &mut [u8]) {
        let n = buf.len();
        let offset = (at as usize) & (self.capacity - 1);
        let first = n.min(self.capacity - offset);
        // SAFETY: both ranges stay inside the data area (as in `copy_in`) and lie
        // below the head the writer published with release ordering, which the reader
        // loaded with acquire: the bytes are complete and the writer does not touch
        // them until the reader publishes a tail past them.
        unsafe {
            copy_bytes_raw(self.data.add(offset), buf.as_mut_ptr(), first);
            copy_bytes_raw(self.data, buf.as_mut_ptr().add(first), n - first);
        }
    }
}

/// The writing end of a ring.
pub(super) struct Writer {
    ring: RingMemory,
    /// Bytes written so far: the head this end last published.
    head: u64,
}

// SAFETY: the end owns its side of the ring exclusively (`RingMemory::new`'s
// contract); the memory itself is only touched through atomics and through byte
// ranges the protocol hands to one side at a time.
unsafe impl Send for Writer {}

impl Writer {
    /// Copies as much of `slices` as fits into the ring, in order, and publishes it.
    /// Returns the bytes copied (0 when the ring is full) and whether the reader was
    /// asleep and must be woken.
    pub(super) fn write(&mut self, slices: &[IoSlice<'_>]) -> Result<(usize, bool), RingError> {
        let ring = self.ring;
        ring.control()
            .write(&mut self.head, ring.capacity, |head, mut free| {
                let mut written = 0usize;
                for slice in slices {
                    if free == 0 {
                        break;
                    }
                    let n = slice.len().min(free);
                    ring.copy_in(head.wrapping_add(written as u64), &slice[..n]);
                    written += n;
                    free -= n;
                }
                written
            })
    }

    /// Raises the writer's flag before a sleep and says whether there is room after
    /// all (then the caller must not sleep).
    pub(super) fn prepare_sleep(&self) -> bool {
        self.ring
            .control()
            .writer_prepare_sleep(self.head, self.ring.capacity)
    }

    /// Lowers the writer's flag after a sleep.
    pub(super) fn end_sleep(&self) {
        self.ring.control().writer_end_sleep();
    }

    /// Whether every byte written has been read.
    #[cfg(test)]
    pub(super) fn drained(&self) -> bool {
        self.ring.control().tail.load(Ordering::Acquire) == self.head
    }
}

/// The reading end of a ring.
pub(super) struct Reader {
    ring: RingMemory,
    /// Bytes read so far: the tail this end last published.
    tail: u64,
}

// SAFETY: as for `Writer`.
unsafe impl Send for Reader {}

impl Reader {
    /// Copies up to `buf.len()` waiting bytes into `buf` and frees their room.
    /// Returns the bytes copied (0 when the ring is empty) and whether the writer was
    /// asleep waiting for room and must be woken.
    pub(super) fn read(&mut self, buf: &mut [u8]) -> Result<(usize, bool), RingError> {
        let ring = self.ring;
        ring.control()
            .read(&mut self.tail, ring.capacity, buf.len(), |tail, n| {
                ring.copy_out(tail, &mut buf[..n]);
            })
    }

    /// Raises the reader's flag before a sleep and says whether bytes arrived after
    /// all (then the caller must not sleep).
    pub(super) fn prepare_sleep(&self) -> bool {
        self.ring.control().reader_prepare_sleep(self.tail)
    }

    /// Lowers the reader's flag after a sleep.
    pub(super) fn end_sleep(&self) {
        self.ring.control().reader_end_sleep();
    }
}

/// After a position was published: whether the other side's sleep flag was up, taking
/// it down (so that one sleep costs one wake-up however many writes follow).
fn take_flag(flag: &AtomicU32) -> bool {
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A ring of `capacity` bytes in this process's memory (8-aligned).
    struct Local {
        memory: Vec<u64>,
        capacity: usize,
    }

    impl Local {
        fn new(capacity: usize) -> Local {
            Local {
                memory: vec![0; (CONTROL_BYTES + capacity) / 8],
                capacity,
            }
        }

        fn ring(&mut self) -> RingMemory {
            let base = self.memory.as_mut_ptr().cast::<u8>();
            // SAFETY: the vector outlives every end made in a test, and holds
            // CONTROL_BYTES + capacity bytes, 8-aligned.
            unsafe { RingMemory::new(base, base.add(CONTROL_BYTES), self.capacity) }
        }

        fn control(&self) -> &Control {
            // SAFETY: as in `ring`.
            unsafe { &*self.memory.as_ptr().cast::<Control>() }
        }
    }

    #[test]
    fn bytes_come_out_in_order_across_the_wrap() {
        let mut local = Local::new(16);
        let (mut w, mut r) = (local.ring().writer(), local.ring().reader());
        let mut out = Vec::new();
        let mut next = 0u8;
        for round in 0..20 {
            let chunk: Vec<u8> = (0..(round % 7 + 3))
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            let (a, b) = chunk.split_at(chunk.len() / 2);
            let (n, _) = w.write(&[IoSlice::new(a), IoSlice::new(b)]).unwrap();
            assert_eq!(n, chunk.len(), "round {round}");
            let mut buf = [0u8; 5];
            loop {
                let (got, _) = r.read(&mut buf).unwrap();
                if got == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..got]);
            }
        }
        let expected: Vec<u8> = (1..=next).collect();
        assert_eq!(out, expected);
        assert!(w.drained());
    }

    #[test]
    fn a_full_ring_takes_what_fits_and_then_nothing() {
        let mut local = Local::new(8);
        let (mut w, mut r) = (local.ring().writer(), local.ring().reader());
        assert_eq!(w.write(&[IoSlice::new(&[1; 6])]).unwrap().0, 6);
        assert_eq!(w.write(&[IoSlice::new(&[2; 6])]).unwrap().0, 2);
        assert_eq!(w.write(&[IoSlice::new(&[3; 1])]).unwrap().0, 0);
        let mut buf = [0u8; 16];
        assert_eq!(r.read(&mut buf).unwrap().0, 8);
        assert_eq!(&buf[..8], &[1, 1, 1, 1, 1, 1, 2, 2]);
        assert_eq!(r.read(&mut buf).unwrap().0, 0);
    }

    /// The sleeper's flag makes the next mover ask for exactly one wake-up; without a
    /// sleeper nobody is woken.
    #[test]
    fn a_sleeping_side_is_woken_once() {
        let mut local = Local::new(8);
        let (mut w, mut r) = (local.ring().writer(), local.ring().reader());
        assert!(!w.write(&[IoSlice::new(b"ab")]).unwrap().1);
        let mut buf = [0u8; 8];
        r.read(&mut buf).unwrap();
        assert!(!r.prepare_sleep(), "empty ring: the reader may sleep");
        assert!(
            w.write(&[IoSlice::new(b"c")]).unwrap().1,
            "the reader slept"
        );
        assert!(
            !w.write(&[IoSlice::new(b"d")]).unwrap().1,
            "one wake-up a sleep"
        );
        assert!(r.prepare_sleep(), "data waiting: no sleep");
        r.end_sleep();
        assert_eq!(local.control().reader_sleeping.load(Ordering::Relaxed), 0);

        assert_eq!(w.write(&[IoSlice::new(&[9; 8])]).unwrap().0, 6);
        assert!(!w.prepare_sleep(), "full ring: the writer may sleep");
        assert!(r.read(&mut buf[..1]).unwrap().1, "the writer slept");
        assert!(w.prepare_sleep(), "room again");
        w.end_sleep();
    }

    /// Positions a peer could have scribbled over are reported, never used.
    #[test]
    fn a_corrupt_control_block_is_an_error() {
        let mut local = Local::new(8);
        let (mut w, mut r) = (local.ring().writer(), local.ring().reader());
        local.control().head.store(1 << 40, Ordering::Relaxed);
        let mut buf = [0u8; 8];
        let err = r.read(&mut buf).unwrap_err();
        assert!(err.to_string().contains("more than 8 bytes apart"), "{err}");
        // A tail ahead of what was written.
        local.control().tail.store(100, Ordering::Relaxed);
        assert!(w.write(&[IoSlice::new(b"x")]).is_err());
    }

    /// Two threads stream 8 MiB through a 4 KiB ring, each sleeping on a condition
    /// when the ring stops it: every byte arrives once and in order.
    #[test]
    fn a_stream_between_two_threads_arrives_whole() {
        use std::sync::{Arc, Condvar, Mutex};
        const TOTAL: usize = 8 << 20;
        let mut local = Local::new(4096);
        let (mut w, mut r) = (local.ring().writer(), local.ring().reader());
        let bell = Arc::new((Mutex::new(0u64), Condvar::new()));
        let ring_bell = |bell: &(Mutex<u64>, Condvar)| {
            *bell.0.lock().unwrap() += 1;
            bell.1.notify_all();
        };
        let sleep = |bell: &(Mutex<u64>, Condvar), seen: u64| {
            let guard = bell.0.lock().unwrap();
            let _ = bell
                .1
                .wait_timeout_while(guard, std::time::Duration::from_millis(50), |n| *n == seen)
                .unwrap();
        };
        std::thread::scope(|scope| {
            let writer_bell = bell.clone();
            scope.spawn(move || {
                let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
                let mut at = 0;
                while at < TOTAL {
                    let seen = *writer_bell.0.lock().unwrap();
                    let (n, wake) = w.write(&[IoSlice::new(&data[at..])]).unwrap();
                    if wake {
                        ring_bell(&writer_bell);
                    }
                    at += n;
                    if n == 0 && !w.prepare_sleep() {
                        sleep(&writer_bell, seen);
                    }
                    w.end_sleep();
                }
            });
            let mut got = 0usize;
            let mut buf = vec![0u8; 1500];
            while got < TOTAL {
                let seen = *bell.0.lock().unwrap();
                let (n, wake) = r.read(&mut buf).unwrap();
                if wake {
                    ring_bell(&bell);
                }
                for (i, byte) in buf[..n].iter().enumerate() {
                    assert_eq!(*byte, ((got + i) % 251) as u8, "byte {}", got + i);
                }
                got += n;
                if n == 0 && !r.prepare_sleep() {
                    sleep(&bell, seen);
                }
                r.end_sleep();
            }
        });
        drop(local);
    }
}

#[cfg(all(test, loom))]
#[path = "ring_loom.rs"]
mod loom_tests;
