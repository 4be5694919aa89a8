//! Cutting a request into one per server, and putting the answers back together:
//! pure functions of the [`Placement`], without sockets.

use super::shard::Placement;
use super::wire::{KvMeta, Runs};
use super::{PsError, Value};
use bytes::Bytes;
use std::collections::HashSet;
use switchyard_msg::payload;

/// Values of a list of keys: one vector, cut by per-key lengths.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvValues<T> {
    keys: Vec<u64>,
    lens: Vec<usize>,
    starts: Vec<usize>,
    values: Vec<T>,
}

impl<T> KvValues<T> {
    /// The keys, in the order asked.
    pub fn keys(&self) -> &[u64] {
        &self.keys
    }

    /// Every key's values, one after the other.
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// Each key's number of values.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// The values of the `i`-th key.
    pub fn get(&self, i: usize) -> Option<&[T]> {
        let (start, len) = (*self.starts.get(i)?, *self.lens.get(i)?);
        self.values.get(start..start + len)
    }

    /// The values, without the keys.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }
}

impl<T: Value> KvValues<T> {
    /// Copies each piece, `(key index, offset in the key's value, total, bytes)`, into
    /// place for keys of lengths `lens`; `None` when the pieces do not cover every
    /// value exactly once.
    pub(crate) fn assemble(
        keys: Vec<u64>,
        lens: Vec<usize>,
        pieces: &[(usize, u64, u64, Bytes)],
    ) -> Option<KvValues<T>> {
        let mut starts = Vec::with_capacity(lens.len());
        let mut sum = 0usize;
        for len in &lens {
            starts.push(sum);
            sum += len;
        }
        let size = std::mem::size_of::<T>();
        let mut placed: Vec<(usize, &Bytes)> = pieces
            .iter()
            .map(|(k, offset, _, piece)| ((starts[*k] + *offset as usize) * size, piece))
            .collect();
        placed.sort_unstable_by_key(|&(at, _)| at);
        if !tile(&placed, sum * size) {
            return None;
        }
        // Appended in order, the result is written once, not zero-filled first (a
        // megabyte a pull at 1 MiB values).
        let mut values = Vec::with_capacity(sum);
        for (_, piece) in placed {
            switchyard_msg::copy::extend_elements(&mut values, piece);
        }
        Some(KvValues {
            keys,
            lens,
            starts,
            values,
        })
    }
}

/// Whether pieces sorted by position cover `0..total` bytes exactly, each starting
/// where the one before ended (a count of every key's values cannot tell a piece
/// that came twice from one that never came).
fn tile(placed: &[(usize, &Bytes)], total: usize) -> bool {
    let mut end = 0;
    for &(at, piece) in placed {
        if at != end {
            return false;
        }
        end += piece.len();
    }
    end == total
}

/// One request per server for pushing `values` (cut by `lens`) to `keys`: the
/// metadata and the value frames, slices of one buffer that owns `values` (no copy).
/// Servers with nothing to do get an empty request.
pub(crate) fn push_requests<T: Value>(
    placement: &Placement,
    keys: &[u64],
    lens: &[usize],
    values: Vec<T>,
) -> Result<Vec<(KvMeta, Vec<Bytes>)>, PsError> {
    if keys.len() != lens.len() {
        return Err(PsError::BadArguments(format!(
            "{} keys but {} lengths",
            keys.len(),
            lens.len()
        )));
    }
    let sum: usize = lens.iter().sum();
    if sum != values.len() {
        return Err(PsError::BadArguments(format!(
            "lengths add up to {sum} but {} values were given",
            values.len()
        )));
    }
    check_unique(keys)?;
    let size = std::mem::size_of::<T>();
    let buffer = payload::frame_from_vec(values);
    let mut requests: Vec<(KvMeta, Runs)> = (0..placement.servers())
        .map(|_| Default::default())
        .collect();
    let mut start = 0usize;
    for (&key, &len) in keys.iter().zip(lens) {
        let total = len as u64;
        for p in placement.pieces(key, total)? {
            let (m, runs) = &mut requests[p.server];
            m.keys.push(key);
            m.lens.push(p.len);
            m.offsets.push(p.offset);
            m.totals.push(total);
            let from = (start + p.offset as usize) * size;
            runs.add(&buffer, from, from + p.len as usize * size);
        }
        start += len;
    }
    Ok(requests
        .into_iter()
        .map(|(m, runs)| (m, runs.finish(&buffer)))
        .collect())
}

/// One pull request per server for `keys`. With every key's length known
/// (`totals`), only the servers holding a piece are asked and must have it; a key
/// not seen before may be split or not, so then every server is asked for whatever it
/// holds, and the pieces are checked afterwards.
pub(crate) fn pull_requests(
    placement: &Placement,
    keys: &[u64],
    totals: Option<&[u64]>,
) -> Result<Vec<(KvMeta, Vec<Bytes>)>, PsError> {
    check_unique(keys)?;
    let mut metas: Vec<KvMeta> = vec![KvMeta::default(); placement.servers()];
    match totals {
        Some(totals) => {
            for (&key, &total) in keys.iter().zip(totals) {
                for p in placement.pieces(key, total)? {
                    let m = &mut metas[p.server];
                    m.keys.push(key);
                    m.lens.push(0);
                    m.offsets.push(0);
                    m.totals.push(0);
                    m.must_have = true;
                }
            }
        }
        None => {
            for m in &mut metas {
                m.keys = keys.to_vec();
                m.lens = vec![0; keys.len()];
                m.offsets = vec![0; keys.len()];
                m.totals = vec![0; keys.len()];
            }
        }
    }
    Ok(metas.into_iter().map(|m| (m, Vec::new())).collect())
}

fn check_unique(keys: &[u64]) -> Result<(), PsError> {
    let mut seen = HashSet::with_capacity(keys.len());
    match keys.iter().find(|k| !seen.insert(**k)) {
        Some(k) => Err(PsError::BadArguments(format!("key {k} appears twice"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::Sharding;

    #[test]
    fn a_push_becomes_slices_of_the_callers_buffer() {
        let place = Placement::new(Sharding::Range { key_space: Some(4) }, 2, 6);
        let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let origin = values.as_ptr() as usize;
        // Key 0 (2 values) and key 1 (1) on server 0; key 3 (7 values) split 3 + 4.
        let reqs = push_requests(&place, &[0, 1, 3], &[2, 1, 7], values).unwrap();
        assert_eq!(reqs[0].0.keys, [0, 1, 3]);
        assert_eq!(reqs[0].0.lens, [2, 1, 3]);
        assert_eq!(reqs[1].0.keys, [3]);
        assert_eq!((reqs[1].0.offsets[0], reqs[1].0.lens[0]), (3, 4));
        assert_eq!(reqs[0].1.len(), 1, "three adjacent pieces, one frame");
        assert_eq!(reqs[0].1[0].as_ptr() as usize, origin, "no copy");
        assert_eq!(
            payload::frame_to_vec::<f32>(&reqs[1].1[0]).unwrap(),
            [6.0, 7.0, 8.0, 9.0]
        );
    }

    #[test]
    fn bad_push_arguments_are_named() {
        let place = Placement::new(Sharding::Hash, 2, 100);
        let err = push_requests(&place, &[1, 2], &[1], vec![0.0f32]).unwrap_err();
        assert!(err.to_string().contains("2 keys but 1 lengths"), "{err}");
        let err = pull_requests(&place, &[5, 5], None).unwrap_err();
        assert!(err.to_string().contains("key 5 appears twice"), "{err}");
    }

    #[test]
    fn pieces_are_put_back_in_place() {
        let piece = |v: &[f32]| payload::frame_from_slice(v);
        let pieces = vec![
            (1, 2, 4, piece(&[3.0, 4.0])),
            (0, 0, 1, piece(&[9.0])),
            (1, 0, 4, piece(&[1.0, 2.0])),
        ];
        let got = KvValues::<f32>::assemble(vec![7, 8], vec![1, 4], &pieces).unwrap();
        assert_eq!(got.get(0), Some(&[9.0][..]));
        assert_eq!(got.get(1), Some(&[1.0, 2.0, 3.0, 4.0][..]));
        assert_eq!(got.keys(), [7, 8]);
    }

    #[test]
    fn pieces_that_overlap_or_leave_a_gap_are_refused() {
        let piece = |v: &[f32]| payload::frame_from_slice(v);
        // Key 8's second half twice and its first half never: the count of values is
        // right, the values are not.
        let twice = vec![
            (1, 2, 4, piece(&[3.0, 4.0])),
            (0, 0, 1, piece(&[9.0])),
            (1, 2, 4, piece(&[3.0, 4.0])),
        ];
        assert!(KvValues::<f32>::assemble(vec![7, 8], vec![1, 4], &twice).is_none());
        let short = vec![(0, 0, 1, piece(&[9.0])), (1, 0, 4, piece(&[1.0]))];
        assert!(KvValues::<f32>::assemble(vec![7, 8], vec![1, 4], &short).is_none());
        let overlap = vec![(0, 0, 2, piece(&[1.0, 2.0])), (0, 1, 2, piece(&[2.0]))];
        assert!(KvValues::<f32>::assemble(vec![7], vec![2], &overlap).is_none());
    }
}
