//! Reductions with user functions and broadcasts of serde values: the calls whose
//! elements the engines never interpret. A user reduction is one
//! [`Collective::Fold`]: rank-ordered onto rank 0 (so the function need only be
//! associative), then the result to every rank.

use super::Communicator;
use super::engine::{Collective, Elem};
use super::error::{Call, CollectiveError};
use super::signature::Signature;
use serde::{Serialize, de::DeserializeOwned};
use std::borrow::Cow;
use switchyard_msg::payload::{self, Element};

impl Communicator {
    /// Allreduce with a user function: afterwards every `buf[i]` is
    /// `x0[i] ∘ x1[i] ∘ ... ∘ x(n-1)[i]` in rank order, where `reducer(acc, next)`
    /// computes `acc = acc ∘ next`. The operation must be associative; it need not
    /// be commutative (ranks are combined in order, on a binomial tree to rank 0,
    /// whose result is then broadcast).
    ///
    /// # Examples
    ///
    /// ```
    /// use switchyard::collective::Communicator;
    /// let mut comm = Communicator::solo();
    /// let mut buf = [2.0f64];
    /// comm.allreduce_with(&mut buf, |acc, next| *acc = *acc * 10.0 + *next)?;
    /// assert_eq!(buf, [2.0]);
    /// # Ok::<(), switchyard::collective::CollectiveError>(())
    /// ```
    pub fn allreduce_with<T: Element>(
        &mut self,
        buf: &mut [T],
        reducer: impl Fn(&mut T, &T),
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        let (len, width, me) = (buf.len(), size_of::<T>(), self.rank);
        let combine = |acc: &mut Vec<u8>, next: &[u8], from: usize| {
            if next.len() % width != 0 {
                return Err(CollectiveError::Malformed {
                    call,
                    rank: from,
                    reason: format!("{} bytes, not whole elements of {width}", next.len()),
                });
            }
            if next.len() != acc.len() {
                let (ours, theirs) = (len as u64, (next.len() / width) as u64);
                let sig = Signature::user(Elem::Sized(width));
                return Err(CollectiveError::SizeMismatch {
                    call,
                    rank: from,
                    me,
                    ours,
                    theirs,
                    our_call: sig.text(ours),
                    their_call: sig.text(theirs),
                });
            }
            // In place where the bytes are aligned for `T`, through a copy otherwise.
            let copy = |bytes: &[u8]| {
                payload::frame_to_vec::<T>(bytes).map_err(|e| CollectiveError::Malformed {
                    call,
                    rank: from,
                    reason: e.to_string(),
                })
            };
            let theirs: Cow<'_, [T]> = match bytemuck::try_cast_slice(next) {
                Ok(slice) => Cow::Borrowed(slice),
                Err(_) => Cow::Owned(copy(next)?),
            };
            let fold = |ours: &mut [T]| {
                for (a, b) in ours.iter_mut().zip(theirs.iter()) {
                    reducer(a, b);
                }
            };
            match bytemuck::try_cast_slice_mut::<u8, T>(acc) {
                Ok(ours) => fold(ours),
                Err(_) => {
                    let mut ours = copy(acc)?;
                    fold(&mut ours);
                    acc.copy_from_slice(bytemuck::cast_slice(&ours));
                }
            }
            Ok(())
        };
        let mut bytes = bytemuck::cast_slice::<T, u8>(buf).to_vec();
        self.run(Collective::Fold {
            buf: &mut bytes,
            count: len as u64,
            elem: Elem::Sized(width),
            combine: &combine,
        })?;
        let out: &mut [u8] = bytemuck::cast_slice_mut(buf);
        if bytes.len() != out.len() {
            return Err(CollectiveError::Malformed {
                call,
                rank: 0,
                reason: format!("a result of {} bytes for {}", bytes.len(), out.len()),
            });
        }
        out.copy_from_slice(&bytes);
        Ok(())
    }

    /// Allreduce of structured values with a user function, like rabit's
    /// `SerializeReducer`: every rank passes the same number of values; afterwards
    /// `values[i]` is the rank-ordered combination `reducer(acc, next)` of every
    /// rank's `values[i]`. Values travel serde + bincode encoded.
    pub fn allreduce_serde<T: Serialize + DeserializeOwned>(
        &mut self,
        values: &mut [T],
        reducer: impl Fn(&mut T, &T),
    ) -> Result<(), CollectiveError> {
        let call = Call::Allreduce;
        let limit = self.options.socket.limits.max_frame_bytes;
        let (len, me) = (values.len(), self.rank);
        // Values are combined decoded; the engine moves them encoded.
        let mine =
            payload::frame_from_value(&*values).map_err(|e| CollectiveError::InvalidArgument {
                call,
                reason: format!("cannot encode the values: {e}"),
            })?;
        let combine = |acc: &mut Vec<u8>, next: &[u8], _from: usize| {
            let failed = |reason: String| CollectiveError::Malformed {
                call,
                rank: me,
                reason,
            };
            let mut ours =
                payload::frame_to_value::<Vec<T>>(acc, limit).map_err(|e| failed(e.to_string()))?;
            let theirs = payload::frame_to_value::<Vec<T>>(next, limit)
                .map_err(|e| failed(e.to_string()))?;
            if ours.len() != theirs.len() {
                return Err(failed(format!(
                    "{} values against {}",
                    ours.len(),
                    theirs.len()
                )));
            }
            for (x, y) in ours.iter_mut().zip(&theirs) {
                reducer(x, y);
            }
            *acc = payload::frame_from_value(&ours)
                .map_err(|e| failed(e.to_string()))?
                .to_vec();
            Ok(())
        };
        let mut bytes = mine.to_vec();
        self.run(Collective::Fold {
            buf: &mut bytes,
            count: len as u64,
            elem: Elem::Bytes,
            combine: &combine,
        })?;
        let result: Vec<T> =
            payload::frame_to_value(&bytes, limit).map_err(|e| CollectiveError::Malformed {
                call,
                rank: 0,
                reason: e.to_string(),
            })?;
        if result.len() != len {
            let (ours, theirs) = (len as u64, result.len() as u64);
            let sig = Signature::user(Elem::Bytes);
            return Err(CollectiveError::SizeMismatch {
                call,
                rank: 0,
                me,
                ours,
                theirs,
                our_call: sig.text(ours),
                their_call: sig.text(theirs),
            });
        }
        for (slot, value) in values.iter_mut().zip(result) {
            *slot = value;
        }
        Ok(())
    }

    /// Replaces `value` on every rank with rank `root`'s (serde + bincode encoded).
    pub fn broadcast_value<T: Serialize + DeserializeOwned>(
        &mut self,
        value: &mut T,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.check_root(Call::Broadcast, root)?;
        let mut bytes = if self.rank == root {
            payload::frame_from_value(&*value)
                .map_err(|e| CollectiveError::InvalidArgument {
                    call: Call::Broadcast,
                    reason: format!("cannot encode the value: {e}"),
                })?
                .to_vec()
        } else {
            Vec::new()
        };
        self.broadcast_bytes(&mut bytes, root)?;
        if self.rank != root {
            *value = payload::frame_to_value(&bytes, self.options.socket.limits.max_frame_bytes)
                .map_err(|e| CollectiveError::Malformed {
                    call: Call::Broadcast,
                    rank: root,
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }
}
