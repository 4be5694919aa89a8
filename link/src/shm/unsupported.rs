//! Where shared memory is not built (not Linux): no pipe can exist, and the hand-over
//! gives none, so every pair keeps its TCP connection.

use crate::LinkError;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::time::Instant;

/// No value of this type exists here.
#[derive(Debug)]
pub(crate) enum ShmPipe {}

impl ShmPipe {
    pub(crate) fn write_vectored(&mut self, _: &[IoSlice<'_>]) -> io::Result<usize> {
        match *self {}
    }

    pub(crate) fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        match *self {}
    }

    pub(crate) fn fd(&self) -> RawFd {
        match *self {}
    }

    pub(crate) fn prepare_sleep(&mut self, _: bool) -> bool {
        match *self {}
    }

    pub(crate) fn end_sleep(&mut self) {
        match *self {}
    }

    pub(crate) fn wake(&self) {
        match *self {}
    }
}

/// No pipes: every entry `None`.
pub(crate) fn hand_over(
    _rank: usize,
    streams: &[Option<TcpStream>],
    _addrs: &[String],
    _same_host: &[bool],
    _deadline: Instant,
) -> Result<Vec<Option<ShmPipe>>, LinkError> {
    Ok(streams.iter().map(|_| None).collect())
}

/// No board either.
#[derive(Debug)]
pub(crate) enum Board {}

/// A slot's content (never made here).
pub(crate) struct Entry<'a> {
    pub(crate) seq: u64,
    pub(crate) meta: &'a [u8],
    pub(crate) data: &'a [u8],
}

impl Board {
    pub(crate) fn slot_bytes(&self) -> usize {
        match *self {}
    }

    pub(crate) fn publish(&mut self, _: u64, _: &[u8], _: &[&[u8]], _: impl FnMut(usize)) {
        match *self {}
    }

    pub(crate) fn ahead(&self, _: usize) -> Result<Option<Entry<'_>>, std::convert::Infallible> {
        match *self {}
    }

    pub(crate) fn entry(&self, _: usize) -> Result<Option<Entry<'_>>, std::convert::Infallible> {
        match *self {}
    }

    pub(crate) fn set_sleeping(&self, _: bool) {
        match *self {}
    }

    pub(crate) fn published_last(&self, _: usize) -> bool {
        match *self {}
    }

    pub(crate) fn shares_processor_with(&self, _: Option<usize>) -> bool {
        match *self {}
    }
}

/// No board: `None`.
pub(crate) fn share_board(
    _rank: usize,
    _pipes: &[Option<ShmPipe>],
    _addrs: &[String],
    _deadline: Instant,
) -> Result<Option<Board>, LinkError> {
    Ok(None)
}
