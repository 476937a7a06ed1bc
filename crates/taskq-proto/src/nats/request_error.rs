//! Why a NATS request failed: what the session and every driver over it
//! answer (sent or not, outcome known or not, connection usable or not).

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
    /// The server refused the connection at `CONNECT` (`-ERR` before the
    /// handshake's `PONG`): a wrong or expired credential, a bad signature, no
    /// credentials where some are required. Nothing of the caller's was sent.
    Refused(Refusal),
    /// The server refused a request for the account's permissions (`-ERR
    /// 'Permissions Violation for ...'`): it was not processed. The
    /// connection is replaced all the same.
    Permission(String),
    /// TLS failed, at connect (nothing sent) or while reading a reply (then
    /// the outcome is unknown and this is reported as [`NatsError::Io`]).
    Tls(TlsError),
    /// The connection could not be set up: the socket broke, went silent or
    /// carried bytes that are not NATS before the handshake's `PONG`. Nothing
    /// of the caller's was sent.
    Handshake {
        /// The step: `"waiting for INFO"`, `"waiting for PONG"`, `"in the TLS handshake"`.
        during: &'static str,
        /// What failed.
        error: Box<NatsError>,
    },
    /// A credentials, nkey or TLS file could not be read or is not what it
    /// should be (the file's path and what is wrong, never its contents).
    /// Nothing was sent.
    Credentials(String),
}

/// The handshake's first step (a [`NatsError::Handshake`]'s `during`): the
/// server has said nothing yet.
pub const WAITING_FOR_INFO: &str = "waiting for INFO";

/// Why the server refused a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The server's `-ERR` text (`Authorization Violation`, ...), control
    /// characters escaped, and any password, token or JWT the client sent
    /// shown as `***` should a server echo one.
    pub reason: String,
    /// What the client authenticated with (`user alice`, `token`, `nkey file
    /// PATH`, ...), never a secret.
    pub auth: String,
}

impl Refusal {
    /// True when the refusal is about credentials (as opposed to, say, the
    /// server's connection limit).
    pub fn is_auth(&self) -> bool {
        let r = self.reason.to_ascii_lowercase();
        r.contains("authorization") || r.contains("authentication") || r.contains("expired")
    }
}

/// What failed in TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate is not signed by a trusted authority.
    UnknownIssuer,
    /// The server's certificate does not name the host connected to.
    NameMismatch,
    /// The server's certificate has expired or is not valid yet.
    Expired,
    /// The server asked for a client certificate and none (or a refused one) was given.
    ClientCertificate,
    /// The client wants TLS and the server does not offer it.
    ServerWithoutTls,
    /// The server requires TLS and this build has no TLS (feature `secure`).
    ServerRequiresTls,
    /// The server sent no `INFO`: it may expect the TLS handshake first.
    NoInfo,
    /// Anything else (the detail says what).
    Other,
}

/// A TLS failure: what failed, and the TLS library's words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// What failed.
    pub failure: TlsFailure,
    /// The detail.
    pub detail: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.failure {
            TlsFailure::UnknownIssuer => {
                "the server's certificate is not signed by a trusted CA (give the CA with --tls-ca)"
            }
            TlsFailure::NameMismatch => {
                "the server's certificate does not name the host connected to"
            }
            TlsFailure::Expired => "the server's certificate has expired or is not valid yet",
            TlsFailure::ClientCertificate => {
                "the server wants a client certificate it accepts (give --tls-cert and --tls-key)"
            }
            TlsFailure::ServerWithoutTls => "TLS was asked for, but the server does not offer it",
            TlsFailure::ServerRequiresTls => {
                "the server requires TLS, and this build has none (feature secure)"
            }
            TlsFailure::NoInfo => {
                "the server sent no INFO (if it wants the TLS handshake first, use --tls-first)"
            }
            TlsFailure::Other => "TLS failed",
        };
        write!(f, "TLS: {what}")?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server refused the connection: {} (authenticating with {})",
            self.reason, self.auth
        )
    }
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

    /// True when a connect failed before the server said anything: no
    /// `INFO` came, or the connection closed first (a server that wants the
    /// TLS handshake first, a port that is not a NATS server's, a frozen
    /// node). A reset is not this: it is a connection that broke.
    pub fn server_said_nothing(&self) -> bool {
        matches!(self, NatsError::Handshake { during, error }
            if *during == WAITING_FOR_INFO
                && matches!(**error, NatsError::Timeout { .. } | NatsError::Closed))
    }

    /// True when the server refused the connection's credentials.
    pub fn is_auth_refused(&self) -> bool {
        matches!(self, NatsError::Refused(r) if r.is_auth())
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
            NatsError::Refused(r) => write!(f, "{r}; not sent"),
            NatsError::Permission(t) => write!(f, "refused by the server: {t}; not processed"),
            NatsError::Tls(e) => write!(f, "{e}; not sent"),
            NatsError::Credentials(what) => write!(f, "{what}; not sent"),
            NatsError::Handshake { during, error } => {
                write!(f, "connecting failed {during}: ")?;
                match &**error {
                    NatsError::Timeout { waited } => write!(f, "no reply within {waited:?}")?,
                    NatsError::Closed => f.write_str("the server closed the connection")?,
                    NatsError::Io(e) => write!(f, "{e}")?,
                    e => write!(f, "{e}")?,
                }
                // A server with `handshake_first` sends no INFO: the client
                // waits until its own deadline, or until the server's TLS
                // timeout (2 s by default) closes the connection.
                if *during == WAITING_FOR_INFO
                    && matches!(**error, NatsError::Timeout { .. } | NatsError::Closed)
                {
                    f.write_str(" (if the server wants the TLS handshake first, use --tls-first)")?;
                }
                f.write_str("; not sent")
            }
        }
    }
}

impl std::error::Error for ApiError {}
impl std::error::Error for TlsError {}
/// `Display` already names the inner error.
impl std::error::Error for NatsError {}
