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

use std::io::IoSlice;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::nats::access::{NatsAccess, TlsSettings};
use taskq_proto::defaults;
use taskq_proto::nats::session::{Handshake, HandshakeStep, NatsSession, Signed};
use taskq_proto::nats::NatsLimits;
use taskq_proto::nats::WAITING_FOR_INFO;
use taskq_proto::SockIo;
use taskq_proto::{Interrupter, IoCounts};

#[cfg(feature = "secure")]
mod creds;
#[cfg(feature = "jetstream")]
mod js;
mod publish;
mod pull;
mod request;
#[cfg(feature = "secure")]
pub(crate) mod tls;
mod wire;

pub use self::wire::TlsSession;
use self::wire::Wire;
#[cfg(feature = "jetstream")]
pub use js::{ConsumerInfo, ConsumerSpec, MsgSelect, StoredMsg, StreamInfo, StreamSpec};
#[cfg(feature = "jetstream")]
use taskq_proto::nats::ApiError;
use taskq_proto::nats::{NatsError, TlsError, TlsFailure};

/// Settings of a NATS connection. The defaults are the shared ones of
/// [`defaults`](taskq_proto::defaults).
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
            connect_timeout: defaults::CONNECT_TIMEOUT,
            io_timeout: defaults::IO_TIMEOUT,
            keepalive: defaults::KEEPALIVE,
            limits: NatsLimits::default(),
            name: "taskq".into(),
            access: NatsAccess::default(),
            api_patience: defaults::API_PATIENCE,
        }
    }
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
    /// The protocol state: buffers, tokens, what is owed.
    s: NatsSession,
    /// The handshake's step, for its errors.
    step: &'static str,
}

impl std::fmt::Debug for NatsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConnection")
            .field("peer", &self.peer)
            .field("server_id", &self.s.server_id())
            .field("broken", &self.s.is_broken())
            .finish()
    }
}

/// A connection taken apart by [`NatsConnection::into_parts`], for another driver.
#[derive(Debug)]
pub struct Parts {
    /// The connected socket (blocking mode).
    pub socket: std::net::TcpStream,
    /// The protocol state: buffers, tokens, the server's `INFO`.
    pub session: NatsSession,
    /// The TLS session, when the connection is encrypted: every byte on the
    /// socket goes through it.
    pub tls: Option<Box<TlsSession>>,
}

/// The host of `host:port` (an IPv6 literal without its brackets).
/// Each seed with the name its TLS certificate must hold: its own host, or
/// for a seed given as an IP address the first seed given by name (the nodes
/// a cluster announces come as IP addresses), as the official clients do.
pub(crate) fn tls_names<S: AsRef<str>>(seeds: &[S]) -> impl Iterator<Item = (&str, &str)> {
    let named = seeds
        .iter()
        .map(|s| host_of(s.as_ref()))
        .find(|h| h.parse::<std::net::IpAddr>().is_err());
    seeds.iter().map(move |seed| {
        let host = host_of(seed.as_ref());
        let tls_name = match (named, host.parse::<std::net::IpAddr>()) {
            (Some(n), Ok(_)) => n,
            _ => host,
        };
        (seed.as_ref(), tls_name)
    })
}

/// True when a failure to connect to one node ends the search: credentials
/// the server refused, or that cannot be read, are refused by every node alike.
pub(crate) fn ends_search(e: &NatsError) -> bool {
    matches!(e, NatsError::Refused(_) | NatsError::Credentials(_))
}

/// The error of a seed list that resolved to no address.
pub(crate) fn no_seed() -> NatsError {
    NatsError::NotSent(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        "no seed address resolved",
    ))
}

/// A TLS session with the server named `host`, as `settings` configure it.
#[cfg(feature = "secure")]
pub(crate) fn new_tls(settings: &TlsSettings, host: &str) -> Result<Box<TlsSession>, NatsError> {
    let config = tls::client_config(settings)?;
    Ok(Box::new(tls::TlsSession::new(config, host)?))
}

#[cfg(not(feature = "secure"))]
pub(crate) fn new_tls(_: &TlsSettings, _: &str) -> Result<Box<TlsSession>, NatsError> {
    Err(NatsError::Tls(TlsError {
        failure: TlsFailure::ServerRequiresTls,
        detail: String::new(),
    }))
}

/// The nonce signed for nkey or JWT authentication, when `access` has them.
#[cfg(feature = "secure")]
pub(crate) fn sign(access: &NatsAccess, nonce: &[u8]) -> Result<Option<Signed>, NatsError> {
    creds::sign(access, nonce)
}

#[cfg(not(feature = "secure"))]
pub(crate) fn sign(access: &NatsAccess, _: &[u8]) -> Result<Option<Signed>, NatsError> {
    if access.creds_file.is_some() || access.nkey_file.is_some() {
        return Err(NatsError::Unsupported(
            "nkey and JWT credentials (feature secure)",
        ));
    }
    Ok(None)
}

fn host_of(seed: &str) -> &str {
    let host = match seed.rfind(':') {
        Some(i) if !seed[i..].contains(']') => &seed[..i],
        _ => seed,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A failed write of something other than the caller's request (a `PONG`)
/// while the caller's reply is owed: the request went out before it, so
/// the outcome is unknown, never "not sent" (which promises that nothing
/// reached the server and a fresh re-send is safe).
pub(crate) fn not_the_request(e: NatsError) -> NatsError {
    match e {
        NatsError::NotSent(io) => NatsError::Io(io),
        NatsError::Broken => NatsError::Io(std::io::Error::other(
            "the connection broke while the reply was owed",
        )),
        e => e,
    }
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
        for (seed, tls_name) in tls_names(seeds) {
            let addrs = match seed.to_socket_addrs() {
                Ok(a) => a,
                Err(e) => {
                    last = Some(NatsError::NotSent(e));
                    continue;
                }
            };
            for a in addrs {
                match NatsConnection::open(a, tls_name, cfg.clone()) {
                    Ok(c) => return Ok(c),
                    Err(e) if ends_search(&e) => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
        }
        Err(last.unwrap_or_else(no_seed))
    }

    /// Connects to one address (over TLS, its certificate must name the IP address).
    pub fn connect_addr(addr: SocketAddr, cfg: NatsConfig) -> Result<NatsConnection, NatsError> {
        NatsConnection::open(addr, &addr.ip().to_string(), cfg)
    }

    /// Connects to `addr`, the node named `host` (for TLS).
    fn open(addr: SocketAddr, host: &str, cfg: NatsConfig) -> Result<NatsConnection, NatsError> {
        let sock = SockIo::open(addr, cfg.connect_timeout, cfg.io_timeout, cfg.keepalive)
            .map_err(NatsError::NotSent)?;
        let mut c = NatsConnection {
            io: Wire::plain(sock),
            peer: addr,
            s: NatsSession::new(cfg.limits, &addr.to_string()),
            step: WAITING_FOR_INFO,
            cfg,
        };
        c.s.set_io_timeout(c.cfg.io_timeout);
        c.handshake(host).map_err(|e| {
            c.s.mark_broken();
            match e {
                e if e.outcome_unknown() => NatsError::Handshake {
                    during: c.step,
                    error: Box::new(e),
                },
                e => e,
            }
        })?;
        if c.is_tls() {
            c.cfg
                .access
                .tls
                .seen
                .spoke_tls(&addr.to_string(), c.servers());
        }
        Ok(c)
    }

    fn handshake(&mut self, host: &str) -> Result<(), NatsError> {
        let started = Instant::now();
        let wait = self.cfg.io_timeout;
        let tls = &self.cfg.access.tls;
        let peer = self.peer.to_string();
        let mut hs = Handshake::new(
            started,
            wait,
            tls.first,
            tls.wanted() || tls.seen.wants_tls(&peer),
            &peer,
        );
        let mut first = true;
        loop {
            self.step = hs.during();
            let step = hs.step(&mut self.s);
            self.answer_pings()?;
            match step? {
                HandshakeStep::Read => self.fill(started, wait, &mut first, false)?,
                HandshakeStep::StartTls => {
                    self.start_tls(host, started, wait)?;
                    // The TLS handshake read on the same clock: a read
                    // after it waits only what is left of the wait.
                    first = false;
                    hs.tls_started();
                }
                HandshakeStep::Connect { nonce } => {
                    let signed = sign(&self.cfg.access, nonce.as_bytes())?;
                    let describe = self.cfg.access.describe();
                    let creds = self.cfg.access.credentials(signed.as_ref(), &describe);
                    hs.connect(&mut self.s, &self.cfg.name, &creds)?;
                }
                HandshakeStep::Write => {
                    let sent = self.io.write_all(&mut [IoSlice::new(self.s.queued())]);
                    // The CONNECT line holds the credentials: leave no copy behind.
                    self.s.wipe_queue();
                    sent.map_err(|e| self.broke(e))?;
                    hs.written();
                }
                HandshakeStep::Done => {
                    self.step = "";
                    return Ok(());
                }
            }
        }
    }

    /// Starts TLS with the server named `host`.
    fn start_tls(&mut self, host: &str, started: Instant, wait: Duration) -> Result<(), NatsError> {
        let session = new_tls(&self.cfg.access.tls, host)?;
        #[cfg(feature = "secure")]
        return self.io.start_tls(session, started, wait);
        #[cfg(not(feature = "secure"))]
        {
            let _ = (started, wait);
            match *session {}
        }
    }

    /// The server's release as its `INFO` gave it (`2.9.10`).
    pub fn server_version(&self) -> &str {
        self.s.server_version()
    }

    /// The limit on each whole reply.
    pub fn io_timeout(&self) -> Duration {
        self.cfg.io_timeout
    }

    /// How long JetStream calls are tried again while the cluster has no leader.
    pub fn api_patience_setting(&self) -> Duration {
        self.cfg.api_patience
    }

    /// True when the server can hold a message until its time (message
    /// schedules): its `INFO` says 2.12 or later.
    pub fn holds_schedules(&self) -> bool {
        taskq_proto::nats::holds_schedules(self.server_version())
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
        self.s.server_id()
    }

    /// The cluster's addresses (`host:port`) as the server last announced
    /// them (`connect_urls`), this one first: where to connect next after a failure.
    pub fn servers(&self) -> &[String] {
        self.s.servers()
    }

    /// The largest payload (headers included) the server takes.
    pub fn max_payload(&self) -> usize {
        self.s.limits().max_payload
    }

    /// The settings in force (with `max_payload` lowered to the server's).
    pub fn config(&self) -> &NatsConfig {
        &self.cfg
    }

    /// True once the connection is out of step; it must be replaced.
    pub fn is_broken(&self) -> bool {
        self.s.is_broken()
    }

    /// Marks the connection broken.
    pub fn mark_broken(&mut self) {
        self.s.mark_broken();
    }

    /// System calls made so far.
    pub fn io_counts(&self) -> IoCounts {
        self.io.counts()
    }

    /// Server `PING`s answered so far (each one write of `PONG`).
    pub fn pings_answered(&self) -> u64 {
        self.s.pings_answered()
    }

    /// A handle that can cut this connection from another thread; a blocked
    /// read then fails with [`NatsError::Closed`] or an I/O error.
    pub fn interrupter(&self) -> std::io::Result<Interrupter> {
        Interrupter::new(&self.io.sock.sock)
    }

    /// Hands the connection over to another driver (an async one): its
    /// socket (left blocking, with the I/O timeout as its socket timeouts),
    /// its protocol state, and its TLS session when it is encrypted.
    /// [`NatsError::Busy`] when replies are owed or operations queued (the
    /// connection is dropped then).
    pub fn into_parts(self) -> Result<Parts, NatsError> {
        self.s.idle()?;
        if !self.s.queued().is_empty() {
            return Err(NatsError::Busy);
        }
        let NatsConnection { io, s, .. } = self;
        let (socket, tls) = io.into_parts();
        Ok(Parts {
            socket: socket.into(),
            session: s,
            tls,
        })
    }

    /// Marks the connection broken and hands `e` back.
    fn broke(&mut self, e: NatsError) -> NatsError {
        self.s.mark_broken();
        e
    }

    /// Writes what is queued with one write.
    fn flush_tx(&mut self) -> Result<(), NatsError> {
        let r = self.io.write_all(&mut [IoSlice::new(self.s.queued())]);
        match r {
            Ok(()) => {
                self.s.queue_sent();
                Ok(())
            }
            Err(e) => {
                self.s.clear_queue();
                Err(self.broke(e))
            }
        }
    }

    /// Answers the server's `PING`s read so far, one write of `PONG` each.
    ///
    /// A PONG is not a caller's request: a caller waiting for a reply owed
    /// maps a failed write of one with [`not_the_request`].
    #[inline]
    fn answer_pings(&mut self) -> Result<(), NatsError> {
        while let Some(pong) = self.s.pong() {
            if let Err(e) = self.io.send(pong) {
                return Err(self.broke(e));
            }
        }
        Ok(())
    }

    /// Reads more bytes before the deadline.
    fn fill(
        &mut self,
        started: Instant,
        wait: Duration,
        first: &mut bool,
        soft: bool,
    ) -> Result<(), NatsError> {
        let room = self.s.recv_room()?;
        match self.io.fill(room, started, wait, first) {
            Ok(n) => {
                self.s.received(n);
                // What the settings say follows the server's latest INFO.
                self.cfg.limits = *self.s.limits();
                Ok(())
            }
            // After the handshake a TLS failure breaks a request whose
            // outcome is then unknown.
            Err(NatsError::Tls(t)) if self.step.is_empty() => {
                Err(self.broke(NatsError::Io(std::io::Error::other(t.to_string()))))
            }
            // A deadline that is not the connection's: nothing was lost.
            Err(e @ NatsError::Timeout { .. }) if soft => Err(e),
            Err(e) => Err(self.broke(e)),
        }
    }

    /// Polls the session with `poll` until it has an answer, on the
    /// session's deadlines for what is owed (a PubAck, a confirmation, a
    /// pull, the reply to a lone put or a request): each read waits at
    /// most until the next of them, where the session acts (a probe it
    /// queues is written at once; a reply overdue breaks the connection).
    /// Answers the server's `PING`s on the way.
    fn wait_owed<T>(
        &mut self,
        mut poll: impl FnMut(&mut NatsSession) -> Result<Option<T>, NatsError>,
    ) -> Result<T, NatsError> {
        // One clock read for the wait's start; the first read needs no
        // other when the socket's timeout (the I/O timeout) fits in what is
        // left, as for a lone reply it does.
        let start = Instant::now();
        self.s.start_wait(start);
        let mut first = true;
        loop {
            let r = poll(&mut self.s);
            let pongs = self.answer_pings();
            // An answer read stands whatever the PONG's write came to (the
            // connection is marked broken for the next call).
            if let Some(v) = r? {
                return Ok(v);
            }
            pongs.map_err(not_the_request)?;
            let now = if first { start } else { Instant::now() };
            let due = self.s.poll_timeout();
            if due.is_some_and(|d| d <= now) {
                self.s.handle_timeout(now)?;
                if !self.s.queued().is_empty() {
                    self.flush_tx()?;
                }
                first = false;
                continue;
            }
            // Nothing due (a huge I/O timeout): each read waits the I/O
            // timeout, and the session is asked again.
            let wait = due.map_or(self.cfg.io_timeout, |d| d - now);
            first = first && wait >= self.cfg.io_timeout;
            match self.fill(now, wait, &mut first, true) {
                Ok(()) => {}
                Err(NatsError::Timeout { .. }) => {
                    // The socket's deadline allows a little slack: what is
                    // left of the session's is slept, not spun.
                    if let Some(left) = due.and_then(|d| d.checked_duration_since(Instant::now())) {
                        std::thread::sleep(left);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pong_that_could_not_be_written_never_says_the_request_was_not_sent() {
        let e = not_the_request(NatsError::NotSent(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        assert!(
            matches!(&e, NatsError::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe),
            "{e:?}"
        );
        assert!(matches!(
            not_the_request(NatsError::Broken),
            NatsError::Io(_)
        ));
        // Anything else is what it was.
        assert!(matches!(
            not_the_request(NatsError::Closed),
            NatsError::Closed
        ));
        assert!(not_the_request(NatsError::Timeout {
            waited: Duration::from_secs(1)
        })
        .is_timeout());
    }
}
