//! glibc's allocator under libzmq's large messages.
//!
//! libzmq allocates every received message of more than a few KiB with `malloc`, at its
//! full size, and reads the socket straight into it; the message is freed once the
//! frame that owns it is dropped. glibc serves an allocation of 128 KiB or more with a
//! fresh `mmap` (or, after its threshold has moved, from a thread arena that it trims
//! back as soon as the top is free), so each 1 MiB message costs 256 page faults
//! while it is read: 73% of all page faults of `switchyard bench ps`, and the bare
//! 1 MiB Dealer/Router exchange ran at 0.8-0.9 GB/s with them against 2.0 without
//! (`docs/benchmarks/log.md`, "The parameter server: pooled buffers, and libzmq's
//! received messages").
//!
//! So the first ZeroMQ socket of a process sets glibc's mmap threshold to 32 MiB (its
//! own ceiling for the dynamic threshold) and its trim threshold to 256 MiB: freed
//! message memory stays mapped and is reused by the next message. The price is
//! memory that a process does not give back to the system after a burst of large
//! messages (up to the trim threshold per arena). This is what HPC libraries have
//! long done for the same reason (MVAPICH turns trimming and mmap off altogether).
//!
//! Left alone when the process chose its own allocator settings (`GLIBC_TUNABLES`
//! naming `glibc.malloc`, or any of `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`,
//! `MALLOC_TOP_PAD_`, `MALLOC_MMAP_MAX_`), and when [`ENV_MALLOC_TUNING`] is `0`.
//! Without glibc (musl, macOS) it does nothing.

/// Set to `0` to keep glibc's allocator settings as they are; `1` (or unset) lets the
/// first ZeroMQ socket set them (see the module documentation).
pub const ENV_MALLOC_TUNING: &str = "SWITCHYARD_MALLOC_TUNING";

/// The mmap threshold set: glibc's largest dynamic threshold on 64-bit systems.
const MMAP_THRESHOLD: i32 = 32 << 20;

/// The trim threshold set: freed memory at an arena's top stays mapped below this.
const TRIM_THRESHOLD: i32 = 256 << 20;

/// The variables through which a process sets glibc's allocator itself.
const USER_SETTINGS: [&str; 4] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
];

/// Whether to set the allocator, from the environment as `lookup` reads it; `Err`
/// names a value of [`ENV_MALLOC_TUNING`] that is neither `0` nor `1`.
pub(crate) fn wanted(lookup: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    match lookup(ENV_MALLOC_TUNING).as_deref().map(str::trim) {
        None | Some("1") => {}
        Some("0") => return Ok(false),
        Some(other) => {
            return Err(format!(
                "{ENV_MALLOC_TUNING}={other:?}: expected 0 (leave glibc's allocator alone) or 1"
            ));
        }
    }
    let tunables = lookup("GLIBC_TUNABLES").is_some_and(|t| t.contains("glibc.malloc."));
    let own = USER_SETTINGS.iter().any(|name| lookup(name).is_some());
    Ok(!tunables && !own)
}

/// Sets glibc's thresholds once per process, unless [`wanted`] says otherwise.
pub(crate) fn tune_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match wanted(|name| std::env::var(name).ok()) {
        Ok(true) => apply(),
        Ok(false) => {}
        Err(reason) => tracing::warn!("{reason}; glibc's allocator left as it is"),
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() {
    // SAFETY: mallopt only changes the allocator's parameters; it is thread-safe and
    // takes effect for later allocations.
    let set = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    };
    if set {
        tracing::debug!(
            mmap_threshold = MMAP_THRESHOLD,
            trim_threshold = TRIM_THRESHOLD,
            "zmq: glibc keeps freed message memory for the next messages"
        );
    } else {
        tracing::warn!("zmq: glibc refused the allocator settings for large messages");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() {}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_allocator_is_set_unless_the_process_set_it_or_said_no() {
        assert_eq!(wanted(env(&[])), Ok(true));
        assert_eq!(wanted(env(&[(ENV_MALLOC_TUNING, "1")])), Ok(true));
        assert_eq!(wanted(env(&[(ENV_MALLOC_TUNING, "0")])), Ok(false));
        assert_eq!(wanted(env(&[("MALLOC_TRIM_THRESHOLD_", "0")])), Ok(false));
        let tunables = "glibc.malloc.mmap_threshold=4096";
        assert_eq!(wanted(env(&[("GLIBC_TUNABLES", tunables)])), Ok(false));
        let other = "glibc.cpu.x86_rep_movsb_threshold=4096";
        assert_eq!(wanted(env(&[("GLIBC_TUNABLES", other)])), Ok(true));
    }

    #[test]
    fn a_malformed_setting_is_named() {
        let err = wanted(env(&[(ENV_MALLOC_TUNING, "yes")])).unwrap_err();
        assert!(
            err.contains(ENV_MALLOC_TUNING) && err.contains("yes"),
            "{err}"
        );
    }

    /// Minor page faults of this thread so far.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn faults() -> i64 {
        // SAFETY: getrusage writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
            0
        );
        usage.ru_minflt
    }

    /// After tuning, bursts of 1 MiB buffers that one thread allocates and writes
    /// and another frees (libzmq's io thread reading messages that the application
    /// drops) reuse the same memory: the first burst faults its pages in, the later
    /// ones do not. Without it glibc trims the freed burst off the arena's top
    /// (above twice its moving mmap threshold) and every burst faults again.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn freed_large_buffers_are_reused_without_page_faults() {
        if !wanted(|name| std::env::var(name).ok()).unwrap_or(false) {
            return; // The environment running the tests set the allocator itself.
        }
        tune_once();
        const BURSTS: usize = 16;
        const BURST: usize = 8;
        let (to_dropper, dropped) = std::sync::mpsc::channel::<Vec<Vec<u8>>>();
        let (to_allocator, done) = std::sync::mpsc::channel::<()>();
        let dropper = std::thread::spawn(move || {
            for burst in dropped.iter() {
                drop(burst);
                let _ = to_allocator.send(());
            }
        });
        let faults = std::thread::spawn(move || {
            let before = faults();
            for round in 0..BURSTS {
                let burst: Vec<Vec<u8>> = (0..BURST)
                    .map(|_| std::hint::black_box(vec![round as u8 | 1; 1 << 20]))
                    .collect();
                to_dropper.send(burst).expect("dropping thread");
                done.recv().expect("dropping thread");
            }
            faults() - before
        })
        .join()
        .expect("allocating thread");
        dropper.join().expect("dropping thread");
        // One burst's pages (8 x 256) and some slack; untuned it is most bursts'.
        assert!(
            faults < 2 * BURST as i64 * 256 + 512,
            "{faults} page faults for {BURSTS} bursts of {BURST} buffers of 1 MiB"
        );
    }
}
