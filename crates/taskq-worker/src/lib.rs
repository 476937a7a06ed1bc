//! A blocking worker for work queues that never loses a job: beanstalkd-protocol
//! servers, and NATS JetStream clusters (a `nats://` or `tls://` address).
//!
//! A [`Worker`] runs a [`Handler`] on each job it reserves and settles the job by
//! the [`Outcome`] the handler returns: delete, release, or bury. It counts a job
//! done only when the server confirms it (`DELETED`, or JetStream's ack
//! confirmation), survives cut, silent and dead
//! connections by reconnecting with capped, jittered backoff, and stops cleanly:
//! [`Control::shutdown`] stops taking jobs and lets the running ones finish,
//! and [`Control::abort`] (`taskq-worker`'s second signal) gives them back
//! at once.
//!
//! [`AsyncWorker`] runs async handlers on the program's tokio runtime
//! instead (feature `tokio`, kept for the programs that name it).
//!
//! Both run one worker state machine per server (the window of jobs in
//! flight, settling, leases, fairness, the idle rule, the acks sent again),
//! written once without I/O, each on one connection to the server, driven
//! by one driver task: the async worker's on the program's runtime, the
//! blocking worker's on a small runtime of its own on one thread, with its
//! handlers on threads (`Config::concurrency` of them running at once, per
//! server). After a job its `delete` goes out with the next
//! `reserve-with-timeout` (or pull) in one write. See docs/async-worker.md.
//!
//! # Weighted tubes
//!
//! beanstalkd serves the tubes a connection watches in strict priority order,
//! then oldest first, so a steady stream of urgent jobs starves every other
//! tube. Give [`Config::weights`] (or `--tube vip:4 --tube standard:1` to
//! `taskq-worker`; plain `--tube NAME` keeps the strict order) and each
//! connection follows this rule instead:
//!
//! 1. The tubes take turns in the order given; tube `i`'s turn is a run of
//!    `weights[i] * run_scale` jobs ([`Config::run_scale`], default 8).
//! 2. During tube `i`'s run the connection watches tube `i` alone and reserves
//!    with `reserve-with-timeout 0`, which answers at once. The `watch`/`ignore`
//!    commands of a switch go out in the same write as the previous job's
//!    `delete` and the next reserve: no extra round trip, two extra commands per
//!    switch.
//! 3. When tube `i` answers `TIMED_OUT` (no ready job), the rest of its run is a
//!    fallback run: the connection watches all the weighted tubes and makes
//!    ordinary blocking reserves (the server's order), so an idle tube's share
//!    goes to the others and an empty queue costs one reserve per reserve
//!    timeout, as in strict mode. After as many jobs as were left of the run,
//!    the next tube has its turn.
//!
//! So while every tube has ready jobs, tube `i` gets `weights[i] / sum(weights)`
//! of the jobs each connection takes, whatever the jobs' priorities and ages;
//! priorities still order jobs within a tube. A tube with nothing ready costs
//! one immediate `TIMED_OUT` round trip per cycle. Each connection (one per
//! server) keeps its own schedule, starting at the tube of the server's index,
//! so servers start at different tubes.
//!
//! ```no_run
//! use taskq_worker::{Config, Outcome, Worker};
//!
//! let cfg = Config {
//!     servers: vec!["127.0.0.1:11300".into()],
//!     concurrency: 4,
//!     ..Config::default()
//! };
//! let worker = Worker::new(cfg, |job: &mut taskq_worker::Job<'_>| {
//!     println!("job {}: {} bytes", job.id(), job.body().len());
//!     Outcome::Done
//! })
//! .unwrap();
//! let counts = worker.run();
//! println!("{counts}");
//! ```

mod async_worker;
pub mod command;
mod config;
mod counters;
mod engine;
mod failure;
mod fair;
mod handler;
mod job;
mod job_info;
#[cfg(feature = "serde")]
mod json;
mod machine;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "cli")]
pub mod nats_cli;
mod shared;
pub mod table;
mod worker;

pub use async_worker::{AsyncJob, AsyncWorker};
pub use config::{Config, ConfigError, JetStreamConfig};
pub use counters::{Counters, Snapshot, COUNTER_HELP};
pub use handler::{Handler, Outcome};
pub use job::{Job, JobError};
pub use job_info::JobInfo;
#[cfg(feature = "serde")]
pub use json::{DecodeError, DecodeErrorKind};
/// What a program needs to reach a secured NATS cluster (credentials, TLS,
/// in [`JetStreamConfig::access`]) and the shared connection defaults,
/// re-exported so that it depends on this crate alone.
pub use taskq_connect::nats::{NatsAccess, TlsSettings};
pub use taskq_connect::{Address, AddressError, Engine};
pub use taskq_proto::{defaults, Backoff, Jitter, JobId, Secret};
pub use worker::{Control, Running, Worker};

/// The README's Rust examples, compiled as doctests so they cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// This crate's README's example (its page on crates.io), compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;
