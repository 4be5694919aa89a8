//! The two-byte floats (`f16`, `bf16`) against references computed in `f64`, on
//! every algorithm of the mesh: recursive doubling, the direct exchange and the ring
//! over TCP, the host board over shared memory (in pieces smaller than the buffer),
//! the pipes of shared memory without the board, a hierarchy of hosts, and
//! `local://` queues; at n = 2, 3 and 4. What is checked is the documented rule
//! (`DType::is_half`): every rank's values summed in `f32` and rounded once,
//! bit-identical on every rank.

use super::{on_ranks_over, on_ranks_with};
use switchyard::collective::{CollectiveError, Communicator, DataPath, ReduceOp, Reducible};
use switchyard::half::{bf16, f16};

/// Where the ranks run, and the algorithm the options send an allreduce to.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// TCP, buffers below the large threshold: recursive doubling.
    Doubling,
    /// TCP, every buffer "large", few ranks: the direct exchange, in small pieces.
    Direct,
    /// TCP, every buffer "large", no direct exchange: the ring, in small pieces.
    Ring,
    /// Shared memory with the host board, pieces of 1 KiB: 5000 elements (20,000
    /// bytes as `f32`) take 20 board calls.
    Board,
    /// Shared memory with the board turned off: the ring over the pipes.
    Pipes,
    /// Two ranks a host: within each host, among the hosts' leaders, back.
    Hosts,
    /// `local://` in-process queues (recursive doubling).
    Local,
}

const PATHS: [Path; 7] = [
    Path::Doubling,
    Path::Direct,
    Path::Ring,
    Path::Board,
    Path::Pipes,
    Path::Hosts,
    Path::Local,
];

/// Runs `body` on `n` ranks over `path`; returns every rank's result in rank order.
fn on<R: Send + 'static>(
    path: Path,
    n: usize,
    body: impl Fn(&mut Communicator) -> Result<R, CollectiveError> + Send + Sync + 'static,
) -> Vec<R> {
    let base = super::options();
    let tcp = base
        .clone()
        .with_data_path(DataPath::Tcp)
        .with_shared_memory(false);
    let shm = base
        .clone()
        .with_data_path(DataPath::Tcp)
        .with_shared_memory(true);
    let large = |o: switchyard::collective::CommOptions| {
        o.with_large_threshold(0)
            .with_board_max_bytes(0)
            .with_piece_bytes(512)
            .with_window(3)
    };
    match path {
        Path::Doubling => on_ranks_over("tcp", n, tcp, body),
        Path::Direct => on_ranks_over("tcp", n, large(tcp).with_direct_max_ranks(64), body),
        Path::Ring => on_ranks_over("tcp", n, large(tcp).with_direct_max_ranks(0), body),
        Path::Board => on_ranks_over("tcp", n, shm.with_piece_bytes(1024), body),
        Path::Pipes => on_ranks_over("tcp", n, large(shm).with_direct_max_ranks(0), body),
        Path::Hosts => on_ranks_with(
            "tcp",
            n,
            move |rank| shm.clone().with_host_id(format!("half-host-{}", rank / 2)),
            body,
        ),
        Path::Local => on_ranks_over("local", n, base, body),
    }
}

/// What the tests need of a two-byte float.
trait Half: Reducible + std::fmt::Debug {
    /// The unit roundoff: half the distance from 1 to the next value.
    const UNIT: f64;
    /// Half the smallest positive value (the rounding error below the normal range).
    const TINY: f64;
    /// The exponents of [`value`]'s wide-range inputs, whose sums `f32` cannot always
    /// hold exactly but `f64` can (so the reference is exact).
    const WIDE: (i32, i32);
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn bits(self) -> u16;
}

impl Half for f16 {
    const UNIT: f64 = 1.0 / 2048.0;
    const TINY: f64 = 1.0 / (1u64 << 25) as f64;
    const WIDE: (i32, i32) = (-12, 4);
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

impl Half for bf16 {
    const UNIT: f64 = 1.0 / 256.0;
    const TINY: f64 = 0.0;
    const WIDE: (i32, i32) = (-20, 20);
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

/// Rank `rank`'s element `i` (of data set `set`), as `T`: a sign, a significand of
/// up to 11 bits and an exponent in `exps`, drawn by a fixed hash.
fn value<T: Half>(set: u64, rank: usize, i: usize, exps: (i32, i32)) -> T {
    let mut x = set << 48 ^ (rank as u64) << 32 ^ i as u64;
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let significand = 1.0 + (x & 0x7ff) as f64 / 2048.0;
    let span = (exps.1 - exps.0 + 1) as u64;
    let exponent = exps.0 + ((x >> 11) % span) as i32;
    let sign = if (x >> 40) & 1 == 1 { -1.0 } else { 1.0 };
    T::from_f64(sign * significand * 2f64.powi(exponent))
}

/// Every rank's input of one data set: `inputs[rank][i]`.
fn inputs<T: Half>(set: u64, n: usize, len: usize, exps: (i32, i32)) -> Vec<Vec<T>> {
    (0..n)
        .map(|r| (0..len).map(|i| value::<T>(set, r, i, exps)).collect())
        .collect()
}

/// The distance between `x` and the next value of `T` away from zero.
fn ulp<T: Half>(x: f64) -> f64 {
    let smallest = 2.0 * T::TINY;
    let digits = (1.0 / T::UNIT).log2() as i32; // significand bits after the point + 1
    let ulp = 2f64.powi(x.abs().log2().floor() as i32 - digits + 1);
    if T::TINY > 0.0 {
        ulp.max(smallest)
    } else {
        ulp
    }
}

/// Largest error seen, in units in the last place of the exact result.
#[derive(Default, Debug)]
struct Worst {
    sum_wide: f64,
    prod: f64,
}

/// Checks every rank's results of one world against the `f64` references:
/// bit-identical across ranks; a correctly rounded sum where the `f32` sum is exact
/// (narrow inputs); the documented bound on wide inputs and on products; exact
/// maxima and minima. Returns the largest errors, in units in the last place.
fn check<T: Half>(label: &str, n: usize, len: usize, results: &[[Vec<T>; 5]]) -> Worst {
    let mut worst = Worst::default();
    let bits = |v: &[T]| v.iter().map(|x| x.bits()).collect::<Vec<u16>>();
    for (rank, r) in results.iter().enumerate() {
        for k in 0..5 {
            assert_eq!(
                bits(&r[k]),
                bits(&results[0][k]),
                "{label}: rank {rank}, result {k}, differs from rank 0's"
            );
        }
    }
    let [narrow, wide, prod, max, min] = &results[0];
    let gamma = (n - 1) as f64 * f32::EPSILON as f64 / 2.0 * 1.0001;
    let sets = [
        inputs::<T>(1, n, len, (-4, 4)),
        inputs::<T>(2, n, len, T::WIDE),
        inputs::<T>(3, n, len, (-2, 2)),
    ];
    for i in 0..len {
        let column = |set: &Vec<Vec<T>>| set.iter().map(|v| v[i].to_f64()).collect::<Vec<_>>();
        let (xs, ws, ps) = (column(&sets[0]), column(&sets[1]), column(&sets[2]));
        let exact: f64 = xs.iter().sum();
        assert_eq!(
            narrow[i].bits(),
            T::from_f64(exact).bits(),
            "{label}: narrow sum [{i}] of {xs:?}: {:?}, the correctly rounded sum is {:?}",
            narrow[i],
            T::from_f64(exact)
        );
        let exact: f64 = ws.iter().sum();
        let delta = gamma * ws.iter().map(|w| w.abs()).sum::<f64>();
        let bound = T::UNIT * (exact.abs() + delta) + delta + T::TINY;
        let error = (wide[i].to_f64() - exact).abs();
        assert!(
            error <= bound,
            "{label}: wide sum [{i}] of {ws:?}: {:?} is {error:e} from {exact}, bound {bound:e}",
            wide[i]
        );
        if exact != 0.0 {
            worst.sum_wide = worst.sum_wide.max(error / ulp::<T>(exact));
        }
        let exact: f64 = ps.iter().product();
        let delta = gamma * exact.abs();
        let bound = T::UNIT * (exact.abs() + delta) + delta + T::TINY;
        let error = (prod[i].to_f64() - exact).abs();
        assert!(
            error <= bound,
            "{label}: product [{i}] of {ps:?}: {:?}",
            prod[i]
        );
        worst.prod = worst.prod.max(error / ulp::<T>(exact));
        let (hi, lo) = ws
            .iter()
            .fold((f64::MIN, f64::MAX), |(h, l), &w| (h.max(w), l.min(w)));
        assert_eq!(
            (max[i].to_f64(), min[i].to_f64()),
            (hi, lo),
            "{label}: max/min [{i}]"
        );
    }
    worst
}

/// One rank's allreduces of every data set: a narrow sum, a wide sum, a product, a
/// maximum and a minimum.
fn rank_calls<T: Half>(
    comm: &mut Communicator,
    len: usize,
) -> Result<[Vec<T>; 5], CollectiveError> {
    let (n, r) = (comm.world_size(), comm.rank());
    let mine = |set, exps| inputs::<T>(set, n, len, exps).swap_remove(r);
    let mut out = [
        mine(1, (-4, 4)),
        mine(2, T::WIDE),
        mine(3, (-2, 2)),
        mine(2, T::WIDE),
        mine(2, T::WIDE),
    ];
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
    ];
    for (buf, op) in out.iter_mut().zip(ops) {
        comm.allreduce(buf, op)?;
    }
    Ok(out)
}

/// Sums, products, maxima and minima of both types, on every path, n = 2, 3, 4, and
/// lengths of 1, 3 and 5000 elements (the last crossing the board's and the ring's
/// piece size many times), against the `f64` references and the documented bound.
#[test]
fn halves_reduce_in_f32_round_once_and_agree_bit_for_bit() {
    let (mut f16_worst, mut bf16_worst) = (Worst::default(), Worst::default());
    for path in PATHS {
        for n in [2, 3, 4] {
            for len in [1, 3, 5000] {
                let results = on(path, n, move |comm| {
                    Ok((
                        rank_calls::<f16>(comm, len)?,
                        rank_calls::<bf16>(comm, len)?,
                    ))
                });
                let label = format!("{path:?} n={n} len={len}");
                let (halves, brains): (Vec<_>, Vec<_>) = results.into_iter().unzip();
                let w = check::<f16>(&format!("f16 {label}"), n, len, &halves);
                f16_worst.sum_wide = f16_worst.sum_wide.max(w.sum_wide);
                f16_worst.prod = f16_worst.prod.max(w.prod);
                let w = check::<bf16>(&format!("bf16 {label}"), n, len, &brains);
                bf16_worst.sum_wide = bf16_worst.sum_wide.max(w.sum_wide);
                bf16_worst.prod = bf16_worst.prod.max(w.prod);
            }
        }
    }
    // Printed for the documentation (run with --nocapture): correctly rounded is 0.5.
    eprintln!("largest error in ulps: f16 {f16_worst:?}, bf16 {bf16_worst:?}");
    assert!(f16_worst.sum_wide <= 1.0 && bf16_worst.sum_wide <= 1.0);
}

/// 2048 + 1 + 1 in `f16` (256 + 1 + 1 in `bf16`): rounding after each addition gives
/// 2048 (2049 is a tie, which rounds to even), the `f32` sum rounded once gives 2050,
/// which is exact. Every path rounds once.
#[test]
fn a_sum_rounds_once_not_after_each_rank() {
    let pairwise = {
        let mut acc = [f16::from_f32(2048.0)];
        f16::reduce_into(ReduceOp::Sum, &mut acc, &[f16::ONE]);
        f16::reduce_into(ReduceOp::Sum, &mut acc, &[f16::ONE]);
        acc[0]
    };
    assert_eq!(pairwise.to_f32(), 2048.0);
    for path in PATHS {
        let results = on(path, 3, |comm| {
            let first = comm.rank() == 0;
            let mut h = [if first {
                f16::from_f32(2048.0)
            } else {
                f16::ONE
            }; 7];
            comm.allreduce(&mut h, ReduceOp::Sum)?;
            let mut b = [if first {
                bf16::from_f32(256.0)
            } else {
                bf16::ONE
            }; 7];
            comm.allreduce(&mut b, ReduceOp::Sum)?;
            Ok((h, b))
        });
        for (rank, (h, b)) in results.iter().enumerate() {
            assert_eq!(*h, [f16::from_f32(2050.0); 7], "{path:?} rank {rank}");
            assert_eq!(*b, [bf16::from_f32(258.0); 7], "{path:?} rank {rank}");
        }
    }
}

/// Broadcast, allgather and reduce-scatter take halves too: the first two as plain
/// data, bit for bit (a NaN's payload and a negative zero included).
#[test]
fn halves_broadcast_and_allgather_as_they_are() {
    let special = [
        f16::NAN,
        f16::NEG_ZERO,
        f16::INFINITY,
        f16::from_bits(0x7e01),
    ];
    for path in [Path::Board, Path::Doubling, Path::Local] {
        let results = on(path, 3, move |comm| {
            let r = comm.rank();
            let mut sent = if r == 1 { special } else { [f16::ZERO; 4] };
            comm.broadcast(&mut sent, 1)?;
            let mut all = vec![bf16::ZERO; 3 * 2];
            let mine = [bf16::from_f32(r as f32 + 0.5), bf16::MIN_POSITIVE_SUBNORMAL];
            comm.allgather(&mine, &mut all)?;
            Ok((sent, all))
        });
        for (sent, all) in results {
            let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sent), bits(&special), "{path:?}");
            let want: Vec<bf16> = (0..3)
                .flat_map(|r| [bf16::from_f32(r as f32 + 0.5), bf16::MIN_POSITIVE_SUBNORMAL])
                .collect();
            assert_eq!(all, want, "{path:?}");
        }
    }
}
