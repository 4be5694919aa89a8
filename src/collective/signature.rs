//! What every rank of one call must agree on, and the one place both engines check it.
//!
//! A [`Signature`] names a call: which collective, which operation, which element type
//! and which root. The mesh engine sends it in the meta frame before every payload
//! ([`Meta`]) and the MPI engine allgathers it before each call; both compare it with
//! [`Signature::agree`], so that ranks calling with different lengths, operations,
//! types or roots get the same error, naming the other rank, on either engine.

use super::element::{DType, ReduceOp};
use super::engine::{Collective, Elem};
use super::error::{Call, CollectiveError};

/// Operation code of the user reducers (`allreduce_with`, `allreduce_serde`).
pub(crate) const USER_OP: u8 = 0xff;

/// What every rank of one call must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub(crate) call: Call,
    /// Operation code: 0 for none, a [`ReduceOp`] code, or [`USER_OP`].
    pub(crate) op: u8,
    /// For the built-in reductions a [`DType`] code; otherwise the element width in
    /// bytes (0 for byte strings and serde values).
    pub(crate) dtype: u8,
    pub(crate) root: u32,
}

impl Signature {
    /// The signature of a built-in reduction (allreduce or reduce-scatter).
    pub(crate) fn reduction(call: Call, dtype: DType, op: ReduceOp) -> Signature {
        Signature {
            call,
            op: op.code(),
            dtype: dtype.code(),
            root: 0,
        }
    }

    /// A broadcast of `elem`s from `root`.
    pub(crate) fn broadcast(elem: Elem, root: usize) -> Signature {
        Signature {
            call: Call::Broadcast,
            op: 0,
            dtype: elem.code(),
            root: root as u32,
        }
    }

    /// Both halves of a rank-ordered reduction with a user function whose values are
    /// fixed-size elements (the reduction to rank 0 and the broadcast of its result);
    /// for byte strings, the reduction only (the result travels by
    /// [`Signature::broadcast`] of bytes).
    pub(crate) fn user(elem: Elem) -> Signature {
        Signature {
            call: Call::Allreduce,
            op: USER_OP,
            dtype: elem.code(),
            root: 0,
        }
    }

    /// A call with neither operation nor root.
    pub(crate) fn plain(call: Call, elem: Elem) -> Signature {
        Signature {
            call,
            op: 0,
            dtype: elem.code(),
            root: 0,
        }
    }

    /// The signature `request` starts with (a fold's later phases have their own, see
    /// [`Signature::user`]).
    pub(crate) fn of(request: &Collective<'_>) -> Signature {
        match request {
            Collective::Allreduce { dtype, op, .. } => {
                Signature::reduction(Call::Allreduce, *dtype, *op)
            }
            Collective::ReduceScatter { dtype, op, .. } => {
                Signature::reduction(Call::ReduceScatter, *dtype, *op)
            }
            Collective::Broadcast { elem, root, .. } => Signature::broadcast(*elem, *root),
            Collective::Allgather { width, .. } => {
                Signature::plain(Call::Allgather, Elem::Sized(*width))
            }
            Collective::Barrier => Signature::plain(Call::Barrier, Elem::Bytes),
            Collective::Fold { elem, .. } => Signature::user(*elem),
        }
    }

    /// The signature as one `u64`: call, operation, element type, root.
    pub(crate) fn encode(self) -> u64 {
        u64::from(self.call.code())
            | u64::from(self.op) << 8
            | u64::from(self.dtype) << 16
            | u64::from(self.root) << 32
    }

    /// `call/op/dtype/root` for an encoded signature, with names where the codes are
    /// known (a peer's bits may be anything).
    pub(crate) fn describe(bits: u64) -> String {
        let (call, op, dtype, root) = (
            (bits & 0xff) as u8,
            (bits >> 8) as u8,
            (bits >> 16) as u8,
            bits >> 32,
        );
        let call = Call::from_code(call).map_or_else(|| format!("call {call}"), |c| c.to_string());
        let builtin = ReduceOp::from_code(op);
        let op_name = match (op, builtin) {
            (0, _) => "-".to_string(),
            (USER_OP, _) => "user".to_string(),
            (_, Some(o)) => format!("{o:?}"),
            (code, None) => format!("op {code}"),
        };
        let dtype = match (dtype, builtin) {
            (0, _) => "bytes".to_string(),
            (code, Some(_)) => {
                DType::from_code(code).map_or_else(|| format!("dtype {code}"), |d| format!("{d:?}"))
            }
            (width, None) => format!("{width}-byte"),
        };
        format!("{call}/{op_name}/{dtype}/root {root}")
    }

    /// Checks what rank `peer` sent against this rank's call: its encoded signature
    /// and, where it must match, its element count. `me` is this rank, for the error.
    pub(crate) fn agree(
        self,
        count: u64,
        me: usize,
        peer: usize,
        theirs: u64,
        their_count: Option<u64>,
    ) -> Result<(), CollectiveError> {
        if theirs != self.encode() {
            return Err(CollectiveError::CallMismatch {
                call: self.call,
                rank: peer,
                ours: Signature::describe(self.encode()),
                theirs: Signature::describe(theirs),
            });
        }
        match their_count {
            Some(theirs) if theirs != count => Err(CollectiveError::SizeMismatch {
                call: self.call,
                rank: peer,
                me,
                ours: count,
                theirs,
            }),
            _ => Ok(()),
        }
    }
}

/// The 24-byte meta frame before every mesh payload: the call's total element count,
/// its signature, and the offset of the payload within the call's buffer (in the unit
/// the algorithm slices the buffer in: elements for reductions, bytes for copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) total: u64,
    pub(crate) sig: u64,
    pub(crate) offset: u64,
}

impl Meta {
    /// Length of an encoded meta frame.
    pub(crate) const LEN: usize = 24;

    /// Little-endian `total`, `sig`, `offset`.
    pub(crate) fn encode(self) -> [u8; Meta::LEN] {
        let mut meta = [0u8; Meta::LEN];
        meta[..8].copy_from_slice(&self.total.to_le_bytes());
        meta[8..16].copy_from_slice(&self.sig.to_le_bytes());
        meta[16..].copy_from_slice(&self.offset.to_le_bytes());
        meta
    }

    /// The meta frame in `bytes`, or `None` if it is not [`Meta::LEN`] long.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Meta> {
        let bytes: &[u8; Meta::LEN] = bytes.try_into().ok()?;
        let word = |i: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(word)
        };
        Some(Meta {
            total: word(0),
            sig: word(1),
            offset: word(2),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_described_by_name() {
        let sig = Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Sum);
        assert_eq!(
            Signature::describe(sig.encode()),
            "allreduce/Sum/F32/root 0"
        );
        assert_eq!(
            Signature::describe(Signature::broadcast(Elem::Bytes, 2).encode()),
            "broadcast/-/bytes/root 2"
        );
        assert_eq!(
            Signature::describe(Signature::broadcast(Elem::Sized(4), 1).encode()),
            "broadcast/-/4-byte/root 1"
        );
        assert_eq!(
            Signature::describe(Signature::user(Elem::Bytes).encode()),
            "allreduce/user/bytes/root 0"
        );
        // A peer's bits may be anything.
        assert_eq!(
            Signature::describe(0x0000_0007_00ee_77f0),
            "call 240/op 119/238-byte/root 7"
        );
    }

    #[test]
    fn every_field_takes_part_in_the_comparison() {
        let ours = Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Sum);
        let others = [
            Signature::reduction(Call::ReduceScatter, DType::F32, ReduceOp::Sum),
            Signature::reduction(Call::Allreduce, DType::F64, ReduceOp::Sum),
            Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Max),
            Signature { root: 1, ..ours },
        ];
        for theirs in others {
            let err = ours.agree(3, 0, 2, theirs.encode(), Some(3)).unwrap_err();
            assert!(
                matches!(err, CollectiveError::CallMismatch { rank: 2, .. }),
                "{err:?}"
            );
        }
        let err = ours.agree(3, 1, 2, ours.encode(), Some(4)).unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::SizeMismatch {
                rank: 2,
                me: 1,
                ours: 3,
                theirs: 4,
                ..
            }
        ));
        assert!(ours.agree(3, 1, 2, ours.encode(), None).is_ok());
        assert!(ours.agree(3, 1, 2, ours.encode(), Some(3)).is_ok());
    }

    #[test]
    fn meta_frames_round_trip_and_refuse_other_lengths() {
        let meta = Meta {
            total: 7,
            sig: u64::MAX - 3,
            offset: 1 << 40,
        };
        assert_eq!(Meta::decode(&meta.encode()), Some(meta));
        assert_eq!(Meta::decode(&[0; 23]), None);
        assert_eq!(Meta::decode(&[0; 25]), None);
    }
}
