//! Several "hosts" on one machine for the multi-host tests: each host is a network
//! namespace with its own address, joined to the others by a veth pair to a bridge
//! that lives in a namespace of its own (so nothing is added to the machine's own
//! network, and two tests never share an address space).
//!
//! ```text
//!   host 0 (10.77.0.1)     host 1 (10.77.0.2)     host 2 (10.77.0.3)
//!        eth0                   eth0                   eth0
//!         |                      |                      |
//!        h0 ------------------- br0 ------------------- h2      (bridge namespace)
//! ```
//!
//! [`Net::new`] needs root and a working `ip netns` (iproute2). Where either is
//! missing it prints why and returns `None`, and the test returns early; with
//! `SWITCHYARD_REQUIRE_NETNS=1` (CI, which runs as root) that is a failure instead.
//!
//! Every host has a default route via 10.77.0.254, an address nobody answers.
//! Ports are per namespace: a test may use a fixed port (a `MASTER_PORT`) without
//! colliding with anything outside its own hosts.
//!
//! Names are `sy{pid}n{counter}...`, unique per test process and per harness, so tests
//! in parallel do not collide. Dropping the [`Net`] deletes every namespace it made
//! (deleting a namespace deletes its interfaces), also when the test panics; a test
//! process killed outright leaves its namespaces behind, and the next [`Net::new`]
//! deletes those of processes that no longer run.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod ssh;

use std::net::Ipv4Addr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Set to `1` to make a missing namespace facility a test failure instead of a skip.
pub(crate) const ENV_REQUIRE: &str = "SWITCHYARD_REQUIRE_NETNS";

/// Prefix of every namespace the harness makes.
const PREFIX: &str = "sy";

/// The interface that joins a host to the bridge, inside the host's namespace.
pub(crate) const HOST_IF: &str = "eth0";

/// The hosts' default gateway: an address on the bridge's network that nobody has.
pub(crate) const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 254);

/// Network namespaces joined by a bridge, deleted on drop.
#[derive(Debug)]
pub(crate) struct Net {
    /// `sy{pid}n{counter}`: every namespace name starts with it.
    name: String,
    /// The host namespaces, in host order.
    hosts: Vec<String>,
    /// Every namespace made so far (bridge, hosts, islands), deleted on drop.
    made: Vec<String>,
}

/// Runs `ip ARGS`, returning its output (not checked).
fn ip_output(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"))
}

/// Runs `ip ARGS` and panics with its stderr when it fails.
pub(crate) fn ip(args: &[&str]) {
    let out = ip_output(args);
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Prints why the test does not run, or fails it when namespaces are required.
fn skip(why: &str) -> Option<Net> {
    let required = std::env::var(ENV_REQUIRE).is_ok_and(|v| v.trim() == "1");
    assert!(
        !required,
        "{ENV_REQUIRE}=1 but network namespaces are unusable: {why}"
    );
    eprintln!(
        "skipped: network namespaces are unusable here ({why}); {ENV_REQUIRE}=1 makes this a failure"
    );
    None
}

/// The namespaces there are now.
pub(crate) fn list() -> Vec<String> {
    let out = ip_output(&["netns", "list"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Deletes namespaces that earlier, killed test processes left behind.
fn sweep_leftovers() {
    for name in list() {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('n') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip_output(&["netns", "del", &name]);
        }
    }
}

impl Net {
    /// `hosts` hosts on one bridge, host `i` at [`Net::addr`]`(i)` on its
    /// [`HOST_IF`], loopback up everywhere. `None` (after saying why) when namespaces
    /// cannot be made here.
    pub(crate) fn new(hosts: usize) -> Option<Net> {
        Net::with_dead_ends(hosts, &[])
    }

    /// As [`Net::new`], and host `i` of each `(i, ifname, cidr)` also gets the
    /// interface `ifname` at `cidr` (e.g. `10.99.0.1/24`), up and linked to a
    /// namespace of its own that reaches no other host: a network the job must not
    /// use. It is made before [`HOST_IF`], so it comes first in the host's interface
    /// list (a choice of "the first interface" picks it).
    pub(crate) fn with_dead_ends(hosts: usize, dead_ends: &[(usize, &str, &str)]) -> Option<Net> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        if hosts == 0 || hosts > 250 {
            panic!("{hosts} hosts: the harness has addresses for 1 to 250");
        }
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}n{n}", std::process::id());
        let bridge = format!("{name}br");
        match Command::new("ip")
            .args(["netns", "add", &bridge])
            .stdin(Stdio::null())
            .output()
        {
            Err(e) => return skip(&format!("cannot run `ip`: {e}")),
            Ok(out) if !out.status.success() => {
                return skip(&format!(
                    "`ip netns add` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(_) => {}
        }
        let mut net = Net {
            name,
            hosts: Vec::new(),
            made: vec![bridge.clone()],
        };
        sweep_leftovers();
        ip(&["-n", &bridge, "link", "set", "lo", "up"]);
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge, "link", "set", "br0", "up"]);
        for i in 0..hosts {
            let ns = net.namespace(&format!("h{i}"));
            for &(_, ifname, cidr) in dead_ends.iter().filter(|d| d.0 == i) {
                net.add_dead_end(&ns, ifname, cidr);
            }
            let port = format!("h{i}");
            ip(&[
                "-n", &ns, "link", "add", HOST_IF, "type", "veth", "peer", "name", &port, "netns",
                &bridge,
            ]);
            ip(&["-n", &bridge, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &bridge, "link", "set", &port, "up"]);
            let cidr = format!("{}/24", Net::addr(i));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", HOST_IF]);
            ip(&["-n", &ns, "link", "set", HOST_IF, "up"]);
            // Hosts have a default route, as real ones do (unique ids find their
            // address by it); the gateway does not exist, so nothing goes beyond.
            let gateway = GATEWAY.to_string();
            ip(&[
                "-n", &ns, "route", "add", "default", "via", &gateway, "dev", HOST_IF,
            ]);
            net.hosts.push(ns);
        }
        Some(net)
    }

    /// A new namespace `{name}{suffix}` with loopback up, deleted on drop.
    fn namespace(&mut self, suffix: &str) -> String {
        let ns = format!("{}{suffix}", self.name);
        ip(&["netns", "add", &ns]);
        self.made.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// Host `i`'s address on the bridge: `10.77.0.{i+1}`.
    pub(crate) fn addr(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, u8::try_from(i + 1).expect("at most 250 hosts"))
    }

    /// Every namespace made (bridge, hosts, dead ends), deleted on drop.
    pub(crate) fn namespaces(&self) -> &[String] {
        &self.made
    }

    /// How many hosts.
    pub(crate) fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Host `i`'s namespace name.
    pub(crate) fn ns(&self, i: usize) -> &str {
        &self.hosts[i]
    }

    /// `program` to be run on host `i` (`ip netns exec NS program`).
    pub(crate) fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i]]).arg(program);
        c
    }

    /// Takes host `i`'s bridge interface down: its peers' packets go nowhere and no
    /// RST comes back, as when a cable is pulled.
    pub(crate) fn link_down(&self, i: usize) {
        ip(&["-n", &self.hosts[i], "link", "set", HOST_IF, "down"]);
    }

    /// Gives the host namespace `host` an interface `ifname` at `cidr` whose far end
    /// is in a namespace of its own (see [`Net::with_dead_ends`]).
    fn add_dead_end(&mut self, host: &str, ifname: &str, cidr: &str) {
        let island = self.namespace(&format!("x{}", self.made.len()));
        ip(&[
            "-n", host, "link", "add", ifname, "type", "veth", "peer", "name", "x0", "netns",
            &island,
        ]);
        ip(&["-n", &island, "link", "set", "x0", "up"]);
        ip(&["-n", host, "addr", "add", cidr, "dev", ifname]);
        ip(&["-n", host, "link", "set", ifname, "up"]);
    }
}

impl Drop for Net {
    /// Deletes every namespace made, hosts before the bridge (each deletion removes
    /// that namespace's interfaces and the far ends of its veth pairs).
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let out = ip_output(&["netns", "del", ns]);
            if !out.status.success() {
                eprintln!(
                    "netns harness: could not delete {ns}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
}
