//! Which local address a process binds and advertises for its mesh.
//!
//! On a host with several interfaces (a management network, a fast fabric, docker
//! bridges) the address matters: peers must reach it. Every mesh setup (the
//! launcher's rendezvous, a tracker, a unique id, the `MASTER_ADDR` and scheduler
//! conventions) asks [`bind_address`], which answers, in this order:
//!
//! 1. [`ENV_IFNAME`] (`SWITCHYARD_IFNAME`, like NCCL's `NCCL_SOCKET_IFNAME` and Gloo's
//!    `GLOO_SOCKET_IFNAME`): a comma-separated list of interface names; the first one
//!    that exists and has an address wins, its IPv4 address before an IPv6 one.
//!    Names are exact (no prefixes or exclusions). A name that matches nothing is an
//!    error listing the interfaces there are.
//! 2. Otherwise the local address of the route to the root (rendezvous, tracker,
//!    unique-id root), found by "connecting" a UDP socket, which sends no packet. A
//!    root on loopback therefore gives `127.0.0.1`.
//!
//! The choice (address, interface, root, and which rule) is logged at `tracing` info
//! level the first time in a process, at debug after.

use super::BootstrapError;
use std::net::IpAddr;
use switchyard_net::env::{self, EnvError};
use switchyard_net::route::interface_addresses;

/// Environment variable naming the interface(s) to bind the mesh on.
pub const ENV_IFNAME: &str = "SWITCHYARD_IFNAME";

/// The address to bind and advertise when the root is at `host:port`: the address of
/// the interface named by [`ENV_IFNAME`], else the local address of the route to the
/// root, found by "connecting" a UDP socket (no packet is sent). `SWITCHYARD_IFNAME`
/// is a comma-separated list of exact interface names, tried in order; an
/// interface's IPv4 address is preferred. The choice is logged.
///
/// # Errors
///
/// [`BootstrapError::Env`] when `SWITCHYARD_IFNAME` names no interface with an address;
/// [`BootstrapError::Rendezvous`] naming `host:port` when the host does not resolve or
/// there is no route to it.
///
/// # Examples
///
/// ```
/// use switchyard_bootstrap::bind_address;
/// # fn main() -> Result<(), switchyard_bootstrap::BootstrapError> {
/// if std::env::var_os("SWITCHYARD_IFNAME").is_none() {
///     // A root on loopback is reached from loopback.
///     assert!(bind_address("127.0.0.1", 9)?.is_loopback());
/// }
/// # Ok(())
/// # }
/// ```
pub fn bind_address(host: &str, port: u16) -> Result<IpAddr, BootstrapError> {
    let (ip, how) = match ifname_address()? {
        Some(ip) => (ip, ENV_IFNAME),
        None => (route_address(host, port)?, "the route to the root"),
    };
    // Which interface a rank talks on is the first question when ranks cannot reach
    // each other: said at info once per process (as NCCL does), at debug after.
    let interface = interface_of(ip);
    let root = format!("{host}:{port}");
    if LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::debug!(%ip, %interface, %root, "mesh address from {how}");
    } else {
        tracing::info!(%ip, %interface, %root, "mesh address from {how}");
    }
    Ok(ip)
}

/// Whether [`bind_address`] logged its choice at info yet.
static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The name of the interface that has `ip`, or `?`.
fn interface_of(ip: IpAddr) -> String {
    interface_addresses()
        .ok()
        .and_then(|all| all.into_iter().find(|(_, a)| *a == ip))
        .map_or_else(|| "?".to_string(), |(name, _)| name)
}

/// The address of the interface named by [`ENV_IFNAME`], or `None` when it is unset
/// or empty.
pub fn ifname_address() -> Result<Option<IpAddr>, BootstrapError> {
    let Some(names) = env::text(&env::ProcessEnv, ENV_IFNAME) else {
        return Ok(None);
    };
    let all = interface_addresses().map_err(|e| {
        EnvError::malformed(
            ENV_IFNAME,
            names.clone(),
            format!("names of interfaces, which cannot be listed here: {e}"),
        )
    })?;
    match pick(&all, &names) {
        Some((name, ip)) => {
            tracing::debug!(interface = name, %ip, "{ENV_IFNAME} picked");
            Ok(Some(ip))
        }
        None => {
            // Each name once, in the system's order (an interface with an IPv4 and
            // an IPv6 address is listed twice, apart).
            let mut known: Vec<&str> = Vec::new();
            for (name, _) in &all {
                if !known.contains(&name.as_str()) {
                    known.push(name);
                }
            }
            Err(EnvError::malformed(
                ENV_IFNAME,
                names,
                format!("the name of an interface with an address, one of {known:?}"),
            )
            .into())
        }
    }
}

/// The first of the comma-separated `names` found in `all`, with its IPv4 address if
/// it has one (the ZeroMQ mesh does not enable IPv6), else its first address.
fn pick<'a>(all: &'a [(String, IpAddr)], names: &str) -> Option<(&'a str, IpAddr)> {
    names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .find_map(|name| {
            let mut of = all.iter().filter(|(n, _)| n == name);
            let first = of.clone().next()?;
            let best = of.find(|(_, ip)| ip.is_ipv4()).unwrap_or(first);
            Some((best.0.as_str(), best.1))
        })
}

/// The local address of the route to `host:port`: a UDP socket's "connect" picks the
/// route and source address and sends nothing.
pub(crate) fn route_address(host: &str, port: u16) -> Result<IpAddr, BootstrapError> {
    switchyard_net::route::local_address_to(host, port).map_err(|e| BootstrapError::Rendezvous {
        addr: format!("{host}:{port}"),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn pick_prefers_the_first_listed_name_and_ipv4() {
        let v6: IpAddr = "fe80::1".parse().unwrap();
        let all = vec![
            ("lo".to_string(), IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ("eth1".to_string(), v6),
            ("eth1".to_string(), "10.1.0.2".parse().unwrap()),
            ("eth2".to_string(), v6),
        ];
        assert_eq!(
            pick(&all, "nope, eth1,lo"),
            Some(("eth1", "10.1.0.2".parse().unwrap()))
        );
        assert_eq!(pick(&all, "eth2"), Some(("eth2", v6)));
        assert_eq!(pick(&all, "eth9"), None);
        assert_eq!(pick(&all, " , "), None);
    }

    #[test]
    fn route_to_loopback_is_loopback() {
        assert!(route_address("127.0.0.1", 9).unwrap().is_loopback());
    }

    #[test]
    fn unresolvable_root_is_named() {
        let e = route_address("no-such-host.invalid", 9).unwrap_err();
        assert!(e.to_string().contains("no-such-host.invalid:9"), "{e}");
    }
}
