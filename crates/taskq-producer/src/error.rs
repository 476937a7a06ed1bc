//! What a put can come to: inserted, refused before sending, rejected by the
//! server, or sent with its outcome unknown. The types here never conflate them.

use std::fmt;
use std::io;
use std::time::Duration;

use taskq_proto::{EncodeError, Reply};

use crate::JobId;

/// Why a producer call failed.
///
/// Each variant answers the question a caller has to decide on: may the job be
/// in the queue, and is it safe to send it again (here or elsewhere)?
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The input was refused before anything was sent (bad tube name, body over
    /// the maximum job size, too small an outcome slice). Nothing was queued.
    Invalid(Invalid),
    /// The server answered, and the answer was not `INSERTED`: see [`Rejection`].
    /// Every rejection except [`Rejection::InsertedBuried`] means nothing was queued.
    Rejected(Rejection),
    /// The request was sent (at least in part) and no complete reply came: the
    /// job may or may not be queued. The connection was dropped; the next call
    /// reconnects.
    Unknown(taskq_proto::ConnectionError),
    /// Nothing reached the server (see [`NotSent`] for why). Safe to send
    /// again, here or to another server.
    NotSent(NotSent),
}

/// Why nothing of a request reached the server.
#[derive(Debug)]
#[non_exhaustive]
pub enum NotSent {
    /// Connecting failed, or the write failed before any byte of the request left.
    Io(io::Error),
    /// The address resolved to no socket address.
    NoAddress,
    /// The server is in its reconnect backoff; the next connect is due in `left`.
    Backoff {
        /// What is left of the wait.
        left: Duration,
    },
    /// The connection was already broken; the next call opens a new one.
    Broken,
    /// JetStream answered `503 no responders`: it has no leader for the
    /// stream right now (an election) or no stream captures the subject.
    /// Nothing was stored.
    Unavailable,
    /// The JetStream stream could not be set up, or an existing one does not
    /// fit taskq's layout (it was left unchanged): what is wrong.
    Layout(String),
    /// The NATS server refused the connection (wrong or expired
    /// credentials, a bad signature, none where some are required).
    Refused(taskq_proto::nats::Refusal),
    /// TLS failed while connecting (an unknown issuer, a name mismatch, no
    /// client certificate, a server without TLS).
    Tls(taskq_proto::nats::TlsError),
    /// A credentials, nkey or TLS file could not be used (its path and why).
    Credentials(String),
    /// A fresh connection could not `use` the tube, so the job was not sent on it.
    UseFailed {
        /// The tube.
        tube: String,
        /// What the `use` came to.
        cause: Box<Error>,
    },
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotSent::Io(e) => e.fmt(f),
            NotSent::NoAddress => f.write_str("address resolved to nothing"),
            NotSent::Backoff { left } => {
                write!(f, "server down; next connect attempt in {left:?}")
            }
            NotSent::Broken => f.write_str("connection was broken"),
            NotSent::Unavailable => {
                f.write_str("JetStream has no responder for the stream (503); nothing stored")
            }
            NotSent::Layout(what) => write!(f, "JetStream stream not usable: {what}"),
            NotSent::Refused(r) => r.fmt(f),
            NotSent::Tls(e) => e.fmt(f),
            NotSent::Credentials(what) => f.write_str(what),
            NotSent::UseFailed { tube, cause } => {
                write!(f, "reconnected, but `use {tube}` failed: {cause}")
            }
        }
    }
}

/// `Display` names the inner error, so `source` does not repeat it.
impl std::error::Error for NotSent {}

/// An input refused before anything was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Invalid {
    /// The command could not be encoded: bad tube name, body too big, line too long.
    Encode(EncodeError),
    /// The outcome slice given to a batch is shorter than the batch.
    OutcomesTooShort {
        /// Jobs in the batch.
        jobs: usize,
        /// Length of the outcome slice.
        slots: usize,
    },
    /// A multi-server producer was given no server.
    NoServers,
    /// A JetStream publish that cannot be encoded (a payload over the
    /// server's `max_payload`, a bad header).
    Nats(taskq_proto::nats::NatsEncodeError),
    /// `put_json`: the value does not serialize to JSON (a map whose keys
    /// are not strings, a `Serialize` implementation that failed).
    Unserializable,
    /// What this build cannot do yet.
    Unsupported {
        /// What was asked for.
        what: &'static str,
    },
}

/// The server's answer to a put (or a `use`) when it was not `INSERTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// `JOB_TOO_BIG`: the body exceeds the server's own maximum (`-z`). Nothing queued.
    JobTooBig,
    /// `DRAINING`: the server takes no new jobs. Nothing queued.
    Draining,
    /// `EXPECTED_CRLF`: the body was not followed by CRLF. Nothing queued.
    ExpectedCrlf,
    /// `BURIED <id>`: the job *was* inserted, but buried, because the server is
    /// short of memory. It will not run until kicked.
    InsertedBuried {
        /// The buried job's id.
        id: JobId,
    },
    /// `OUT_OF_MEMORY`. Nothing queued.
    OutOfMemory,
    /// `INTERNAL_ERROR`: a server bug. Nothing queued.
    InternalError,
    /// `BAD_FORMAT`: the server could not read the command. Nothing queued.
    BadFormat,
    /// `UNKNOWN_COMMAND`. Nothing queued.
    UnknownCommand,
    /// The NATS account may not publish to the tube's subject (`-ERR
    /// 'Permissions Violation for Publish ...'`); nothing stored.
    Permission,
    /// JetStream refused the publish (its API error); nothing stored.
    JetStream {
        /// The HTTP-like status (`503`, ...).
        code: u16,
        /// JetStream's own error number (`10077`, ...).
        err_code: u32,
    },
}

impl Rejection {
    /// The rejection a reply stands for, if it is one.
    pub fn from_reply(reply: &Reply<'_>) -> Option<Rejection> {
        Some(match *reply {
            Reply::JobTooBig => Rejection::JobTooBig,
            Reply::Draining => Rejection::Draining,
            Reply::ExpectedCrlf => Rejection::ExpectedCrlf,
            Reply::InsertedBuried { id } => Rejection::InsertedBuried { id: JobId::new(id) },
            Reply::OutOfMemory => Rejection::OutOfMemory,
            Reply::InternalError => Rejection::InternalError,
            Reply::BadFormat => Rejection::BadFormat,
            Reply::UnknownCommand => Rejection::UnknownCommand,
            _ => return None,
        })
    }

    /// The reply word on the wire.
    pub fn word(self) -> &'static str {
        match self {
            Rejection::JobTooBig => "JOB_TOO_BIG",
            Rejection::Draining => "DRAINING",
            Rejection::ExpectedCrlf => "EXPECTED_CRLF",
            Rejection::InsertedBuried { .. } => "BURIED",
            Rejection::OutOfMemory => "OUT_OF_MEMORY",
            Rejection::InternalError => "INTERNAL_ERROR",
            Rejection::BadFormat => "BAD_FORMAT",
            Rejection::UnknownCommand => "UNKNOWN_COMMAND",
            Rejection::JetStream { .. } => "JETSTREAM_ERROR",
            Rejection::Permission => "PERMISSIONS_VIOLATION",
        }
    }

    /// True when the job is in the queue despite the rejection (`BURIED <id>`).
    pub fn queued(self) -> bool {
        matches!(self, Rejection::InsertedBuried { .. })
    }
}

impl Error {
    /// True when the job may be in the queue: outcome unknown, or inserted but buried.
    pub fn maybe_queued(&self) -> bool {
        match self {
            Error::Unknown(_) => true,
            Error::Rejected(r) => r.queued(),
            _ => false,
        }
    }

    /// True when nothing reached the server, so sending again cannot duplicate the job.
    pub fn not_sent(&self) -> bool {
        matches!(self, Error::Invalid(_) | Error::NotSent(_))
    }

    /// True when a NATS server refused the connection's credentials.
    pub fn auth_refused(&self) -> bool {
        matches!(self, Error::NotSent(NotSent::Refused(r)) if r.is_auth())
    }

    /// True when the request was sent and no complete reply came.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::Unknown(_))
    }

    /// The job's id when it was inserted but buried.
    pub fn buried_id(&self) -> Option<JobId> {
        match self {
            Error::Rejected(Rejection::InsertedBuried { id }) => Some(*id),
            _ => None,
        }
    }

    /// Sorts an error of the connection into not sent / outcome unknown.
    pub(crate) fn from_conn(e: taskq_proto::ConnectionError) -> Error {
        match e {
            taskq_proto::ConnectionError::Invalid(e) => Error::Invalid(Invalid::Encode(e)),
            taskq_proto::ConnectionError::NotSent(io) => Error::NotSent(NotSent::Io(io)),
            e if e.not_sent() => Error::NotSent(NotSent::Broken),
            other => Error::Unknown(other),
        }
    }
}

impl From<EncodeError> for Error {
    fn from(e: EncodeError) -> Self {
        Error::Invalid(Invalid::Encode(e))
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Encode(e) => e.fmt(f),
            Invalid::OutcomesTooShort { jobs, slots } => write!(
                f,
                "outcome slice has {slots} slots for a batch of {jobs} jobs"
            ),
            Invalid::NoServers => f.write_str("no server address given"),
            Invalid::Nats(e) => e.fmt(f),
            Invalid::Unserializable => f.write_str(
                "the value does not serialize to JSON (a map whose keys are not strings, or a failing Serialize)",
            ),
            Invalid::Unsupported { what } => write!(f, "not supported: {what}"),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::InsertedBuried { id } => {
                write!(
                    f,
                    "BURIED {id}: inserted but buried (server short of memory)"
                )
            }
            Rejection::JobTooBig => f.write_str("JOB_TOO_BIG: body exceeds the server's maximum"),
            Rejection::Draining => f.write_str("DRAINING: server takes no new jobs"),
            Rejection::JetStream { code, err_code } => {
                write!(f, "JetStream error {code} (err_code {err_code})")
            }
            Rejection::Permission => f.write_str(
                "Permissions Violation: the account may not publish to this tube's subject",
            ),
            other => f.write_str(other.word()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(e) => write!(f, "invalid, not sent: {e}"),
            Error::Rejected(r) => write!(f, "rejected by the server: {r}"),
            Error::Unknown(e) => write!(f, "outcome unknown (the job may be queued): {e}"),
            Error::NotSent(e) => write!(f, "not sent: {e}"),
        }
    }
}

impl std::error::Error for Invalid {}
impl std::error::Error for Rejection {}
/// `Display` names the inner error, so `source` does not repeat it: a
/// report that walks the chain prints each cause once.
impl std::error::Error for Error {}
