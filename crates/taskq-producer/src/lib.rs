//! The enqueue side of taskq: put jobs on a beanstalkd-protocol server or a
//! NATS JetStream stream with the least work per job, and say honestly what
//! became of each one.
//!
//! A [`Producer`] holds one connection. [`Producer::put`] is one write and one
//! read with no heap allocation in steady state; [`Producer::put_batch`] sends
//! many jobs in one write and reads the replies in order;
//! [`Producer::put_with_position`] also tells how many ready jobs are in line.
//! A put ends in one of: an id, [`Error::Rejected`] (the server said why),
//! [`Error::Unknown`] (sent, no reply: it may be queued), [`Error::NotSent`] or
//! [`Error::Invalid`] (nothing reached the server). A broken connection is
//! replaced on the next call. [`MultiProducer`] spreads jobs over several servers.
//!
//! The address picks the engine: `HOST:PORT` is beanstalkd, `nats://HOST:PORT`
//! JetStream, where a put is a publish to the tube's subject answered by the
//! stream's PubAck (the job id is the stream sequence). Each JetStream put
//! carries its own `Nats-Msg-Id`, so a put whose outcome is unknown is sent
//! again on a fresh connection, within [`Builder::resolve_for`], and stored once.
//!
//! ```no_run
//! use taskq_producer::{Error, Producer, PutOptions};
//!
//! let mut p = Producer::connect("127.0.0.1:11300")?;
//! p.use_tube("emails")?;
//! match p.put(b"send welcome to 42", PutOptions { ttr: 30, ..PutOptions::default() }) {
//!     Ok(id) => println!("queued as {}", id.get()),
//!     Err(e) if e.outcome_unknown() => println!("may be queued: {e}"),
//!     Err(e) => println!("not queued: {e}"),
//! }
//! # Ok::<(), Error>(())
//! ```
//!
//! With the `tokio` feature, `AsyncProducer` is the same producer for async
//! code, on beanstalkd or JetStream (`nats://`): one tokio `TcpStream`, the
//! same outcomes, batches and reconnect rule, one write and no heap
//! allocation or timer registration per put.
#![cfg_attr(
    feature = "tokio",
    doc = r#"
```no_run
use taskq_producer::{AsyncProducer, Error, Producer, PutOptions};

async fn enqueue() -> Result<(), Error> {
    let mut p = AsyncProducer::connect("127.0.0.1:11300").await?;
    p.use_tube("emails").await?;
    let id = p.put(b"send welcome to 42", PutOptions::default()).await?;
    println!("queued as {id}");
    // Non-default settings: the blocking producer's builder, then `connect_async`.
    let _q = Producer::builder()
        .io_timeout(std::time::Duration::from_millis(500))
        .connect_async("127.0.0.1:11300")
        .await?;
    Ok(())
}
```
"#
)]

#[cfg(feature = "tokio")]
mod async_producer;
mod builder;
mod classify;
mod delays;
mod engine;
mod error;
#[cfg(feature = "serde")]
mod json;
mod multi;
mod nats;
mod outcome;
mod producer;
mod reconnects;
#[cfg(feature = "tokio")]
mod shared;
mod target;

#[cfg(feature = "tokio")]
pub use async_producer::AsyncProducer;
pub use builder::{Builder, DEFAULT_RESOLVE_FOR};
pub use error::{Error, Invalid, NotSent, Rejection};
pub use multi::{MultiProducer, Placed};
pub use outcome::{
    BatchError, BatchReport, Position, PutOutcome, MAX_PIPELINE_BYTES, MAX_PIPELINE_JOBS,
};
pub use producer::Producer;
#[cfg(feature = "tokio")]
pub use shared::{
    SharedProducer, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_PUTS, MAX_QUEUED_PUTS,
};

pub use target::{IntoTarget, Target};
/// What a program needs to reach a secured NATS cluster (credentials, TLS)
/// and the shared connection defaults, re-exported so that it depends on
/// this crate alone.
pub use taskq_connect::nats::{NatsAccess, TlsSettings};
pub use taskq_connect::{Address, AddressError, Engine, READY_AT_HEADER};
pub use taskq_proto::{defaults, Backoff, Jitter, JobId, Secret};

use taskq_proto::Command;

/// How a job is put.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PutOptions {
    /// Priority: 0 is most urgent; below 1024 counts as urgent. Default 1024.
    pub pri: u32,
    /// Seconds before the job becomes ready. Default 0.
    pub delay: u32,
    /// Time to run: seconds a reserved job is held before it goes back to ready
    /// (the server raises 0 to 1). Default 60.
    pub ttr: u32,
}

impl Default for PutOptions {
    fn default() -> Self {
        PutOptions {
            pri: 1024,
            delay: 0,
            ttr: 60,
        }
    }
}

impl PutOptions {
    /// The same options with priority 0: the job goes ahead of every
    /// non-urgent job in its tube (beanstalkd counts priorities below 1024 as
    /// urgent). Between tubes, workers with weighted tubes (`--tube vip:4
    /// --tube standard:1`) decide: put urgent work in the heavier tube too.
    pub fn urgent(self) -> PutOptions {
        PutOptions { pri: 0, ..self }
    }

    #[inline]
    pub(crate) fn command(self, body: &[u8]) -> Command<'_> {
        Command::Put {
            pri: self.pri,
            delay: self.delay,
            ttr: self.ttr,
            body,
        }
    }
}
