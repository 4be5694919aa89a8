//! The fuzz targets, one module each, and the list the driver and the replay test
//! walk.

mod header;
mod mpi;
mod stream;

pub use header::decode_header;
pub use mpi::mpi_wire;
pub use stream::stream_frames;

/// One fuzz target.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Its name: the folder of its corpus (`fuzz/corpus/NAME`) and its cargo-fuzz
    /// binary.
    pub name: &'static str,
    /// Runs one input. Panics on a finding; otherwise returns a short label of what
    /// the decoder said (numbers left out), which the stable driver uses as its only
    /// feedback: an input with a label not seen before joins the working corpus.
    pub run: fn(&[u8]) -> String,
    /// The seed corpus: well-formed encodings of every variant and a few near misses.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Longest input the driver makes (a little over the largest valid one).
    pub max_len: usize,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "decode_header",
        run: decode_header,
        seeds: header::seeds,
        max_len: 300,
    },
    Target {
        name: "mpi_wire",
        run: mpi_wire,
        seeds: mpi::seeds,
        max_len: 2048,
    },
    Target {
        name: "stream_frames",
        run: stream_frames,
        seeds: stream::seeds,
        max_len: 8192,
    },
];

/// What the allocator may hand out beyond a limit: error values and their text.
pub(crate) const SLACK: usize = 256;

/// `text` without its digits and without what stands in brackets (bytes shown as
/// lists), so that errors differing only in a length, a tag or the bytes found share
/// one label.
pub(crate) fn label(text: &str) -> String {
    let mut depth = 0usize;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ if depth > 0 || c.is_ascii_digit() => {}
            _ => out.push(c),
        }
    }
    out
}
