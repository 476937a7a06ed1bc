//! The JetStream side of the producer's engine seam: a put is a publish to
//! the tube's subject (`taskq.T`) with a `Nats-Msg-Id`, answered by the
//! stream's PubAck; the job id is the stream sequence. A delayed job goes
//! where [`crate::delays`] says: to a schedule the server holds, or to the
//! tube with its ready time.
//!
//! Every put carries a message id unique to this producer (a random prefix
//! and a counter that survives reconnects). A put whose PubAck never came is
//! sent again with the same id on a fresh connection; the stream keeps ids
//! for its duplicate window (2 minutes by default) and stores the job once,
//! answering the re-send with the original sequence. So on this engine the
//! producer itself resolves an unknown outcome, within
//! [`Builder::resolve_for`](crate::Builder::resolve_for).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use taskq_connect::nats::{
    run_blocking, JetStream, NatsAccess, NatsConfig, NatsConnection, StreamSpec,
};
#[cfg(feature = "tokio")]
use taskq_connect::tokio::AsyncNatsConn;
use taskq_connect::Layout;
use taskq_proto::nats::NatsError;
use taskq_proto::{ConnectionConfig, ConnectionError};

use crate::classify::Chunk;
use crate::classify::{chunk_write_failed, read_chunk};
use crate::delays::{stream_and_delays, Delays, Put, Route, Stamp};
use crate::error::{Error, Invalid, NotSent, Rejection};
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::{JobId, PutOptions};

/// What a producer needs to set JetStream up and name its messages.
#[derive(Debug, Clone)]
pub(crate) struct NatsSetup {
    /// The stream and its subjects.
    pub(crate) layout: Layout,
    /// Replicas when the stream is created; `None`: 3 on a cluster of 3 or
    /// more nodes, else 1.
    pub(crate) replicas: Option<usize>,
    /// The producer's message ids, shared by its successive connections.
    pub(crate) ids: MsgIds,
    /// The cluster's nodes as the last connection learned them (`INFO`),
    /// tried after the seeds on the next connect.
    pub(crate) known: Vec<String>,
    /// Credentials and TLS.
    pub(crate) access: NatsAccess,
    /// The seeds as given (`host:port`, names kept for TLS); empty when the
    /// producer was given socket addresses.
    pub(crate) seeds: Vec<String>,
    /// Never change an existing stream (so never turn message schedules on
    /// for one): [`Builder::keep_stream_config`](crate::Builder::keep_stream_config).
    pub(crate) keep_stream_config: bool,
    /// How long the stream's lookup and creation retry while the cluster
    /// has no leader: [`Builder::api_patience`](crate::Builder::api_patience).
    pub(crate) api_patience: Duration,
    /// [`Builder::resolve_for`](crate::Builder::resolve_for) as asked.
    resolve_for: Duration,
    /// The stream's duplicate window, as the last connection found it.
    duplicate_window: Option<Duration>,
}

/// How long an unknown put may be re-sent with its message id: the time
/// asked, cut to nine tenths of the stream's duplicate window when that is
/// shorter. The stream stores a copy sent again once only while it still
/// remembers the id, for the window from the first copy's store, which
/// comes after the put's first send; a re-send is begun no later than nine
/// tenths of the window after that send, so that its way to the server and
/// the server's sweep of old ids, at whatever moment it runs, still find
/// the id. A window of zero (not said) cuts nothing.
pub(crate) fn resolve_within(asked: Duration, window: Option<Duration>) -> Duration {
    // Past a century is for ever, and still a time the clock can add.
    let asked = asked.min(Duration::from_secs(100 * 365 * 24 * 3600));
    match window {
        Some(w) if !w.is_zero() => asked.min(w / 10 * 9),
        _ => asked,
    }
}

/// Queues `chunk`'s puts on JetStream, job `i` with the message id of
/// counter `first + i` (`publish` queues one: subject, message id, further
/// headers, body): the one encoding of a batch's write, for the blocking
/// and the async producer.
pub(crate) fn queue_chunk<B: AsRef<[u8]>>(
    ids: &MsgIds,
    route: &mut Route,
    chunk: &Chunk<'_, B>,
    mut publish: impl FnMut(&str, &[u8], &[(&[u8], &[u8])], &[u8]) -> Result<(), NatsError>,
) -> Result<(), NatsError> {
    let mut buf = IdBuf::new();
    let stamp = Stamp::now(chunk.opts.delay);
    let (from, end) = chunk.span();
    for (i, body) in chunk.bodies.iter().enumerate().take(end).skip(from) {
        let id = ids.id(chunk.first + i as u64, &mut buf);
        let put = Put::new(route, stamp.as_ref(), id);
        publish(put.subject(), id, put.extra(), body.as_ref())?;
    }
    Ok(())
}

impl NatsSetup {
    pub(crate) fn new(
        layout: Layout,
        replicas: Option<usize>,
        access: NatsAccess,
        seeds: Vec<String>,
        keep_stream_config: bool,
        api_patience: Duration,
        resolve_for: Duration,
    ) -> NatsSetup {
        NatsSetup {
            layout,
            replicas,
            ids: MsgIds::new(),
            known: Vec::new(),
            access,
            seeds,
            keep_stream_config,
            api_patience,
            resolve_for,
            duplicate_window: None,
        }
    }

    /// How long an unknown put is re-sent with its id ([`resolve_within`]
    /// the stream's duplicate window as last found).
    pub(crate) fn resolve_for(&self) -> Duration {
        resolve_within(self.resolve_for, self.duplicate_window)
    }

    /// The stream found on a connection remembers ids for `window`: says
    /// once when that cuts short the time asked to resolve unknown puts.
    fn found_window(&mut self, window: Duration) {
        let cut = resolve_within(self.resolve_for, Some(window));
        if cut < self.resolve_for && self.duplicate_window != Some(window) {
            tracing::warn!(
                stream = self.layout.stream(),
                duplicate_window_ms = window.as_millis() as u64,
                resolve_for_ms = self.resolve_for.as_millis() as u64,
                resolving_for_ms = cut.as_millis() as u64,
                "the stream's duplicate window is shorter than resolve_for: a put whose \
                 outcome is unknown is re-sent only within the window, so that it is \
                 never stored twice"
            );
        }
        self.duplicate_window = Some(window);
    }
}

/// A producer's message ids: `<16 random base-36 digits>-<counter>`. The
/// counter is shared by the producer's connections, so a reconnect never
/// reuses an id (which the stream would take for a duplicate).
#[derive(Debug, Clone)]
pub(crate) struct MsgIds {
    prefix: [u8; 17],
    next: Arc<AtomicU64>,
}

impl MsgIds {
    fn new() -> MsgIds {
        let mut prefix = [b'-'; 17];
        for b in &mut prefix[..16] {
            *b = b"0123456789abcdefghijklmnopqrstuvwxyz"[fastrand::usize(..36)];
        }
        MsgIds {
            prefix,
            next: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Takes `n` consecutive counters; returns the first.
    #[inline]
    pub(crate) fn take(&self, n: u64) -> u64 {
        self.next.fetch_add(n, Ordering::Relaxed)
    }

    /// The id of counter `k`, written into `buf`.
    #[inline]
    pub(crate) fn id<'b>(&self, k: u64, buf: &'b mut IdBuf) -> &'b [u8] {
        buf.0[..17].copy_from_slice(&self.prefix);
        let mut digits = itoa::Buffer::new();
        let d = digits.format(k).as_bytes();
        buf.0[17..17 + d.len()].copy_from_slice(d);
        &buf.0[..17 + d.len()]
    }
}

/// Room for one message id on the stack.
pub(crate) struct IdBuf([u8; 40]);

impl IdBuf {
    pub(crate) fn new() -> IdBuf {
        IdBuf([0; 40])
    }
}

/// A producer's connection to a JetStream cluster.
#[derive(Debug)]
pub(crate) struct NatsLink {
    conn: NatsConnection,
    layout: Layout,
    ids: MsgIds,
    /// Who holds delayed jobs on this connection.
    delays: Delays,
    /// Where puts into the tube in use go.
    route: Route,
    /// The counter of the last put, for a re-send with the same id.
    last: u64,
}

impl NatsLink {
    /// Connects to the first seed that answers, makes sure the stream exists
    /// (creating it when missing; one that does not fit is an error), and
    /// puts into `tube`.
    pub(crate) fn open(
        seeds: &[SocketAddr],
        cfg: NatsConfig,
        setup: &mut NatsSetup,
        tube: &str,
    ) -> Result<NatsLink, Error> {
        let (conn, delays) = connect_stream(seeds, cfg, setup)?;
        Ok(NatsLink {
            conn,
            layout: setup.layout.clone(),
            ids: setup.ids.clone(),
            delays,
            route: Route::new(&setup.layout, tube, delays),
            last: 0,
        })
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    pub(crate) fn io_counts(&self) -> taskq_proto::IoCounts {
        self.conn.io_counts()
    }

    /// Puts later jobs into `tube` (checked by the caller): only the route changes.
    pub(crate) fn use_tube(&mut self, tube: &str) {
        self.route = Route::new(&self.layout, tube, self.delays);
    }

    /// One put with a fresh id: one write, one PubAck.
    #[inline]
    pub(crate) fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let k = self.ids.take(1);
        self.put_as(k, body, opts)
    }

    /// The counter of the last put (whose outcome a re-send resolves).
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// One put with the id of counter `k` (a fresh one, or a re-send).
    #[inline]
    pub(crate) fn put_as(&mut self, k: u64, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        self.last = k;
        let mut buf = IdBuf::new();
        let id = self.ids.id(k, &mut buf);
        let stamp = Stamp::now(opts.delay);
        let put = Put::new(&mut self.route, stamp.as_ref(), id);
        let r = self.conn.publish_with(put.subject(), id, put.extra(), body);
        match r {
            Ok(ack) => Ok(JobId::new(ack.stream_seq)),
            Err(e) => Err(from_nats(e)),
        }
    }

    /// Sends `chunk` in one write, with the ids of counters `first + from
    /// ..`, and reads their PubAcks in order into `out`.
    pub(crate) fn put_chunk<B: AsRef<[u8]>>(
        &mut self,
        chunk: Chunk<'_, B>,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<(), BatchError> {
        let (ids, route, conn) = (&self.ids, &mut self.route, &mut self.conn);
        let queued = queue_chunk(ids, route, &chunk, |subject, id, extra, body| {
            conn.queue_publish(subject, id, extra, body)
        });
        if let Err(e) = queued {
            // Nothing of the chunk was written yet: drop what was queued.
            self.conn.mark_broken();
            return Err(chunk.not_sent(from_nats(e)));
        }
        if let Err(e) = self.conn.flush() {
            return Err(chunk_write_failed(from_nats(e), out, chunk.span()));
        }
        let conn = &mut self.conn;
        let r = read_chunk(out, report, chunk.span(), || {
            conn.recv_puback()
                .map(|a| JobId::new(a.stream_seq))
                .map_err(from_nats)
        });
        if r.is_err() && !self.conn.is_broken() {
            // PubAcks still owed would be read as the next chunk's.
            self.conn.mark_broken();
        }
        r
    }

    /// Closes the connection.
    pub(crate) fn quit(self) {
        drop(self.conn);
    }
}

impl NatsSetup {
    /// The nodes to try, in order (the seeds as given, then the nodes the
    /// last connection learned), and the connection's settings.
    fn plan(&self, seeds: &[SocketAddr], cfg: NatsConfig) -> (Vec<String>, NatsConfig) {
        let mut nodes: Vec<String> = if self.seeds.is_empty() {
            seeds.iter().map(SocketAddr::to_string).collect()
        } else {
            self.seeds.clone()
        };
        for k in &self.known {
            if !nodes.contains(k) {
                nodes.push(k.clone());
            }
        }
        let cfg = NatsConfig {
            access: self.access.clone(),
            api_patience: self.api_patience,
            ..cfg
        };
        (nodes, cfg)
    }

    /// A connection opened on a cluster announcing `servers`: remembers
    /// them for the next connect, and says the stream to make sure of.
    fn opened(&mut self, servers: &[String]) -> StreamSpec {
        self.known.clear();
        self.known.extend(servers.iter().cloned());
        let replicas = self
            .replicas
            .unwrap_or(if servers.len() >= 3 { 3 } else { 1 });
        StreamSpec {
            name: self.layout.stream().to_owned(),
            subjects: vec![self.layout.capture()],
            replicas,
            duplicate_window: None,
        }
    }
}

/// Connects to the first seed that answers (the seeds as given, then the
/// nodes the last connection learned) and makes sure the stream exists,
/// creating it when missing; one that does not fit is an error. Says who
/// holds delayed jobs on the connection ([`stream_and_delays`]). Updates the
/// nodes learned.
pub(crate) fn connect_stream(
    seeds: &[SocketAddr],
    cfg: NatsConfig,
    setup: &mut NatsSetup,
) -> Result<(NatsConnection, Delays), Error> {
    let (nodes, cfg) = setup.plan(seeds, cfg);
    let mut conn =
        NatsConnection::connect(&nodes, cfg).map_err(|e| setup_failed("connecting", e))?;
    let spec = setup.opened(conn.servers());
    let keep = setup.keep_stream_config;
    let (delays, window) = run_blocking(stream_and_delays(&mut JetStream(&mut conn), &spec, keep))
        .map_err(|e| setup_failed("looking up the stream", e))?;
    setup.found_window(window);
    Ok((conn, delays))
}

/// [`connect_stream`] on tokio: the same steps and rules, by the async
/// driver (name resolution, connect, TLS, credentials and the stream's
/// lookup all awaited on the runtime).
#[cfg(feature = "tokio")]
pub(crate) async fn connect_stream_async(
    seeds: &[SocketAddr],
    cfg: NatsConfig,
    setup: &mut NatsSetup,
) -> Result<(AsyncNatsConn, Delays), Error> {
    let (nodes, cfg) = setup.plan(seeds, cfg);
    let mut conn = AsyncNatsConn::connect(&nodes, &cfg)
        .await
        .map_err(|e| setup_failed("connecting", e))?;
    let spec = setup.opened(conn.servers());
    let keep = setup.keep_stream_config;
    let (delays, window) = stream_and_delays(&mut conn.js(), &spec, keep)
        .await
        .map_err(|e| setup_failed("looking up the stream", e))?;
    setup.found_window(window);
    Ok((conn, delays))
}

/// The NATS settings of a producer's connection settings.
pub(crate) fn nats_config(cfg: &ConnectionConfig) -> NatsConfig {
    NatsConfig {
        connect_timeout: cfg.connect_timeout,
        io_timeout: cfg.io_timeout,
        keepalive: cfg.keepalive,
        ..NatsConfig::default()
    }
}

/// A failure while `step` (connecting, the handshake, the stream's lookup or
/// creation): none of the caller's puts was written yet, so whatever the
/// step's own request came to, the put is not sent. A connection that broke
/// or a reply that did not come is said as such, without the "outcome
/// unknown" of a put.
fn setup_failed(step: &str, e: NatsError) -> Error {
    use std::io::{Error as IoError, ErrorKind};
    let io = |kind: ErrorKind, what: String| Error::NotSent(NotSent::Io(IoError::new(kind, what)));
    match e {
        NatsError::Mismatch(what) => Error::NotSent(NotSent::Layout(what)),
        NatsError::Unsupported(what) => Error::NotSent(NotSent::Layout(what.to_owned())),
        NatsError::NoResponders => Error::NotSent(NotSent::Unavailable),
        // The cluster has no leader (yet): what a 503 no-responders says too.
        NatsError::Api(a) if a.code == 503 || a.err_code == 10008 => {
            Error::NotSent(NotSent::Unavailable)
        }
        NatsError::Api(a) => Error::NotSent(NotSent::Layout(a.to_string())),
        NatsError::NotSent(e) => Error::NotSent(NotSent::Io(e)),
        NatsError::Broken => Error::NotSent(NotSent::Broken),
        NatsError::Timeout { waited } => io(
            ErrorKind::TimedOut,
            format!("no reply within {waited:?} while {step}"),
        ),
        NatsError::Closed => io(
            ErrorKind::ConnectionAborted,
            format!("the server closed the connection while {step}"),
        ),
        NatsError::Io(e) => io(e.kind(), format!("connection broke while {step}: {e}")),
        NatsError::Invalid(e) => Error::Invalid(Invalid::Nats(e)),
        // The connection's own setup broke: said as the step's failure, and
        // retried as one when it comes and goes.
        // A server that said nothing at all (no INFO) is an answer too: a
        // port that is not NATS's, a server that wants TLS first.
        e if e.server_said_nothing() => io(ErrorKind::Other, format!("{step}: {e}")),
        NatsError::Handshake { during, error } => {
            setup_failed(&format!("{step} ({during})"), *error)
        }
        NatsError::Refused(r) => Error::NotSent(NotSent::Refused(r)),
        NatsError::Tls(t) => Error::NotSent(NotSent::Tls(t)),
        NatsError::Credentials(what) => Error::NotSent(NotSent::Credentials(what)),
        e => io(ErrorKind::Other, format!("{step}: {e}")),
    }
}

/// True when a JetStream producer's connection failed in a way that comes and
/// goes: the server was reached and the connection broke, a reply did not
/// come in time, or the cluster had no leader (an election). Opened again,
/// with the reconnect backoff, within `resolve_for`. Nobody listening, a
/// server's refusal and a stream that does not fit are answers: not retried.
pub(crate) fn open_again(e: &Error) -> bool {
    use std::io::ErrorKind;
    match e {
        Error::NotSent(NotSent::Unavailable | NotSent::Broken) => true,
        Error::NotSent(NotSent::Io(io)) => matches!(
            io.kind(),
            ErrorKind::TimedOut
                | ErrorKind::WouldBlock
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
                | ErrorKind::Interrupted
        ),
        _ => false,
    }
}

/// JetStream's error number for a publish whose message id is a copy the
/// stream is still storing (nats-server 2.11 and later).
const DUPLICATE_IN_PROCESS: u64 = 10158;

/// Sorts a NATS error into the producer's outcomes: not sent, rejected (a
/// JetStream API error: nothing stored), or unknown.
pub(crate) fn from_nats(e: NatsError) -> Error {
    match e {
        NatsError::Invalid(e) => Error::Invalid(Invalid::Nats(e)),
        NatsError::NotSent(io) => Error::NotSent(NotSent::Io(io)),
        NatsError::NoResponders => Error::NotSent(NotSent::Unavailable),
        // "Duplicate message id is in process": the stream is still deciding
        // on an earlier copy of this very put (during a leader election), so
        // it is no answer yet. Nothing of this copy is stored; it goes again
        // after a pause, as for no responders. Only a re-send meets it, so
        // the put's resolution already counts it as maybe stored: out of
        // time it ends unknown, never not sent.
        NatsError::Api(a) if a.err_code == DUPLICATE_IN_PROCESS => {
            Error::NotSent(NotSent::Unavailable)
        }
        NatsError::Api(a) => Error::Rejected(Rejection::JetStream {
            code: u16::try_from(a.code).unwrap_or(u16::MAX),
            err_code: u32::try_from(a.err_code).unwrap_or(u32::MAX),
        }),
        NatsError::Timeout { waited } => Error::Unknown(ConnectionError::Timeout { waited }),
        NatsError::Closed => Error::Unknown(ConnectionError::Closed),
        NatsError::Io(io) => Error::Unknown(ConnectionError::Io(io)),
        NatsError::Mismatch(what) => Error::NotSent(NotSent::Layout(what)),
        NatsError::Unsupported(what) => Error::NotSent(NotSent::Layout(what.to_owned())),
        NatsError::Refused(r) => Error::NotSent(NotSent::Refused(r)),
        NatsError::Tls(t) => Error::NotSent(NotSent::Tls(t)),
        NatsError::Credentials(what) => Error::NotSent(NotSent::Credentials(what)),
        NatsError::Permission(_) => Error::Rejected(Rejection::Permission),
        e @ NatsError::Handshake { .. } => {
            Error::NotSent(NotSent::Io(std::io::Error::other(e.to_string())))
        }
        e if e.outcome_unknown() => {
            Error::Unknown(ConnectionError::Io(std::io::Error::other(e.to_string())))
        }
        _ => Error::NotSent(NotSent::Broken),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn message_ids_are_unique_per_producer_and_counter() {
        let a = MsgIds::new();
        let b = MsgIds::new();
        let (mut x, mut y) = (IdBuf::new(), IdBuf::new());
        assert_ne!(a.id(1, &mut x), b.id(1, &mut y), "random prefixes differ");
        let k = a.take(2);
        assert_eq!(a.take(1), k + 2);
        let id = a.id(u64::MAX, &mut x).to_vec();
        assert_eq!(id.len(), 17 + 20);
        assert_eq!(id[16], b'-');
        assert!(id[..16].iter().all(u8::is_ascii_alphanumeric));
        // A clone (a reconnect's link) continues the same counter.
        let c = a.clone();
        assert_eq!(c.take(1), k + 3);
    }

    #[test]
    fn unknown_puts_are_re_sent_only_within_nine_tenths_of_the_duplicate_window() {
        let s = Duration::from_secs;
        // The default 30 s inside the default 2-minute window: untouched.
        assert_eq!(resolve_within(s(30), Some(s(120))), s(30));
        // A short window cuts it, with a tenth kept for the way there.
        assert_eq!(resolve_within(s(30), Some(s(10))), s(9));
        assert_eq!(
            resolve_within(s(30), Some(Duration::from_millis(1000))),
            Duration::from_millis(900)
        );
        // Not known yet, or not said: as asked.
        assert_eq!(resolve_within(s(30), None), s(30));
        assert_eq!(resolve_within(s(30), Some(Duration::ZERO)), s(30));
        // For ever is a century: a deadline the clock can hold.
        let ever = resolve_within(Duration::MAX, None);
        assert!(ever >= s(3_000_000_000) && std::time::Instant::now().checked_add(ever).is_some());
        // The setup keeps the time asked and the window it last found.
        let mut setup = NatsSetup::new(
            Layout::default(),
            None,
            NatsAccess::default(),
            Vec::new(),
            false,
            s(10),
            s(30),
        );
        assert_eq!(setup.resolve_for(), s(30));
        setup.found_window(s(2));
        assert_eq!(setup.resolve_for(), Duration::from_millis(1800));
        setup.found_window(s(120));
        assert_eq!(setup.resolve_for(), s(30));
    }

    #[test]
    fn a_failed_setup_is_not_sent_and_only_what_comes_and_goes_is_tried_again() {
        use std::io::{Error as IoError, ErrorKind};
        let again = |e: NatsError| {
            let e = setup_failed("looking up the stream", e);
            assert!(e.not_sent(), "{e}");
            assert!(!e.to_string().contains("unknown"), "{e}");
            (open_again(&e), e.to_string())
        };
        let (yes, text) = again(NatsError::Timeout {
            waited: Duration::from_secs(1),
        });
        assert!(yes);
        assert!(text.contains("no reply within 1s while looking up the stream"));
        let (yes, text) = again(NatsError::Closed);
        assert!(yes);
        assert!(text.contains("closed the connection while looking up the stream"));
        let reset = IoError::from(ErrorKind::ConnectionReset);
        assert!(again(NatsError::Io(reset)).0);
        assert!(again(NatsError::NotSent(IoError::from(ErrorKind::BrokenPipe))).0);
        assert!(again(NatsError::NoResponders).0);
        assert!(again(NatsError::Broken).0);
        let api = |code, err_code| {
            NatsError::Api(taskq_proto::nats::ApiError {
                code,
                err_code,
                description: String::new(),
            })
        };
        assert!(again(api(503, 10008)).0, "no leader yet");
        // Answers, not weather: nobody listening, a refusal, a misfit.
        let refused = IoError::from(ErrorKind::ConnectionRefused);
        assert!(!again(NatsError::NotSent(refused)).0);
        assert!(!again(NatsError::Server("'Authorization Violation'".into())).0);
        assert!(!again(NatsError::Mismatch("retention limits".into())).0);
        assert!(!again(api(400, 10052)).0);
        assert!(!again(NatsError::Unsupported("message headers")).0);
        // The handshake's own failures: a silent or closing node comes and
        // goes; a refusal or a TLS failure is an answer, kept typed.
        let (yes, text) = again(NatsError::Handshake {
            during: "waiting for PONG",
            error: Box::new(NatsError::Timeout {
                waited: Duration::from_secs(1),
            }),
        });
        assert!(yes, "{text}");
        assert!(
            text.contains("no reply within 1s while looking up the stream (waiting for PONG)"),
            "{text}"
        );
        let reset = IoError::from(ErrorKind::ConnectionReset);
        let (yes, _) = again(NatsError::Handshake {
            during: taskq_proto::nats::WAITING_FOR_INFO,
            error: Box::new(NatsError::Io(reset)),
        });
        assert!(yes, "a reset before INFO is a connection that broke");
        let (yes, text) = again(NatsError::Handshake {
            during: taskq_proto::nats::WAITING_FOR_INFO,
            error: Box::new(NatsError::Closed),
        });
        assert!(!yes && text.contains("--tls-first"), "said nothing: {text}");
        let refusal = taskq_proto::nats::Refusal {
            reason: "Authorization Violation".into(),
            auth: "user alice".into(),
        };
        let e = setup_failed("connecting", NatsError::Refused(refusal));
        assert!(e.auth_refused() && !open_again(&e), "{e}");
        let tls = taskq_proto::nats::TlsError {
            failure: taskq_proto::nats::TlsFailure::UnknownIssuer,
            detail: String::new(),
        };
        let e = setup_failed("connecting", NatsError::Tls(tls));
        assert!(
            matches!(e, Error::NotSent(NotSent::Tls(_))) && !open_again(&e),
            "{e}"
        );
    }

    #[test]
    fn nats_errors_sort_into_put_outcomes() {
        assert!(matches!(
            from_nats(NatsError::NoResponders),
            Error::NotSent(NotSent::Unavailable)
        ));
        assert!(from_nats(NatsError::Timeout {
            waited: Duration::from_secs(1)
        })
        .outcome_unknown());
        assert!(from_nats(NatsError::Closed).outcome_unknown());
        assert!(from_nats(NatsError::Broken).not_sent());
        let api = taskq_proto::nats::ApiError {
            code: 503,
            err_code: 10077,
            description: "maximum messages exceeded".into(),
        };
        assert!(matches!(
            from_nats(NatsError::Api(api)),
            Error::Rejected(Rejection::JetStream {
                code: 503,
                err_code: 10077
            })
        ));
        // An earlier copy still being stored is no answer: sent again after a pause.
        let in_process = taskq_proto::nats::ApiError {
            code: 409,
            err_code: 10158,
            description: "duplicate message id is in process".into(),
        };
        assert!(matches!(
            from_nats(NatsError::Api(in_process)),
            Error::NotSent(NotSent::Unavailable)
        ));
    }
}
