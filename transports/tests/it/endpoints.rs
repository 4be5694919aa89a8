//! Endpoint parsing and the typed error for a backend this build does not have.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(any(not(feature = "mpi"), feature = "zmq"))]
use switchyard_transports::{Dealer, DealerSocket};
use switchyard_transports::{Endpoint, SocketOptions, TransportError};
#[cfg(any(not(feature = "mpi"), not(feature = "zmq")))]
use switchyard_transports::{Router, RouterSocket};

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_endpoint_names_the_missing_feature() {
    let err = RouterSocket::bind("mpi://0", SocketOptions::default()).unwrap_err();
    match err {
        TransportError::FeatureNotBuilt { feature, built, .. } => {
            assert_eq!(feature, "mpi");
            assert!(built.contains("local"));
        }
        other => panic!("expected FeatureNotBuilt, got {other}"),
    }
    let text = DealerSocket::connect("mpi://1", SocketOptions::default())
        .unwrap_err()
        .to_string();
    assert!(text.contains("needs the `mpi` cargo feature"), "{text}");
}

#[cfg(not(feature = "zmq"))]
#[test]
fn zmq_endpoints_name_the_missing_feature() {
    let err = RouterSocket::bind("tcp://127.0.0.1:0", SocketOptions::default()).unwrap_err();
    assert!(
        matches!(err, TransportError::FeatureNotBuilt { feature: "zmq", .. }),
        "{err}"
    );
}

#[test]
fn malformed_endpoints_are_invalid() {
    for bad in [
        "",
        "tcp://",
        "tcp://host",
        "tcp://:80",
        "tcp://h:99999",
        "udp://h:1",
        "local://",
        "mpi://-1",
        "nothing",
    ] {
        assert!(
            matches!(
                Endpoint::parse(bad),
                Err(TransportError::InvalidEndpoint { .. })
            ),
            "{bad:?} should be invalid"
        );
    }
    assert_eq!(Endpoint::parse("mpi://3").unwrap(), Endpoint::Mpi(3));
    assert_eq!(
        Endpoint::parse("local://a").unwrap().to_string(),
        "local://a"
    );
}

#[cfg(feature = "zmq")]
#[test]
fn connect_needs_a_real_port() {
    let err = DealerSocket::connect("tcp://127.0.0.1:0", SocketOptions::default()).unwrap_err();
    assert!(
        matches!(err, TransportError::InvalidEndpoint { .. }),
        "{err}"
    );
}
