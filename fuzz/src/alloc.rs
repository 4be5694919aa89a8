//! A counting global allocator: what the decoders allocate is part of what they are
//! fuzzed for ("never allocates beyond the limit", `msg/WIRE.md` section 4).
//!
//! It wraps `System` and, while [`measure`] runs on a thread, records that thread's
//! largest single allocation and its total. Being the global allocator of every binary
//! that links this crate (the driver, the replay test, the cargo-fuzz targets), it
//! checks the bound however the targets are run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The counting allocator; see the module docs.
#[derive(Debug)]
pub struct Counting;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: allocations during thread teardown must not touch a dead local.
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

/// What one measured call allocated on its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The largest single allocation, in bytes.
    pub largest: usize,
    /// All allocations added up, in bytes (frees are not subtracted).
    pub total: usize,
}

/// Runs `f` with counting on for this thread and returns its result with what it
/// allocated. Allocations made by dropping the result later are not counted, so a
/// target measures only the decoding and drops the result afterwards.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Usage) {
    LARGEST.with(|l| l.set(0));
    TOTAL.with(|t| t.set(0));
    ACTIVE.with(|a| a.set(true));
    let result = f();
    ACTIVE.with(|a| a.set(false));
    let usage = Usage {
        largest: LARGEST.with(Cell::get),
        total: TOTAL.with(Cell::get),
    };
    (result, usage)
}
