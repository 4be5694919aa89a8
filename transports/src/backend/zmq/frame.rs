//! Moving frames between [`Bytes`] and libzmq without copying large payloads.
//!
//! libzmq copies whatever `zmq_send` is given. For frames of [`ZERO_COPY_MIN`] bytes
//! and more we instead hand libzmq a message whose data points into the `Bytes` and
//! whose free callback drops it, so the payload is never copied on our side. Smaller
//! frames are copied: that is cheaper than the allocation the callback needs, and
//! libzmq stores frames up to 33 bytes inline anyway.

use bytes::Bytes;
use std::os::raw::c_void;

/// Frames at least this long are sent without copying.
pub(crate) const ZERO_COPY_MIN: usize = 8 * 1024;

unsafe extern "C" fn drop_boxed_bytes(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the pointer `send_frame` made with `Box::into_raw` below, and
    // libzmq calls this exactly once per message, when it releases the data.
    drop(unsafe { Box::from_raw(hint.cast::<Bytes>()) });
}

/// Sends one frame; `flags` are libzmq's (`SNDMORE`, `DONTWAIT`).
pub(crate) fn send_frame(socket: &mut zmq::Socket, frame: &Bytes, flags: i32) -> zmq::Result<()> {
    if frame.len() < ZERO_COPY_MIN {
        return socket.send(&frame[..], flags);
    }
    let owner = Box::new(frame.clone());
    let data = owner.as_ptr() as *mut c_void;
    let len = owner.len();
    let hint = Box::into_raw(owner).cast::<c_void>();
    // SAFETY: `raw` is initialised by `zmq_msg_init_data` before use. The data pointer
    // stays valid until libzmq calls `drop_boxed_bytes`, because the boxed `Bytes` it
    // points into is only freed there. On a failed send the message still owns the
    // data, and `zmq_msg_close` releases it through the same callback.
    unsafe {
        let mut raw: zmq_sys::zmq_msg_t = std::mem::zeroed();
        if zmq_sys::zmq_msg_init_data(&mut raw, data, len, Some(drop_boxed_bytes), hint) != 0 {
            let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
            drop(Box::from_raw(hint.cast::<Bytes>()));
            return Err(err);
        }
        if zmq_sys::zmq_msg_send(&mut raw, socket.as_mut_ptr(), flags) == -1 {
            let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
            zmq_sys::zmq_msg_close(&mut raw);
            return Err(err);
        }
    }
    Ok(())
}

/// A received libzmq message that a [`Bytes`] can own.
struct ZmqOwned(zmq::Message);

// SAFETY: a zmq_msg_t is plain data plus a reference count that libzmq updates
// atomically; it is not tied to the thread or socket that received it.
unsafe impl Send for ZmqOwned {}

impl AsRef<[u8]> for ZmqOwned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Turns a received message into `Bytes`, copying only small ones.
pub(crate) fn into_bytes(message: zmq::Message) -> Bytes {
    if message.len() < ZERO_COPY_MIN {
        Bytes::copy_from_slice(&message)
    } else {
        Bytes::from_owner(ZmqOwned(message))
    }
}
