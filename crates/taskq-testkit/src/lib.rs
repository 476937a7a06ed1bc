//! Test support for taskq, for both engines: real `beanstalkd` and
//! `nats-server` (JetStream, one node or a cluster) harnesses, a
//! beanstalkd-compatible reference server with a ledger and fault plans, and a
//! fault-injecting proxy.
//!
//! - [`Beanstalkd`]: the real server as a child process on a free loopback port.
//! - [`NatsCluster`]: real `nats-server` nodes with JetStream, one or a cluster,
//!   with kill -9, SIGSTOP/SIGCONT and restart of a node.
//! - [`TestServer`]: the reference server in this process, with a [`Ledger`] of
//!   every job and connection and [`FaultPlan`]s that make it misbehave on demand.
//! - [`alloc::CountingAllocator`]: counts allocations, for the zero-allocation tests.
//! - [`TestCerts`]: a CA, server and client certificates made with `openssl`, for TLS tests.
//! - [`TempDir`]: a scratch directory removed on drop.
//! - [`ChaosProxy`]: a TCP proxy with run-time [`Toxic`]s (latency, reset,
//!   silence, data limit, slicer) to put in front of either.
//!
//! Everything listens on 127.0.0.1 only and stops when dropped.

// A global allocator can only be written with `unsafe`; it forwards to `System`.
#[allow(unsafe_code)]
pub mod alloc;
pub mod beanstalkd;
// Sends SIGSTOP/SIGCONT to its nodes with kill(2).
#[allow(unsafe_code)]
pub mod nats;
pub mod pki;
pub mod proxy;
pub mod server;
pub mod tempdir;

pub use beanstalkd::Beanstalkd;
pub use nats::{
    binary_version, current_node, current_server_binary, oldest_node, server_binary, NatsBuilder,
    NatsCluster, ServerVersion, DEBIAN_SERVER,
};
pub use pki::TestCerts;
pub use proxy::{ChaosProxy, Direction, Toxic};
pub use server::{
    ConnCounts, Defects, Fault, FaultPlan, JobHistory, Ledger, LedgerReport, ServerConfig, Target,
    TestServer,
};
pub use tempdir::TempDir;

/// The README's example, compiled and run as a doctest (the README is the
/// crate's page on crates.io).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
