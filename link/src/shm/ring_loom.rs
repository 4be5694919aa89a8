//! Loom models of the ring (`ring.rs`): [`Control`]'s methods, the protocol the ends
//! run, over bytes that loom watches (each data byte a `loom::cell::UnsafeCell`: a
//! read or write of a byte that the protocol did not order after the other side's
//! last access to it is a causality violation). The models' names start with `loom_`.
//!
//! Each invariant has a broken variant beside it, the protocol with one ordering
//! weakened or one step left out, which loom must fail (`#[should_panic]`): a model
//! that cannot fail proves nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::{Control, RingError, take_flag};
use crate::sync::model::{Bell, check};
use crate::sync::{AtomicU32, Ordering};
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicBool;
use loom::thread;
use std::sync::Arc;

/// The protocol a model runs: as written, or broken in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    AsWritten,
    /// The writer publishes its head with relaxed ordering, not release.
    HeadRelaxed,
    /// The reader publishes its tail with relaxed ordering, not release.
    TailRelaxed,
    /// A side reads the other's flag with no fence after publishing its position.
    NoFenceBeforeFlag,
    /// The reader raises its flag and sleeps without looking at the ring again.
    NoSecondLook,
    /// A reader that sees the peer's close reports the end without reading the ring
    /// once more (`ShmPipe::read`).
    NoReadAfterClose,
}

/// A ring of `CAPACITY` bytes: the control block and the data, shared by the model's
/// threads.
struct Ring<const CAPACITY: usize> {
    control: Control,
    data: [UnsafeCell<u8>; CAPACITY],
    variant: Variant,
}

// SAFETY: the data bytes are loom's cells, which check every access against the
// orderings the protocol set up: the point of the model.
unsafe impl<const CAPACITY: usize> Sync for Ring<CAPACITY> {}

impl<const CAPACITY: usize> Ring<CAPACITY> {
    fn new(variant: Variant) -> Arc<Self> {
        Arc::new(Ring {
            control: Control::new(),
            data: std::array::from_fn(|_| UnsafeCell::new(0)),
            variant,
        })
    }

    /// [`Control::write`] with the bytes of `bytes` that fit.
    fn write(&self, head: &mut u64, bytes: &[u8]) -> (usize, bool) {
        let copy = |at: u64, free: usize| {
            let n = bytes.len().min(free);
            for (i, &byte) in bytes[..n].iter().enumerate() {
                let cell = &self.data[(at as usize + i) % CAPACITY];
                // SAFETY: loom's cell; a write the protocol did not order after the
                // reader's last read of the byte fails the model.
                cell.with_mut(|p| unsafe { *p = byte });
            }
            n
        };
        let done = match self.variant {
            Variant::HeadRelaxed => write_broken(&self.control, head, CAPACITY, copy, true),
            Variant::NoFenceBeforeFlag => write_broken(&self.control, head, CAPACITY, copy, false),
            _ => self.control.write(head, CAPACITY, copy),
        };
        done.unwrap()
    }

    /// [`Control::read`] of at most `most` bytes, appended to `out`.
    fn read(&self, tail: &mut u64, most: usize, out: &mut Vec<u8>) -> (usize, bool) {
        let copy = |at: u64, n: usize| {
            for i in 0..n {
                let cell = &self.data[(at as usize + i) % CAPACITY];
                // SAFETY: loom's cell; a read the protocol did not order after the
                // writer's write of the byte fails the model.
                out.push(cell.with(|p| unsafe { *p }));
            }
        };
        let done = match self.variant {
            Variant::TailRelaxed => read_broken(&self.control, tail, CAPACITY, most, copy, true),
            Variant::NoFenceBeforeFlag => {
                read_broken(&self.control, tail, CAPACITY, most, copy, false)
            }
            _ => self.control.read(tail, CAPACITY, most, copy),
        };
        done.unwrap()
    }

    /// [`Control::reader_prepare_sleep`].
    fn reader_prepare_sleep(&self, tail: u64) -> bool {
        if self.variant == Variant::NoSecondLook {
            self.control.reader_sleeping.store(1, Ordering::SeqCst);
            return false;
        }
        self.control.reader_prepare_sleep(tail)
    }
}

/// [`Control::write`] with its head published relaxed (`relaxed_head`) or with no
/// fence before it reads the reader's flag.
fn write_broken(
    control: &Control,
    head: &mut u64,
    capacity: usize,
    copy: impl FnOnce(u64, usize) -> usize,
    relaxed_head: bool,
) -> Result<(usize, bool), RingError> {
    let tail = control.tail.load(Ordering::Acquire);
    let used = head.wrapping_sub(tail);
    let written = copy(*head, capacity - used as usize);
    if written == 0 {
        return Ok((0, false));
    }
    *head = head.wrapping_add(written as u64);
    if relaxed_head {
        control.head.store(*head, Ordering::Relaxed);
        return Ok((written, take_flag(&control.reader_sleeping)));
    }
    control.head.store(*head, Ordering::Release);
    Ok((written, take_flag_without_fence(&control.reader_sleeping)))
}

fn take_flag_without_fence(flag: &AtomicU32) -> bool {
    flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
}

/// [`Control::read`] with its tail published relaxed (`relaxed_tail`) or with no fence
/// before it reads the writer's flag.
fn read_broken(
    control: &Control,
    tail: &mut u64,
    capacity: usize,
    most: usize,
    copy: impl FnOnce(u64, usize),
    relaxed_tail: bool,
) -> Result<(usize, bool), RingError> {
    let head = control.head.load(Ordering::Acquire);
    let n = (head.wrapping_sub(*tail) as usize).min(most).min(capacity);
    if n == 0 {
        return Ok((0, false));
    }
    copy(*tail, n);
    *tail = tail.wrapping_add(n as u64);
    if relaxed_tail {
        control.tail.store(*tail, Ordering::Relaxed);
        return Ok((n, take_flag(&control.writer_waiting)));
    }
    control.tail.store(*tail, Ordering::Release);
    Ok((n, take_flag_without_fence(&control.writer_waiting)))
}

/// Three bytes through a ring of two, spinning when it is full or empty: every byte
/// arrives once, in order, and no byte is read before it was written or overwritten
/// before it was read (the slot of byte 1 is reused for byte 3).
fn bytes_arrive_whole_and_in_order(variant: Variant) {
    check(move || {
        let ring = Ring::<2>::new(variant);
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || {
                let (mut head, bytes) = (0u64, [1u8, 2, 3]);
                let mut at = 0;
                while at < bytes.len() {
                    let (n, _) = ring.write(&mut head, &bytes[at..]);
                    at += n;
                    if n == 0 {
                        thread::yield_now();
                    }
                }
            })
        };
        let (mut tail, mut got) = (0u64, Vec::new());
        while got.len() < 3 {
            if ring.read(&mut tail, 2, &mut got).0 == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(got, [1, 2, 3], "bytes lost, doubled or out of order");
        writer.join().unwrap();
    });
}

#[test]
fn loom_ring_bytes_arrive_whole_and_in_order() {
    bytes_arrive_whole_and_in_order(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_broken_head_relaxed_reads_a_byte_before_it_is_written() {
    bytes_arrive_whole_and_in_order(Variant::HeadRelaxed);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_broken_tail_relaxed_overwrites_a_byte_before_it_is_read() {
    bytes_arrive_whole_and_in_order(Variant::TailRelaxed);
}

/// A reader that finds the ring empty sleeps the way `ShmPipe` does (its flag up,
/// one more look, then the sleep); the writer writes one byte and rings the bell when
/// the ring says the reader slept. The reader always wakes (a lost wake-up leaves it
/// asleep for good: loom's deadlock) and takes the byte.
fn sleeping_reader_is_woken(variant: Variant) {
    check(move || {
        let ring = Ring::<2>::new(variant);
        let bell = Arc::new(Bell::new());
        let writer = {
            let (ring, bell) = (ring.clone(), bell.clone());
            thread::spawn(move || {
                let mut head = 0u64;
                let (n, wake) = ring.write(&mut head, &[7]);
                assert_eq!(n, 1);
                if wake {
                    bell.ring();
                }
            })
        };
        let (mut tail, mut got) = (0u64, Vec::new());
        loop {
            if ring.read(&mut tail, 2, &mut got).0 > 0 {
                break;
            }
            if !ring.reader_prepare_sleep(tail) {
                bell.sleep();
            }
            ring.control.reader_end_sleep();
        }
        assert_eq!(got, [7]);
        writer.join().unwrap();
    });
}

#[test]
fn loom_ring_sleeping_reader_is_woken() {
    sleeping_reader_is_woken(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_ring_broken_no_fence_before_the_flag_loses_a_wake_up() {
    sleeping_reader_is_woken(Variant::NoFenceBeforeFlag);
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_ring_broken_no_second_look_loses_a_wake_up() {
    sleeping_reader_is_woken(Variant::NoSecondLook);
}

/// A writer with two bytes for a ring of one, and a reader: each sleeps when the ring
/// stops it (its flag up, one more look, then the sleep) and rings the other's bell
/// when the ring says the other slept. Neither sleeps for good (a lost wake-up leaves
/// both asleep: loom's deadlock) and both bytes arrive.
fn waiting_writer_is_woken(variant: Variant) {
    check(move || {
        let ring = Ring::<1>::new(variant);
        let (reader_bell, writer_bell) = (Arc::new(Bell::new()), Arc::new(Bell::new()));
        let writer = {
            let ring = ring.clone();
            let (reader_bell, writer_bell) = (reader_bell.clone(), writer_bell.clone());
            thread::spawn(move || {
                let (mut head, bytes) = (0u64, [1u8, 2]);
                let mut at = 0;
                while at < bytes.len() {
                    let (n, wake) = ring.write(&mut head, &bytes[at..]);
                    if wake {
                        reader_bell.ring();
                    }
                    at += n;
                    if n == 0 {
                        if !ring.control.writer_prepare_sleep(head, 1) {
                            writer_bell.sleep();
                        }
                        ring.control.writer_end_sleep();
                    }
                }
            })
        };
        let (mut tail, mut got) = (0u64, Vec::new());
        while got.len() < 2 {
            let (n, wake) = ring.read(&mut tail, 1, &mut got);
            if wake {
                writer_bell.ring();
            }
            if n == 0 {
                if !ring.reader_prepare_sleep(tail) {
                    reader_bell.sleep();
                }
                ring.control.reader_end_sleep();
            }
        }
        assert_eq!(got, [1, 2]);
        writer.join().unwrap();
    });
}

#[test]
fn loom_ring_waiting_writer_is_woken() {
    waiting_writer_is_woken(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_ring_broken_no_fence_before_the_flag_deadlocks_a_full_ring() {
    waiting_writer_is_woken(Variant::NoFenceBeforeFlag);
}

/// A peer writes its last bytes and closes its end (in the real code its socket,
/// which the kernel closes after everything the process did before; here a flag set
/// with release ordering). The reader runs `ShmPipe::read`'s steps: the ring, then,
/// when it is empty, whether the peer is gone, and once it is, the ring once more
/// before it reports the end. It reports the end only after every byte.
fn closed_peer_leaves_its_last_bytes(variant: Variant) {
    check(move || {
        let ring = Ring::<2>::new(variant);
        let closed = Arc::new(AtomicBool::new(false));
        let peer = {
            let (ring, closed) = (ring.clone(), closed.clone());
            thread::spawn(move || {
                let mut head = 0u64;
                assert_eq!(ring.write(&mut head, &[1, 2]).0, 2);
                closed.store(true, Ordering::Release);
            })
        };
        let (mut tail, mut got, mut gone) = (0u64, Vec::new(), false);
        loop {
            if ring.read(&mut tail, 1, &mut got).0 > 0 {
                continue;
            }
            gone = gone || closed.load(Ordering::Acquire);
            if gone {
                if variant == Variant::NoReadAfterClose || ring.read(&mut tail, 1, &mut got).0 == 0
                {
                    break;
                }
                continue;
            }
            thread::yield_now();
        }
        assert_eq!(got, [1, 2], "the end reported before the peer's last bytes");
        peer.join().unwrap();
    });
}

#[test]
fn loom_pipe_closed_peer_leaves_its_last_bytes() {
    closed_peer_leaves_its_last_bytes(Variant::AsWritten);
}

#[test]
#[should_panic(expected = "the end reported before the peer's last bytes")]
fn loom_pipe_broken_no_read_after_close_loses_the_last_bytes() {
    closed_peer_leaves_its_last_bytes(Variant::NoReadAfterClose);
}
