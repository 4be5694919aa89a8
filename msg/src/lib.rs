//! The switchyard message: who sends it, who gets it, what it is about, and its payload.
//!
//! A [`Msg`] is a [`Header`] plus zero or more payload frames. Frames are
//! [`bytes::Bytes`], so adding, cloning and forwarding a frame never copies its data.
//! On the wire, frame 0 is the encoded header and frames 1.. are the payloads as they
//! are; `msg/WIRE.md` describes the layout byte by byte.
//!
//! # Examples
//!
//! Build a parameter update, put it on the wire and read it back:
//!
//! ```
//! use switchyard_msg::{payload, Addr, Kind, Limits, Msg, Target};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Addr::worker(0, 3);
//! let server = Addr::server(0, 1);
//! let grad = vec![0.5f32, -1.0, 2.0];
//! let msg = Msg::new(worker, server, Kind::Update)
//!     .with_target(Target::Param(7))
//!     .with_seq(42)
//!     .with_frame(payload::frame_from_vec(grad.clone()));
//!
//! let wire = msg.to_wire();
//! assert_eq!(wire.len(), 2); // header + one payload frame
//!
//! let back = Msg::from_wire(wire, &Limits::default())?;
//! assert_eq!(back, msg);
//! assert_eq!(payload::frame_to_vec::<f32>(&back.frames()[0])?, grad);
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]

mod addr;
mod codec;
pub mod copy;
mod error;
pub mod fast_hash;
mod header;
mod limits;
mod message;
pub mod payload;

pub use addr::{Addr, Role};
pub use codec::{MAGIC, WIRE_PREFIX_LEN, WIRE_VERSION, decode_header, encode_header};
pub use error::{DecodeError, PayloadError};
pub use header::{Header, Kind, Target};
pub use limits::Limits;
pub use message::Msg;
