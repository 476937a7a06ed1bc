//! Why a request on a [`NatsConnection`](super::NatsConnection) failed.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::error::ConnectionError;
use crate::nats::{NatsEncodeError, NatsProtoError};

/// A JetStream API error: the server read the request and refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP-like status (`404`, `503`, ...).
    pub code: u64,
    /// JetStream's error number (`10059` stream not found, ...); 0 when absent.
    pub err_code: u64,
    /// The server's description.
    pub description: String,
}

/// Why a NATS request failed.
///
/// As for beanstalkd's [`ConnectionError`]: was the request sent (may it have
/// taken effect), and is the connection still usable.
#[derive(Debug)]
#[non_exhaustive]
pub enum NatsError {
    /// The arguments were refused before anything was sent; still usable.
    Invalid(NatsEncodeError),
    /// Connecting failed, or the write failed before any byte left. Not sent; broken.
    NotSent(io::Error),
    /// The connection was already broken; nothing was sent.
    Broken,
    /// Replies are owed that this call would have to skip (a pull under way,
    /// PubAcks or ack confirmations not read yet). Nothing was sent; still usable.
    Busy,
    /// Nothing is owed, so there is nothing to read. Still usable.
    NothingOwed,
    /// No complete reply before the whole-reply deadline: outcome unknown; broken.
    Timeout {
        /// How long the reply was waited for.
        waited: Duration,
    },
    /// The server closed the connection: outcome unknown; broken.
    Closed,
    /// An I/O error after the request was at least partly sent: outcome unknown; broken.
    Io(io::Error),
    /// The server sent bytes that cannot be decoded: broken.
    Protocol(NatsProtoError),
    /// The server sent `-ERR` (its text); it closes the connection: broken.
    Server(String),
    /// Nobody serves the subject (a `503` status): no stream captures it, or
    /// JetStream has no leader right now. Not processed; still usable.
    NoResponders,
    /// JetStream refused the request; still usable.
    Api(ApiError),
    /// The server lacks something taskq needs (headers, JetStream).
    Unsupported(&'static str),
    /// An existing stream or consumer is not what taskq needs; it was left unchanged.
    Mismatch(String),
}

impl NatsError {
    /// True when the request may have reached the server and taken effect.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            NatsError::Timeout { .. }
                | NatsError::Closed
                | NatsError::Io(_)
                | NatsError::Protocol(_)
                | NatsError::Server(_)
        )
    }

    /// True when the connection must be closed and replaced.
    pub fn breaks_connection(&self) -> bool {
        !matches!(
            self,
            NatsError::Invalid(_)
                | NatsError::Busy
                | NatsError::NothingOwed
                | NatsError::NoResponders
                | NatsError::Api(_)
                | NatsError::Mismatch(_)
        )
    }

    /// True for a missed reply deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, NatsError::Timeout { .. })
    }
}

impl From<ConnectionError> for NatsError {
    /// The transport errors of the shared socket layer.
    fn from(e: ConnectionError) -> Self {
        match e {
            ConnectionError::NotSent(e) => NatsError::NotSent(e),
            ConnectionError::Timeout { waited } => NatsError::Timeout { waited },
            ConnectionError::Closed => NatsError::Closed,
            ConnectionError::Io(e) => NatsError::Io(e),
            // The socket layer makes no other; map them to what they mean.
            ConnectionError::Broken => NatsError::Broken,
            ConnectionError::NothingOwed => NatsError::NothingOwed,
            ConnectionError::Invalid(_) | ConnectionError::Protocol(_) => {
                NatsError::Io(io::Error::other(e.to_string()))
            }
        }
    }
}

impl From<NatsEncodeError> for NatsError {
    fn from(e: NatsEncodeError) -> Self {
        NatsError::Invalid(e)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "JetStream error {} (err_code {}): {}",
            self.code, self.err_code, self.description
        )
    }
}

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsError::Invalid(e) => write!(f, "invalid request, not sent: {e}"),
            NatsError::NotSent(e) => write!(f, "not sent: {e}"),
            NatsError::Broken => f.write_str("connection is broken; not sent"),
            NatsError::Busy => f.write_str("replies are owed; read them first; not sent"),
            NatsError::NothingOwed => f.write_str("nothing is owed to read"),
            NatsError::Timeout { waited } => {
                write!(f, "no complete reply within {waited:?}; outcome unknown")
            }
            NatsError::Closed => f.write_str("server closed the connection; outcome unknown"),
            NatsError::Io(e) => write!(f, "I/O error after sending; outcome unknown: {e}"),
            NatsError::Protocol(e) => write!(f, "bad data from the server: {e}"),
            NatsError::Server(t) => write!(f, "server error: {t}"),
            NatsError::NoResponders => f.write_str("no responders (503): not processed"),
            NatsError::Api(e) => e.fmt(f),
            NatsError::Unsupported(what) => write!(f, "server does not support {what}"),
            NatsError::Mismatch(what) => write!(f, "existing JetStream object differs: {what}"),
        }
    }
}

impl std::error::Error for ApiError {}
/// `Display` already names the inner error.
impl std::error::Error for NatsError {}
