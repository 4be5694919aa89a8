//! Copying large buffers without falling into `memcpy`'s slow case on AMD Zen.
//!
//! glibc's `memcpy` moves a buffer of a few KiB or more with `rep movsb`. On AMD Zen
//! processors (the EPYC of the project's benchmark machine, glibc 2.36) that
//! instruction runs about 20 times slower when the destination lies 1 to 63 bytes
//! after the source modulo 4096: 39 us instead of 1.7 us for 64 KiB, 155 us instead
//! of 9 us for 256 KiB (`docs/benchmarks/log.md`, "Copies that memcpy makes slow"). Heap
//! buffers of 128 KiB and more start 16 bytes into a page, so copying between such a
//! buffer and page-aligned memory (shared memory, another rank's slot) hits that case
//! every time in one direction. Smaller `memcpy`s (2 KiB) use vector moves instead and
//! are fast at any distance, so [`copy_bytes`] copies in 2 KiB pieces exactly when the
//! distance is in the slow range and the length in the range where glibc uses
//! `rep movsb` (up to 1 MiB), and with one `memcpy` otherwise.
//!
//! # Examples
//!
//! ```
//! use switchyard_msg::copy::{copy_bytes, copy_elements};
//!
//! let source = vec![7u8; 100_000];
//! let mut target = vec![0u8; 100_016];
//! copy_bytes(&mut target[16..], &source);
//! assert!(target[16..] == source[..] && target[..16] == [0; 16]);
//!
//! let mut floats = [0.0f32; 3];
//! copy_elements(&mut floats, &[1.0, 2.0, 3.0]);
//! assert_eq!(floats, [1.0, 2.0, 3.0]);
//! ```

/// Bytes per `memcpy` when the distance is in the slow range: small enough that glibc
/// copies them with vector moves, large enough that the calls cost nothing.
const PIECE: usize = 2048;

/// The distances (destination minus source, modulo [`PAGE`]) at which `rep movsb`
/// is slow: 1 to 63 bytes.
const SLOW_DISTANCE: std::ops::Range<usize> = 1..64;

/// The period of the slow case.
const PAGE: usize = 4096;

/// The largest copy that glibc makes with `rep movsb`, near the per-core L2 size: on
/// the benchmark machine 384 KiB is slow and 512 KiB fast again; newer Zen parts have
/// 1 MiB of L2. Larger copies use vector loops, or non-temporal stores from a few MiB
/// on, which 2 KiB pieces would lose (a 16 MiB copy in pieces measured 30-60% slower).
/// `scripts/memcpy-distance.c` measures a machine.
const LARGEST_SLOW: usize = 1 << 20;

/// Whether copying `len` bytes from `src` to `dst` would hit the slow case.
fn is_slow(dst: *const u8, src: *const u8, len: usize) -> bool {
    (PIECE + 1..=LARGEST_SLOW).contains(&len)
        && SLOW_DISTANCE.contains(&(dst as usize).wrapping_sub(src as usize).rem_euclid(PAGE))
}

/// Copies `src` into `dst`, of the same length, as `dst.copy_from_slice(src)` does
/// (and panics, as it does, when the lengths differ), in 2 KiB pieces where one
/// `memcpy` would be slow (see the module documentation).
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    if !is_slow(dst.as_ptr(), src.as_ptr(), src.len()) {
        dst.copy_from_slice(src);
        return;
    }
    // `black_box` keeps the optimizer from merging the pieces back into one `memcpy`.
    let piece = std::hint::black_box(PIECE);
    for (to, from) in dst.chunks_mut(piece).zip(src.chunks(piece)) {
        to.copy_from_slice(from);
    }
}

/// [`copy_bytes`] for slices of plain elements (`f32`, `u64`, ...).
pub fn copy_elements<T: bytemuck::Pod>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy_elements: lengths differ");
    copy_bytes(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

/// Appends `src`, the bytes of whole elements at any alignment, to `dst` as elements
/// of `T`, copied as [`copy_bytes`] copies and without zero-filling the new room
/// first (as `vec![T::default(); n]` before a copy would).
///
/// # Panics
/// When `T` has no size or `src.len()` is not a multiple of its size.
///
/// # Examples
///
/// ```
/// use switchyard_msg::copy::extend_elements;
///
/// let bytes: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
/// let mut values = vec![0.25f32];
/// extend_elements(&mut values, &bytes);
/// assert_eq!(values, [0.25, 1.5, -2.0]);
/// ```
pub fn extend_elements<T: bytemuck::Pod>(dst: &mut Vec<T>, src: &[u8]) {
    let size = std::mem::size_of::<T>();
    assert!(
        size != 0 && src.len() % size == 0,
        "extend_elements: {} bytes are not whole elements of {size} bytes",
        src.len()
    );
    let count = src.len() / size;
    dst.reserve(count);
    // SAFETY: `reserve` made room for `count` more elements after `len`, that is
    // `src.len()` writable bytes; `src` cannot overlap them (no reference reaches a
    // vector's spare room while it is borrowed mutably). `T` is `Pod`, so any bytes
    // are a valid `T`, and every byte of the `count` elements is written before the
    // length covers them.
    unsafe {
        let room = dst.as_mut_ptr().add(dst.len()).cast::<u8>();
        copy_bytes_raw(src.as_ptr(), room, src.len());
        dst.set_len(dst.len() + count);
    }
}

/// [`copy_bytes`] to raw memory: `len` bytes from `src` to `dst`.
///
/// # Safety
/// As for [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for
/// `len` bytes, the two not overlapping.
pub unsafe fn copy_bytes_raw(src: *const u8, dst: *mut u8, len: usize) {
    if !is_slow(dst, src, len) {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let piece = std::hint::black_box(PIECE);
    let mut at = 0;
    while at < len {
        let n = piece.min(len - at);
        // SAFETY: `at + n <= len`, within what the caller promised.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), n) };
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_distance_and_length_copies_exactly() {
        let source: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut target = vec![0u8; 20_000 + 128];
        for shift in [0usize, 1, 15, 16, 17, 63, 64, 100] {
            for len in [0usize, 1, 2047, 2048, 2049, 4096, 10_001, 20_000 - 128] {
                target.fill(0xEE);
                copy_bytes(&mut target[shift..shift + len], &source[..len]);
                assert_eq!(
                    &target[shift..shift + len],
                    &source[..len],
                    "shift {shift} len {len}"
                );
                assert!(target[..shift].iter().all(|&b| b == 0xEE));
                assert!(target[shift + len..].iter().all(|&b| b == 0xEE));
            }
        }
    }

    #[test]
    fn the_slow_range_is_a_short_forward_distance_within_a_page() {
        let base = 0x10_0000usize as *const u8;
        let at = |d: usize| (base as usize + d) as *const u8;
        assert!(!is_slow(at(0), base, 1 << 20));
        assert!(is_slow(at(16), base, 64 << 10));
        assert!(is_slow(at(4096 + 16), base, 1 << 20));
        assert!(!is_slow(at(64), base, 1 << 20));
        assert!(!is_slow(base, at(16), 1 << 20));
        assert!(!is_slow(at(16), base, PIECE));
        assert!(!is_slow(at(16), base, LARGEST_SLOW + 1));
    }

    #[test]
    fn raw_copies_match_slice_copies() {
        let source: Vec<u8> = (0..9_000u32).map(|i| i as u8).collect();
        let mut target = vec![0u8; 9_016];
        // SAFETY: both ranges are inside their vectors and do not overlap.
        unsafe { copy_bytes_raw(source.as_ptr(), target.as_mut_ptr().add(16), source.len()) };
        assert_eq!(&target[16..], &source[..]);
    }

    #[test]
    fn elements_are_appended_from_bytes_at_any_alignment() {
        let values: Vec<f32> = (0..3_000).map(|i| i as f32 * 0.5).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&values);
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(bytes);
        for src in [bytes, &shifted[1..]] {
            let mut out = vec![-1.0f32];
            extend_elements(&mut out, src);
            extend_elements(&mut out, &[]);
            assert_eq!(out.len(), 1 + values.len());
            assert_eq!(out[0], -1.0);
            assert_eq!(&out[1..], &values[..]);
        }
    }

    #[test]
    #[should_panic(expected = "not whole elements")]
    fn a_partial_element_panics() {
        extend_elements(&mut Vec::<u32>::new(), &[1u8; 6]);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn different_lengths_panic_like_copy_from_slice() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
