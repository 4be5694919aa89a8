//! `Bootstrap::from_lookup` (what `Bootstrap::from_env` reads the process environment
//! with) and the DMLC tracker variables.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchyard::bootstrap::{Bootstrap, BootstrapError, Rendezvous};
use switchyard::collective::TrackerProtocol;

/// The variables are injected: nothing here reads or changes the process
/// environment, so the cases need neither a child process nor `set_var`.
fn with(vars: &[(&str, &str)]) -> Result<Option<Bootstrap>, BootstrapError> {
    Bootstrap::from_lookup(vars)
}

/// The variable an environment error names, and the whole message.
fn env_error(r: Result<Option<Bootstrap>, BootstrapError>) -> (String, String) {
    match r {
        Err(BootstrapError::Env(e)) => (e.var().to_string(), e.to_string()),
        other => panic!("expected an environment error, got {other:?}"),
    }
}

#[test]
fn dmlc_tracker_variables() {
    assert_eq!(with(&[]).unwrap(), None);

    let boot = with(&[
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
        ("DMLC_TASK_ID", "w3"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        boot.rendezvous,
        Rendezvous::Tracker {
            host: "127.0.0.1".into(),
            port: 9091,
            task_id: Some("w3".into()),
            protocol: TrackerProtocol::Classic,
        }
    );
    assert_eq!((boot.rank, boot.world_size), (0, 0));
    assert_eq!(boot.stub_endpoint(), "tcp://127.0.0.1:0");
    assert!(matches!(
        boot.exchange("tcp://127.0.0.1:1", std::time::Duration::from_secs(1)),
        Err(BootstrapError::Rendezvous { .. })
    ));

    let boot = with(&[
        ("DMLC_TRACKER_URI", "localhost"),
        ("DMLC_TRACKER_PORT", "9091"),
        ("DMLC_NUM_WORKER", "4"),
        ("SWITCHYARD_TRACKER_PROTOCOL", "JSON"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(boot.world_size, 4);
    assert!(matches!(
        boot.rendezvous,
        Rendezvous::Tracker {
            task_id: None,
            protocol: TrackerProtocol::Json,
            ..
        }
    ));

    // Half-set: the error names the missing variable.
    let (var, reason) = env_error(with(&[("DMLC_TRACKER_URI", "127.0.0.1")]));
    assert_eq!(var, "DMLC_TRACKER_PORT");
    assert!(reason.contains("DMLC_TRACKER_URI is set"), "{reason}");
    let (var, _) = env_error(with(&[("DMLC_TRACKER_PORT", "9091")]));
    assert_eq!(var, "DMLC_TRACKER_URI");

    let (var, reason) = env_error(with(&[("DMLC_TASK_ID", "w1")]));
    assert_eq!(var, "DMLC_TRACKER_URI");
    assert!(reason.contains("DMLC_TASK_ID is set"), "{reason}");

    // Servers do not join the tracker; workers do.
    let tracker = [
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
    ];
    let (var, _) = env_error(with(&[tracker[0], tracker[1], ("DMLC_ROLE", "server")]));
    assert_eq!(var, "DMLC_ROLE");
    assert!(
        with(&[tracker[0], tracker[1], ("DMLC_ROLE", "worker")])
            .unwrap()
            .is_some()
    );

    // Malformed values.
    let (var, _) = env_error(with(&[
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "ninety"),
    ]));
    assert_eq!(var, "DMLC_TRACKER_PORT");
    let (var, text) = env_error(with(&[
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
        ("DMLC_NUM_WORKER", "four"),
    ]));
    assert_eq!(var, "DMLC_NUM_WORKER");
    assert!(
        text.starts_with("DMLC_NUM_WORKER=\"four\": expected"),
        "{text}"
    );
    let (var, reason) = env_error(with(&[
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
        ("SWITCHYARD_TRACKER_PROTOCOL", "grpc"),
    ]));
    assert_eq!(var, "SWITCHYARD_TRACKER_PROTOCOL");
    assert!(reason.contains("classic or json"), "{reason}");

    // XGBoost's "no tracker" sentinel.
    assert_eq!(
        with(&[("DMLC_TRACKER_URI", "NULL"), ("DMLC_TRACKER_PORT", "9091")]).unwrap(),
        None
    );

    // `switchyard launch` sets both; its own rendezvous wins.
    let boot = with(&[
        ("SWITCHYARD_RANK", "1"),
        ("SWITCHYARD_WORLD_SIZE", "2"),
        ("SWITCHYARD_RENDEZVOUS", "127.0.0.1:5000"),
        ("DMLC_TRACKER_URI", "127.0.0.1"),
        ("DMLC_TRACKER_PORT", "9091"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        boot.rendezvous,
        Rendezvous::Launcher("127.0.0.1:5000".into())
    );
    assert_eq!((boot.rank, boot.world_size), (1, 2));
}
