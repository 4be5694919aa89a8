//! Which local address routes to a host, and which addresses this host has.
//!
//! A process that advertises an address to its peers must advertise one they can
//! reach. On a host with several interfaces the answer is the source address of the
//! route towards the peer (or its rendezvous), which the kernel picks when a UDP socket
//! "connects": no packet is sent. Both IPv4 and IPv6 targets work.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

/// Why no local address towards a host was found. The messages name the target, not
/// the `host:port` asked for: callers put that in front.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The host name did not resolve.
    #[error("cannot resolve the host: {0}")]
    Resolve(#[source] std::io::Error),
    /// The host name resolved to no address.
    #[error("the host name has no address")]
    NoAddress,
    /// No UDP socket could be made to ask the kernel.
    #[error("no local UDP socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The kernel has no route to the target.
    #[error("no route to {target}: {source}")]
    NoRoute {
        /// The resolved target.
        target: SocketAddr,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The route has no usable local address.
    #[error("no local address towards {target}")]
    NoLocalAddress {
        /// The resolved target.
        target: SocketAddr,
    },
}

/// The local address of the route to `host:port`. `host` may be a name, an IPv4
/// address or an IPv6 one, bracketed or not.
///
/// # Examples
///
/// ```
/// # fn main() -> Result<(), switchyard_net::route::RouteError> {
/// // A host on loopback is reached from loopback.
/// assert!(switchyard_net::route::local_address_to("127.0.0.1", 9)?.is_loopback());
/// # Ok(())
/// # }
/// ```
pub fn local_address_to(host: &str, port: u16) -> Result<IpAddr, RouteError> {
    let target: SocketAddr = (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .map_err(RouteError::Resolve)?
        .next()
        .ok_or(RouteError::NoAddress)?;
    local_address_towards(target)
}

/// The local address of the route to `target`.
pub fn local_address_towards(target: SocketAddr) -> Result<IpAddr, RouteError> {
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(any).map_err(RouteError::Socket)?;
    socket
        .connect(target)
        .map_err(|source| RouteError::NoRoute { target, source })?;
    let ip = socket
        .local_addr()
        .map_err(|_| RouteError::NoLocalAddress { target })?
        .ip();
    if ip.is_unspecified() {
        return Err(RouteError::NoLocalAddress { target });
    }
    Ok(ip)
}

/// Every (interface name, address) pair of this host, from `getifaddrs(3)`, in the
/// system's order (an interface with an IPv4 and an IPv6 address is listed twice).
///
/// # Errors
///
/// The system's error when the interfaces cannot be listed.
pub fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family says which
        // larger struct it is the start of.
        let ip = unsafe {
            match i32::from((*entry.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(entry.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(entry.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                }
                _ => None,
            }
        };
        if let Some(ip) = ip {
            out.push((name, ip));
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_address() {
        let all = interface_addresses().unwrap();
        assert!(
            all.iter()
                .any(|(_, ip)| *ip == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{all:?}"
        );
    }

    #[test]
    fn route_to_loopback_is_loopback() {
        assert!(local_address_to("127.0.0.1", 9).unwrap().is_loopback());
        assert!(
            local_address_towards("127.0.0.1:9".parse().unwrap())
                .unwrap()
                .is_loopback()
        );
    }

    #[test]
    fn an_unresolvable_host_is_a_resolve_error() {
        assert!(matches!(
            local_address_to("no-such-host.invalid", 9),
            Err(RouteError::Resolve(_))
        ));
    }
}
