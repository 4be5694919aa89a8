//! How far apart two cores of this machine are right now: the round trip of one cache
//! line between two threads pinned to the first two cores this process may use.
//!
//! Why the collective suites print it: on the project's virtual machine this round
//! trip moves between about 80-200 ns and about 600 ns from one second to the next
//! (the host places the virtual CPUs anew), and every shared-memory transfer between
//! ranks, ours and MPI's alike, slows with it: a launch that meets the slow placement
//! runs its 256 KiB-4 MiB calls 2-3x slower. Printed before every launch, it tells a
//! slow launch of the machine from a slow launch of the code.

use std::sync::atomic::{AtomicU64, Ordering};

/// Round trips per probe: a few tens of milliseconds.
const TRIPS: u64 = 100_000;

/// The median cache-line round trip between the first two allowed cores, in
/// nanoseconds, over three probes; `None` where there are not two cores to pin to.
pub(crate) fn core_round_trip_ns() -> Option<f64> {
    let cores = allowed_cores();
    let (&a, &b) = (cores.first()?, cores.get(1)?);
    let mut probes: Vec<f64> = (0..3).filter_map(|_| probe(a, b)).collect();
    if probes.is_empty() {
        return None;
    }
    probes.sort_by(f64::total_cmp);
    Some(probes[probes.len() / 2])
}

/// One probe: a thread on core `a` and one on core `b` pass a counter back and forth.
fn probe(a: usize, b: usize) -> Option<f64> {
    #[repr(align(64))]
    struct Line(AtomicU64);
    let (ping, pong) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    std::thread::scope(|scope| {
        let echo = scope.spawn(|| {
            if !pin(b) {
                return false;
            }
            for i in 1..=TRIPS {
                while ping.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.0.store(i, Ordering::Release);
            }
            true
        });
        let timed = scope
            .spawn(|| {
                if !pin(a) {
                    // Let the echo thread finish: it waits for every trip.
                    ping.0.store(u64::MAX, Ordering::Release);
                    return None;
                }
                let started = std::time::Instant::now();
                for i in 1..=TRIPS {
                    ping.0.store(i, Ordering::Release);
                    while pong.0.load(Ordering::Acquire) != i {
                        if ping.0.load(Ordering::Relaxed) == u64::MAX {
                            return None;
                        }
                        std::hint::spin_loop();
                    }
                }
                Some(started.elapsed().as_nanos() as f64 / TRIPS as f64)
            })
            .join()
            .ok()
            .flatten();
        if timed.is_none() {
            // The echo thread may wait for a trip that never comes.
            ping.0.store(u64::MAX, Ordering::Release);
        }
        let echoed = echo.join().unwrap_or(false);
        timed.filter(|_| echoed)
    })
}

/// The cores this process may run on.
#[cfg(target_os = "linux")]
fn allowed_cores() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid set of the size given.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
        return Vec::new();
    }
    let max = 8 * std::mem::size_of_val(&set);
    // SAFETY: CPU_ISSET reads within the set's size.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[cfg(not(target_os = "linux"))]
fn allowed_cores() -> Vec<usize> {
    Vec::new()
}

/// Pins the calling thread to `core`; false when it cannot.
#[cfg(target_os = "linux")]
fn pin(core: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it (`core`
    // came from CPU_ISSET over the same size).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: a valid set; 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn pin(_core: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_gives_a_plausible_round_trip_where_there_are_two_cores() {
        let Some(ns) = core_round_trip_ns() else {
            assert!(allowed_cores().len() < 2, "two cores but no probe");
            return;
        };
        // Between a few nanoseconds (a shared cache) and a millisecond (a loaded
        // machine descheduling a thread): anything else is a broken measurement.
        assert!(ns > 1.0 && ns < 1e6, "{ns} ns");
    }
}
