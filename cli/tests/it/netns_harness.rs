//! The namespace harness (`netns/`) itself: its hosts reach each other and nothing
//! else, and it leaves nothing behind, not even when a test panics or its process
//! was killed.
//!
//! Needs root: without it every test says why and returns, unless
//! `SWITCHYARD_REQUIRE_NETNS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::netns;
use crate::support;

use netns::{Net, ip, list};
use std::time::Duration;
use support::run_bounded;

/// Whether host `from` reaches `to`: a TCP connect to port 9 (where nothing
/// listens) is refused at once by a host that is there, and goes unanswered or finds
/// no route otherwise (bash's `/dev/tcp`, bounded by `timeout`).
fn reaches(net: &Net, from: usize, to: &str) -> bool {
    let mut cmd = net.command(from, "timeout");
    cmd.args(["2", "bash", "-c", &format!("exec 3<>/dev/tcp/{to}/9")]);
    let (out, _) = run_bounded(cmd, Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "something listens on {to}:9: {stderr}"
    );
    stderr.contains("Connection refused")
}

#[test]
fn hosts_reach_each_other_and_a_downed_host_is_cut_off() {
    let Some(net) = Net::with_dead_ends(3, &[(1, "a0", "10.99.0.2/24")]) else {
        return;
    };
    for from in 0..3 {
        for to in 0..3 {
            let to = Net::addr(to).to_string();
            assert!(reaches(&net, from, &to), "host {from} cannot reach {to}");
        }
    }
    // The dead end is an address of host 1 alone: reached there, from nowhere else.
    assert!(reaches(&net, 1, "10.99.0.2"));
    assert!(!reaches(&net, 0, "10.99.0.2"));
    net.link_down(2);
    assert!(!reaches(&net, 0, &Net::addr(2).to_string()));
    assert!(reaches(&net, 0, &Net::addr(1).to_string()));
}

#[test]
fn a_panicking_test_leaves_no_namespace_behind() {
    // Skip (or fail, when required) out here: the panic below is caught.
    let Some(probe) = Net::new(1) else { return };
    drop(probe);
    let made = std::sync::Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let net = Net::with_dead_ends(2, &[(0, "a0", "10.99.0.1/24")]).unwrap();
        made.lock().unwrap().extend(net.namespaces().to_vec());
        panic!("a test fails with its hosts up");
    });
    let made = made.into_inner().unwrap();
    assert!(result.is_err());
    assert_eq!(made.len(), 4, "bridge, two hosts, one dead end: {made:?}");
    let left: Vec<String> = list().into_iter().filter(|n| made.contains(n)).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn namespaces_of_a_killed_test_process_are_swept_by_the_next() {
    // Above the kernel's largest pid (2^22), so no such process can be running.
    let stale = "sy4194999n0h0";
    let Some(probe) = Net::new(1) else { return };
    drop(probe);
    ip(&["netns", "add", stale]);
    let net = Net::new(1);
    let swept = !list().iter().any(|n| n == stale);
    if !swept {
        ip(&["netns", "del", stale]);
    }
    drop(net);
    assert!(swept, "{stale} is still there");
}
