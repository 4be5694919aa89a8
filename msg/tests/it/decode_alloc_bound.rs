//! Allocation bounds of the decoders (allocation stays within the limit plus a
//! small constant), measured with a counting global allocator.
//!
//! The allocator wraps `System` and, while a thread-local flag is set, records the
//! largest single allocation and the total bytes the current thread asks for. Inputs
//! are built before the window opens, so only the decoder's own allocations count.
//! Adversarial inputs: random frames (from a fixed-seed generator), a 1 MiB header
//! frame, 2000 empty payload frames, and serde frames whose length prefix claims a huge
//! collection, decoded with `payload::frame_to_value` and a limit of 4096.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use switchyard_msg::{Addr, DecodeError, Kind, Limits, Msg, Target, decode_header, payload};

/// What the decoder may allocate beyond a limit: error values and their text.
const SLACK: usize = 256;

struct Counting;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = ACTIVE.try_with(|active| {
        if active.get() {
            LARGEST.with(|l| l.set(l.get().max(size)));
            TOTAL.with(|t| t.set(t.get().saturating_add(size)));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// `note` only touches const-initialised thread-locals and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` was allocated by `System` through this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` through this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What one measured call allocated.
#[derive(Debug, Clone, Copy)]
struct Usage {
    largest: usize,
    total: usize,
}

/// Runs `f` with counting on for this thread; the result is dropped inside the window
/// too, so it cannot hide an allocation by outliving it.
fn measure<R>(f: impl FnOnce() -> R) -> Usage {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    ACTIVE.with(|a| a.set(true));
    drop(std::hint::black_box(f()));
    ACTIVE.with(|a| a.set(false));
    Usage {
        largest: LARGEST.with(Cell::get),
        total: TOTAL.with(Cell::get),
    }
}

/// A fixed-seed generator (SplitMix64) so the "random" inputs are the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn sample() -> Msg {
    Msg::new(Addr::worker(0, 3), Addr::server(0, 1), Kind::Update)
        .with_target(Target::Param(7))
        .with_seq(42)
        .with_frame(Bytes::from_static(b"payload"))
}

#[test]
fn the_counter_sees_allocations() {
    let usage = measure(|| vec![0u8; 10_000]);
    assert!(usage.largest >= 10_000, "{usage:?}");
    assert!(usage.total >= 10_000, "{usage:?}");
    let none = measure(|| 1 + 1);
    assert_eq!(none.total, 0, "{none:?}");
}

#[test]
fn random_frames_stay_within_the_header_limit() {
    let limits = Limits::default();
    let bound = limits.max_header_bytes + SLACK;
    let good = sample().encode_header().to_vec();
    let mut rng = Rng(0x5359_0001);
    let mut worst = Usage {
        largest: 0,
        total: 0,
    };
    for round in 0..4000 * crate::support::scale() {
        // A quarter pure noise, the rest a valid header with some bytes changed, so
        // that the field decoder (and its error text) is reached.
        let frame0 = if round % 4 == 0 {
            let len = rng.below(300);
            rng.bytes(len)
        } else {
            let mut frame = good.clone();
            for _ in 0..1 + rng.below(3) {
                let at = 4 + rng.below(frame.len() - 4);
                frame[at] = rng.next() as u8;
            }
            match rng.below(4) {
                0 => frame.truncate(frame.len() - 1 - rng.below(8)),
                1 => frame.push(rng.next() as u8),
                _ => {}
            }
            frame
        };
        let mut wire = vec![Bytes::from(frame0.clone())];
        for _ in 0..rng.below(4) {
            let len = rng.below(40);
            wire.push(Bytes::from(rng.bytes(len)));
        }
        let usage = measure(|| decode_header(&frame0, &limits));
        worst.largest = worst.largest.max(usage.largest);
        worst.total = worst.total.max(usage.total);
        let usage = measure(|| Msg::from_wire(wire, &limits));
        worst.largest = worst.largest.max(usage.largest);
        worst.total = worst.total.max(usage.total);
    }
    assert!(worst.largest <= bound, "{worst:?} over {bound}");
    assert!(worst.total <= bound, "{worst:?} over {bound}");
}

#[test]
fn one_mebibyte_header_frame_is_refused_without_allocating() {
    let limits = Limits::default();
    let mut big = vec![0u8; 1 << 20];
    big[..4].copy_from_slice(b"SY\x02\x00");
    let big = Bytes::from(big);
    let wire = vec![big.clone(), Bytes::from_static(b"x")];
    let mut result = None;
    let usage = measure(|| {
        result = Some(Msg::from_wire(wire, &limits));
    });
    assert_eq!(
        result,
        Some(Err(DecodeError::HeaderTooLarge {
            len: 1 << 20,
            limit: 256
        }))
    );
    assert_eq!(usage.total, 0, "{usage:?}");
    let usage = measure(|| decode_header(&big, &limits));
    assert_eq!(usage.total, 0, "{usage:?}");
}

#[test]
fn many_frames_and_big_frames_are_refused_without_allocating() {
    let limits = Limits::default().with_max_frame_bytes(1024);
    let many = Msg::from_parts(sample().header, vec![Bytes::new(); 2000]).to_wire();
    let usage = measure(|| {
        assert!(matches!(
            Msg::from_wire(many, &limits),
            Err(DecodeError::TooManyFrames { count: 2000, .. })
        ));
    });
    assert!(usage.largest <= SLACK, "{usage:?}");
    let mut big = sample();
    big.frames_mut()[0] = Bytes::from(vec![0u8; 1 << 20]);
    let wire = big.to_wire();
    let usage = measure(|| {
        assert!(matches!(
            Msg::from_wire(wire, &limits),
            Err(DecodeError::FrameTooLarge { .. })
        ));
    });
    assert!(usage.largest <= SLACK, "{usage:?}");
    // Accepting a message reuses the frames it was given.
    let ok = sample().to_wire();
    let usage = measure(|| Msg::from_wire(ok, &limits).unwrap());
    assert_eq!(usage.total, 0, "{usage:?}");
}

/// A frame holding only a bincode length prefix of 2^62.
fn huge_claim() -> Vec<u8> {
    (1u64 << 62).to_le_bytes().to_vec()
}

const VALUE_LIMIT: usize = 4096;

/// Serde values whose allocation stays bounded by the limit: strings and byte buffers
/// are read only after their claimed length is checked against the input.
#[test]
fn huge_string_claims_stay_within_the_value_limit() {
    let bound = VALUE_LIMIT + SLACK;
    let claim = huge_claim();
    let mut with_tail = claim.clone();
    with_tail.extend_from_slice(&[b'a'; 64]);
    for frame in [&claim, &with_tail] {
        let usage = measure(|| {
            assert!(payload::frame_to_value::<String>(frame, VALUE_LIMIT).is_err());
        });
        assert!(usage.largest <= bound, "String: {usage:?} over {bound}");
    }
    // Vec<String>: the outer sequence claims one element, the string 2^62 bytes.
    let mut nested = 1u64.to_le_bytes().to_vec();
    nested.extend_from_slice(&claim);
    let usage = measure(|| {
        assert!(payload::frame_to_value::<Vec<String>>(&nested, VALUE_LIMIT).is_err());
    });
    assert!(
        usage.largest <= bound,
        "Vec<String>: {usage:?} over {bound}"
    );
    // An honest value just under the limit is still decoded.
    let honest: Vec<u32> = (0..1000).collect();
    let frame = payload::frame_from_value(&honest).unwrap();
    let usage = measure(|| {
        assert_eq!(
            payload::frame_to_value::<Vec<u32>>(&frame, VALUE_LIMIT).as_ref(),
            Ok(&honest)
        );
    });
    assert!(usage.largest >= 4000 && usage.largest <= bound, "{usage:?}");
}

/// A `Vec<T>` whose prefix claims 2^62 elements: serde preallocates
/// `min(claim, 1 MiB / size_of::<T>())` elements before reading any, so each such
/// sequence may cost up to 1 MiB however small the limit, as `frame_to_value`
/// documents; never the 2^62 the prefix claims.
#[test]
fn huge_sequence_claims_stay_within_the_documented_bound() {
    let bound = VALUE_LIMIT + SLACK + (1 << 20);
    let claim = huge_claim();
    let mut report = Vec::new();
    let usage = measure(|| payload::frame_to_value::<Vec<u64>>(&claim, VALUE_LIMIT).is_err());
    report.push(("Vec<u64>", usage));
    let usage = measure(|| payload::frame_to_value::<Vec<u8>>(&claim, VALUE_LIMIT).is_err());
    report.push(("Vec<u8>", usage));
    let mut nested = claim.clone();
    nested.extend_from_slice(&claim);
    let usage = measure(|| payload::frame_to_value::<Vec<Vec<f32>>>(&nested, VALUE_LIMIT).is_err());
    report.push(("Vec<Vec<f32>>", usage));
    for (what, usage) in &report {
        assert!(
            usage.largest <= bound,
            "{what}: {usage:?} over {bound}; all: {report:?}"
        );
    }
}
