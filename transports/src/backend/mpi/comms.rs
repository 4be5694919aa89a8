//! The communicators the sockets use, and how a data message is posted on them and
//! received from them whole: its head on the data communicator, and the frames of a
//! large one as messages of their own on the frames communicator of its direction
//! (the wire layout is in `wire`).

use super::engine::ROUTER_TAG;
use super::ffi::{self, Matched, MpiError, Request};
use super::pool;
use super::wire::{self, Decoded, Encoded, Malformed};
use bytes::Bytes;
use mpi::ffi::MPI_Comm;
use std::time::{Duration, Instant};
use switchyard_msg::Limits;

/// How long a receiver waits for the frames of a message whose head it has: the
/// sender posts them right after the head, so only a rank that died in between
/// leaves them missing.
const FRAMES_WAIT: Duration = Duration::from_secs(30);

/// How long a receiver polls for a frame without yielding its core.
const FRAME_BUSY_POLL: Duration = Duration::from_micros(50);

/// The sockets' communicators, each a duplicate of `MPI_COMM_WORLD`.
#[derive(Clone, Copy)]
pub(crate) struct Comms {
    /// Control notes and the heads of data messages (whole small messages).
    pub(crate) data: MPI_Comm,
    /// Frames to a router, tagged with the sending dealer's tag.
    to_router: MPI_Comm,
    /// Frames to a dealer, tagged with that dealer's tag.
    to_dealer: MPI_Comm,
}

// SAFETY: MPI handles; other threads than the progress thread use them only when MPI
// granted MPI_THREAD_MULTIPLE (`Engine::here` is `None` otherwise).
unsafe impl Send for Comms {}
// SAFETY: as above; MPI serialises what it must inside the calls.
unsafe impl Sync for Comms {}

impl Comms {
    /// Adds the frames' two duplicates to `data`: collective, like the `MPI_Init`
    /// before it.
    pub(crate) fn with_data(data: MPI_Comm) -> Result<Comms, MpiError> {
        Ok(Comms {
            data,
            to_router: ffi::dup_world()?,
            to_dealer: ffi::dup_world()?,
        })
    }

    /// Where the frames of a message on socket tag `tag` travel: a router's messages
    /// (tag [`ROUTER_TAG`]) carry the sending dealer's tag `dealer`; a dealer's own
    /// tag names it.
    fn frames_route(&self, tag: i32, dealer: i32) -> (MPI_Comm, i32) {
        if tag == ROUTER_TAG {
            (self.to_router, dealer)
        } else {
            (self.to_dealer, tag)
        }
    }

    /// Posts `encoded` from the socket with tag `source_tag` to `dest`'s socket
    /// `tag`: the head, then each frame of a split message. Every posted request is
    /// appended to `requests`, also when a later post fails.
    ///
    /// # Safety
    ///
    /// `encoded`'s buffers must stay alive and unmoved until every request appended
    /// to `requests` completes.
    pub(crate) unsafe fn post(
        &self,
        encoded: &Encoded,
        dest: i32,
        tag: i32,
        source_tag: i32,
        requests: &mut Vec<Request>,
    ) -> Result<(), MpiError> {
        // SAFETY: passed on to the caller.
        unsafe {
            requests.push(ffi::isend(self.data, &encoded.head, dest, tag)?);
            if encoded.frames.is_empty() {
                return Ok(());
            }
            let (comm, frames_tag) = self.frames_route(tag, source_tag);
            for frame in &encoded.frames {
                requests.push(ffi::isend(comm, frame, dest, frames_tag)?);
            }
        }
        Ok(())
    }

    /// Receives the matched message on socket tag `tag` whole into buffers of the
    /// pool: `Ok(Err(_))` for a message that is dropped as malformed.
    pub(crate) fn receive_data(
        &self,
        matched: Matched,
        tag: i32,
        limits: &Limits,
    ) -> Result<Decoded, MpiError> {
        let source = matched.source;
        let head = receive_pooled(matched)?;
        let Some((count, dealer)) = wire::frames_to_follow(&head) else {
            return Ok(wire::decode(head, limits));
        };
        if count > limits.max_frames {
            // Not received: a sender that announces more frames than any receiver
            // accepts is not one of ours; its frames, if any, stay unmatched.
            return Ok(wire::decode_split(head, Vec::new(), limits));
        }
        let (comm, frames_tag) = self.frames_route(tag, dealer);
        let mut frames = Vec::with_capacity(count);
        for i in 0..count {
            let Some(frame) = await_frame(comm, source, frames_tag)? else {
                return Ok(Err(Malformed::Layout(format!(
                    "frame {} of {count} did not arrive within {FRAMES_WAIT:?} of its head",
                    i + 1
                ))));
            };
            frames.push(frame);
        }
        Ok(wire::decode_split(head, frames, limits))
    }
}

/// Receives a matched message into a buffer of the pool.
pub(crate) fn receive_pooled(matched: Matched) -> Result<Bytes, MpiError> {
    let mut buffer = pool::take(matched.len);
    ffi::receive_into(matched, &mut buffer)?;
    Ok(pool::share(buffer))
}

/// The next frame from `source` on `tag`, once it arrives (polled, so that a sender
/// that died after its head cannot hold this thread for good).
fn await_frame(comm: MPI_Comm, source: i32, tag: i32) -> Result<Option<Bytes>, MpiError> {
    let started = Instant::now();
    loop {
        if let Some(matched) = ffi::probe(comm, Some(source), Some(tag))? {
            return receive_pooled(matched).map(Some);
        }
        let waited = started.elapsed();
        if waited > FRAMES_WAIT {
            return Ok(None);
        }
        // The frame is normally microseconds behind its head: poll without giving
        // up the core at first (a yield costs about as much).
        if waited < FRAME_BUSY_POLL {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
