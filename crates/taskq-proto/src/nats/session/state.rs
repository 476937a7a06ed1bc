//! [`NatsSession`]: the state of one NATS connection and the reading of
//! server operations into the events a driver waits for. The requests are
//! encoded by the sibling files (handshake, publish, pull, request), each an
//! `impl` of this type.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use crate::nats::op::{parse_frame, Frame, MsgFrame};
use crate::nats::request_error::NatsError;
use crate::nats::span::Span;
use crate::nats::{parse_info, NatsLimits, NatsProtoError, PutEncoder};
use crate::reply::{parse_u64, Status};
use crate::session::{RecvBuf, INITIAL_RECV};

/// The subscription id of the connection's inbox.
pub(crate) const INBOX_SID: u64 = 1;

/// What a driver writes to answer a server `PING`.
pub const PONG: &[u8] = b"PONG\r\n";

/// Replies a session keeps room for without allocating: a batch of PubAcks
/// or a window of ack confirmations.
const OWED_INITIAL: usize = 1024;

/// A pull request: its reply token and the messages it may still deliver.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullOwed {
    pub(crate) token: u64,
    pub(crate) remaining: u64,
    /// How long the server waits on it (zero: `no_wait`).
    pub(crate) expires: Duration,
    /// When its driver began to wait for it (after its write).
    pub(crate) since: Option<Instant>,
}

/// What reading brought that a caller may wait for. The message's spans
/// point into [`NatsSession::event_bytes`] until the next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A message on the inbox: the reply to request `token`.
    Reply {
        /// The request it answers.
        token: u64,
        /// The message, as offsets.
        m: MsgFrame,
    },
    /// A message under its own subject: a pulled delivery.
    Delivery(MsgFrame),
    /// `PONG`: the answer to our `PING`.
    Pong,
}

/// What the handshake needs of the server's first `INFO`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The nonce to sign for nkey or JWT authentication (empty when none).
    pub nonce: String,
    /// The server requires TLS.
    pub tls_required: bool,
    /// The server offers TLS.
    pub tls_available: bool,
}

/// The reply to a lone put or a request, awaited by its token: it is due
/// `wait` after its wait began (the I/O timeout, or a request's own
/// patience), and its wait begins at the first wait after its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Awaited {
    pub(super) token: u64,
    pub(super) wait: Duration,
    pub(super) since: Option<Instant>,
    /// Its request is still in the send buffer, or being written.
    pub(super) unsent: bool,
}

/// One NATS connection's protocol state, with no socket and no clock of its
/// own: the deadlines it keeps are on the instants its driver gives it.
///
/// It holds the send buffer (operations queued for the next write) and the
/// put encoder, the receive buffer, the inbox and its reply tokens, and what
/// is owed: the pull under way, PubAcks of queued publishes, ack
/// confirmations, and `PONG`s for the server's `PING`s. A driver writes what
/// it encodes, reads into [`recv_room`](Self::recv_room), polls for what it
/// waits for, and wakes at the session's deadlines
/// ([`start_wait`](Self::start_wait), [`poll_timeout`](Self::poll_timeout),
/// [`handle_timeout`](Self::handle_timeout)).
///
/// Every reply to the connection (PubAcks, request replies, pull statuses,
/// ack confirmations) arrives on `<inbox><token>` through one wildcard
/// subscription; the token says which request it answers. Pulled messages
/// arrive on the same subscription under their own subject. After a server
/// `-ERR` or bytes it cannot decode the session is broken for good.
pub struct NatsSession {
    pub(super) limits: NatsLimits,
    pub(super) rx: RecvBuf,
    /// Where the last event's spans start in the receive buffer.
    pub(super) base: usize,
    /// Operations queued for the next write.
    pub(super) tx: Vec<u8>,
    /// Scratch for the parts of an operation (a subject, a JSON body).
    pub(super) scratch: Vec<u8>,
    pub(super) put: PutEncoder,
    /// `_INBOX.<random>.`
    pub(super) inbox: Vec<u8>,
    next_token: u64,
    /// The pulls under way (their requests written), oldest first: a
    /// consumer serves its waiting pulls in order, so a delivery answers
    /// the oldest.
    pub(super) pulls: VecDeque<PullOwed>,
    /// Pulls encoded into the send buffer, owed once the buffer is written.
    pub(super) pulls_queued: VecDeque<PullOwed>,
    /// PubAcks owed, by token, in the order their publishes were queued,
    /// with when their wait began.
    pub(super) pubacks: VecDeque<(u64, Option<Instant>)>,
    /// Ack confirmations owed, by token, with when their wait began.
    pub(super) confirms: VecDeque<(u64, Option<Instant>)>,
    /// The newest PubAcks and confirmations owed whose requests are still
    /// in the send buffer: their waits begin once it is written.
    pub(super) pubacks_unsent: usize,
    pub(super) confirms_unsent: usize,
    /// The I/O timeout the reply deadlines allow (see `clock`).
    pub(super) io_timeout: Duration,
    /// The one reply awaited alone: a lone put's PubAck or a request's
    /// reply (see `clock`).
    pub(super) awaited: Option<Awaited>,
    /// The probes written (`PING`s behind overdue pulls), oldest first: the
    /// newest pull token each one asks about.
    pub(super) probes: VecDeque<u64>,
    /// Probes encoded into the send buffer, written with it.
    pub(super) probes_queued: VecDeque<u64>,
    /// Pulls a probe's `PONG` found never answered, for
    /// [`poll_delivery`](Self::poll_delivery) to report.
    pub(super) unanswered: VecDeque<u64>,
    /// The newest pull ended by its probe, while the server may still hold
    /// it (its `408` was late, not missing): until its own answer or a
    /// later waiting pull's `408` shows it over.
    pub(super) strays: Option<u64>,
    pongs_owed: u32,
    pings: u64,
    pub(super) broken: bool,
    /// The server's address as the driver names it, first among the servers.
    peer: String,
    server_id: String,
    version: String,
    servers: Vec<String>,
    /// What the handshake authenticated with, for a refusal's message.
    pub(super) auth: String,
}

impl std::fmt::Debug for NatsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSession")
            .field("server_id", &self.server_id)
            .field("pulling", &!self.pulls.is_empty())
            .field("pubacks", &self.pubacks.len())
            .field("confirms", &self.confirms.len())
            .field("queued", &self.tx.len())
            .field("buffered", &self.rx.len())
            .field("broken", &self.broken)
            .finish()
    }
}

/// A random inbox prefix, `_INBOX.<22 base-36 digits>.`, from the standard
/// library's randomly keyed hasher (no extra dependency, no clock).
pub fn random_inbox() -> Vec<u8> {
    let mut out = b"_INBOX.".to_vec();
    for round in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(round);
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

/// True when an inbox reply is a `503` no-responders status.
pub(super) fn no_responders(m: &MsgFrame) -> bool {
    matches!(m.headers, Some((_, 503, _))) && m.payload.start == m.payload.end
}

impl NatsSession {
    /// A session for the server at `peer` (`host:port`, listed first among
    /// [`servers`](Self::servers)), with a random inbox.
    pub fn new(limits: NatsLimits, peer: &str) -> NatsSession {
        NatsSession::with_inbox(limits, peer, &random_inbox())
    }

    /// A session whose reply subjects start with `inbox` (`_INBOX.x.`): for
    /// tests that script the server's bytes.
    pub fn with_inbox(limits: NatsLimits, peer: &str, inbox: &[u8]) -> NatsSession {
        NatsSession {
            rx: RecvBuf::new(INITIAL_RECV, limits.recv_capacity()),
            limits,
            base: 0,
            tx: Vec::with_capacity(4096),
            scratch: Vec::with_capacity(256),
            put: PutEncoder::new(inbox),
            inbox: inbox.to_vec(),
            next_token: 1,
            pulls: VecDeque::new(),
            pulls_queued: VecDeque::new(),
            pubacks: VecDeque::with_capacity(OWED_INITIAL),
            confirms: VecDeque::with_capacity(OWED_INITIAL),
            pubacks_unsent: 0,
            confirms_unsent: 0,
            io_timeout: crate::defaults::IO_TIMEOUT,
            awaited: None,
            probes: VecDeque::new(),
            probes_queued: VecDeque::new(),
            unanswered: VecDeque::new(),
            strays: None,
            pongs_owed: 0,
            pings: 0,
            broken: false,
            peer: peer.to_owned(),
            server_id: String::new(),
            version: String::new(),
            servers: Vec::new(),
            auth: String::new(),
        }
    }

    /// What the parser accepts; `max_payload` is lowered to the server's.
    pub fn limits(&self) -> &NatsLimits {
        &self.limits
    }

    /// The inbox prefix (`_INBOX.<random>.`).
    pub fn inbox(&self) -> &[u8] {
        &self.inbox
    }

    /// The server's `server_id`.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// The server's release as its `INFO` gave it (`2.9.10`).
    pub fn server_version(&self) -> &str {
        &self.version
    }

    /// The cluster's addresses (`host:port`) as the server last announced
    /// them (`connect_urls`), the peer first.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// Forgets the cluster's addresses an `INFO` read in the clear named
    /// (anyone on the path could have written them): only the peer's own
    /// stays, until an `INFO` comes over TLS.
    pub(super) fn forget_learned_servers(&mut self) {
        self.servers.clear();
        self.servers.push(self.peer.clone());
    }

    /// True once the stream is out of step; the connection must be replaced.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks the session broken (the transport failed, or a caller cannot
    /// accept what came).
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// Marks the session broken and hands `e` back.
    pub(super) fn broke(&mut self, e: NatsError) -> NatsError {
        self.broken = true;
        e
    }

    /// Refuses work on a broken session.
    #[inline]
    pub fn usable(&self) -> Result<(), NatsError> {
        if self.broken {
            return Err(NatsError::Broken);
        }
        Ok(())
    }

    /// Refuses a request whose wait would skip owed replies.
    #[inline]
    pub fn idle(&self) -> Result<(), NatsError> {
        self.usable()?;
        if !self.pulls.is_empty() || !self.pubacks.is_empty() || !self.confirms.is_empty() {
            return Err(NatsError::Busy);
        }
        Ok(())
    }

    /// The next reply token.
    #[inline]
    pub(super) fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// The token the next request will get.
    #[inline]
    pub(super) fn peek_token(&self) -> u64 {
        self.next_token
    }

    /// Operations queued for the next write (publishes, acks, a pull).
    #[inline]
    pub fn queued(&self) -> &[u8] {
        &self.tx
    }

    /// The queued operations for one write, or `None` when nothing is
    /// queued. On a broken session the queue is dropped and the answer is
    /// [`NatsError::Broken`]. After the write, call [`queue_sent`](Self::queue_sent).
    pub fn to_flush(&mut self) -> Result<Option<&[u8]>, NatsError> {
        if self.broken {
            self.clear_queue();
            return Err(NatsError::Broken);
        }
        Ok(Some(self.tx.as_slice()).filter(|q| !q.is_empty()))
    }

    /// Says that the queued operations were written: a pull among them is now under way.
    #[inline]
    pub fn queue_sent(&mut self) {
        self.tx.clear();
        self.pubacks_unsent = 0;
        self.confirms_unsent = 0;
        self.awaited_sent();
        self.pulls.append(&mut self.pulls_queued);
        self.probes.append(&mut self.probes_queued);
    }

    /// Drops the queued operations without sending them (a pull among them
    /// is not under way). PubAcks and confirmations they were owed stay
    /// owed: drop them by replacing the connection.
    pub fn clear_queue(&mut self) {
        self.tx.clear();
        // Owed all the same, and waited for from the next wait on: with
        // nothing coming, the session breaks rather than wait forever.
        self.pubacks_unsent = 0;
        self.confirms_unsent = 0;
        self.awaited_sent();
        self.pulls_queued.clear();
        self.probes_queued.clear();
    }

    /// Zeroes and drops the send buffer: after `CONNECT`, whose line holds
    /// the credentials, no copy is left behind.
    pub fn wipe_queue(&mut self) {
        self.tx.fill(0);
        self.clear_queue();
    }

    /// Room for the driver to read into. A buffer at its cap with no whole
    /// operation in it breaks the session.
    #[inline]
    pub fn recv_room(&mut self) -> Result<&mut [u8], NatsError> {
        if self.broken {
            return Err(NatsError::Broken);
        }
        match self.rx.spare() {
            Ok(room) => Ok(room),
            Err(_) => {
                // The parser refuses longer lines and larger payloads before this point.
                let max = self.limits.max_line.max(self.limits.max_info);
                self.broken = true;
                Err(NatsError::Protocol(NatsProtoError::LineTooLong { max }))
            }
        }
    }

    /// Says that `n` bytes were read into the room [`recv_room`](Self::recv_room) gave.
    #[inline]
    pub fn received(&mut self, n: usize) {
        self.rx.filled(n);
    }

    /// Bytes received and not yet read as operations.
    pub fn buffered(&self) -> usize {
        self.rx.len()
    }

    /// `PING`s read and not yet answered.
    #[inline]
    pub fn pongs_owed(&self) -> u32 {
        self.pongs_owed
    }

    /// The answer to one owed `PING`, for the driver to write at once (one
    /// write each); `None` when none is owed or the session is broken.
    #[inline]
    pub fn pong(&mut self) -> Option<&'static [u8]> {
        if self.pongs_owed == 0 || self.broken {
            return None;
        }
        self.pongs_owed -= 1;
        self.pings += 1;
        Some(PONG)
    }

    /// Server `PING`s answered so far.
    pub fn pings_answered(&self) -> u64 {
        self.pings
    }

    /// The bytes the last event's spans point into (valid until the next read).
    #[inline]
    pub fn event_bytes(&self) -> &[u8] {
        self.rx.from(self.base)
    }

    /// Reads the next event from the bytes received: a reply on the inbox, a
    /// delivery or a `PONG`; `None` when more bytes are needed. On the way it
    /// counts `PING`s owed an answer, takes `INFO`s and skips `+OK` and other
    /// subscriptions. A server `-ERR` or bytes it cannot decode break the
    /// session.
    pub fn poll_event(&mut self) -> Result<Option<Event>, NatsError> {
        self.usable()?;
        loop {
            match parse_frame(self.rx.data(), &self.limits) {
                Ok(Status::Complete(f, n)) => {
                    let base = self.rx.start();
                    self.rx.consume(n);
                    match f {
                        Frame::Msg(m) if m.sid == INBOX_SID => {
                            let subject = m.subject.of(self.rx.from(base));
                            match subject.strip_prefix(&self.inbox[..]) {
                                Some(tok) => {
                                    // A token we never made (not a number) is no reply of ours.
                                    if let Ok(token) = parse_u64(tok) {
                                        self.base = base;
                                        // The reply awaited alone came: whoever
                                        // reads it, it is no longer owed.
                                        if self.awaited.is_some_and(|a| a.token == token) {
                                            self.awaited = None;
                                        }
                                        return Ok(Some(Event::Reply { token, m }));
                                    }
                                }
                                None => {
                                    self.base = base;
                                    return Ok(Some(Event::Delivery(m)));
                                }
                            }
                        }
                        Frame::Pong => {
                            if let Some(through) = self.probes.pop_front() {
                                self.pulls_unanswered(through);
                            }
                            return Ok(Some(Event::Pong));
                        }
                        Frame::Msg(_) | Frame::Ok => {}
                        Frame::Ping => self.pongs_owed = self.pongs_owed.saturating_add(1),
                        Frame::Info(s) => {
                            if let Err(e) = self.take_info(base, s, false) {
                                return Err(self.broke(e));
                            }
                        }
                        Frame::Err(s) => {
                            // Shown as text only: a server's words may not
                            // command a terminal or forge a log line.
                            let text = crate::peer_text(s.of(self.rx.from(base)));
                            // The server keeps the connection after a
                            // permissions violation, but which request it
                            // answers is not certain: replace it all the same.
                            let e = if text.starts_with("Permissions Violation") {
                                NatsError::Permission(text)
                            } else {
                                NatsError::Server(text)
                            };
                            return Err(self.broke(e));
                        }
                    }
                }
                Ok(Status::Partial) => return Ok(None),
                Err(e) => return Err(self.broke(NatsError::Protocol(e))),
            }
        }
    }

    /// Reads until the reply to request `token` (skipping stale replies and
    /// deliveries nobody waits for); `None` when more bytes are needed.
    #[inline]
    pub fn poll_reply(&mut self, token: u64) -> Result<Option<MsgFrame>, NatsError> {
        loop {
            match self.poll_event()? {
                Some(Event::Reply { token: t, m }) if t == token => return Ok(Some(m)),
                Some(_) => {}
                None => return Ok(None),
            }
        }
    }

    /// Takes what an `INFO` says: the server's id and release, its payload
    /// limit, and the cluster's other addresses. Only the first (`handshake`)
    /// must offer headers; a later INFO that leaves the field out changes
    /// nothing about what the server takes.
    pub(super) fn take_info(
        &mut self,
        base: usize,
        s: Span,
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
            self.limits.max_payload = self.limits.max_payload.min(max);
        }
        self.server_id = crate::peer_text(info.server_id);
        if !info.version.is_empty() {
            self.version = crate::peer_text(info.version);
        }
        if !urls.contains(&self.peer) {
            urls.insert(0, self.peer.clone());
        }
        self.servers = urls;
        Ok(Hello {
            nonce: String::from_utf8_lossy(info.nonce).into_owned(),
            tls_required: info.tls_required,
            tls_available: info.tls_available,
        })
    }
}
