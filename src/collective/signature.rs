//! What every rank of one call must agree on, and the one place both engines check it.
//!
//! A [`Signature`] names a call: which collective, which operation, which element type
//! and which root. The mesh engine sends it in the meta frame before every payload
//! ([`Meta`]) and the MPI engine allgathers it before each call; both compare it with
//! [`Signature::agree`], so that ranks calling with different lengths, operations,
//! types or roots get the same error, naming the other rank, on either engine.

use super::algo::choice::Algorithm;
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
    /// How the ranks run the call: on the mesh, the algorithm's code
    /// ([`Algorithm::code`](super::algo::choice::Algorithm::code)) plus [`CHECKED`] in
    /// checked mode; 0 under MPI. Ranks whose tunings differ pick different algorithms
    /// for the same call, and their step tags never meet: this byte makes the first
    /// message between them an error instead of a hang.
    pub(crate) how: u8,
}

/// The bit of [`Signature::how`] that says the sender runs in checked mode.
pub(crate) const CHECKED: u8 = 0x80;

/// The bits of an encoded signature that name the call itself (not [`Signature::how`]).
const WHAT: u64 = !(0xff << 24);

impl Signature {
    /// The signature of a built-in reduction (allreduce or reduce-scatter).
    pub(crate) fn reduction(call: Call, dtype: DType, op: ReduceOp) -> Signature {
        Signature {
            call,
            op: op.code(),
            dtype: dtype.code(),
            root: 0,
            how: 0,
        }
    }

    /// A broadcast of `elem`s from `root`.
    pub(crate) fn broadcast(elem: Elem, root: usize) -> Signature {
        Signature {
            call: Call::Broadcast,
            op: 0,
            dtype: elem.code(),
            root: root as u32,
            how: 0,
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
            how: 0,
        }
    }

    /// A call with neither operation nor root.
    pub(crate) fn plain(call: Call, elem: Elem) -> Signature {
        Signature {
            call,
            op: 0,
            dtype: elem.code(),
            root: 0,
            how: 0,
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

    /// This signature run as `how` (see [`Signature::how`]).
    pub(crate) fn run_as(self, how: u8) -> Signature {
        Signature { how, ..self }
    }

    /// The signature as one `u64`: call, operation, element type, how, root.
    pub(crate) fn encode(self) -> u64 {
        u64::from(self.call.code())
            | u64::from(self.op) << 8
            | u64::from(self.dtype) << 16
            | u64::from(self.how) << 24
            | u64::from(self.root) << 32
    }

    /// Checks what rank `peer` sent against this rank's call: its encoded signature
    /// and, where it must match, its element count. `me` is this rank, for the error.
    /// The call itself (kind, operation, type, root) is compared first, then the
    /// count, then how the call is run, so that the error names the first difference
    /// a user would fix.
    pub(crate) fn agree(
        self,
        count: u64,
        me: usize,
        peer: usize,
        theirs: u64,
        their_count: Option<u64>,
    ) -> Result<(), CollectiveError> {
        let ours = self.encode();
        let their_count = their_count.filter(|&c| c != count);
        if theirs & WHAT != ours & WHAT {
            let shown = their_count.unwrap_or(count);
            return Err(CollectiveError::CallMismatch {
                call: self.call,
                rank: peer,
                ours: CallText::new(ours, count, false).to_string(),
                theirs: CallText::new(theirs, shown, false).to_string(),
            });
        }
        if let Some(their_count) = their_count {
            return Err(CollectiveError::SizeMismatch {
                call: self.call,
                rank: peer,
                me,
                ours: count,
                theirs: their_count,
                our_call: CallText::new(ours, count, false).to_string(),
                their_call: CallText::new(theirs, their_count, false).to_string(),
            });
        }
        if theirs != ours {
            return Err(CollectiveError::CallMismatch {
                call: self.call,
                rank: peer,
                ours: CallText::new(ours, count, true).to_string(),
                theirs: CallText::new(theirs, count, true).to_string(),
            });
        }
        Ok(())
    }

    /// This call with `count` elements in words, as mismatch errors print it.
    pub(crate) fn text(self, count: u64) -> String {
        CallText::new(self.encode(), count, false).to_string()
    }
}

/// One rank's call in words, the one form every mismatch error (mesh and MPI) prints:
/// `allreduce(Sum, f32 x 131072)`, `broadcast(4-byte x 1000, root 1)`, `barrier()`;
/// with `how`, also the algorithm and checked mode (`... by direct exchange,
/// checked`). Built from an encoded signature, since a peer's may hold any bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallText {
    bits: u64,
    count: u64,
    how: bool,
}

impl CallText {
    /// The text for encoded signature `bits` with `count` elements; `how` adds how
    /// the call is run (for ranks that differ in nothing else).
    pub(crate) fn new(bits: u64, count: u64, how: bool) -> CallText {
        CallText { bits, count, how }
    }
}

impl std::fmt::Display for CallText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bits = self.bits;
        let (call, op, dtype, how, root) = (
            (bits & 0xff) as u8,
            (bits >> 8) as u8,
            (bits >> 16) as u8,
            (bits >> 24) as u8,
            bits >> 32,
        );
        let kind = Call::from_code(call);
        match kind {
            Some(c) => write!(f, "{c}(")?,
            None => write!(f, "call {call}(")?,
        }
        if kind == Some(Call::Barrier) {
            f.write_str(")")?;
        } else {
            let builtin = ReduceOp::from_code(op);
            match (op, builtin) {
                (0, _) => {}
                (USER_OP, _) => f.write_str("user fn, ")?,
                (_, Some(o)) => write!(f, "{o:?}, ")?,
                (code, None) => write!(f, "op {code}, ")?,
            }
            match (dtype, builtin) {
                (0, _) => f.write_str("bytes")?,
                (code, Some(_)) => match DType::from_code(code) {
                    Some(d) => write!(f, "{}", format!("{d:?}").to_lowercase())?,
                    None => write!(f, "dtype {code}")?,
                },
                (width, None) => write!(f, "{width}-byte")?,
            }
            write!(f, " x {}", self.count)?;
            if kind == Some(Call::Broadcast) || root != 0 {
                write!(f, ", root {root}")?;
            }
            f.write_str(")")?;
        }
        if self.how {
            let algorithm = how & !CHECKED;
            match Algorithm::from_code(algorithm) {
                Some(a) => write!(f, " by {}", a.words())?,
                None if algorithm == 0 => {}
                None => write!(f, " by algorithm {algorithm}")?,
            }
            if how & CHECKED != 0 {
                f.write_str(", checked")?;
            } else {
                f.write_str(", unchecked")?;
            }
        }
        Ok(())
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
    fn calls_are_described_in_words() {
        let text = |sig: Signature, count| CallText::new(sig.encode(), count, false).to_string();
        let sum = Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Sum);
        assert_eq!(text(sum, 131072), "allreduce(Sum, f32 x 131072)");
        assert_eq!(
            text(Signature::broadcast(Elem::Bytes, 2), 5),
            "broadcast(bytes x 5, root 2)"
        );
        assert_eq!(
            text(Signature::broadcast(Elem::Sized(4), 1), 1000),
            "broadcast(4-byte x 1000, root 1)"
        );
        assert_eq!(
            text(Signature::user(Elem::Bytes), 3),
            "allreduce(user fn, bytes x 3)"
        );
        assert_eq!(
            text(Signature::plain(Call::Barrier, Elem::Bytes), 0),
            "barrier()"
        );
        let how = sum.run_as(Algorithm::Direct.code() | CHECKED);
        assert_eq!(
            CallText::new(how.encode(), 8, true).to_string(),
            "allreduce(Sum, f32 x 8) by direct exchange, checked"
        );
        // A peer's bits may be anything.
        assert_eq!(
            CallText::new(0x0000_0007_00ee_77f0, 1, false).to_string(),
            "call 240(op 119, 238-byte x 1, root 7)"
        );
    }

    #[test]
    fn a_mismatch_error_says_what_each_side_called() {
        let ours = Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Sum);
        let err = ours
            .agree(131071, 0, 1, ours.encode(), Some(131072))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "allreduce: rank 1 called allreduce(Sum, f32 x 131072), \
             this rank (rank 0) allreduce(Sum, f32 x 131071)"
        );
        let max = Signature::reduction(Call::Allreduce, DType::F32, ReduceOp::Max);
        let err = ours.agree(4, 0, 3, max.encode(), Some(4)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "allreduce: rank 3 called allreduce(Max, f32 x 4), this rank allreduce(Sum, f32 x 4)"
        );
        // Only the algorithm differs: the tunings do.
        let ring = ours.run_as(Algorithm::Ring.code());
        let direct = ours.run_as(Algorithm::Direct.code());
        let err = ring.agree(4, 0, 2, direct.encode(), Some(4)).unwrap_err();
        assert!(
            err.to_string().contains("by direct exchange, unchecked"),
            "{err}"
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
            ours.run_as(CHECKED),
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
