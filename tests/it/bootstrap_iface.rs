//! The mesh address choice: `SWITCHYARD_IFNAME`, else the route to the root.
//!
//! Cases that need `SWITCHYARD_IFNAME` run in a child process (this test binary again,
//! with the variable set only there), so no thread of this binary mutates the
//! environment.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard::bootstrap::{Bootstrap, BootstrapError, Rendezvous, bind_address};

/// Set in the child process: which case to run.
const CHILD: &str = "SWITCHYARD_TEST_IFACE_CHILD";

fn launcher(addr: &str) -> Bootstrap {
    Bootstrap {
        rank: 0,
        world_size: 2,
        rendezvous: Rendezvous::Launcher(addr.into()),
    }
}

/// Runs `child_case` in a fresh process with `vars`; its exit status is the verdict.
/// Returns what it printed.
fn in_child(case: &str, vars: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg(support::test_name(module_path!(), "child_case"))
        .args(["--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .env_remove("SWITCHYARD_IFNAME");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child case {case} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child case {case} did not run:\n{text}"
    );
    text
}

/// The body of the child process; outside one it has nothing to check.
#[test]
fn child_case() {
    let Ok(case) = std::env::var(CHILD) else {
        return;
    };
    match case.as_str() {
        // The named interface wins over the route (to an address no interface has).
        "lo" => {
            assert_eq!(
                bind_address("192.0.2.1", 9).unwrap(),
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            );
            assert_eq!(
                launcher("192.0.2.1:9").bind_endpoint().unwrap(),
                "tcp://127.0.0.1:0"
            );
        }
        "missing" => match bind_address("127.0.0.1", 9) {
            Err(BootstrapError::Env(e)) => {
                assert_eq!(e.var(), "SWITCHYARD_IFNAME");
                let reason = e.expected();
                assert!(reason.contains("\"lo\""), "{reason}");
                // Each interface once, though lo has an IPv4 and an IPv6 address.
                assert_eq!(reason.matches("\"lo\"").count(), 1, "{reason}");
            }
            other => panic!("expected an error naming SWITCHYARD_IFNAME, got {other:?}"),
        },
        // Two choices, logged at info level.
        "logged" => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .init();
            bind_address("127.0.0.1", 9).unwrap();
            bind_address("127.0.0.1", 10).unwrap();
        }
        other => panic!("unknown case {other}"),
    }
}

#[test]
fn ifname_picks_the_named_interface() {
    in_child("lo", &[("SWITCHYARD_IFNAME", "no-such-if0,lo")]);
}

#[test]
fn ifname_that_matches_nothing_is_an_error_listing_interfaces() {
    in_child("missing", &[("SWITCHYARD_IFNAME", "no-such-if0")]);
}

#[test]
fn launcher_on_loopback_binds_loopback() {
    if std::env::var_os("SWITCHYARD_IFNAME").is_some() {
        eprintln!("SWITCHYARD_IFNAME is set in this environment: the route is not used");
        return;
    }
    assert_eq!(
        launcher("127.0.0.1:5000").bind_endpoint().unwrap(),
        "tcp://127.0.0.1:0"
    );
    let e = launcher("no-port").bind_endpoint().unwrap_err();
    assert!(e.to_string().contains("no-port"), "{e}");
}

#[test]
fn unreachable_rendezvous_is_an_error_naming_it_within_the_timeout() {
    // A port that was free a moment ago: nothing listens there now.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let started = Instant::now();
    let e = switchyard::bootstrap::rendezvous::exchange(
        &addr,
        0,
        2,
        "tcp://127.0.0.1:1",
        Duration::from_secs(2),
    )
    .unwrap_err();
    // Told apart from a wait without a deadline, with room for a loaded runner.
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(e.to_string().contains(&addr), "{e}");
}

/// The mesh address is said at info level once per process, with its interface.
#[test]
fn the_mesh_address_is_logged_at_info_once() {
    let text = in_child("logged", &[]);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("mesh address from"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("INFO"), "{text}");
    assert!(lines[0].contains("ip=127.0.0.1"), "{text}");
    assert!(lines[0].contains("interface=lo"), "{text}");
}
