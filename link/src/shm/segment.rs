//! The memory two ranks on one host share: an anonymous file (`memfd_create`) mapped
//! by both, holding one ring each way, and the passing of its descriptor over a Unix
//! socket (`SCM_RIGHTS`).
//!
//! Why a memfd: it has no name in any file system, so nothing is left in `/dev/shm` or
//! `/tmp` whatever happens to the ranks; the kernel frees it when the last descriptor
//! and mapping go, which a SIGKILL of both ranks does too.
//!
//! Layout: a 4 KiB header page (magic, ring size, then the two rings' control blocks),
//! then the data of ring 0 (written by the rank that created the segment), then the
//! data of ring 1 (written by the other rank).

use super::ring::{CONTROL_BYTES, RingMemory};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The first bytes of a segment: what the rank that maps one it was handed checks.
const MAGIC: u64 = u64::from_le_bytes(*b"SYSHM001");
/// Bytes before the rings' data.
const HEADER_BYTES: usize = 4096;
/// Where the control blocks begin in the header.
const CONTROLS_AT: usize = 64;

/// Bytes of data in each ring of a segment made by [`Segment::create`]. Measured with
/// `switchyard bench allreduce` at n = 2 and 4: 256 KiB to 4 MiB gave the same large
/// message bandwidth within the noise; smaller rings put more wake-ups into a large
/// message. Two of these per pair of ranks on a host.
pub(crate) const RING_BYTES: usize = 1 << 20;

/// The largest ring a handed-over segment may have: a peer cannot make this process
/// map more than a few MiB per pair.
const MAX_RING_BYTES: usize = 4 * RING_BYTES;

/// The seals every segment carries: its size can change no more, nor its seals.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A mapped segment. Unmapped when dropped; the memory lives on while the peer maps it.
pub(super) struct Segment {
    base: *mut u8,
    len: usize,
    ring_bytes: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the rings made from it are
// used by one thread at a time (each end is owned by one `ShmPipe`).
unsafe impl Send for Segment {}

impl Segment {
    /// Creates and maps a segment with two rings of `ring_bytes` (a power of two) each.
    /// Returns it with its descriptor, to be handed to the peer.
    pub(super) fn create(ring_bytes: usize) -> io::Result<(Segment, OwnedFd)> {
        if !ring_bytes.is_power_of_two() || ring_bytes < 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("ring size {ring_bytes} is not a power of two of at least 64"),
            ));
        }
        let len = HEADER_BYTES + 2 * ring_bytes;
        let fd = sealed_memfd(c"switchyard-shm", len)?;
        let segment = Segment::map_fd(fd.as_raw_fd(), len, ring_bytes)?;
        // A fresh memfd reads as zeros: both rings start empty, nobody asleep.
        // SAFETY: the header is inside the mapping, 8-aligned (page-aligned base).
        unsafe {
            segment.base.cast::<u64>().write(MAGIC);
            segment.base.cast::<u64>().add(1).write(ring_bytes as u64);
        }
        Ok((segment, fd))
    }

    /// Maps a segment a peer created and handed over as `fd`, checking its size and
    /// header.
    pub(super) fn open(fd: OwnedFd) -> io::Result<Segment> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let len = sealed_len(&fd)?;
        if len < HEADER_BYTES + 2 * 64 {
            return Err(bad(format!("segment of {len} bytes is too small")));
        }
        let ring_bytes = (len - HEADER_BYTES) / 2;
        if !ring_bytes.is_power_of_two()
            || HEADER_BYTES + 2 * ring_bytes != len
            || ring_bytes > MAX_RING_BYTES
        {
            return Err(bad(format!(
                "segment of {len} bytes has no valid ring size"
            )));
        }
        let segment = Segment::map_fd(fd.as_raw_fd(), len, ring_bytes)?;
        // SAFETY: inside the mapping, 8-aligned.
        let (magic, size) = unsafe {
            (
                segment.base.cast::<u64>().read_volatile(),
                segment.base.cast::<u64>().add(1).read_volatile(),
            )
        };
        if magic != MAGIC || size != ring_bytes as u64 {
            return Err(bad(format!(
                "segment header {magic:#x}/{size} is not a switchyard ring pair of {ring_bytes} bytes"
            )));
        }
        Ok(segment)
    }

    fn map_fd(fd: RawFd, len: usize, ring_bytes: usize) -> io::Result<Segment> {
        Ok(Segment {
            base: map_shared(fd, len)?,
            len,
            ring_bytes,
        })
    }

    /// Ring `index` (0: written by the creator, 1: written by the other rank).
    pub(super) fn ring(&self, index: usize) -> RingMemory {
        assert!(index < 2, "a segment has two rings");
        // SAFETY: the control blocks lie in the header (64 + 2 * CONTROL_BYTES <=
        // 4096), the data areas after it, all inside the mapping, which outlives the
        // ends (`ShmPipe` drops them with the segment). Each ring is used by one
        // writer and one reader, one in each rank.
        unsafe {
            let control = self.base.add(CONTROLS_AT + index * CONTROL_BYTES);
            let data = self.base.add(HEADER_BYTES + index * self.ring_bytes);
            RingMemory::new(control, data, self.ring_bytes)
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_fd`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// A new anonymous file of `len` zero bytes, sealed at that size (`SEALS`) before
/// anyone else can hold it: a peer that shrank the file would make this process die
/// of SIGBUS at its next touch of the memory.
pub(super) fn sealed_memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: the name is a valid C string; the flags are valid.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a valid descriptor and a length that fits an off_t.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a valid descriptor and valid seal flags.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The size of a file a peer handed over, which must be sealed at that size
/// (`SEALS`): otherwise its sender could shrink it under this process's mapping.
pub(super) fn sealed_len(fd: &OwnedFd) -> io::Result<usize> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    // SAFETY: `stat` is plain data that fstat fills.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a valid descriptor.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err(bad(format!(
            "segment not sealed at its size (seals {seals:#x})"
        )));
    }
    usize::try_from(stat.st_size).map_err(|_| bad("negative size".into()))
}

/// Maps `len` bytes of `fd` shared, read and write. The caller unmaps them.
pub(super) fn map_shared(fd: RawFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh shared mapping of a descriptor the caller holds; the kernel
    // picks the address.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base.cast::<u8>())
}

const _: () = assert!(CONTROLS_AT + 2 * CONTROL_BYTES <= HEADER_BYTES);

/// A zeroed buffer of at least `bytes` bytes for control messages, aligned as their
/// headers must be (`cmsghdr` holds a `usize`).
fn cmsg_buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// A message header over one data buffer (`iov`) and `space` bytes of `control`.
/// Both must outlive every use of the header.
fn message_header(iov: &mut libc::iovec, control: &mut [u64], space: usize) -> libc::msghdr {
    debug_assert!(control.len() * 8 >= space);
    // SAFETY: msghdr is plain data; the pointers set below are the caller's to keep
    // valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    msg
}

/// Sends `data` with the descriptor `fd` attached over `socket`.
pub(super) fn send_fd(socket: &UnixStream, data: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = cmsg_buffer(space);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let msg = message_header(&mut iov, &mut control, space);
    // SAFETY: the control buffer holds one CMSG_SPACE for one descriptor, so the first
    // header and its data fit.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        libc::CMSG_DATA(header).cast::<RawFd>().write_unaligned(raw);
    }
    // SAFETY: a valid socket and message.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != data.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from `socket` and the descriptor attached to them,
/// if any. Descriptors beyond the first are closed.
pub(super) fn recv_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    // Room for a few descriptors, so that a peer sending more does not truncate the
    // message into a lost descriptor (each one we get, we close or keep).
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(4 * std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = cmsg_buffer(space);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut msg = message_header(&mut iov, &mut control, space);
    // SAFETY: a valid socket and message; CLOEXEC so the descriptor is not inherited
    // by a child the program starts.
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`, with the
    // length it set; each SCM_RIGHTS payload is an array of descriptors now owned here.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    received.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok((got as usize, received.into_iter().next()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::IoSlice;
    use std::os::fd::AsFd;

    /// A segment handed over a socket pair maps the same memory on the other side:
    /// what one end writes into a ring the other reads.
    #[test]
    fn a_handed_over_segment_shares_its_rings() {
        let (mut a_sock, b_sock) = UnixStream::pair().unwrap();
        let (mine, fd) = Segment::create(4096).unwrap();
        send_fd(&a_sock, b"hello", fd.as_fd()).unwrap();
        drop(fd);
        let mut buf = [0u8; 16];
        let (n, theirs) = recv_fd(&b_sock, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let theirs = Segment::open(theirs.expect("a descriptor")).unwrap();
        let mut writer = mine.ring(0).writer();
        let mut reader = theirs.ring(0).reader();
        writer.write(&[IoSlice::new(b"across")]).unwrap();
        let (n, _) = reader.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"across");
        // A message without a descriptor carries none.
        use std::io::Write;
        a_sock.write_all(b"plain").unwrap();
        let (n, none) = recv_fd(&b_sock, &mut buf).unwrap();
        assert_eq!((&buf[..n], none.is_none()), (&b"plain"[..], true));
    }

    /// Any other file handed over is refused with a reason, not mapped as rings: an
    /// unsealed memfd (its sender could shrink it under our mapping), and a sealed
    /// one without the header.
    #[test]
    fn a_descriptor_that_is_not_a_segment_is_refused() {
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(Segment::open(OwnedFd::from(file)).is_err());
        let memfd = |seal: bool| {
            // SAFETY: a valid name and flags.
            let fd = unsafe {
                libc::memfd_create(
                    c"stranger".as_ptr(),
                    libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
                )
            };
            // SAFETY: fresh descriptor.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: valid descriptor.
            assert_eq!(
                unsafe { libc::ftruncate(fd.as_raw_fd(), 4096 + 2 * 4096) },
                0
            );
            if seal {
                // SAFETY: valid descriptor and seals.
                assert_eq!(
                    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) },
                    0
                );
            }
            fd
        };
        let err = Segment::open(memfd(false)).err().expect("unsealed");
        assert!(err.to_string().contains("not sealed"), "{err}");
        let err = Segment::open(memfd(true))
            .err()
            .expect("zeros are not a header");
        assert!(
            err.to_string().contains("not a switchyard ring pair"),
            "{err}"
        );
        assert!(Segment::create(1000).is_err());
        // A segment of ours is sealed: it can be neither shrunk nor grown.
        let (_, fd) = Segment::create(4096).unwrap();
        // SAFETY: valid descriptor.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
    }
}
