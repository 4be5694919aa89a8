//! What a collective call can report.

use std::time::Duration;
pub(crate) use switchyard_link::LinkError;

/// A collective operation, named in every error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// [`Communicator::allreduce`](super::Communicator::allreduce) and its variants.
    Allreduce,
    /// [`Communicator::broadcast`](super::Communicator::broadcast) and its variants.
    Broadcast,
    /// [`Communicator::allgather`](super::Communicator::allgather) and
    /// [`allgather_varied`](super::Communicator::allgather_varied).
    Allgather,
    /// [`Communicator::reduce_scatter`](super::Communicator::reduce_scatter).
    ReduceScatter,
    /// [`Communicator::barrier`](super::Communicator::barrier).
    Barrier,
    /// Forming the communicator: binding, connecting, exchanging endpoints.
    Setup,
    /// [`Communicator::checkpoint`](super::Communicator::checkpoint) and
    /// [`lazy_checkpoint`](super::Communicator::lazy_checkpoint).
    Checkpoint,
    /// [`Communicator::load_checkpoint`](super::Communicator::load_checkpoint).
    LoadCheckpoint,
    /// Recovery after a lost rank: rejoining, agreeing, replaying results.
    Recovery,
}

impl Call {
    pub(crate) fn code(self) -> u8 {
        match self {
            Call::Allreduce => 1,
            Call::Broadcast => 2,
            Call::Allgather => 3,
            Call::ReduceScatter => 4,
            Call::Barrier => 5,
            Call::Setup => 6,
            Call::Checkpoint => 7,
            Call::LoadCheckpoint => 8,
            Call::Recovery => 9,
        }
    }

    /// The call with code `code`, if there is one.
    pub(crate) fn from_code(code: u8) -> Option<Call> {
        [
            Call::Allreduce,
            Call::Broadcast,
            Call::Allgather,
            Call::ReduceScatter,
            Call::Barrier,
            Call::Setup,
            Call::Checkpoint,
            Call::LoadCheckpoint,
            Call::Recovery,
        ]
        .into_iter()
        .find(|c| c.code() == code)
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Call::Allreduce => "allreduce",
            Call::Broadcast => "broadcast",
            Call::Allgather => "allgather",
            Call::ReduceScatter => "reduce_scatter",
            Call::Barrier => "barrier",
            Call::Setup => "communicator setup",
            Call::Checkpoint => "checkpoint",
            Call::LoadCheckpoint => "load_checkpoint",
            Call::Recovery => "recovery",
        })
    }
}

/// Why a collective call failed. Every variant names the call and, where one is to
/// blame, the peer rank.
///
/// After an error the communicator's peers may be in the middle of the same call,
/// or past it: the communicator refuses every later call with
/// [`Poisoned`](CollectiveError::Poisoned) (as Gloo's and NCCL's do), except after
/// an argument refused before any traffic
/// ([`InvalidArgument`](CollectiveError::InvalidArgument) from the call's own
/// checks), [`NotRobust`](CollectiveError::NotRobust), in robust mode a failed
/// `prepare` on this rank, and on the MPI engine the failures every rank reaches
/// together before any data moves (a mismatch found by the argument check, a
/// failed `prepare`). See the
/// [`Communicator`](super::Communicator)'s "After a failed call".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A peer passed a buffer of another length. Prints both calls in words:
    /// "allreduce: rank 1 called allreduce(Sum, f32 x 131072), this rank (rank 0)
    /// allreduce(Sum, f32 x 131071)".
    #[error("{call}: rank {rank} called {their_call}, this rank (rank {me}) {our_call}")]
    SizeMismatch {
        /// The call.
        call: Call,
        /// The peer whose length differs.
        rank: usize,
        /// This rank.
        me: usize,
        /// This rank's element count.
        ours: u64,
        /// The peer's element count.
        theirs: u64,
        /// This rank's call in words, e.g. `allreduce(Sum, f32 x 131071)`.
        our_call: String,
        /// The peer's call in words.
        their_call: String,
    },
    /// A peer called another collective, operation, element type or root (or, with
    /// everything else alike, ran it another way: another algorithm because its
    /// tuning differs, or checked mode on one rank only). Prints both calls in words:
    /// "allreduce: rank 3 called allreduce(Max, f32 x 4), this rank allreduce(Sum,
    /// f32 x 4)".
    #[error("{call}: rank {rank} called {theirs}, this rank {ours}")]
    CallMismatch {
        /// The call this rank made.
        call: Call,
        /// The peer.
        rank: usize,
        /// This rank's call in words, e.g. `broadcast(4-byte x 1000, root 0)`.
        ours: String,
        /// The peer's call.
        theirs: String,
    },
    /// The peer this rank waited for sent nothing, not one byte, for the silence
    /// timeout ([`CommOptions::timeout`](super::CommOptions::timeout)).
    #[error("{call}: waited {waited:.2?} for rank {rank}{during}, no byte arrived")]
    PeerTimeout {
        /// The call.
        call: Call,
        /// The peer waited for.
        rank: usize,
        /// How long the peer had been silent: at least the timeout.
        waited: Duration,
        /// Where in the call, e.g. " (ring step 4)"; may be empty.
        during: String,
    },
    /// The call ran past its deadline
    /// ([`CommOptions::deadline`](super::CommOptions::deadline)), busy or not.
    #[error(
        "{call}: the call's deadline of {limit:.2?} passed while waiting for rank {rank}{during}"
    )]
    DeadlineExceeded {
        /// The call.
        call: Call,
        /// The deadline, counted from the start of the call.
        limit: Duration,
        /// The peer waited for when it passed.
        rank: usize,
        /// Where in the call, e.g. " (ring step 4)"; may be empty.
        during: String,
    },
    /// A peer's connection is gone (its process died or closed the communicator).
    #[error("{call}: lost rank {rank} at {endpoint}: {reason}")]
    PeerLost {
        /// The call.
        call: Call,
        /// The peer.
        rank: usize,
        /// Where the peer was reached.
        endpoint: String,
        /// What the transport said.
        reason: String,
    },
    /// A peer gave up on the call and told everyone why.
    #[error("{call}: rank {rank} aborted the call: {reason}")]
    Aborted {
        /// The call.
        call: Call,
        /// The rank that gave up.
        rank: usize,
        /// Its reason.
        reason: String,
    },
    /// A message from a peer made no sense (wrong layout, wrong offset, bad payload).
    #[error("{call}: malformed message from rank {rank}: {reason}")]
    Malformed {
        /// The call.
        call: Call,
        /// The sender.
        rank: usize,
        /// What was wrong.
        reason: String,
    },
    /// Forming the communicator failed at `stage`, for the reason in `source`: the
    /// tracker or the launcher's rendezvous could not be reached, the endpoint
    /// exchange broke off, the environment is malformed. Reads as one sentence,
    /// "joining the tracker at 10.0.0.1:9091: cannot connect to the tracker ...", and
    /// [`source`](std::error::Error::source) walks down to the first cause, so that a
    /// caller can tell a dead tracker (an I/O error underneath) from a bad argument
    /// ([`InvalidArgument`](CollectiveError::InvalidArgument)).
    #[error("{stage}: {source}")]
    Setup {
        /// What was being done, e.g. "joining the tracker at 10.0.0.1:9091".
        stage: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The arguments cannot work on any rank (an operation the type lacks, a root
    /// outside the world, an output buffer of the wrong length, a rank outside the
    /// world at setup).
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call.
        call: Call,
        /// What was wrong.
        reason: String,
    },
    /// Recovery needed the result of call `seq` of checkpoint version `version`, and
    /// every rank that kept it (`keepers`, [`RobustOptions::global_replica`] of
    /// them) is gone.
    ///
    /// [`RobustOptions::global_replica`]: crate::collective::RobustOptions::global_replica
    #[error(
        "recovery: the result of call {seq} after checkpoint {version} is lost: every rank that kept it ({keepers:?}) is gone"
    )]
    ResultLost {
        /// The checkpoint version the call followed.
        version: u64,
        /// The call's number since that checkpoint (from 0).
        seq: u64,
        /// The ranks that kept the result.
        keepers: Vec<usize>,
    },
    /// A restarted rank needed rank `rank`'s local model, and the ranks that held a
    /// copy (`replicas_tried`: the rank itself and its
    /// [`RobustOptions::local_replica`] ring successors) are all gone.
    ///
    /// [`RobustOptions::local_replica`]: crate::collective::RobustOptions::local_replica
    #[error(
        "recovery: rank {rank}'s local model is lost: every rank that held a copy ({replicas_tried:?}) is gone"
    )]
    LocalModelLost {
        /// Whose local model.
        rank: usize,
        /// The ranks that held a copy.
        replicas_tried: Vec<usize>,
    },
    /// Keeping the results of the calls since the last checkpoint would pass
    /// [`RobustOptions::result_budget`](crate::collective::RobustOptions::result_budget).
    #[error(
        "{call}: keeping this call's result ({needed} bytes, {kept} kept since checkpoint {version}) would pass the result budget of {budget} bytes: checkpoint more often or raise RobustOptions::result_budget"
    )]
    ResultBudget {
        /// The call.
        call: Call,
        /// Bytes kept already.
        kept: usize,
        /// Bytes this result needs.
        needed: usize,
        /// The budget.
        budget: usize,
        /// The checkpoint version the calls follow.
        version: u64,
    },
    /// During recovery the ranks found that they are not making the same calls
    /// (the program differs between ranks, or a restarted rank did not start from
    /// [`load_checkpoint`](super::Communicator::load_checkpoint)).
    #[error("{call}: ranks disagree: {reason}")]
    Disagree {
        /// The call.
        call: Call,
        /// Which ranks, and what each is doing.
        reason: String,
    },
    /// Checkpoints need a communicator in robust mode
    /// ([`CommOptions::with_robust`](super::CommOptions::with_robust)).
    #[error("{call}: this communicator is not in robust mode ({engine} engine)")]
    NotRobust {
        /// The call.
        call: Call,
        /// The engine it runs on.
        engine: &'static str,
    },
    /// The communicator's [`Interrupt`](super::Interrupt) was raised while the call
    /// waited (Ctrl-C in the Python module); the other ranks were told.
    #[error("{call}: interrupted on rank {rank}")]
    Interrupted {
        /// The call.
        call: Call,
        /// This rank.
        rank: usize,
    },
    /// The `prepare` closure of a lazy call
    /// ([`Communicator::try_allreduce_lazy`](super::Communicator::try_allreduce_lazy))
    /// failed on this rank: the call did not run here, and the other ranks were told
    /// (theirs fail with `Aborted` naming this rank and "prepare failed"). Like any
    /// failed call it makes the communicator unusable
    /// ([`Poisoned`](CollectiveError::Poisoned)), except in robust mode, whose
    /// agreement brings the ranks back into step, and on the MPI engine, where every
    /// rank learns of the failure before any runs the call.
    #[error("{call}: prepare failed on rank {rank}: {reason}")]
    PrepareFailed {
        /// The call.
        call: Call,
        /// This rank.
        rank: usize,
        /// The closure's error, in words.
        reason: String,
    },
    /// An earlier call on this communicator failed on this rank, so this one was
    /// refused before it touched any peer: after a failed call the ranks may be in
    /// different calls (a peer one call ahead or behind, a message or host board
    /// part of the failed call still on its way), and a later call could otherwise
    /// take another call's data for its own. `first` is that first failure, in
    /// words. The communicator stays unusable: make a new one (on every rank) to go
    /// on. See the [`Communicator`](super::Communicator)'s "After a failed call".
    #[error(
        "{call}: this communicator is unusable after an earlier call failed ({first}); make a new communicator"
    )]
    Poisoned {
        /// The call refused.
        call: Call,
        /// The first failure on this communicator, in words.
        first: String,
    },
    /// The transport or MPI failed.
    #[error("{call}: transport error with rank {rank}: {reason}")]
    Transport {
        /// The call.
        call: Call,
        /// The peer involved.
        rank: usize,
        /// What failed.
        reason: String,
    },
}

impl CollectiveError {
    /// A [`Setup`](CollectiveError::Setup) failure: `source` (an error, or a reason in
    /// words) while doing `stage`.
    pub(crate) fn setup(
        stage: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> CollectiveError {
        CollectiveError::Setup {
            stage: stage.into(),
            source: source.into(),
        }
    }
}

/// A [`LinkError`] as it happened during a call.
pub(crate) trait During {
    /// This error as it happened during `call`: the same words after the call's name.
    fn during(self, call: Call) -> CollectiveError;
}

impl During for LinkError {
    fn during(self, call: Call) -> CollectiveError {
        match self {
            LinkError::Timeout { rank, waited } => CollectiveError::PeerTimeout {
                call,
                rank,
                waited,
                during: String::new(),
            },
            LinkError::Lost {
                rank,
                endpoint,
                reason,
            } => CollectiveError::PeerLost {
                call,
                rank,
                endpoint,
                reason,
            },
            LinkError::Aborted { rank, reason } => CollectiveError::Aborted { call, rank, reason },
            LinkError::Transport { rank, reason } => {
                CollectiveError::Transport { call, rank, reason }
            }
            LinkError::Interrupted { rank } => CollectiveError::Interrupted { call, rank },
            LinkError::Refused { rank, first } => CollectiveError::Malformed {
                call,
                rank,
                reason: format!("a message of another call ({} bytes of meta)", first.len()),
            },
            // A failure the link layer learnt to tell apart after this engine was
            // written: a transport error, in the link's words.
            other => CollectiveError::Transport {
                call,
                rank: other.rank(),
                reason: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link's error reads as the collective error it becomes, less the call: the
    /// link's set-up writes its errors' reasons itself (its notices to the peers).
    #[test]
    fn a_link_error_reads_as_its_collective_error_after_the_call() {
        let errors = [
            LinkError::Timeout {
                rank: 1,
                waited: Duration::from_millis(1500),
            },
            LinkError::Lost {
                rank: 2,
                endpoint: "tcp://10.0.0.2:7000".into(),
                reason: "connection reset".into(),
            },
            LinkError::Aborted {
                rank: 3,
                reason: "rank 3: mismatch".into(),
            },
            LinkError::Interrupted { rank: 0 },
            LinkError::Transport {
                rank: 4,
                reason: "no route".into(),
            },
            LinkError::Refused {
                rank: 5,
                first: bytes::Bytes::from_static(b"meta"),
            },
        ];
        for e in errors {
            for call in [Call::Setup, Call::Allreduce] {
                assert_eq!(e.clone().during(call).to_string(), format!("{call}: {e}"));
            }
        }
    }
}
