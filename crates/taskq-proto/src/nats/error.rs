//! The codec's errors: what is wrong with bytes from the server, and why a
//! client operation could not be encoded.

use std::fmt;

/// Why bytes from a NATS server could not be decoded. A connection that
/// received them is out of step and must be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsProtoError {
    /// No line end within the configured line limit.
    LineTooLong {
        /// The limit that was reached.
        max: usize,
    },
    /// A line ended with `\n` not preceded by `\r`.
    BadLineEnd,
    /// The operation name is not one a server sends.
    UnknownOp,
    /// The operation is known but its arguments are missing, extra or bad.
    Malformed {
        /// The operation's name.
        op: &'static str,
    },
    /// A number that is not unsigned decimal or does not fit its type.
    BadNumber,
    /// A payload byte count beyond the configured maximum.
    PayloadTooLarge {
        /// The count the server announced.
        len: u64,
        /// The configured maximum.
        max: usize,
    },
    /// An `HMSG` whose header count exceeds its total count.
    HeaderLongerThanTotal,
    /// The payload was not followed by `\r\n`.
    MissingPayloadCrlf,
    /// A header block that is not `NATS/1.0[ status[ description]]\r\n(Key: value\r\n)*\r\n`.
    BadHeaders,
    /// A JSON reply the hand-written reader cannot read.
    BadJson {
        /// Byte offset in the payload where reading failed.
        at: usize,
    },
    /// A JSON reply lacking a field it must have.
    MissingField {
        /// The field's name.
        field: &'static str,
    },
    /// A reply subject that is not a JetStream ack subject.
    BadAckSubject,
}

/// Why a client operation could not be encoded. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NatsEncodeError {
    /// A subject that is empty or holds a space, a control byte or DEL.
    BadSubject,
    /// A header name or value the server would misread (CR, LF, or in a name a colon or space).
    BadHeader,
    /// A payload (headers included) larger than the server's `max_payload`.
    PayloadTooLarge {
        /// The payload's size in bytes.
        size: usize,
        /// The maximum.
        max: usize,
    },
}

impl fmt::Display for NatsProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsProtoError::LineTooLong { max } => {
                write!(f, "server line longer than {max} bytes")
            }
            NatsProtoError::BadLineEnd => f.write_str("server line ends in LF without CR"),
            NatsProtoError::UnknownOp => f.write_str("unknown server operation"),
            NatsProtoError::Malformed { op } => write!(f, "malformed {op} line"),
            NatsProtoError::BadNumber => f.write_str("bad number in server line"),
            NatsProtoError::PayloadTooLarge { len, max } => write!(
                f,
                "server announces a payload of {len} bytes, more than the maximum {max}"
            ),
            NatsProtoError::HeaderLongerThanTotal => {
                f.write_str("HMSG header count exceeds its total count")
            }
            NatsProtoError::MissingPayloadCrlf => f.write_str("payload not followed by CRLF"),
            NatsProtoError::BadHeaders => f.write_str("malformed NATS/1.0 header block"),
            NatsProtoError::BadJson { at } => write!(f, "unreadable JSON reply at byte {at}"),
            NatsProtoError::MissingField { field } => {
                write!(f, "JSON reply lacks the field {field:?}")
            }
            NatsProtoError::BadAckSubject => f.write_str("not a JetStream ack subject"),
        }
    }
}

impl fmt::Display for NatsEncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsEncodeError::BadSubject => {
                f.write_str("subject is empty or holds a space or control byte")
            }
            NatsEncodeError::BadHeader => {
                f.write_str("header name or value holds CR, LF (or, in a name, ':' or space)")
            }
            NatsEncodeError::PayloadTooLarge { size, max } => {
                write!(f, "payload of {size} bytes exceeds max_payload {max}")
            }
        }
    }
}

impl std::error::Error for NatsProtoError {}
impl std::error::Error for NatsEncodeError {}
