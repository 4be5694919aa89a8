//! Where the calling thread runs, and moving it off a processor it shares with a peer.

use std::mem;

/// Moves the calling thread to another processor of those it may run on, and says
/// whether it moved.
///
/// Two ranks of one host that the scheduler put on one core hand that core back and
/// forth on every call (a few microseconds each time), while a core of their own each
/// would let both run at once. The scheduler puts them together when one wakes the
/// other, and leaves them there while each keeps the core busy. This narrows the
/// thread's affinity to every processor it may use but the current one, which makes
/// the kernel move it before the call returns, then puts the affinity back as it was:
/// the program's choice of processors stands, and the thread stays where it went
/// until the scheduler moves it again.
///
/// False, and nothing changed, when the thread may run on one processor only (a
/// program or launcher pinned it), or when the kernel does not say where it runs.
pub(crate) fn step_aside() -> bool {
    // SAFETY: `sched_getcpu` takes no arguments.
    let Ok(here) = usize::try_from(unsafe { libc::sched_getcpu() }) else {
        return false;
    };
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut allowed: libc::cpu_set_t = unsafe { mem::zeroed() };
    let size = mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a valid cpu_set_t of `size` bytes for the call to fill.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return false;
    }
    // SAFETY: the set was filled above; `here` is checked against its size.
    if here >= libc::CPU_SETSIZE as usize
        || !unsafe { libc::CPU_ISSET(here, &allowed) }
        || unsafe { libc::CPU_COUNT(&allowed) } < 2
    {
        return false;
    }
    let mut elsewhere = allowed;
    // SAFETY: `here` is below CPU_SETSIZE.
    unsafe { libc::CPU_CLR(here, &mut elsewhere) };
    // SAFETY: both sets are valid cpu_set_t of `size` bytes; 0 is the calling thread.
    unsafe {
        if libc::sched_setaffinity(0, size, &elsewhere) != 0 {
            return false;
        }
        let moved = libc::sched_getcpu() != here as libc::c_int;
        libc::sched_setaffinity(0, size, &allowed);
        moved
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn allowed() -> libc::cpu_set_t {
        // SAFETY: as in `step_aside`.
        unsafe {
            let mut set: libc::cpu_set_t = mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            set
        }
    }

    fn pin_to(cpus: &[usize]) {
        // SAFETY: as in `step_aside`.
        unsafe {
            let mut set: libc::cpu_set_t = mem::zeroed();
            for &cpu in cpus {
                libc::CPU_SET(cpu, &mut set);
            }
            assert_eq!(
                libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
    }

    fn cpus_of(set: &libc::cpu_set_t) -> Vec<usize> {
        // SAFETY: reading a valid set below its size.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, set) })
            .collect()
    }

    #[test]
    fn a_thread_with_two_processors_moves_to_the_other_and_keeps_both() {
        // A thread of its own, so that the test's pinning stays with it.
        std::thread::spawn(|| {
            let mine = cpus_of(&allowed());
            if mine.len() < 2 {
                eprintln!("skipped: one processor only");
                return;
            }
            let pair = [mine[0], mine[1]];
            pin_to(&pair);
            // SAFETY: no arguments.
            let before = unsafe { libc::sched_getcpu() } as usize;
            assert!(step_aside());
            let after = unsafe { libc::sched_getcpu() } as usize;
            assert_ne!(before, after);
            assert!(pair.contains(&after));
            assert_eq!(cpus_of(&allowed()), pair, "the affinity is put back");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_pinned_to_one_processor_stays() {
        std::thread::spawn(|| {
            let mine = cpus_of(&allowed());
            pin_to(&mine[..1]);
            assert!(!step_aside());
            assert_eq!(cpus_of(&allowed()), &mine[..1]);
        })
        .join()
        .unwrap();
    }
}
