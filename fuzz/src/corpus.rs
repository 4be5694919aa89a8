//! The corpus on disk: `fuzz/corpus/TARGET/FILE`, one input a file.
//!
//! The seeds are written by `fuzz seed` from [`crate::Target::seeds`] as `seed-NN`;
//! inputs that once crashed a target go beside them under any other name (cargo-fuzz
//! names them by hash) and are replayed by the normal tests from then on.

use std::io;
use std::path::{Path, PathBuf};

/// `fuzz/corpus` in the source tree.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// `fuzz/artifacts` in the source tree: where the driver writes a crashing input.
pub fn artifacts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts")
}

/// The inputs of one target, sorted by file name so that a run is repeatable. A
/// missing folder is an empty corpus.
pub fn read(dir: &Path, target: &str) -> io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let folder = dir.join(target);
    let entries = match std::fs::read_dir(&folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| std::fs::read(&path).map(|bytes| (path, bytes)))
        .collect()
}

/// The file name of seed `index`.
pub fn seed_name(index: usize) -> String {
    format!("seed-{index:02}")
}

/// Writes `seeds` as `dir/target/seed-NN`, replacing older seed files of that target
/// (other files, such as saved crashes, are kept). Returns how many were written.
pub fn write_seeds(dir: &Path, target: &str, seeds: &[Vec<u8>]) -> io::Result<usize> {
    let folder = dir.join(target);
    std::fs::create_dir_all(&folder)?;
    for (path, _) in read(dir, target)? {
        let stale = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("seed-"));
        if stale {
            std::fs::remove_file(path)?;
        }
    }
    for (index, seed) in seeds.iter().enumerate() {
        std::fs::write(folder.join(seed_name(index)), seed)?;
    }
    Ok(seeds.len())
}

/// A short stable name for an input (FNV-1a, 64 bits), for crash files.
pub fn hash_name(input: &[u8]) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &byte in input {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("crash-{hash:016x}")
}
