//! The handshake: the server's first `INFO`, then `CONNECT` (with the
//! credentials the driver gives), the inbox `SUB` and a `PING`, answered by
//! `PONG` or refused with `-ERR`. Signing a nonce and TLS belong to the
//! driver; the session only carries their results.

use crate::nats::op::{parse_frame, Frame};
use crate::nats::request_error::{NatsError, Refusal};
use crate::nats::{encode_connect, encode_ping, encode_sub, ConnectOptions, NatsProtoError};
use crate::reply::Status;
use crate::secret::Secret;

use super::state::{Event, Hello, NatsSession, INBOX_SID};

/// What `CONNECT` carries for nkey or JWT authentication: the server's nonce
/// signed by the driver with the nkey seed.
#[derive(Clone, PartialEq, Eq)]
pub struct Signed {
    /// The user JWT (JWT authentication).
    pub jwt: Option<Secret>,
    /// The public nkey (nkey authentication).
    pub nkey: Option<String>,
    /// The nonce's signature, base64url without padding.
    pub sig: String,
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("jwt", &self.jwt)
            .field("nkey", &self.nkey)
            .finish_non_exhaustive()
    }
}

/// What `CONNECT` proves, as the driver gives it: a user and password or a
/// token, and for nkey or JWT authentication the signed nonce. Reading these
/// from files, the environment or an address is the driver's part.
#[derive(Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// A user and password.
    pub user: Option<(&'a str, &'a Secret)>,
    /// A token.
    pub token: Option<&'a Secret>,
    /// The JWT or nkey with the nonce's signature.
    pub signed: Option<&'a Signed>,
    /// How errors name these credentials (`user bob`, `token`, `nkey file
    /// F`): never a secret.
    pub describe: &'a str,
}

impl std::fmt::Debug for Credentials<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

impl NatsSession {
    /// Reads the server's first operation, which must be `INFO`; `None` when
    /// more bytes are needed. The `INFO` must offer message headers.
    pub fn poll_info(&mut self) -> Result<Option<Hello>, NatsError> {
        self.usable()?;
        match parse_frame(self.rx.data(), &self.limits) {
            Ok(Status::Complete(Frame::Info(s), n)) => {
                let base = self.rx.start();
                let r = self.take_info(base, s, true);
                self.rx.consume(n);
                r.map(Some)
            }
            Ok(Status::Complete(_, _)) => Err(NatsError::Protocol(NatsProtoError::Malformed {
                op: "INFO",
            })),
            Ok(Status::Partial) => Ok(None),
            Err(e) => Err(NatsError::Protocol(e)),
        }
    }

    /// Queues `CONNECT` (named `name`, with `creds`), the inbox's `SUB` and
    /// a `PING`, for one write. `tls` says the connection is encrypted. After
    /// the write, call [`wipe_queue`](Self::wipe_queue): the line holds the
    /// credentials.
    pub fn queue_connect(
        &mut self,
        name: &str,
        creds: &Credentials<'_>,
        tls: bool,
    ) -> Result<(), NatsError> {
        self.usable()?;
        let signed = creds.signed;
        let opts = ConnectOptions {
            name,
            version: env!("CARGO_PKG_VERSION"),
            user_pass: creds.user.map(|(u, p)| (u, p.expose())),
            token: creds.token.map(|t| t.expose()),
            jwt: signed.and_then(|s| s.jwt.as_ref()).map(|j| j.expose()),
            nkey: signed.and_then(|s| s.nkey.as_deref()),
            sig: signed.map(|s| s.sig.as_str()),
            tls_required: tls,
        };
        encode_connect(&mut self.tx, &opts);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch.push(b'*');
        encode_sub(&mut self.tx, &self.scratch, INBOX_SID)?;
        encode_ping(&mut self.tx);
        self.auth.clear();
        self.auth.push_str(creds.describe);
        Ok(())
    }

    /// After [`queue_connect`](Self::queue_connect)'s write: true once the
    /// server's `PONG` says `CONNECT` and `SUB` were taken; `false` when more
    /// bytes are needed. A `-ERR` before it is the server refusing the
    /// connection ([`NatsError::Refused`]).
    pub fn poll_connected(&mut self) -> Result<bool, NatsError> {
        loop {
            match self.poll_event() {
                Ok(Some(Event::Pong)) => return Ok(true),
                Ok(Some(_)) => {}
                Ok(None) => return Ok(false),
                Err(NatsError::Server(reason)) | Err(NatsError::Permission(reason)) => {
                    return Err(NatsError::Refused(Refusal {
                        reason,
                        auth: self.auth.clone(),
                    }))
                }
                Err(e) => return Err(e),
            }
        }
    }
}
