//! Which ranks share a host: the identity a rank announces at mesh setup.

/// This process's host identity for choosing shared memory: the kernel's boot id
/// (different on every machine and every boot) and the network namespace this process
/// lives in. Two ranks with the same identity can reach each other's abstract Unix
/// sockets, which the segment hand-over needs; ranks in different network namespaces
/// of one machine (containers, or the tests' namespace hosts) count as different
/// hosts and talk over TCP. `None` where `/proc` does not say (no shared memory then).
pub fn host_identity() -> Option<String> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = std::fs::read_link("/proc/self/ns/net").ok()?;
    Some(format!("{}/{}", boot.trim(), namespace.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    #[cfg(target_os = "linux")]
    #[test]
    fn the_identity_names_the_boot_and_the_network_namespace() {
        let id = super::host_identity().expect("Linux has /proc");
        assert!(id.contains("/net:["), "{id}");
        assert_eq!(super::host_identity().unwrap(), id);
    }
}
