//! The NATS session: one connection's protocol state with no socket, and
//! the deadlines it keeps on the instants its driver gives it, as
//! [`crate::session`] is for beanstalkd.
//!
//! A [`NatsSession`] encodes operations into its own send buffer (a put's
//! line and headers through a kept [`PutEncoder`](crate::nats::PutEncoder)),
//! hands out reply tokens on its inbox and remembers what is owed (the pull
//! under way, PubAcks of queued publishes, ack confirmations, `PONG`s for
//! the server's `PING`s), takes the bytes a driver read and yields what the
//! driver waits for, borrowed from its receive buffer. A driver (the blocking
//! or the tokio one of `taskq-connect`)
//! owns the socket, TLS and the clock: it writes what the session encoded
//! with one write, answers `PING`s, reads into the room the session gives,
//! says when it begins to wait, and wakes at the session's next deadline
//! (the rules of each are the session's: see `clock.rs`).
//!
//! ```
//! use taskq_proto::nats::{NatsLimits, NatsSession};
//!
//! let mut s = NatsSession::with_inbox(NatsLimits::default(), "127.0.0.1:4222", b"_INBOX.t.");
//! let put = s.start_put_whole(b"taskq.T", b"id-1", &[], b"hi").unwrap();
//! let token = put.token;
//! assert!(put.head.starts_with(b"HPUB taskq.T _INBOX.t.1 "));
//! s.queue_sent();
//! // A server PING, then the PubAck, arriving in two pieces.
//! let ack = r#"{"stream":"TASKQ","seq":7}"#;
//! let wire = format!("PING\r\nMSG _INBOX.t.1 1 {}\r\n{ack}\r\n", ack.len());
//! let (a, b) = wire.as_bytes().split_at(16);
//! for piece in [a, b] {
//!     assert!(s.poll_reply(token).unwrap().is_none());
//!     let room = s.recv_room().unwrap();
//!     room[..piece.len()].copy_from_slice(piece);
//!     s.received(piece.len());
//! }
//! let m = s.poll_reply(token).unwrap().expect("the whole PubAck");
//! assert_eq!(s.puback(m).unwrap().stream_seq, 7);
//! assert_eq!(s.pong(), Some(&b"PONG\r\n"[..]));
//! ```

mod clock;
mod handshake;
mod publish;
mod pull;
mod request;
mod state;

pub use handshake::{Credentials, Handshake, HandshakeStep, Signed};
pub use publish::{PubAck, Put};
pub use pull::{pull_grace, Delivery, DeliveryFrame, PULL_GRACE};
pub use state::{random_inbox, Event, Hello, NatsSession, PONG};
