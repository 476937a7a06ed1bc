//! The blocking NATS driver: one socket (the shared [`SockIo`]), one
//! [`RecvBuf`], one wildcard inbox subscription for every reply, and a
//! deadline on every whole reply.
//!
//! Every reply to this connection (PubAcks, request replies, pull statuses,
//! ack confirmations) arrives on `_INBOX.<random>.<token>` through
//! subscription 1; the token says which request it answers. Pulled messages
//! arrive on the same subscription under their own subject. A server `PING`
//! met in any read is answered at once. Opening is in this module; publishing
//! in `publish`, pulling and acking in `pull`, the JetStream API in `js`.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::io::IoSlice;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::conn::sock::SockIo;
use crate::conn::{Interrupter, IoCounts};
use crate::nats::access::NatsAccess;
use crate::nats::op::{parse_frame, Frame, MsgFrame};
use crate::nats::{
    encode_connect, encode_ping, encode_sub, parse_info, ConnectOptions, NatsLimits,
    NatsProtoError, PutEncoder,
};
use crate::reply::Status;
use crate::session::{RecvBuf, INITIAL_RECV};

#[cfg(feature = "secure")]
mod creds;
mod error;
#[cfg(feature = "jetstream")]
mod js;
mod publish;
mod pull;
mod request;
#[cfg(feature = "secure")]
mod tls;
mod wire;

use self::error::WAITING_FOR_INFO;
use self::wire::Wire;
pub use error::{ApiError, NatsError, Refusal, TlsError, TlsFailure};
#[cfg(feature = "jetstream")]
pub use js::{ConsumerInfo, ConsumerSpec, MsgSelect, StoredMsg, StreamInfo, StreamSpec};
pub use publish::PubAck;
pub use pull::Delivery;

/// The subscription id of the connection's inbox.
const INBOX_SID: u64 = 1;

/// Settings of a NATS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Limit on each connect attempt, per address.
    pub connect_timeout: Duration,
    /// Limit on each whole reply (plus a pull's `expires`), and on each write.
    pub io_timeout: Duration,
    /// TCP keepalive idle time; `None` leaves keepalive off.
    pub keepalive: Option<Duration>,
    /// What the parser accepts; `max_payload` is lowered to the server's.
    pub limits: NatsLimits,
    /// The connection's name in the server's monitoring.
    pub name: String,
    /// Credentials and TLS.
    pub access: NatsAccess,
    /// How long the JetStream management calls (`ensure_stream`,
    /// `ensure_consumer`) retry while the cluster has no leader.
    pub api_patience: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(2),
            keepalive: Some(Duration::from_secs(30)),
            limits: NatsLimits::default(),
            name: "taskq".into(),
            access: NatsAccess::default(),
            api_patience: Duration::from_secs(10),
        }
    }
}

/// What `CONNECT` carries for nkey or JWT authentication.
pub(crate) struct Signed {
    /// The user JWT (JWT authentication).
    pub(crate) jwt: Option<crate::Secret>,
    /// The public nkey (nkey authentication).
    pub(crate) nkey: Option<String>,
    /// The nonce's signature, base64url without padding.
    pub(crate) sig: String,
}

/// What the handshake needs of the server's first `INFO`.
#[derive(Debug, Default)]
struct Hello {
    nonce: String,
    tls_required: bool,
    tls_available: bool,
}

/// A pull request under way.
#[derive(Debug, Clone, Copy)]
struct PullState {
    token: u64,
    /// Messages the server may still deliver for it.
    remaining: u64,
    started: Instant,
    wait: Duration,
}

/// What a read brought that a caller waits for.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// A message on the inbox: the reply to request `token`.
    Reply { token: u64, m: MsgFrame },
    /// A message under its own subject: a pulled delivery.
    Delivery(MsgFrame),
    /// `PONG`: the answer to our `PING` (the handshake waits for it).
    Pong,
}

/// A blocking connection to a NATS server, for JetStream work queues.
///
/// Each request goes out in one write (together with anything queued); each
/// reply is read against a whole-reply deadline. After a timeout, an I/O
/// error, a server `-ERR` or bytes it cannot decode the connection is broken
/// for good and refuses further requests with [`NatsError::Broken`].
pub struct NatsConnection {
    io: Wire,
    peer: SocketAddr,
    cfg: NatsConfig,
    rx: RecvBuf,
    /// Operations queued for the next write.
    tx: Vec<u8>,
    /// Scratch for the parts of an operation (a subject, a JSON body).
    scratch: Vec<u8>,
    put: PutEncoder,
    /// `_INBOX.<random>.`
    inbox: Vec<u8>,
    next_token: u64,
    servers: Vec<String>,
    server_id: String,
    /// The server's release, from `INFO`.
    version: String,
    /// The handshake's step, for its errors.
    step: &'static str,
    broken: bool,
    pull: Option<PullState>,
    /// PubAcks owed, by token, in the order their publishes were queued.
    pubacks: VecDeque<u64>,
    /// Ack confirmations owed, by token.
    confirms: VecDeque<u64>,
    pings: u64,
}

impl std::fmt::Debug for NatsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConnection")
            .field("peer", &self.peer)
            .field("server_id", &self.server_id)
            .field("broken", &self.broken)
            .finish()
    }
}

/// The host of `host:port` (an IPv6 literal without its brackets).
fn host_of(seed: &str) -> &str {
    let host = match seed.rfind(':') {
        Some(i) if !seed[i..].contains(']') => &seed[..i],
        _ => seed,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A random inbox prefix, `_INBOX.<22 base-36 digits>.`, from the standard
/// library's randomly keyed hasher (no extra dependency).
fn inbox_prefix() -> Vec<u8> {
    let mut out = b"_INBOX.".to_vec();
    for round in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(round);
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        h.write_u32(std::process::id());
        let mut n = h.finish();
        for _ in 0..11 {
            out.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
            n /= 36;
        }
    }
    out.push(b'.');
    out
}

impl NatsConnection {
    /// Connects to the first of `seeds` (`host:port`) that completes the
    /// handshake: `INFO` (TLS when the settings or the server want it), then
    /// `CONNECT` with the credentials, the inbox `SUB` and `PING` in one
    /// write, answered by `PONG` (or `-ERR`: [`NatsError::Refused`]).
    ///
    /// Over TLS each seed's certificate must name its host; a seed given as
    /// an IP address (a node learned from the cluster) is checked against
    /// the first seed given by name, as the official clients do.
    ///
    /// No error of a connect means anything was sent: none is
    /// [`outcome_unknown`](NatsError::outcome_unknown).
    pub fn connect(
        seeds: &[impl AsRef<str>],
        cfg: NatsConfig,
    ) -> Result<NatsConnection, NatsError> {
        let mut last = None;
        let named = seeds
            .iter()
            .map(|s| host_of(s.as_ref()))
            .find(|h| h.parse::<std::net::IpAddr>().is_err())
            .map(str::to_owned);
        for seed in seeds {
            let host = host_of(seed.as_ref());
            let tls_name = match (&named, host.parse::<std::net::IpAddr>()) {
                (Some(n), Ok(_)) => n.as_str(),
                _ => host,
            };
            let addrs = match seed.as_ref().to_socket_addrs() {
                Ok(a) => a,
                Err(e) => {
                    last = Some(NatsError::NotSent(e));
                    continue;
                }
            };
            for a in addrs {
                match NatsConnection::open(a, tls_name, cfg.clone()) {
                    Ok(c) => return Ok(c),
                    // Credentials the server refused, or that cannot be read,
                    // are refused by every node alike: say so at once.
                    Err(e @ (NatsError::Refused(_) | NatsError::Credentials(_))) => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            NatsError::NotSent(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no seed address resolved",
            ))
        }))
    }

    /// Connects to one address (over TLS, its certificate must name the IP address).
    pub fn connect_addr(addr: SocketAddr, cfg: NatsConfig) -> Result<NatsConnection, NatsError> {
        NatsConnection::open(addr, &addr.ip().to_string(), cfg)
    }

    /// Connects to `addr`, the node named `host` (for TLS).
    fn open(addr: SocketAddr, host: &str, cfg: NatsConfig) -> Result<NatsConnection, NatsError> {
        let sock = SockIo::open(addr, cfg.connect_timeout, cfg.io_timeout, cfg.keepalive)
            .map_err(NatsError::NotSent)?;
        let inbox = inbox_prefix();
        let mut c = NatsConnection {
            io: Wire::plain(sock),
            peer: addr,
            rx: RecvBuf::new(INITIAL_RECV, cfg.limits.recv_capacity()),
            tx: Vec::with_capacity(4096),
            scratch: Vec::with_capacity(256),
            put: PutEncoder::new(&inbox),
            inbox,
            next_token: 1,
            servers: Vec::new(),
            server_id: String::new(),
            version: String::new(),
            step: WAITING_FOR_INFO,
            broken: false,
            pull: None,
            pubacks: VecDeque::with_capacity(1024),
            confirms: VecDeque::with_capacity(1024),
            pings: 0,
            cfg,
        };
        c.handshake(host).map_err(|e| {
            c.broken = true;
            match e {
                e if e.outcome_unknown() => NatsError::Handshake {
                    during: c.step,
                    error: Box::new(e),
                },
                e => e,
            }
        })?;
        Ok(c)
    }

    fn handshake(&mut self, host: &str) -> Result<(), NatsError> {
        let started = Instant::now();
        let wait = self.cfg.io_timeout;
        let mut first = true;
        let tls = &self.cfg.access.tls;
        if tls.first {
            self.step = "in the TLS handshake";
            self.start_tls(host, started, wait)?;
        }
        self.step = WAITING_FOR_INFO;
        // The server speaks first: INFO.
        let mut info = loop {
            match parse_frame(self.rx.data(), &self.cfg.limits) {
                Ok(Status::Complete(Frame::Info(s), n)) => {
                    let base = self.rx.start();
                    let r = self.take_info(base, s, true);
                    self.rx.consume(n);
                    break r?;
                }
                Ok(Status::Complete(_, _)) => {
                    return Err(NatsError::Protocol(NatsProtoError::Malformed {
                        op: "INFO",
                    }))
                }
                Ok(Status::Partial) => self.fill(started, wait, &mut first)?,
                Err(e) => return Err(NatsError::Protocol(e)),
            }
        };
        if !self.io.is_tls() && (info.tls_required || self.cfg.access.tls.wanted()) {
            if !info.tls_required && !info.tls_available {
                return Err(NatsError::Tls(TlsError {
                    failure: TlsFailure::ServerWithoutTls,
                    detail: format!("{} offers no TLS", self.peer),
                }));
            }
            self.step = "in the TLS handshake";
            self.start_tls(host, started, wait)?;
        }
        let nonce = std::mem::take(&mut info.nonce);
        let signed = self.sign(nonce.as_bytes())?;
        let access = &self.cfg.access;
        let opts = ConnectOptions {
            name: &self.cfg.name,
            version: env!("CARGO_PKG_VERSION"),
            user_pass: access.user.as_ref().map(|(u, p)| (u.as_str(), p.expose())),
            token: access.token.as_ref().map(|t| t.expose()),
            jwt: signed
                .as_ref()
                .and_then(|s| s.jwt.as_ref())
                .map(|j| j.expose()),
            nkey: signed.as_ref().and_then(|s| s.nkey.as_deref()),
            sig: signed.as_ref().map(|s| s.sig.as_str()),
            tls_required: self.io.is_tls(),
        };
        encode_connect(&mut self.tx, &opts);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch.push(b'*');
        encode_sub(&mut self.tx, &self.scratch, INBOX_SID)?;
        encode_ping(&mut self.tx);
        self.step = "sending CONNECT";
        let sent = self.flush_tx();
        // The CONNECT line holds the credentials: leave no copy behind.
        self.tx.fill(0);
        self.tx.clear();
        sent?;
        self.step = "waiting for PONG";
        // PONG answers our PING once CONNECT and SUB were processed; -ERR
        // means the server refused them (and closes the connection).
        loop {
            match self.next_event(started, wait, &mut first) {
                Ok((Event::Pong, _)) => {
                    self.step = "";
                    return Ok(());
                }
                Ok(_) => {}
                Err(NatsError::Server(reason)) | Err(NatsError::Permission(reason)) => {
                    return Err(NatsError::Refused(Refusal {
                        reason,
                        auth: self.cfg.access.describe(),
                    }))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Starts TLS with the server named `host`.
    #[cfg(feature = "secure")]
    fn start_tls(&mut self, host: &str, started: Instant, wait: Duration) -> Result<(), NatsError> {
        let config = tls::client_config(&self.cfg.access.tls)?;
        let session = Box::new(tls::Tls::new(config, host)?);
        self.io.start_tls(session, started, wait)
    }

    #[cfg(not(feature = "secure"))]
    fn start_tls(&mut self, _: &str, _: Instant, _: Duration) -> Result<(), NatsError> {
        Err(NatsError::Tls(TlsError {
            failure: TlsFailure::ServerRequiresTls,
            detail: String::new(),
        }))
    }

    /// The nonce signed for nkey or JWT authentication, when configured.
    #[cfg(feature = "secure")]
    fn sign(&self, nonce: &[u8]) -> Result<Option<Signed>, NatsError> {
        creds::sign(&self.cfg.access, nonce)
    }

    #[cfg(not(feature = "secure"))]
    fn sign(&self, _: &[u8]) -> Result<Option<Signed>, NatsError> {
        if self.cfg.access.creds_file.is_some() || self.cfg.access.nkey_file.is_some() {
            return Err(NatsError::Unsupported(
                "nkey and JWT credentials (feature secure)",
            ));
        }
        Ok(None)
    }

    /// Takes what an `INFO` says: the server's id, its payload limit, and
    /// the cluster's other addresses.
    /// Only the first (`handshake`) must offer headers; a later INFO that
    /// leaves the field out changes nothing about what the server takes.
    fn take_info(
        &mut self,
        base: usize,
        s: crate::nats::Span,
        handshake: bool,
    ) -> Result<Hello, NatsError> {
        let json = s.of(self.rx.from(base));
        let mut urls: Vec<String> = Vec::new();
        let info = parse_info(json, |u| urls.push(String::from_utf8_lossy(u).into_owned()))
            .map_err(NatsError::Protocol)?;
        if handshake && !info.headers {
            return Err(NatsError::Unsupported("message headers"));
        }
        if info.max_payload > 0 {
            let max = usize::try_from(info.max_payload).unwrap_or(usize::MAX);
            self.cfg.limits.max_payload = self.cfg.limits.max_payload.min(max);
        }
        self.server_id = String::from_utf8_lossy(info.server_id).into_owned();
        if !info.version.is_empty() {
            self.version = String::from_utf8_lossy(info.version).into_owned();
        }
        let me = self.peer.to_string();
        if !urls.contains(&me) {
            urls.insert(0, me);
        }
        self.servers = urls;
        Ok(Hello {
            nonce: String::from_utf8_lossy(info.nonce).into_owned(),
            tls_required: info.tls_required,
            tls_available: info.tls_available,
        })
    }

    /// The server's release as its `INFO` gave it (`2.9.10`).
    pub fn server_version(&self) -> &str {
        &self.version
    }

    /// True when the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.io.is_tls()
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The server's `server_id`.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// The cluster's addresses (`host:port`) as the server last announced
    /// them (`connect_urls`), this one first: where to connect next after a failure.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The largest payload (headers included) the server takes.
    pub fn max_payload(&self) -> usize {
        self.cfg.limits.max_payload
    }

    /// The settings in force (with `max_payload` lowered to the server's).
    pub fn config(&self) -> &NatsConfig {
        &self.cfg
    }

    /// True once the connection is out of step; it must be replaced.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks the connection broken.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// System calls made so far.
    pub fn io_counts(&self) -> IoCounts {
        self.io.counts()
    }

    /// Server `PING`s answered so far (each one write of `PONG`).
    pub fn pings_answered(&self) -> u64 {
        self.pings
    }

    /// A handle that can cut this connection from another thread; a blocked
    /// read then fails with [`NatsError::Closed`] or an I/O error.
    pub fn interrupter(&self) -> std::io::Result<Interrupter> {
        Interrupter::new(&self.io.sock.sock)
    }

    /// Marks the connection broken and hands `e` back.
    fn broke(&mut self, e: NatsError) -> NatsError {
        self.broken = true;
        e
    }

    /// Refuses work on a broken connection.
    fn usable(&self) -> Result<(), NatsError> {
        if self.broken {
            return Err(NatsError::Broken);
        }
        Ok(())
    }

    /// Refuses a request whose wait would skip owed replies.
    fn idle(&self) -> Result<(), NatsError> {
        self.usable()?;
        if self.pull.is_some() || !self.pubacks.is_empty() || !self.confirms.is_empty() {
            return Err(NatsError::Busy);
        }
        Ok(())
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Writes what is queued with one write.
    fn flush_tx(&mut self) -> Result<(), NatsError> {
        let r = self.io.write_all(&mut [IoSlice::new(&self.tx)]);
        self.tx.clear();
        r.map_err(|e| self.broke(e))
    }

    /// Answers a server `PING`.
    fn pong(&mut self) -> Result<(), NatsError> {
        self.pings += 1;
        self.io.send(b"PONG\r\n").map_err(|e| self.broke(e))
    }

    /// Reads more bytes before the deadline.
    fn fill(
        &mut self,
        started: Instant,
        wait: Duration,
        first: &mut bool,
    ) -> Result<(), NatsError> {
        let max = self.cfg.limits.max_line.max(self.cfg.limits.max_info);
        let Ok(room) = self.rx.spare() else {
            return Err(self.broke(NatsError::Protocol(NatsProtoError::LineTooLong { max })));
        };
        match self.io.fill(room, started, wait, first) {
            Ok(n) => {
                self.rx.filled(n);
                Ok(())
            }
            // After the handshake a TLS failure breaks a request whose
            // outcome is then unknown.
            Err(NatsError::Tls(t)) if self.step.is_empty() => {
                Err(self.broke(NatsError::Io(std::io::Error::other(t.to_string()))))
            }
            Err(e) => Err(self.broke(e)),
        }
    }

    /// Reads until a message or `PONG` arrives, answering `PING`s, taking
    /// `INFO`s and skipping `+OK` and other subscriptions. The event's spans
    /// are in `self.rx.from(base)`, valid until the next read. `first` is
    /// true until the wait that began at `started` has made its first read.
    fn next_event(
        &mut self,
        started: Instant,
        wait: Duration,
        first: &mut bool,
    ) -> Result<(Event, usize), NatsError> {
        loop {
            match parse_frame(self.rx.data(), &self.cfg.limits) {
                Ok(Status::Complete(f, n)) => {
                    let base = self.rx.start();
                    self.rx.consume(n);
                    match f {
                        Frame::Msg(m) if m.sid == INBOX_SID => {
                            let subject = m.subject.of(self.rx.from(base));
                            match subject.strip_prefix(&self.inbox[..]) {
                                Some(tok) => {
                                    // A token we never made (not a number) is no reply of ours.
                                    if let Ok(token) = crate::reply::parse_u64(tok) {
                                        return Ok((Event::Reply { token, m }, base));
                                    }
                                }
                                None => return Ok((Event::Delivery(m), base)),
                            }
                        }
                        Frame::Pong => return Ok((Event::Pong, base)),
                        Frame::Msg(_) | Frame::Ok => {}
                        Frame::Ping => self.pong()?,
                        Frame::Info(s) => {
                            if let Err(e) = self.take_info(base, s, false) {
                                return Err(self.broke(e));
                            }
                        }
                        Frame::Err(s) => {
                            let text = String::from_utf8_lossy(s.of(self.rx.from(base)));
                            // The server keeps the connection after a
                            // permissions violation, but which request it
                            // answers is not certain: replace it all the same.
                            let e = if text.starts_with("Permissions Violation") {
                                NatsError::Permission(text.into_owned())
                            } else {
                                NatsError::Server(text.into_owned())
                            };
                            return Err(self.broke(e));
                        }
                    }
                }
                Ok(Status::Partial) => self.fill(started, wait, first)?,
                Err(e) => return Err(self.broke(NatsError::Protocol(e))),
            }
        }
    }

    /// Waits for the reply to request `token`, skipping stale replies and
    /// deliveries nobody waits for.
    fn wait_reply(
        &mut self,
        token: u64,
        started: Instant,
        wait: Duration,
    ) -> Result<(MsgFrame, usize), NatsError> {
        // The first read needs no clock when the socket timeout (the I/O
        // timeout) fits in the wait.
        let mut first = wait >= self.cfg.io_timeout;
        loop {
            if let (Event::Reply { token: t, m }, base) =
                self.next_event(started, wait, &mut first)?
            {
                if t == token {
                    return Ok((m, base));
                }
            }
        }
    }

    /// True when an inbox reply is a `503` no-responders status.
    fn no_responders(&self, m: &MsgFrame) -> bool {
        matches!(m.headers, Some((_, 503, _))) && m.payload.start == m.payload.end
    }
}
