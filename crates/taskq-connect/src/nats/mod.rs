//! NATS beyond the protocol: how a client authenticates and encrypts
//! ([`NatsAccess`], [`TlsSettings`]), the blocking driver
//! [`NatsConnection`] over `taskq_proto::nats::NatsSession`, and the
//! JetStream management API on it (feature `jetstream`: [`StreamSpec`],
//! [`ConsumerSpec`] and what the server reports of them).

pub mod access;
#[cfg(feature = "jetstream")]
pub mod api;
pub(crate) mod client;
pub mod pin;

pub use access::{NatsAccess, TlsSettings};
#[cfg(feature = "jetstream")]
pub use api::{run_blocking, ApiLink, JetStream};
#[cfg(feature = "secure")]
pub use client::tls::TlsStep;
#[cfg(feature = "jetstream")]
pub use client::{ConsumerInfo, ConsumerSpec, MsgSelect, StoredMsg, StreamInfo, StreamSpec};
pub use client::{NatsConfig, NatsConnection, Parts, TlsSession};
pub use pin::TlsPins;
