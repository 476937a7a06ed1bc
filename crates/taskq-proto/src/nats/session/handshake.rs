//! The handshake: the server's first `INFO`, then `CONNECT` (with the
//! credentials the driver gives), the inbox `SUB` and a `PING`, answered by
//! `PONG` or refused with `-ERR`. Signing a nonce and TLS belong to the
//! driver; the session only carries their results.
//!
//! [`Handshake`] is the order of those steps, written once for every driver
//! (the blocking one and the tokio one of `taskq-connect`): it says what the
//! driver must do next ([`HandshakeStep`]: read, start TLS, sign the nonce and
//! send `CONNECT`, write) and owns the handshake's deadline
//! ([`poll_timeout`](Handshake::poll_timeout),
//! [`handle_timeout`](Handshake::handle_timeout)), with no socket and no
//! clock of its own.

use std::time::{Duration, Instant};

use crate::nats::op::{parse_frame, Frame};
use crate::nats::request_error::{NatsError, Refusal, TlsError, TlsFailure, WAITING_FOR_INFO};
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

/// What the driver must do next for a [`Handshake`].
#[derive(Debug, PartialEq, Eq)]
pub enum HandshakeStep<'a> {
    /// Read more bytes into the session before the deadline, then step again.
    Read,
    /// Run the TLS handshake now (every byte after it is encrypted), then
    /// call [`Handshake::tls_started`] and step again.
    StartTls,
    /// Sign `nonce` when the credentials are an nkey or a JWT (empty: the
    /// server sent none), then call [`Handshake::connect`] with the
    /// credentials, and step again.
    Connect {
        /// The server's nonce.
        nonce: &'a str,
    },
    /// Write what the session has queued (`CONNECT`, `SUB`, `PING`) with one
    /// write, wipe it ([`NatsSession::wipe_queue`]: it holds the
    /// credentials), call [`Handshake::written`], then step again.
    Write,
    /// The server took `CONNECT`: the connection is ready.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    TlsFirst,
    Info,
    Connect,
    Write,
    Pong,
    Done,
}

/// The NATS handshake's steps and deadline, over a [`NatsSession`]: TLS
/// first when asked (`tls_first`, for a server that wants the TLS handshake
/// before its `INFO`), then `INFO`; TLS when the server requires it or the
/// client wants it (and an error naming the server when it offers none);
/// then `CONNECT` with the driver's credentials, and `PONG`. The whole
/// handshake must end within the wait it was given.
#[derive(Debug)]
pub struct Handshake {
    phase: Phase,
    tls_wanted: bool,
    tls_on: bool,
    /// TLS was asked for after `INFO` and has not yet started.
    tls_pending: bool,
    nonce: String,
    deadline: Instant,
    wait: Duration,
    peer: String,
    /// The secrets `CONNECT` carried, kept until the server has answered
    /// it: a refusal that echoes one shows it masked.
    sent: Vec<Secret>,
}

impl Handshake {
    /// A handshake begun at `now`, to end within `wait`, with the server
    /// called `peer` in errors. `tls_first`: TLS before anything else;
    /// `tls_wanted`: TLS even when the server does not require it.
    pub fn new(
        now: Instant,
        wait: Duration,
        tls_first: bool,
        tls_wanted: bool,
        peer: &str,
    ) -> Handshake {
        Handshake {
            phase: if tls_first {
                Phase::TlsFirst
            } else {
                Phase::Info
            },
            tls_wanted: tls_wanted || tls_first,
            tls_on: false,
            tls_pending: false,
            nonce: String::new(),
            deadline: crate::session::deadline_after(now, wait),
            wait,
            peer: peer.to_owned(),
            sent: Vec::new(),
        }
    }

    /// When the handshake must have ended.
    pub fn poll_timeout(&self) -> Instant {
        self.deadline
    }

    /// The whole wait the handshake was given.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// At `now`: a [`NatsError::Timeout`] once the deadline has passed
    /// before the handshake ended.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), NatsError> {
        if self.phase != Phase::Done && now >= self.deadline {
            return Err(NatsError::Timeout { waited: self.wait });
        }
        Ok(())
    }

    /// What the handshake was doing, for errors (`waiting for INFO`, `in
    /// the TLS handshake`, `sending CONNECT`, `waiting for PONG`); empty
    /// once done.
    pub fn during(&self) -> &'static str {
        match self.phase {
            Phase::TlsFirst => "in the TLS handshake",
            Phase::Info if self.tls_pending => "in the TLS handshake",
            Phase::Info => WAITING_FOR_INFO,
            Phase::Connect | Phase::Write => "sending CONNECT",
            Phase::Pong => "waiting for PONG",
            Phase::Done => "",
        }
    }

    /// True once TLS was started.
    pub fn is_tls(&self) -> bool {
        self.tls_on
    }

    /// The next step, reading what `s` holds.
    pub fn step(&mut self, s: &mut NatsSession) -> Result<HandshakeStep<'_>, NatsError> {
        match self.phase {
            Phase::TlsFirst => Ok(HandshakeStep::StartTls),
            Phase::Info => {
                let Some(hello) = s.poll_info()? else {
                    return Ok(HandshakeStep::Read);
                };
                self.nonce = hello.nonce;
                if !self.tls_on && (hello.tls_required || self.tls_wanted) {
                    if !hello.tls_required && !hello.tls_available {
                        return Err(NatsError::Tls(TlsError {
                            failure: TlsFailure::ServerWithoutTls,
                            detail: format!("{} offers no TLS", self.peer),
                        }));
                    }
                    // What came in the clear is anyone's on the path: a
                    // server sends nothing after INFO until the TLS
                    // handshake, so bytes there (a forged PONG, a job) are
                    // refused, and the addresses that INFO named are not
                    // trusted as the cluster's.
                    if s.buffered() != 0 {
                        return Err(NatsError::Tls(TlsError {
                            failure: TlsFailure::Other,
                            detail: format!(
                                "{} sent {} bytes in the clear after INFO, before the TLS handshake",
                                self.peer,
                                s.buffered()
                            ),
                        }));
                    }
                    s.forget_learned_servers();
                    self.tls_pending = true;
                    return Ok(HandshakeStep::StartTls);
                }
                self.phase = Phase::Connect;
                Ok(HandshakeStep::Connect { nonce: &self.nonce })
            }
            Phase::Connect => Ok(HandshakeStep::Connect { nonce: &self.nonce }),
            Phase::Write => Ok(HandshakeStep::Write),
            Phase::Pong => match s.poll_connected() {
                Ok(true) => {
                    self.phase = Phase::Done;
                    self.sent.clear();
                    Ok(HandshakeStep::Done)
                }
                Ok(false) => Ok(HandshakeStep::Read),
                Err(NatsError::Refused(mut r)) => {
                    // The server's words, but never a secret of ours in them.
                    r.reason = masked(r.reason, &self.sent);
                    Err(NatsError::Refused(r))
                }
                Err(e) => Err(e),
            },
            Phase::Done => Ok(HandshakeStep::Done),
        }
    }

    /// Says the TLS handshake the last step asked for has ended.
    pub fn tls_started(&mut self) {
        self.tls_on = true;
        self.tls_pending = false;
        if self.phase == Phase::TlsFirst {
            self.phase = Phase::Info;
        } else if self.phase == Phase::Info {
            // INFO was read in the clear: CONNECT comes next.
            self.phase = Phase::Connect;
        }
    }

    /// Says the write the last step asked for went out: `PONG` is awaited.
    pub fn written(&mut self) {
        if self.phase == Phase::Write {
            self.phase = Phase::Pong;
        }
    }

    /// Queues `CONNECT` (named `name`, with `creds`), the inbox's `SUB` and
    /// a `PING` for the write the next step asks for.
    pub fn connect(
        &mut self,
        s: &mut NatsSession,
        name: &str,
        creds: &Credentials<'_>,
    ) -> Result<(), NatsError> {
        if self.phase != Phase::Connect {
            return Err(NatsError::Mismatch(format!(
                "CONNECT asked for {}",
                self.during()
            )));
        }
        s.queue_connect(name, creds, self.tls_on)?;
        let jwt = creds.signed.and_then(|s| s.jwt.as_ref());
        self.sent = [creds.user.map(|(_, p)| p), creds.token, jwt]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        self.phase = Phase::Write;
        Ok(())
    }
}

/// Where a secret's piece is long enough to tell it by (a shorter secret is
/// masked only whole).
const PIECE: usize = 12;

/// A server's `text` with each of the secrets `sent` in it masked: as sent,
/// as the server's text is escaped, and as `CONNECT` escaped it. Withheld
/// whole when a piece of one is still there: a long secret cut by the
/// length the text is kept to.
fn masked(mut text: String, sent: &[Secret]) -> String {
    for secret in sent {
        let raw = secret.expose();
        let mut json = Vec::new();
        crate::nats::encode::json_str(&mut json, raw);
        let json = String::from_utf8_lossy(&json[1..json.len() - 1]).into_owned();
        for form in [raw, &crate::peer_text(raw.as_bytes()), &json] {
            if !form.is_empty() {
                text = text.replace(form, "***");
            }
        }
        let starts: Vec<usize> = raw.char_indices().map(|(i, _)| i).collect();
        let piece_left = starts
            .windows(PIECE + 1)
            .any(|w| text.contains(&raw[w[0]..w[PIECE]]))
            || (starts.len() > PIECE && text.contains(&raw[starts[starts.len() - PIECE]..]));
        if piece_left {
            return "(withheld: it repeated part of a credential this client sent)".to_owned();
        }
    }
    text
}
