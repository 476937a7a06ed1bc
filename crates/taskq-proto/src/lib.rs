//! The protocol core of taskq, for both engines: beanstalkd and NATS JetStream.
//!
//! Two layers, as in `quinn-proto`, for each engine. beanstalkd: a codec with
//! no sockets and no clocks ([`Command`] encodes into a caller-owned buffer,
//! [`parse_reply`] decodes in place into borrowed [`Reply`] values, [`yaml`]
//! reads statistics), the [`Session`] over it, and a blocking [`Connection`] on
//! top that sends each request with one write call and reads each reply
//! against a whole-reply deadline. NATS JetStream, in [`nats`]: the client
//! protocol's codec and the [`NatsSession`](nats::NatsSession) (what is sent,
//! which replies and PubAcks are owed, `PING`s, deliveries). What both
//! engines share: [`Secret`], [`Backoff`] (the one reconnect rule) and the
//! one set of connection [`defaults`] every part of taskq reads. In steady
//! state nothing allocates. Without the default feature (`blocking`) the crate
//! is the codecs and sessions alone, on memchr and itoa.
//!
//! What connecting needs beyond the protocol (addresses, TLS, credentials,
//! the NATS drivers, the JetStream management API, the tokio drivers) is in
//! the `taskq-connect` crate.
//!
//! ```
//! use taskq_proto::{parse_reply, Command, Limits, Reply, Status};
//!
//! let mut buf = [0u8; 64];
//! let put = Command::Put { pri: 10, delay: 0, ttr: 60, body: b"hi\r\nthere" };
//! let n = put.encode(&mut buf, 65535).unwrap();
//! assert_eq!(&buf[..n], b"put 10 0 60 9\r\nhi\r\nthere\r\n");
//!
//! let reply = parse_reply(put.kind(), b"INSERTED 42\r\n", &Limits::default()).unwrap();
//! assert_eq!(reply, Status::Complete(Reply::Inserted { id: 42 }, 13));
//! // Decoding knows the command: bare BURIED cannot answer a put.
//! assert!(parse_reply(put.kind(), b"BURIED\r\n", &Limits::default()).is_err());
//! ```

mod backoff;
mod command;
#[cfg(feature = "blocking")]
mod conn;
pub mod defaults;
mod error;
mod job_id;
pub mod nats;
mod reply;
mod secret;
#[cfg(feature = "server")]
pub mod server;
pub mod session;
mod shown;
pub mod yaml;

pub use backoff::{Backoff, Jitter, Reconnect};
pub use command::{
    is_tube_byte, secs_ceil, validate_tube, Command, CommandKind, MAX_RESERVE_TIMEOUT,
};
#[cfg(feature = "blocking")]
pub use conn::{sock::SockIo, Connection, ConnectionConfig, Interrupter, IoCounts};
pub use error::{ConnectionError, EncodeError, ReplyError, TubeNameError, YamlError};
pub use job_id::JobId;
pub use reply::{parse_reply, parse_u64, Limits, Reply, Status};
pub use secret::Secret;
pub use session::{earliest, Framed, RecvBuf, Request, Session, INLINE_REQUEST};
pub use shown::{peer_text, push_printable, MAX_PEER_TEXT};
pub use yaml::{JobStats, ServerStats, TubeStats};

/// Longest command or reply line, CRLF included. The server answers `BAD_FORMAT` to a longer command.
pub const MAX_LINE: usize = 224;
/// Longest tube name in bytes.
pub const MAX_TUBE_NAME: usize = 200;
/// beanstalkd's default maximum job size (`-z`).
pub const DEFAULT_MAX_JOB_SIZE: usize = 65535;
/// Default limit on a YAML document from `stats*` or `list-tubes*`.
pub const DEFAULT_MAX_YAML_SIZE: usize = 1 << 20;

/// The README's example, compiled and run as a doctest (the README is the
/// crate's page on crates.io).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
