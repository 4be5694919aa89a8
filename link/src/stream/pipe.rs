//! What carries one peer's bytes: a TCP connection, or shared memory for a peer on
//! this host. Both read and write as non-blocking sockets do, so the stream link's
//! framing, queues and waits are the same over either.

use crate::shm::ShmPipe;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

/// One peer's byte stream.
#[derive(Debug)]
pub(crate) enum Pipe {
    /// A non-blocking TCP connection, Nagle's delay off.
    Tcp(TcpStream),
    /// Rings in memory shared with a peer on this host.
    Shm(Box<ShmPipe>),
}

impl Pipe {
    /// How an endpoint on this pipe is written in errors: `tcp://` or `shm://`.
    pub(crate) fn scheme(&self) -> &'static str {
        match self {
            Pipe::Tcp(_) => "tcp",
            Pipe::Shm(_) => "shm",
        }
    }

    /// Writes what the pipe takes now (`WouldBlock` when nothing).
    pub(super) fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Pipe::Tcp(stream) => stream.write_vectored(slices),
            Pipe::Shm(pipe) => pipe.write_vectored(slices),
        }
    }

    /// Reads what is waiting (`WouldBlock` when nothing, `Ok(0)` at the end).
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Pipe::Tcp(stream) => stream.read(buf),
            Pipe::Shm(pipe) => pipe.read(buf),
        }
    }

    /// Before a sleep in `poll(2)`: the descriptor to wait on and the events, or
    /// `None` when there is work already (the caller must not sleep).
    pub(super) fn prepare_sleep(&mut self, waiting_to_write: bool) -> Option<(RawFd, i16)> {
        match self {
            Pipe::Tcp(stream) => {
                let write = if waiting_to_write { libc::POLLOUT } else { 0 };
                Some((stream.as_raw_fd(), libc::POLLIN | write))
            }
            Pipe::Shm(pipe) => {
                if pipe.prepare_sleep(waiting_to_write) {
                    None
                } else {
                    Some((pipe.fd(), libc::POLLIN))
                }
            }
        }
    }

    /// After the sleep (or after deciding not to sleep).
    pub(super) fn end_sleep(&mut self) {
        if let Pipe::Shm(pipe) = self {
            pipe.end_sleep();
        }
    }
}
