//! The program every rank runs, and its failure-free run computed without any
//! communicator (the oracle).

use std::time::Duration;
use switchyard::collective::{CollectiveError, CommOptions, Communicator, ReduceOp};
use switchyard_sim::Rng;

/// Words of the global model.
const GLOBAL: usize = 4;
/// Words of each rank's local model.
const LOCAL: usize = 2;

/// One call of an iteration.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// An allreduce of `len` words.
    Allreduce { op: ReduceOp, len: usize },
    /// A lazy allreduce (sum) of `len` words, the input written by `prepare`.
    Lazy { len: usize },
    /// `len` words from `root`.
    Broadcast { root: usize, len: usize },
    /// A byte string from `root`, its length from the input.
    Bytes { root: usize },
    /// `width` words from every rank.
    Allgather { width: usize },
}

impl Op {
    /// A call drawn from `rng`; about one in seven moves 100-299 words.
    fn draw(rng: &mut Rng, size: usize) -> Op {
        let len = if rng.chance(15) {
            100 + rng.index(200)
        } else {
            1 + rng.index(6)
        };
        let root = rng.index(size);
        match rng.below(6) {
            0 | 1 => {
                let op = rng.pick(&[
                    ReduceOp::Sum,
                    ReduceOp::Prod,
                    ReduceOp::Max,
                    ReduceOp::Min,
                    ReduceOp::BitOr,
                ]);
                Op::Allreduce { op, len }
            }
            2 => Op::Lazy { len },
            3 => Op::Broadcast { root, len },
            4 => Op::Bytes { root },
            _ => Op::Allgather {
                width: 1 + rng.index(3),
            },
        }
    }

    /// Words of each rank's input.
    pub(crate) fn len(self) -> usize {
        match self {
            Op::Allreduce { len, .. } | Op::Lazy { len } | Op::Broadcast { len, .. } => len,
            Op::Bytes { .. } => 2,
            Op::Allgather { width } => width,
        }
    }
}

/// A rank's models: the global one (the same on every rank) and its local one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) global: Vec<u64>,
    pub(crate) local: Vec<u64>,
}

impl Model {
    pub(crate) fn initial(program: &Program, rank: usize) -> Model {
        Model {
            global: (0..GLOBAL as u64).map(|j| mix(program.salt ^ j)).collect(),
            local: (0..LOCAL as u64)
                .map(|j| mix(program.salt ^ (rank as u64 + 1) << 40 ^ j))
                .collect(),
        }
    }

    /// This rank's input to call `c` of iteration `iter`.
    pub(crate) fn input(&self, program: &Program, rank: usize, iter: u64, c: usize) -> Vec<u64> {
        let op = program.calls[c];
        (0..op.len())
            .map(|j| {
                let key = program.salt ^ (rank as u64) << 56 ^ iter << 40 ^ (c as u64) << 24;
                let word = mix(key ^ j as u64)
                    ^ self.global[(c + j) % GLOBAL].wrapping_add(self.local[j % LOCAL]);
                match op {
                    // Odd factors keep the product from collapsing to zero.
                    Op::Allreduce {
                        op: ReduceOp::Prod, ..
                    } => word | 1,
                    _ => word,
                }
            })
            .collect()
    }

    /// Folds the result of call `c` of iteration `iter` into the models.
    pub(crate) fn fold(
        &mut self,
        program: &Program,
        (rank, iter, c): (usize, u64, usize),
        result: &[u8],
    ) {
        let d = fnv(result) ^ (iter << 8 | c as u64);
        let g = c % GLOBAL;
        self.global[g] = self.global[g].rotate_left(13) ^ d;
        let h = (c + 1) % GLOBAL;
        self.global[h] = self.global[h].wrapping_add(d >> 7);
        if program.lazy {
            // Not checkpointed: it must stay what a restarted process starts with.
            return;
        }
        let l = c % LOCAL;
        self.local[l] = self.local[l].rotate_left(5) ^ d.wrapping_mul(2 * rank as u64 + 1);
    }

    /// The models of a loaded checkpoint of `rank`; `None` when its local model is
    /// missing (or present where a lazy checkpoint has none).
    pub(crate) fn decode(
        program: &Program,
        rank: usize,
        global: &[u8],
        local: Option<&[u8]>,
    ) -> Option<Model> {
        let words = |b: &[u8]| -> Vec<u64> {
            b.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        let local = match (program.lazy, local) {
            (true, None) => Model::initial(program, rank).local,
            (false, Some(local)) => words(local),
            _ => return None,
        };
        Some(Model {
            global: words(global),
            local,
        })
    }
}

pub(crate) fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The byte string a `Bytes` call's root sends: its length from the input.
pub(crate) fn string_of(input: &[u64]) -> Vec<u8> {
    let len = 1 + (input[0] % 40) as usize;
    (0..len)
        .map(|i| (input[i % input.len()] >> (8 * (i % 8))) as u8)
        .collect()
}

/// SplitMix64's finaliser: a word from a key.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a over bytes.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One seed's job, without its deaths.
#[derive(Clone, Debug)]
pub(crate) struct Program {
    pub(crate) size: usize,
    pub(crate) iters: u64,
    pub(crate) calls: Vec<Op>,
    pub(crate) salt: u64,
    pub(crate) schedule: u64,
    /// Small thresholds: long buffers go round the ring in pieces.
    pub(crate) small: bool,
    pub(crate) checked: bool,
    /// Fewer copies than the defaults (which, in worlds this small, keep every
    /// result on every rank and each local model on three): (global, local).
    pub(crate) replicas: Option<(usize, usize)>,
    /// Checkpoints are lazy (`lazy_checkpoint`: the global model only, encoded when a
    /// restarted rank needs it), and the local models stay as they start.
    pub(crate) lazy: bool,
}

impl Program {
    pub(crate) fn draw(rng: &mut Rng) -> Program {
        let size = 2 + rng.index(3);
        let iters = 2 + rng.below(3);
        let count = 1 + rng.index(3);
        Program {
            size,
            iters,
            calls: (0..count).map(|_| Op::draw(rng, size)).collect(),
            salt: rng.next_u64(),
            schedule: rng.next_u64(),
            small: rng.chance(40),
            checked: rng.chance(50),
            replicas: rng.chance(35).then(|| (1 + rng.index(2), 1 + rng.index(2))),
            lazy: false,
        }
    }

    pub(crate) fn options(&self) -> CommOptions {
        let options = CommOptions::default()
            .with_timeout(Duration::from_secs(20))
            .with_check(self.checked);
        if self.small {
            options.with_large_threshold(64).with_piece_bytes(256)
        } else {
            options
        }
    }
}

/// The failure-free run, computed without any communicator: every call's result,
/// every rank's models at each checkpoint version, and the final models.
pub(crate) struct Reference {
    /// `results[iter][c]`: the result's bytes (the same on every rank).
    pub(crate) results: Vec<Vec<Vec<u8>>>,
    /// `checkpoints[v][rank]`: the models checkpoint `v` holds (`v` ≥ 1).
    pub(crate) checkpoints: Vec<Vec<Model>>,
    pub(crate) finals: Vec<Model>,
}

impl Reference {
    pub(crate) fn of(program: &Program) -> Reference {
        let n = program.size;
        let mut models: Vec<Model> = (0..n).map(|r| Model::initial(program, r)).collect();
        let mut results = Vec::new();
        let mut checkpoints = vec![models.clone()];
        for iter in 0..program.iters {
            let mut row = Vec::new();
            for (c, op) in program.calls.iter().enumerate() {
                let inputs: Vec<Vec<u64>> = (0..n)
                    .map(|r| models[r].input(program, r, iter, c))
                    .collect();
                let result = match *op {
                    Op::Allreduce { op, .. } => bytes_of(&reduce(&inputs, op)),
                    Op::Lazy { .. } => bytes_of(&reduce(&inputs, ReduceOp::Sum)),
                    Op::Broadcast { root, .. } => bytes_of(&inputs[root]),
                    Op::Bytes { root } => string_of(&inputs[root]),
                    Op::Allgather { .. } => bytes_of(&inputs.concat()),
                };
                for (r, model) in models.iter_mut().enumerate() {
                    model.fold(program, (r, iter, c), &result);
                }
                row.push(result);
            }
            results.push(row);
            checkpoints.push(models.clone());
        }
        Reference {
            results,
            checkpoints,
            finals: models,
        }
    }
}

pub(crate) fn reduce(inputs: &[Vec<u64>], op: ReduceOp) -> Vec<u64> {
    let mut acc = inputs[0].clone();
    for input in &inputs[1..] {
        for (a, &b) in acc.iter_mut().zip(input) {
            *a = match op {
                ReduceOp::Sum => a.wrapping_add(b),
                ReduceOp::Prod => a.wrapping_mul(b),
                ReduceOp::Max => (*a).max(b),
                ReduceOp::Min => (*a).min(b),
                _ => *a | b,
            };
        }
    }
    acc
}

/// Runs call `c` of iteration `iter` with `input`, returning its result's bytes.
pub(crate) fn call(
    comm: &mut Communicator,
    op: Op,
    input: &[u64],
    rank: usize,
) -> Result<Vec<u8>, CollectiveError> {
    let size = comm.world_size();
    // What a rank that is not the root holds before a broadcast: never the result.
    let junk = |len: usize| vec![0xdead_0000 + rank as u64; len];
    Ok(match op {
        Op::Allreduce { op, .. } => {
            let mut buf = input.to_vec();
            comm.allreduce(&mut buf, op)?;
            bytes_of(&buf)
        }
        Op::Lazy { len } => {
            let mut buf = junk(len);
            comm.allreduce_lazy(&mut buf, ReduceOp::Sum, |b| b.copy_from_slice(input))?;
            bytes_of(&buf)
        }
        Op::Broadcast { root, len } => {
            let mut buf = if rank == root {
                input.to_vec()
            } else {
                junk(len)
            };
            comm.broadcast(&mut buf, root)?;
            bytes_of(&buf)
        }
        Op::Bytes { root } => {
            let mut buf = if rank == root {
                string_of(input)
            } else {
                vec![rank as u8; rank + 3]
            };
            comm.broadcast_bytes(&mut buf, root)?;
            buf
        }
        Op::Allgather { width } => {
            let mut out = junk(width * size);
            comm.allgather(input, &mut out)?;
            bytes_of(&out)
        }
    })
}
