//! `UniqueId` + `Communicator::from_unique_id`: ranks as threads of this process, on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::time::Duration;
use switchyard::bootstrap::UniqueId;
use switchyard::bootstrap::unique_id::{IdError, exchange};
use switchyard::collective::{CommOptions, Communicator, ReduceOp};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn options() -> CommOptions {
    let mut o = CommOptions::default();
    o.timeout = Duration::from_secs(10);
    o
}

/// Every rank of `world` runs `Communicator::from_unique_id` and an allreduce of `rank + 1`.
fn job(id: UniqueId, world: usize) {
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut comm = Communicator::from_unique_id(&id, rank, world, options())?;
                assert_eq!((comm.rank(), comm.world_size()), (rank, world));
                let mut x = [rank as u64 + 1];
                comm.allreduce(&mut x, ReduceOp::Sum)?;
                Ok::<_, switchyard::collective::CollectiveError>(x[0])
            })
        })
        .collect();
    let want = (world * (world + 1) / 2) as u64;
    for r in ranks {
        assert_eq!(r.join().expect("rank thread").unwrap(), want);
    }
}

/// A check-in as a rank would send it, written by hand.
fn check_in(tag: u64, rank: u32, world: u32, ring: &str) -> Vec<u8> {
    let mut out = b"SYUI".to_vec();
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&world.to_le_bytes());
    out.extend_from_slice(&(ring.len() as u32).to_le_bytes());
    out.extend_from_slice(ring.as_bytes());
    out
}

#[test]
fn four_ranks_form_a_mesh() {
    job(UniqueId::new_on(LO).unwrap(), 4);
}

#[test]
fn world_of_one_and_of_two() {
    job(UniqueId::new_on(LO).unwrap(), 1);
    job(UniqueId::new_on(LO).unwrap(), 2);
}

#[test]
fn the_printed_id_is_enough() {
    let id = UniqueId::new_on(LO).unwrap();
    let text = id.to_string();
    let theirs: UniqueId = text.parse().unwrap();
    assert_eq!(theirs, id);
    job(theirs, 3);
}

#[test]
fn root_bound_by_rank_zero_at_a_given_address() {
    // The MASTER_ADDR way: nobody made the listener; rank 0 binds the id's port, and a
    // rank started first retries until it does.
    let port = std::net::TcpListener::bind((LO, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = UniqueId::at((LO, port).into(), 42);
    let early = std::thread::spawn(move || exchange(&id, 1, 2, LO, "one", Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(100)); // rank 0 starts late on purpose
    let zero = exchange(&id, 0, 2, LO, "zero", Duration::from_secs(10)).unwrap();
    assert_eq!(zero, ["zero", "one"]);
    assert_eq!(early.join().unwrap().unwrap(), ["zero", "one"]);
}

#[test]
fn a_wrong_tag_is_closed_and_the_job_goes_on() {
    let id = UniqueId::new_on(LO).unwrap();
    let mut stranger = TcpStream::connect(id.root()).unwrap();
    stranger
        .write_all(&check_in(id.tag() ^ 1, 0, 2, "127.0.0.1:1"))
        .unwrap();
    let job = std::thread::spawn(move || job(id, 2));
    stranger
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        stranger.read(&mut buf).unwrap(),
        0,
        "closed without an answer"
    );
    job.join().unwrap();
}

#[test]
fn a_duplicate_rank_is_refused_and_the_job_goes_on() {
    let id = UniqueId::new_on(LO).unwrap();
    // Two processes claim rank 1: whichever the root hears second is refused, the
    // other joins, and the job of three completes. Rank 2 starts only once the refusal
    // is in: a claim that reached the root after the job was complete would find its
    // listener gone (a reset), not a root to refuse it.
    let claims = [(0, "zero"), (1, "one-a"), (1, "one-b"), (2, "two")];
    let spawn = |(rank, name): (u32, &'static str)| {
        std::thread::spawn(move || exchange(&id, rank, 3, LO, name, Duration::from_secs(10)))
    };
    let mut threads: Vec<_> = claims[..3].iter().map(|&c| spawn(c)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !threads[1].is_finished() && !threads[2].is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "no claim of rank 1 was refused"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    threads.push(spawn(claims[3]));
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let refused: Vec<usize> = (0..4).filter(|&i| results[i].is_err()).collect();
    assert!(refused == [1] || refused == [2], "{results:?}");
    let e = results[refused[0]].as_ref().unwrap_err();
    assert!(matches!(e, IdError::DuplicateRank { rank: 1, .. }), "{e}");
    let winner = claims[3 - refused[0]].1;
    for (i, r) in results.iter().enumerate() {
        if i != refused[0] {
            assert_eq!(r.as_ref().unwrap(), &["zero", winner, "two"]);
        }
    }
}

#[test]
fn a_wrong_world_size_is_refused_and_the_job_goes_on() {
    let id = UniqueId::new_on(LO).unwrap();
    let zero = std::thread::spawn(move || exchange(&id, 0, 2, LO, "zero", Duration::from_secs(10)));
    let wrong = exchange(&id, 1, 3, LO, "wrong", Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(wrong, IdError::WrongWorld { world: 3, .. }),
        "{wrong}"
    );
    let one = exchange(&id, 1, 2, LO, "one", Duration::from_secs(10)).unwrap();
    assert_eq!(one, ["zero", "one"]);
    assert_eq!(zero.join().unwrap().unwrap(), ["zero", "one"]);
}

#[test]
fn an_unreachable_root_is_named_within_the_timeout() {
    let port = std::net::TcpListener::bind((LO, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = UniqueId::at((LO, port).into(), 1);
    let started = std::time::Instant::now();
    let e = exchange(&id, 1, 2, LO, "one", Duration::from_millis(500)).unwrap_err();
    // What this tells apart is a wait without a deadline: a bound far above the
    // 500 ms timeout cannot trip on a loaded runner.
    assert!(started.elapsed() < Duration::from_secs(10));
    match e {
        IdError::Unreachable { addr, .. } => assert_eq!(addr, id.root()),
        other => panic!("expected Unreachable, got {other}"),
    }
}

#[test]
fn bad_ranks_are_refused_before_any_traffic() {
    let id = UniqueId::at((LO, 9).into(), 1);
    assert!(matches!(
        exchange(&id, 2, 2, LO, "x", Duration::from_secs(1)),
        Err(IdError::BadRank { rank: 2, world: 2 })
    ));
    assert!(Communicator::from_unique_id(&id, 0, 0, options()).is_err());
}

#[test]
fn bootstrap_exchange_swaps_stub_endpoints_through_the_root() {
    use switchyard::bootstrap::{Bootstrap, Rendezvous};
    let id = UniqueId::new_on(LO).unwrap();
    let ranks: Vec<_> = (0..3u32)
        .map(|rank| {
            std::thread::spawn(move || {
                let boot = Bootstrap {
                    rank,
                    world_size: 3,
                    rendezvous: Rendezvous::UniqueId(id),
                };
                assert_eq!(boot.bind_endpoint().unwrap(), "tcp://127.0.0.1:0");
                boot.exchange(&format!("stub-{rank}"), Duration::from_secs(10))
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap().unwrap(), ["stub-0", "stub-1", "stub-2"]);
    }
}

#[test]
fn an_id_on_the_default_address_works_on_this_host() {
    // Whatever address `new` picks (the default route's, another interface's or
    // loopback), ranks on this host reach it.
    let id = UniqueId::new().unwrap();
    job(id, 2);
}
