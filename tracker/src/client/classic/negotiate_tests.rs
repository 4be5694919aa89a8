//! The classic join's orderings, each written down without a socket or a sleep.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn at() -> SocketAddr {
    "127.0.0.1:9091".parse().unwrap()
}

fn peer(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

/// Rank 1 of 4: tree neighbours 0 and 2 (parent 0), ring 0 and 2; links {0, 2}.
fn fields() -> Fields {
    Fields {
        rank: 1,
        parent: 0,
        world: 4,
        tree: vec![0, 2],
        prev: 0,
        next: 2,
    }
}

/// Rank 1 of 4 with links {0, 2, 3} (ring successor 3).
fn three_links() -> Assignment {
    Assignment::check(1, 0, 4, vec![0, 2], 0, 3).unwrap()
}

fn offer(connect: &[(&str, i32, i32)], accept: usize) -> Offer {
    Offer {
        connect: connect
            .iter()
            .map(|&(h, p, r)| (h.to_string(), p, r))
            .collect(),
        accept,
    }
}

fn dial(host: &str, port: u16, rank: u32) -> Step {
    Step::Dial {
        host: host.into(),
        port,
        rank,
    }
}

fn answered(rank: i32) -> Dialled {
    Dialled::Answered {
        peer: peer(7000),
        rank,
    }
}

/// Opens a round: the linked ranks sent, then the offer read.
fn open_round(n: &mut Negotiation, linked: &[u32], o: Offer) {
    assert_eq!(n.next().unwrap(), Step::SendLinked(linked.to_vec()));
    assert!(matches!(n.next().unwrap(), Step::ReadOffer { .. }));
    n.on_offer(o).unwrap();
}

#[test]
fn a_round_that_reaches_every_peer_ends_the_negotiation() {
    let a = assignment(at(), None, fields()).unwrap();
    let mut n = Negotiation::new(at(), &a);
    assert_eq!(n.next().unwrap(), Step::SendLinked(vec![]));
    // The offer's counts are capped by this worker's links.
    assert_eq!(n.next().unwrap(), Step::ReadOffer { cap: 2 });
    n.on_offer(offer(&[("h0", 7000, 0)], 1)).unwrap();
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    assert!(n.on_dialled(answered(0)).unwrap());
    assert_eq!(n.next().unwrap(), Step::SendFailed(0));
    assert_eq!(n.next().unwrap(), Step::Accept(1));
    assert_eq!(n.linked().iter().copied().collect::<Vec<_>>(), [0]);
    let t0 = Instant::now();
    let mut acc = n.accepting(Duration::from_secs(30), t0);
    assert!(acc.wants_more());
    assert_eq!(acc.deadline(), t0 + Duration::from_secs(30));
    assert_eq!(acc.on_accepted(peer(7002), 2).unwrap(), 2);
    assert!(!acc.wants_more());
    acc.finish().unwrap();
}

#[test]
fn a_failed_connect_is_reported_and_the_next_round_reports_the_links_made() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0), ("h2", 7002, 2)], 1));
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    assert!(!n.on_dialled(Dialled::Unreachable).unwrap());
    assert_eq!(n.next().unwrap(), dial("h2", 7002, 2));
    assert!(n.on_dialled(answered(2)).unwrap());
    assert_eq!(n.next().unwrap(), Step::SendFailed(1));
    // Another round, opened with the link that was made; the tracker offers 0 again.
    open_round(&mut n, &[2], offer(&[("h0", 7000, 0)], 1));
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    assert!(n.on_dialled(answered(0)).unwrap());
    assert_eq!(n.next().unwrap(), Step::SendFailed(0));
    assert_eq!(n.next().unwrap(), Step::Accept(1));
}

#[test]
fn a_peer_that_stays_unreachable_is_the_trackers_to_give_up_on() {
    // The tracker stops offering a dead listener and has the link accepted instead:
    // the worker follows whatever each round says.
    let a = assignment(at(), None, fields()).unwrap();
    let mut n = Negotiation::new(at(), &a);
    for round in 0..3 {
        open_round(&mut n, &[], offer(&[("h0", 7000, 0)], 1));
        assert_eq!(n.next().unwrap(), dial("h0", 7000, 0), "round {round}");
        assert!(!n.on_dialled(Dialled::Unreachable).unwrap());
        assert_eq!(n.next().unwrap(), Step::SendFailed(1));
    }
    open_round(&mut n, &[], offer(&[], 2));
    assert_eq!(n.next().unwrap(), Step::SendFailed(0));
    assert_eq!(n.next().unwrap(), Step::Accept(2));
}

#[test]
fn an_offer_whose_counts_do_not_add_up_ends_the_join() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    assert_eq!(n.next().unwrap(), Step::SendLinked(vec![]));
    let err = n.on_offer(offer(&[("h0", 7000, 0)], 1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tracker 127.0.0.1:9091 sent a bad negotiation round: \
         1 to connect + 1 to accept + 0 linked != 3 links"
    );
}

#[test]
fn a_later_round_counts_the_links_already_made() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0), ("h2", 7002, 2)], 1));
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    n.on_dialled(answered(0)).unwrap();
    assert_eq!(n.next().unwrap(), dial("h2", 7002, 2));
    n.on_dialled(Dialled::Unreachable).unwrap();
    assert_eq!(n.next().unwrap(), Step::SendFailed(1));
    assert_eq!(n.next().unwrap(), Step::SendLinked(vec![0]));
    // Offering 0 again (it is linked) plus the two others does not fit.
    let err = n
        .on_offer(offer(&[("h2", 7002, 2)], 2))
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("1 to connect + 2 to accept + 1 linked != 3 links"),
        "{err}"
    );
}

#[test]
fn a_rank_offered_twice_in_one_round_is_refused_once_linked() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0), ("h0", 7000, 0)], 1));
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    assert!(n.on_dialled(answered(0)).unwrap());
    let err = n.next().unwrap_err().to_string();
    assert_eq!(
        err,
        "tracker 127.0.0.1:9091 sent a bad peer: rank 0 is already linked"
    );
}

#[test]
fn a_rank_offered_twice_after_a_failed_connect_is_dialled_again() {
    // Nothing is linked after the first failure, so the second offer is tried.
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0), ("h0", 7000, 0)], 1));
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    n.on_dialled(Dialled::Unreachable).unwrap();
    assert_eq!(n.next().unwrap(), dial("h0", 7000, 0));
    assert!(n.on_dialled(answered(0)).unwrap());
    assert_eq!(n.next().unwrap(), Step::SendFailed(1));
}

#[test]
fn offered_peers_outside_the_links_or_the_port_range_end_the_join() {
    let a = three_links();
    for (o, want) in [
        (
            ("h", 7000, 1),
            "rank 1 is not one of this worker's links {0, 2, 3}",
        ),
        (
            ("h", 7000, -1),
            "rank -1 is not one of this worker's links {0, 2, 3}",
        ),
        (("h", 70000, 2), "rank 2 has port 70000"),
        (("h", -5, 3), "rank 3 has port -5"),
    ] {
        let mut n = Negotiation::new(at(), &a);
        open_round(&mut n, &[], offer(&[o], 2));
        let err = n.next().unwrap_err().to_string();
        assert!(err.ends_with(&format!("bad peer: {want}")), "{err}");
    }
}

#[test]
fn a_peer_that_answers_as_another_rank_ends_the_join() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h2", 7002, 2)], 2));
    assert_eq!(n.next().unwrap(), dial("h2", 7002, 2));
    let err = n.on_dialled(answered(3)).unwrap_err();
    assert!(
        matches!(err, ClientError::WrongPeer { got: 3, ref reason, .. }
            if reason == "the tracker named rank 2 there"),
        "{err}"
    );
}

#[test]
fn the_trackers_refusal_and_an_unasked_rank_end_the_join() {
    assert!(refused(at(), 0).is_none());
    let err = refused(at(), -1).expect("a refusal");
    assert!(matches!(err, ClientError::Refused { .. }), "{err}");
    // `recover` names its rank: another one is a bad assignment.
    let err = assignment(at(), Some(2), fields()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tracker 127.0.0.1:9091 sent a bad assignment: asked for rank 2, got 1"
    );
    assert_eq!(assignment(at(), Some(1), fields()).unwrap().rank, 1);
    let bad = Fields {
        parent: 3,
        ..fields()
    };
    let err = assignment(at(), None, bad).unwrap_err().to_string();
    assert!(err.contains("bad assignment: parent 3"), "{err}");
}

#[test]
fn the_accept_deadline_counts_from_the_end_of_the_negotiation() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[], 3));
    assert_eq!(n.next().unwrap(), Step::SendFailed(0));
    let t0 = Instant::now();
    let mut acc = n.accepting(Duration::from_secs(10), t0);
    assert_eq!(acc.deadline(), t0 + Duration::from_secs(10));
    acc.on_accepted(peer(7000), 0).unwrap();
    // The deadline is for all of them, not for each.
    assert_eq!(acc.deadline(), t0 + Duration::from_secs(10));
    assert!(acc.wants_more());
    let err = acc.on_timeout(t0 + Duration::from_millis(10_004));
    assert!(
        matches!(
            err,
            ClientError::AcceptTimeout { got: 1, expected: 3, waited }
                if waited == Duration::from_millis(10_004)
        ),
        "{err}"
    );
}

#[test]
fn a_duplicate_or_unknown_peer_at_the_listener_ends_the_join() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0)], 2));
    n.next().unwrap();
    n.on_dialled(answered(0)).unwrap();
    n.next().unwrap();
    let t0 = Instant::now();
    let mut acc = n.accepting(Duration::from_secs(10), t0);
    // A peer this worker connected to itself, connecting again (a late duplicate).
    let err = acc.on_accepted(peer(7000), 0).unwrap_err();
    assert!(
        matches!(err, ClientError::WrongPeer { got: 0, ref reason, .. }
            if reason == "rank 0 is already linked"),
        "{err}"
    );
    assert_eq!(acc.on_accepted(peer(7002), 2).unwrap(), 2);
    let err = acc.on_accepted(peer(7002), 2).unwrap_err();
    assert!(
        matches!(err, ClientError::WrongPeer { got: 2, .. }),
        "{err}"
    );
    let err = acc.on_accepted(peer(7001), 1).unwrap_err().to_string();
    assert!(
        err.contains("rank 1 is not one of this worker's links"),
        "{err}"
    );
    assert!(acc.wants_more());
    assert_eq!(acc.on_accepted(peer(7003), 3).unwrap(), 3);
    assert!(!acc.wants_more());
    acc.finish().unwrap();
}

#[test]
fn a_negotiation_cut_short_leaves_links_missing() {
    let a = three_links();
    let mut n = Negotiation::new(at(), &a);
    open_round(&mut n, &[], offer(&[("h0", 7000, 0)], 2));
    n.next().unwrap();
    n.on_dialled(answered(0)).unwrap();
    // Not finished (no SendFailed(0) yet): nothing is to be accepted.
    let acc = n.accepting(Duration::from_secs(1), Instant::now());
    assert!(!acc.wants_more());
    let err = acc.finish().unwrap_err().to_string();
    assert!(
        err.ends_with("bad negotiation: it ended with links to ranks [2, 3] missing"),
        "{err}"
    );
}

#[test]
fn a_recover_starts_with_no_links() {
    // `recover` reports no good links: the links of an earlier generation may all be
    // closed, so every one is made afresh.
    let a = assignment(at(), Some(1), fields()).unwrap();
    let mut n = Negotiation::new(at(), &a);
    assert_eq!(n.next().unwrap(), Step::SendLinked(vec![]));
}
