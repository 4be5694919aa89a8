//! The floor every set-up path of switchyard stands on: the launcher's rendezvous, the
//! unique-id ring, the tracker's protocols and the parameter server's address choice
//! all read their peers, pick their addresses and read their variables through these
//! modules, so that a deadline, a length cap or an error's wording is decided once.
//!
//! | module | its one job |
//! |---|---|
//! | [`handshakes`] | the opening handshakes of a listener's connections, each on a thread of its own under its own deadline, at most so many at once, so that a silent stranger delays nobody |
//! | [`stream`] | reads and writes on a `TcpStream` that all share one deadline, with length caps and errors naming the field and the peer |
//! | [`route`] | the local address that routes to a host, and the host's interfaces |
//! | [`tag`] | 64 random bits that keep one job's or one mesh's traffic apart from another's |
//! | [`env`](mod@env) | environment variables through one injectable lookup; a malformed value is one error type, worded the same in every crate |

pub mod env;
pub mod handshakes;
pub mod route;
pub mod stream;
pub mod tag;
