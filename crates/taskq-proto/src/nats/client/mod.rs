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
use crate::nats::op::{parse_frame, Frame, MsgFrame};
use crate::nats::{
    encode_connect, encode_ping, encode_sub, parse_info, ConnectOptions, NatsLimits,
    NatsProtoError, PutEncoder,
};
use crate::reply::Status;
use crate::session::{RecvBuf, INITIAL_RECV};

mod error;
#[cfg(feature = "jetstream")]
mod js;
mod publish;
mod pull;
mod request;

pub use error::{ApiError, NatsError};
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
    /// User and password, when the server requires them.
    pub user_pass: Option<(String, String)>,
    /// Authentication token, when the server requires one.
    pub token: Option<String>,
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
            user_pass: None,
            token: None,
            api_patience: Duration::from_secs(10),
        }
    }
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
    io: SockIo,
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
    /// handshake: `INFO`, then `CONNECT`, the inbox `SUB` and `PING` in one
    /// write, answered by `PONG` (or `-ERR`).
    pub fn connect(
        seeds: &[impl AsRef<str>],
        cfg: NatsConfig,
    ) -> Result<NatsConnection, NatsError> {
        let mut last = None;
        for seed in seeds {
            let addrs = match seed.as_ref().to_socket_addrs() {
                Ok(a) => a,
                Err(e) => {
                    last = Some(NatsError::NotSent(e));
                    continue;
                }
            };
            for a in addrs {
                match NatsConnection::connect_addr(a, cfg.clone()) {
                    Ok(c) => return Ok(c),
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

    /// Connects to one address.
    pub fn connect_addr(addr: SocketAddr, cfg: NatsConfig) -> Result<NatsConnection, NatsError> {
        let io = SockIo::open(addr, cfg.connect_timeout, cfg.io_timeout, cfg.keepalive)
            .map_err(NatsError::NotSent)?;
        let inbox = inbox_prefix();
        let mut c = NatsConnection {
            io,
            peer: addr,
            rx: RecvBuf::new(INITIAL_RECV, cfg.limits.recv_capacity()),
            tx: Vec::with_capacity(4096),
            scratch: Vec::with_capacity(256),
            put: PutEncoder::new(&inbox),
            inbox,
            next_token: 1,
            servers: Vec::new(),
            server_id: String::new(),
            broken: false,
            pull: None,
            pubacks: VecDeque::with_capacity(1024),
            confirms: VecDeque::with_capacity(1024),
            pings: 0,
            cfg,
        };
        c.handshake()?;
        Ok(c)
    }

    fn handshake(&mut self) -> Result<(), NatsError> {
        let started = Instant::now();
        let wait = self.cfg.io_timeout;
        let mut first = true;
        // The server speaks first: INFO.
        let info_seen = loop {
            match parse_frame(self.rx.data(), &self.cfg.limits) {
                Ok(Status::Complete(Frame::Info(s), n)) => {
                    let base = self.rx.start();
                    let r = self.take_info(base, s, true);
                    self.rx.consume(n);
                    break r;
                }
                Ok(Status::Complete(_, _)) => {
                    break Err(NatsError::Protocol(NatsProtoError::Malformed {
                        op: "INFO",
                    }))
                }
                Ok(Status::Partial) => self.fill(started, wait, &mut first)?,
                Err(e) => break Err(NatsError::Protocol(e)),
            }
        };
        info_seen.map_err(|e| self.broke(e))?;
        let opts = ConnectOptions {
            name: &self.cfg.name,
            version: env!("CARGO_PKG_VERSION"),
            user_pass: self
                .cfg
                .user_pass
                .as_ref()
                .map(|(u, p)| (u.as_str(), p.as_str())),
            token: self.cfg.token.as_deref(),
        };
        encode_connect(&mut self.tx, &opts);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch.push(b'*');
        encode_sub(&mut self.tx, &self.scratch, INBOX_SID)?;
        encode_ping(&mut self.tx);
        self.flush_tx()?;
        // PONG answers our PING once CONNECT and SUB were processed.
        loop {
            if let (Event::Pong, _) = self.next_event(started, wait, &mut first)? {
                return Ok(());
            }
        }
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
    ) -> Result<(), NatsError> {
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
        let me = self.peer.to_string();
        if !urls.contains(&me) {
            urls.insert(0, me);
        }
        self.servers = urls;
        Ok(())
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
        self.io.counts
    }

    /// Server `PING`s answered so far (each one write of `PONG`).
    pub fn pings_answered(&self) -> u64 {
        self.pings
    }

    /// A handle that can cut this connection from another thread; a blocked
    /// read then fails with [`NatsError::Closed`] or an I/O error.
    pub fn interrupter(&self) -> std::io::Result<Interrupter> {
        Interrupter::new(&self.io.sock)
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
        r.map_err(|e| self.broke(e.into()))
    }

    /// Answers a server `PING`.
    fn pong(&mut self) -> Result<(), NatsError> {
        self.pings += 1;
        self.io.send(b"PONG\r\n").map_err(|e| self.broke(e.into()))
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
            Err(e) => Err(self.broke(e.into())),
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
                            let e = NatsError::Server(text.into_owned());
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
