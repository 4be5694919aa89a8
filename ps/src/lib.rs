//! A parameter server: a scheduler, servers holding key ranges, workers that push,
//! pull and push_pull.
//!
//! The roles are those of ps-lite. Control messages travel over switchyard's
//! Dealer/Router sockets (`tcp://` between processes, `local://` or `inproc://`
//! between threads); values (push, pull, push_pull, init and their answers) over a
//! data plane of their own, as in FPT: the collectives' links, opened worker <->
//! server once every node has registered, TCP between hosts and shared memory within
//! one ([`DataPlane`]; `SWITCHYARD_PS_DATA=zmq` keeps them on ZeroMQ, and a job whose
//! links cannot be opened falls back to it). On the data plane a sync round's answer
//! brings every pushing worker the keys' values, and a pull of them afterwards is a
//! copy of that answer ([`KvWorker::pull`]).
//!
//! - the [`Scheduler`] binds a known endpoint; every node registers with it, gets
//!   its rank and the servers' endpoints (ps-lite's ADD_NODE), and keeps a heartbeat
//!   going. The scheduler releases barriers ([`Group`]: workers, servers or all),
//!   shuts the servers down once every worker has finished, and aborts the job,
//!   naming the node, when one falls silent for [`PsConfig::dead_timeout`];
//! - a [`KvServer`] holds the keys its [`Placement`] gives it and applies an
//!   [`Update`] ([`Update::Sum`], [`Update::Sgd`], a closure) to the pushes, each
//!   key's pushes of a round together ([`Mode::Sync`]) or one by one ([`Mode::Async`]);
//! - a [`KvWorker`] pushes and pulls lists of `u64` keys with per-key value lengths.
//!
//! Processes find each other through ps-lite's environment ([`PsEnv`]: `DMLC_ROLE`,
//! `DMLC_NUM_WORKER`, `DMLC_NUM_SERVER`, `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`), or
//! are given the scheduler's endpoint in code.
//!
//! # Singa's kinds
//!
//! Singa's workers and servers exchange parameters with four message kinds; each is
//! one call here:
//!
//! | Singa | here |
//! |---|---|
//! | `kGet`: ask a server for a parameter | [`KvWorker::pull`] |
//! | `kPut`: store a parameter's first value | [`KvWorker::init`] |
//! | `kUpdate`: send a gradient, get the new value back | [`KvWorker::push_pull`] (with [`Update::Sgd`] or a closure) |
//! | `kSync`: servers of different groups agree on a value | a [`Mode::Sync`] round: every worker's push of the key, applied once |
//!
//! # Errors, not hangs
//!
//! A pull of a key nobody pushed fails with [`PsError::NeverPushed`]; a push whose
//! length differs from the key's with [`PsError::LengthChanged`]; a request of another
//! element type than the servers' with [`PsError::TypeMismatch`]; a sync round that
//! some workers never join with [`PsError::RoundIncomplete`] at
//! [`PsConfig::request_timeout`]. A push is applied by every server it reaches or by
//! none: the first push of keys to several servers is checked by all of them before
//! it is sent, and a push that outwaits the request timeout is withdrawn in two
//! phases, from every server or (when one has applied it already) from none (see
//! [`KvWorker::wait`]). A server, worker
//! or scheduler that dies makes every waiting call fail within
//! [`PsConfig::dead_timeout`] (plus a heartbeat) with [`PsError::Aborted`] or
//! [`PsError::SchedulerSilent`] naming it, and the servers and scheduler return
//! (unless replication replaces a dead server, below).
//!
//! # Replication
//!
//! With [`PsConfig::replicate`] on (`SWITCHYARD_PS_REPLICATE=1`), each server's keys
//! are also kept by the next server of the ring: after a request changes keys, the
//! server sends their new values to that server and answers the workers only once
//! it has acknowledged them. When a server falls silent, the scheduler announces a
//! failover instead of aborting; the next server serves the dead one's keys from its
//! copy, and workers send it the requests the dead server had not answered (each
//! server remembers, per key, the last request of each worker it has counted, so a
//! request sent twice is answered, not added twice). Sums stay exact. One server may
//! die per job: the server that took over keeps no second copy.
//!
//! # Examples
//!
//! See [`KvServer`] for a whole job in one process.

mod config;
mod control;
mod data;
mod error;
mod node;
mod pool;
mod replica;
mod routing;
mod schedule;
mod scheduler;
mod server;
mod shard;
mod split;
mod store;
#[cfg(test)]
mod testing;
mod update;
mod value;
mod wire;
mod withdraw;
mod worker;

// The tests below drive the crate-private hooks (`KvServer::run_until`, `testing`) and
// share the integration tests' job helpers (`tests/ps_support`), which name the crate
// by its external name.
#[cfg(test)]
extern crate self as switchyard_ps;
#[cfg(test)]
mod data_tests;
#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod halves_common;
#[cfg(test)]
mod halves_tests;
#[cfg(test)]
#[path = "../tests/ps_support/mod.rs"]
mod ps_support;
#[cfg(test)]
mod replication_tests;
#[cfg(test)]
mod sim_tests;

pub use config::{DataPlane, PsConfig, PsEnv, PsRole};
pub use error::PsError;
pub use scheduler::{JobReport, Scheduler};
pub use server::{KvServer, ServerReport};
pub use shard::{Piece, Placement, Sharding};
pub use split::KvValues;
pub use update::{Mode, Update, UpdateFn};
pub use value::Value;
pub use wire::{Group, NodeRole};
pub use worker::{KvWorker, Ticket};
