//! The NATS client protocol and the parts of JetStream that taskq's hot path
//! needs, sans-I/O: no sockets, no clocks, no allocation sized by the peer.
//!
//! - [`parse_op`] decodes one server operation (`INFO`, `MSG`, `HMSG`, `PING`,
//!   `PONG`, `+OK`, `-ERR`) in place, borrowing the input buffer.
//! - [`HeaderBlock`] reads a `NATS/1.0` header block (status, description,
//!   case-insensitive lookup) without allocating.
//! - The `encode_*` functions append client operations to a caller-owned
//!   `Vec<u8>`; [`PutEncoder`] is the put hot path, which rewrites only what
//!   changes from one publish to the next.
//! - [`parse_js_reply`] reads a JetStream PubAck (or its error object) and
//!   [`AckInfo::parse`] an ack subject, both by hand and without allocation.
//! - [`schedule`] writes the headers of a delay the server holds (message
//!   schedules, nats-server 2.12+), rounded up to the whole second.
//! - [`NatsSession`] is one connection's state over all of these: what is
//!   sent, which replies are owed, `PING`s to answer, deliveries. Its
//!   drivers (blocking, and tokio) are in the `taskq-connect` crate, with
//!   TLS, credentials and the JetStream management API.
//!
//! ```
//! use taskq_proto::nats::{parse_op, NatsLimits, ServerOp};
//! use taskq_proto::Status;
//!
//! let wire = b"MSG _INBOX.x.7 1  27\r\n{\"stream\":\"TASKQ\", \"seq\":1}\r\n";
//! let Status::Complete(ServerOp::Msg(m), n) = parse_op(wire, &NatsLimits::default()).unwrap() else {
//!     panic!("a whole MSG");
//! };
//! assert_eq!((m.subject, m.sid, m.reply, n), (&b"_INBOX.x.7"[..], 1, None, wire.len()));
//! let ack = taskq_proto::nats::parse_js_reply(m.payload).unwrap();
//! assert_eq!(ack.ok().map(|a| a.seq), Some(1));
//! ```

mod ack;
mod encode;
mod error;
mod headers;
pub(crate) mod json;
pub(crate) mod op;
mod request_error;
pub mod schedule;
pub mod session;
mod span;

pub use ack::{AckInfo, AckKind};
pub use encode::{
    encode_connect, encode_hpub, encode_ping, encode_pong, encode_pub, encode_sub, encode_unsub,
    validate_subject, ConnectOptions, Headers, PutEncoder,
};
pub use error::{NatsEncodeError, NatsProtoError};
pub use headers::HeaderBlock;
pub use json::{parse_info, parse_js_reply, ApiErrorRef, InfoRef, JsReply, PubAckRef};
pub use op::{parse_frame, parse_op, Frame, MsgFrame, MsgOp, ServerOp};
pub use request_error::{ApiError, NatsError, Refusal, TlsError, TlsFailure, WAITING_FOR_INFO};
pub use schedule::{holds_schedules, ScheduleAt};
pub use session::{
    pull_grace, Credentials, Delivery, Event, Handshake, HandshakeStep, NatsSession, PubAck,
    PULL_GRACE,
};
pub use span::Span;

/// True when subject pattern `pattern` (with `*` and `>`) matches every
/// subject `subject` matches (for a literal `subject`: matches it). Used to
/// check that a stream captures taskq's subjects and that no consumer's
/// filter takes in the subjects of delayed jobs.
///
/// ```
/// use taskq_proto::nats::subject_covers;
/// assert!(subject_covers("taskq.>", "taskq.t.delayed.1.x"));
/// assert!(!subject_covers("taskq.t", "taskq.t.delayed.1.x"));
/// assert!(subject_covers("taskq.*", "taskq.t"));
/// ```
pub fn subject_covers(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The NATS server's default `max_payload`: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;
/// Default limit on a control line other than `INFO` (`MSG`, `HMSG`, `-ERR`, ...), CRLF included.
pub const DEFAULT_MAX_LINE: usize = 4096;
/// Default limit on an `INFO` line, which lists a cluster's `connect_urls`.
pub const DEFAULT_MAX_INFO: usize = 64 * 1024;

/// Room for the JSON around a stored message that JetStream's API hands
/// back (`STREAM.MSG.GET`), beside its subject: the reply's type, the
/// sequence, the time, the quotes and keys, and the rounding of two base64
/// fields.
const API_ENVELOPE: usize = 512;

/// What a parser accepts from a NATS server before it calls the peer wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatsLimits {
    /// Largest payload (headers included) sent; what is accepted is derived
    /// from it ([`max_incoming`](Self::max_incoming)).
    pub max_payload: usize,
    /// Longest control line other than `INFO`, CRLF included.
    pub max_line: usize,
    /// Longest `INFO` line, CRLF included.
    pub max_info: usize,
}

impl Default for NatsLimits {
    fn default() -> Self {
        NatsLimits {
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_line: DEFAULT_MAX_LINE,
            max_info: DEFAULT_MAX_INFO,
        }
    }
}

impl NatsLimits {
    /// The largest `MSG`/`HMSG` payload (headers included) accepted.
    ///
    /// A message the server stores is at most `max_payload`, and so is a
    /// job delivered. But JetStream's API hands a stored message back
    /// base64-encoded inside a JSON reply (`STREAM.MSG.GET`, which the bury
    /// copy and the operators' commands read): up to a third larger, plus
    /// the JSON around it, whose subject fits a control line. nats-server
    /// 2.9.10 sends a reply of 1,365,481 bytes for a message of 1,024,000 on
    /// a connection whose `max_payload` is 1 MiB.
    pub fn max_incoming(&self) -> usize {
        self.max_payload
            .div_ceil(3)
            .saturating_mul(4)
            .saturating_add(self.max_line)
            .saturating_add(API_ENVELOPE)
    }

    /// The most a receive buffer must hold for one operation: the longest
    /// line and the largest payload accepted with its CRLF.
    pub fn recv_capacity(&self) -> usize {
        self.max_line
            .max(self.max_info)
            .saturating_add(self.max_incoming())
            .saturating_add(2)
    }
}
