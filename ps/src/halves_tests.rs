//! f16 and bf16 keys in a server's store, without sockets: a sync round's sum is the
//! f32 sum in worker rank order rounded once, whatever order the pushes arrive in and
//! on each server of a split key; SGD steps in f32 and rounds once; async adds each
//! push on arrival; a request of another element type is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::halves_common::Half;
use crate::store::{Answer, Op, Reply, Request, Store};
use crate::wire::KvMeta;
use crate::{Mode, PsError, Update, Value};
use half::{bf16, f16};
use switchyard_msg::payload;

const WORKERS: usize = 4;
const LEN: usize = 96;

/// A piece `offset..offset + len` of key 7, whose whole length is `total`.
fn meta<T>(offset: u64, len: usize, total: usize) -> KvMeta {
    KvMeta {
        keys: vec![7],
        lens: vec![len as u64],
        offsets: vec![offset],
        totals: vec![total as u64],
        must_have: true,
        elem: std::any::type_name::<T>().to_string(),
    }
}

/// Worker `worker`'s push of `values` (as key 7's piece at `offset`); even workers'
/// arrive as one frame (summed from the frame), odd workers' as a buffer.
fn push<T: Value>(worker: u32, id: u64, offset: u64, values: &[T], total: usize) -> Request<T> {
    let frame = worker % 2 == 0;
    Request {
        worker,
        id,
        op: Op::PushPull,
        meta: meta::<T>(offset, values.len(), total),
        values: if frame { Vec::new() } else { values.to_vec() },
        fpt: false,
        shared: frame.then(|| payload::frame_from_slice(values)),
    }
}

fn values<T: Value>(reply: &Reply<u32>) -> Vec<T> {
    match reply.body.as_ref().unwrap() {
        Answer::Values(_, frames) => frames
            .iter()
            .flat_map(|f| payload::frame_to_vec::<T>(f).unwrap())
            .collect(),
        other => panic!("expected values, got {other:?}"),
    }
}

/// Every order of `n` workers.
fn orders(n: usize) -> Vec<Vec<u32>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut o = rest.clone();
            o.insert(at, (n - 1) as u32);
            out.push(o);
        }
    }
    out
}

/// Each worker's push: values of both signs over `2^-span..2^span` (from a fixed
/// generator), with two elements made by hand: `BIG + 1 + 1 + 1` at 0 (each add
/// rounded to the half type would stay at `BIG`), and `1 + 2^-24 + TIE + 2^-24` at 1,
/// whose f32 sum in rank order is the tie `1 + TIE` (each `2^-24` is lost, a tie
/// to even in f32) and so rounds to 1, but summed from the small end is past the
/// tie and rounds up.
fn pushes<T: Half>(span: i32) -> Vec<Vec<T>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    (0..WORKERS)
        .map(|w| {
            (0..LEN)
                .map(|i| {
                    if i == 0 {
                        return T::from(if w == 0 { T::BIG } else { 1.0 });
                    }
                    if i == 1 {
                        return T::from([1.0, 2f32.powi(-24), T::TIE, 2f32.powi(-24)][w]);
                    }
                    let mantissa = 1.0 + (next() % 1024) as f32 / 1024.0;
                    let exponent = (next() % (2 * span as u32 + 1)) as i32 - span;
                    let sign = if next() % 2 == 0 { 1.0 } else { -1.0 };
                    T::from(sign * mantissa * 2f32.powi(exponent))
                })
                .collect()
        })
        .collect()
}

/// The f32 sum of `pushes` in the order `order`, rounded once.
fn sum_in<T: Half>(pushes: &[Vec<T>], order: &[u32]) -> Vec<T> {
    (0..pushes[0].len())
        .map(|i| {
            let mut acc = pushes[order[0] as usize][i].to();
            for &w in &order[1..] {
                acc += pushes[w as usize][i].to();
            }
            T::from(acc)
        })
        .collect()
}

/// The reference: the sum in rank order, added to a stored zero (Update::Sum).
fn reference<T: Half>(pushes: &[Vec<T>]) -> Vec<T> {
    let ranks: Vec<u32> = (0..WORKERS as u32).collect();
    sum_in(pushes, &ranks)
        .into_iter()
        .map(|a| T::from(0.0 + a.to()))
        .collect()
}

fn bits<T: Value>(values: &[T]) -> Vec<u16> {
    bytemuck::cast_slice::<T, u16>(values).to_vec()
}

/// One round per arrival order, each on a fresh store of key 7's piece
/// `offset..offset + len`; every worker's answer is the same bits.
fn rounds<T: Half>(pushes: &[Vec<T>], update: Update<T>, offset: usize, len: usize) -> Vec<T> {
    let mut seen: Option<Vec<T>> = None;
    for order in orders(WORKERS) {
        let mut store = Store::<T, u32>::new("s".into(), Mode::Sync, WORKERS, update.clone());
        let init = Request {
            worker: 0,
            id: 1,
            op: Op::Init,
            meta: meta::<T>(offset as u64, len, LEN),
            values: vec![T::from(0.5); len],
            fpt: false,
            shared: None,
        };
        if matches!(update, Update::Sgd { .. }) {
            assert!(store.handle(0, init)[0].body.is_ok());
        }
        let mut replies = Vec::new();
        for &w in &order {
            let piece = &pushes[w as usize][offset..offset + len];
            replies.extend(store.handle(w, push(w, 2, offset as u64, piece, LEN)));
        }
        assert_eq!(replies.len(), WORKERS, "{order:?}");
        for r in &replies {
            let got = values::<T>(r);
            match &seen {
                None => seen = Some(got),
                Some(s) => assert_eq!(bits(&got), bits(s), "arrival order {order:?}"),
            }
        }
    }
    seen.unwrap()
}

/// The data has teeth: summed in some arrival order, it rounds differently.
fn order_matters<T: Half>(pushes: &[Vec<T>]) {
    let ranks: Vec<u32> = (0..WORKERS as u32).collect();
    let by_rank = bits(&sum_in(pushes, &ranks));
    assert!(
        orders(WORKERS)
            .iter()
            .any(|o| bits(&sum_in(pushes, o)) != by_rank),
        "some arrival order's f32 sum differs"
    );
    let mut halfwise = pushes[0][0];
    for p in &pushes[1..] {
        halfwise = T::from(halfwise.to() + p[0].to());
    }
    assert_ne!(
        bits(&[halfwise]),
        bits(&reference(pushes)[..1]),
        "one rounding"
    );
}

fn sync_round_is_the_rank_order_f32_sum<T: Half>(span: i32) {
    let pushes = pushes::<T>(span);
    order_matters(&pushes);
    let got = rounds(&pushes, Update::Sum, 0, LEN);
    assert_eq!(bits(&got), bits(&reference(&pushes)));
    assert_eq!(got[0], T::from(T::BIG + 3.0), "rounded once: BIG + 4");
    assert_eq!(got[0].to(), T::BIG + 4.0);
    assert_eq!(got[1], T::from(1.0), "the tie 1 + TIE, to even");
}

#[test]
fn f16_sync_rounds_sum_in_f32_in_rank_order_and_round_once() {
    sync_round_is_the_rank_order_f32_sum::<f16>(14);
}

#[test]
fn bf16_sync_rounds_sum_in_f32_in_rank_order_and_round_once() {
    sync_round_is_the_rank_order_f32_sum::<bf16>(40);
}

/// Key 7 split over two servers (a piece of 40 and one of 56): each server's rounds,
/// in every arrival order, give the reference's piece.
fn split_key<T: Half>(span: i32) {
    let pushes = pushes::<T>(span);
    let mut whole = rounds(&pushes, Update::Sum, 0, 40);
    whole.extend(rounds(&pushes, Update::Sum, 40, LEN - 40));
    assert_eq!(bits(&whole), bits(&reference(&pushes)));
}

#[test]
fn a_split_key_sums_alike_on_both_servers() {
    split_key::<f16>(14);
    split_key::<bf16>(40);
}

/// SGD on a stored 0.5: the aggregate rounded once, then `0.5 - rate * aggregate`
/// computed in f32 and rounded once.
fn sgd<T: Half>(span: i32) {
    let pushes = pushes::<T>(span);
    let got = rounds(&pushes, Update::Sgd { rate: 0.1 }, 0, LEN);
    let ranks: Vec<u32> = (0..WORKERS as u32).collect();
    let expected: Vec<T> = sum_in(&pushes, &ranks)
        .into_iter()
        .map(|g| T::from(T::from(0.5).to() - 0.1f32 * g.to()))
        .collect();
    assert_eq!(bits(&got), bits(&expected));
}

#[test]
fn sgd_steps_in_f32_and_rounds_once() {
    sgd::<f16>(14);
    sgd::<bf16>(40);
}

/// Async: each push is added on arrival, in f32, rounded once per push.
#[test]
fn async_adds_each_push_on_arrival_rounding_each_time() {
    let mut store = Store::<f16, u32>::new("s".into(), Mode::Async, 3, Update::Sum);
    let mut last = Vec::new();
    for w in 0..3 {
        let v = f16::from_f32(if w == 0 { 2048.0 } else { 1.0 });
        let r = store.handle(w, push(w, 1, 0, &[v], 1));
        last = values::<f16>(&r[0]);
    }
    // 2048 + 1 is a tie, to even: 2048, twice.
    assert_eq!(last, [f16::from_f32(2048.0)]);
}

/// A push of f16 to f32 keys, or of bf16 to f16 keys (the same width: the bytes alone
/// would pass), is refused with the types named.
#[test]
fn a_push_of_another_half_type_is_a_type_mismatch() {
    fn refused<T: Value, S: Value>(values: Vec<S>) -> PsError {
        let mut store = Store::<T, u32>::new("s".into(), Mode::Sync, 1, Update::Sum);
        let req = Request {
            worker: 0,
            id: 1,
            op: Op::Push,
            meta: meta::<S>(0, values.len(), values.len()),
            values: Vec::new(),
            fpt: false,
            shared: None,
        };
        let r = store.handle(0, req);
        r[0].body.as_ref().unwrap_err().clone().into_error("s")
    }
    let err = refused::<f32, f16>(vec![f16::ONE; 2]);
    assert!(
        matches!(&err, PsError::TypeMismatch { stored, sent, .. } if stored == "f32" && sent.ends_with("f16")),
        "{err}"
    );
    let err = refused::<f16, bf16>(vec![bf16::ONE; 2]);
    assert!(
        matches!(&err, PsError::TypeMismatch { stored, sent, .. } if stored.ends_with("f16") && sent.ends_with("bf16")),
        "{err}"
    );
}
