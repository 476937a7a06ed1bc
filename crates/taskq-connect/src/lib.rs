//! What connecting to a taskq server takes beyond the protocol core of
//! `taskq-proto`: everything that touches a secret, a certificate, a
//! management API or a runtime.
//!
//! - [`Address`]: an address as users write it (`HOST:PORT`,
//!   `beanstalk://`, `nats://`, `tls://`, with credentials as user info),
//!   the engine it selects, and its credentials kept as secrets.
//! - [`nats::NatsAccess`]: how a client proves who it is to a NATS server
//!   (user and password, token, nkey seed, JWT credentials file) and how it
//!   encrypts the connection ([`nats::TlsSettings`]).
//! - [`nats::NatsConnection`]: the blocking NATS driver over
//!   `taskq_proto::nats::NatsSession`, with TLS (rustls, feature `secure`),
//!   nonce signing and the JetStream management API (feature `jetstream`).
//! - [`Layout`]: taskq's names on JetStream (stream, subjects, consumers).
//! - [`tokio`] (feature `tokio`): the tokio drivers of both engines,
//!   [`tokio::AsyncConn`] and [`tokio::AsyncNatsConn`], with the kept
//!   deadline timer they share.
//!
//! The producers and the worker re-export what a user needs of this crate,
//! so most users depend on `taskq-producer` or `taskq-worker` alone.
//!
//! ```
//! use taskq_connect::{Address, Engine};
//!
//! let a = Address::parse("nats://alice:s3cret@127.0.0.1:4222").unwrap();
//! assert_eq!(a.engine(), Engine::Nats);
//! assert!(!a.to_string().contains("s3cret"));
//! ```

mod address;
pub mod layout;
pub mod nats;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use address::{redact_address, Address, AddressError, Engine, UserInfo, NATS_DEFAULT_PORT};
pub use layout::{validate_subject_tube, Layout, SubjectKind, DEFAULT_STREAM, READY_AT_HEADER};
pub use taskq_proto::{defaults, Secret};

/// The README's example, compiled and run as a doctest (the README is the
/// crate's page on crates.io).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
