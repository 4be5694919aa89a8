//! f16 and bf16 keys in a whole job, on both value planes: sync rounds of four workers
//! (one key split over both servers) answer every worker with the same bits, the f32
//! sum in rank order rounded once; SGD; a worker of another type gets the typed error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ps_support;

// The half-precision view the store's unit tests use too.
#[path = "../src/halves_common.rs"]
mod halves_common;

use half::{bf16, f16};
use halves_common::Half;
use ps_support::{Job, config, endpoint, on_workers};
use switchyard_ps::{DataPlane, Group, KvWorker, Mode, PsError, Update, Value};

const WORKERS: u32 = 4;
const ROUNDS: u32 = 6;
/// Key 7 (split over both servers: the split threshold is 16) and key 8.
const KEYS: [u64; 2] = [7, 8];
const LENS: [usize; 2] = [40, 3];

/// Worker `rank`'s push in `round`: values of both signs over a wide range of
/// exponents, and at element 0 `1 + 2^-24 + TIE + 2^-24` over the four workers (the
/// tie `1 + TIE` in rank order, past it summed from the small end).
fn push<T: Half>(rank: u32, round: u32) -> Vec<T> {
    let n: usize = LENS.iter().sum();
    (0..n)
        .map(|i| {
            if i == 0 {
                return T::from([1.0, 2f32.powi(-24), T::TIE, 2f32.powi(-24)][rank as usize]);
            }
            let mut h = (u64::from(rank) << 40) ^ (u64::from(round) << 20) ^ i as u64;
            h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
            h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 32;
            let mantissa = 1.0 + (h % 1024) as f32 / 1024.0;
            let exponent = ((h >> 10) % 21) as i32 - 12;
            let sign = if (h >> 20) % 2 == 0 { 1.0 } else { -1.0 };
            T::from(sign * mantissa * 2f32.powi(exponent))
        })
        .collect()
}

/// The f32 sum of every worker's push of `round` in rank order, rounded once.
fn aggregate<T: Half>(round: u32) -> Vec<T> {
    let pushes: Vec<Vec<T>> = (0..WORKERS).map(|r| push(r, round)).collect();
    (0..pushes[0].len())
        .map(|i| T::from(pushes.iter().map(|p| p[i].to()).fold(-0.0, |a, v| a + v)))
        .collect()
}

fn bits<T: Value>(values: &[T]) -> Vec<u16> {
    bytemuck::cast_slice::<T, u16>(values).to_vec()
}

/// Every round's answer is the reference: the stored value plus the round's
/// aggregate, in f32 and rounded once (`Update::Sum`), the same on every worker.
fn sync_rounds<T: Half>(plane: DataPlane) {
    let config = config(WORKERS as usize, 2)
        .with_split_threshold(16)
        .with_data_plane(plane);
    let job = Job::start_of::<T>(
        &endpoint("local", "halves"),
        config.clone(),
        Mode::Sync,
        Update::Sum,
    );
    let e = job.endpoint.clone();
    let results = on_workers(WORKERS, move |_| {
        let mut w = KvWorker::<T>::join(&e, &config)?;
        assert_eq!(
            w.placement().pieces(KEYS[0], LENS[0] as u64)?.len(),
            2,
            "split"
        );
        let rank = w.rank() as u32;
        let mut answers = Vec::new();
        for round in 0..ROUNDS {
            answers.push(w.push_pull(&KEYS, &LENS, push(rank, round))?.into_values());
        }
        w.barrier(Group::Workers)?;
        answers.push(w.pull(&KEYS)?.into_values());
        w.finish()?;
        Ok(answers)
    });
    let mut stored = vec![T::default(); LENS.iter().sum()];
    let mut expected = Vec::new();
    for round in 0..ROUNDS {
        for (s, a) in stored.iter_mut().zip(aggregate::<T>(round)) {
            *s = T::from(s.to() + a.to());
        }
        expected.push(bits(&stored));
    }
    expected.push(bits(&stored));
    assert_eq!(
        aggregate::<T>(0)[0],
        T::from(1.0),
        "the tie, summed in rank order"
    );
    for r in results {
        let answers = r.expect("worker");
        let got: Vec<Vec<u16>> = answers.iter().map(|a| bits(a)).collect();
        assert_eq!(got, expected, "{plane:?}");
    }
    job.end_ok();
}

#[test]
fn f16_sync_rounds_are_the_rank_order_f32_sum_on_both_planes() {
    sync_rounds::<f16>(DataPlane::Link);
    sync_rounds::<f16>(DataPlane::Zmq);
}

#[test]
fn bf16_sync_rounds_are_the_rank_order_f32_sum_on_both_planes() {
    sync_rounds::<bf16>(DataPlane::Link);
    sync_rounds::<bf16>(DataPlane::Zmq);
}

/// SGD: `stored - rate * aggregate`, in f32, rounded once, on the aggregate rounded
/// once.
fn sgd<T: Half>(plane: DataPlane) {
    let config = config(WORKERS as usize, 2)
        .with_split_threshold(16)
        .with_data_plane(plane);
    let job = Job::start_of::<T>(
        &endpoint("local", "halves-sgd"),
        config.clone(),
        Mode::Sync,
        Update::Sgd { rate: 0.1 },
    );
    let start: Vec<T> = (0..LENS.iter().sum())
        .map(|i| T::from(1.0 + i as f32 / 8.0))
        .collect();
    let init = start.clone();
    let e = job.endpoint.clone();
    let results = on_workers(WORKERS, move |_| {
        let mut w = KvWorker::<T>::join(&e, &config)?;
        if w.rank() == 0 {
            w.init(&KEYS, &LENS, init.clone())?;
        }
        w.barrier(Group::Workers)?;
        let rank = w.rank() as u32;
        let got = w.push_pull(&KEYS, &LENS, push(rank, 0))?.into_values();
        w.finish()?;
        Ok(got)
    });
    let expected: Vec<T> = start
        .iter()
        .zip(aggregate::<T>(0))
        .map(|(s, g)| T::from(s.to() - 0.1f32 * g.to()))
        .collect();
    for r in results {
        assert_eq!(bits(&r.expect("worker")), bits(&expected), "{plane:?}");
    }
    job.end_ok();
}

#[test]
fn sgd_on_halves_steps_in_f32_on_both_planes() {
    sgd::<f16>(DataPlane::Link);
    sgd::<bf16>(DataPlane::Zmq);
}

/// An f16 worker against servers of f32: every request is refused with
/// `TypeMismatch` naming both types, not a malformed message.
#[test]
fn an_f16_worker_against_f32_servers_gets_the_type_mismatch() {
    for plane in [DataPlane::Link, DataPlane::Zmq] {
        let config = config(1, 2).with_data_plane(plane);
        let job = Job::start(
            &endpoint("local", "halves-mismatch"),
            config.clone(),
            Mode::Sync,
            Update::Sum,
        );
        let mut w = KvWorker::<f16>::join(&job.endpoint, &config).unwrap();
        let is_mismatch = |err: &PsError| {
            matches!(err, PsError::TypeMismatch { stored, sent, .. }
                if stored == "f32" && sent.ends_with("f16"))
        };
        let err = w
            .push(&[1, u64::MAX], &[2, 2], vec![f16::ONE; 4])
            .unwrap_err();
        assert!(is_mismatch(&err), "{plane:?}: push: {err}");
        let err = w.push_pull(&[1], &[2], vec![f16::ONE; 2]).unwrap_err();
        assert!(is_mismatch(&err), "{plane:?}: push_pull: {err}");
        let err = w.init(&[1], &[2], vec![f16::ONE; 2]).unwrap_err();
        assert!(is_mismatch(&err), "{plane:?}: init: {err}");
        let err = w.pull(&[1]).unwrap_err();
        assert!(is_mismatch(&err), "{plane:?}: pull: {err}");
        w.finish().unwrap();
        job.end_ok();
    }
}
