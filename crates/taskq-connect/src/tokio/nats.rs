//! The async JetStream driver: one tokio `TcpStream` under a
//! [`NatsSession`], beside the blocking `NatsConnection` over the same
//! session (whose rules it mirrors: one write per put or batch, a deadline
//! on each whole reply, `PING`s answered as they come, broken for good after
//! a timeout, an I/O error, a server `-ERR` or bytes it cannot decode).
//!
//! [`AsyncNatsConn::connect`] opens a connection on tokio: name resolution,
//! the TCP connect, and the handshake as the proto's [`Handshake`] orders it
//! (the same steps the blocking driver takes), with TLS run by the
//! [`TlsSession`]'s own handshake steps over the tokio stream. A connected
//! blocking connection can also be taken over ([`AsyncNatsConn::adopt`]).

use std::future::poll_fn;
use std::io::IoSlice;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::nats::{Event, Handshake, HandshakeStep, NatsError, NatsSession, PubAck};
use taskq_proto::{ConnectionError, IoCounts};

use crate::nats::client::tls::TlsStep;
use crate::nats::client::{ends_search, new_tls, no_seed, sign, tls_names};
use crate::nats::{ApiLink, JetStream, NatsConfig, NatsConnection, TlsSession};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::io::{open_stream, poll_read_into, write_all, write_rest, Deadline};

/// Bodies up to this size are copied behind their header block and sent
/// from one buffer; larger ones go out as a vectored write of three parts.
const WHOLE_PUT: usize = 16 * 1024;

/// A JetStream connection over tokio.
pub struct AsyncNatsConn {
    stream: TcpStream,
    session: NatsSession,
    counts: IoCounts,
    deadline: Deadline,
    /// A write began and has not ended: a put dropped in the middle of its
    /// write leaves the stream out of step.
    writing: bool,
    /// The TLS session every byte goes through, when encrypted.
    tls: Option<Box<TlsSession>>,
    /// How long JetStream calls are tried again while the cluster has no leader.
    api_patience: Duration,
}

impl std::fmt::Debug for AsyncNatsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncNatsConn")
            .field("session", &self.session)
            .field("counts", &self.counts)
            .finish()
    }
}

impl AsyncNatsConn {
    /// Connects to the first of `seeds` (`host:port`) that completes the
    /// handshake, as the blocking `NatsConnection::connect` does and by the
    /// same rules (the seeds in order, each one's TLS name, credentials
    /// refused by one node ending the search), all on tokio.
    pub async fn connect<S: AsRef<str>>(
        seeds: &[S],
        cfg: &NatsConfig,
    ) -> Result<AsyncNatsConn, NatsError> {
        let mut last = None;
        for (seed, tls_name) in tls_names(seeds) {
            let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host(seed).await {
                Ok(a) => a.collect(),
                Err(e) => {
                    last = Some(NatsError::NotSent(e));
                    continue;
                }
            };
            for a in addrs {
                match AsyncNatsConn::open(a, tls_name, cfg).await {
                    Ok(c) => return Ok(c),
                    Err(e) if ends_search(&e) => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
        }
        Err(last.unwrap_or_else(no_seed))
    }

    /// Connects to `addr`, the node named `host` (for TLS), and runs the handshake.
    async fn open(
        addr: std::net::SocketAddr,
        host: &str,
        cfg: &NatsConfig,
    ) -> Result<AsyncNatsConn, NatsError> {
        let stream = open_stream(addr, cfg.connect_timeout, cfg.keepalive)
            .await
            .map_err(NatsError::NotSent)?;
        let peer = addr.to_string();
        let mut session = NatsSession::new(cfg.limits, &peer);
        session.set_io_timeout(cfg.io_timeout);
        let mut c = AsyncNatsConn {
            stream,
            session,
            counts: IoCounts::default(),
            deadline: Deadline::new(),
            writing: false,
            tls: None,
            api_patience: cfg.api_patience,
        };
        let started = Instant::now();
        let tls = &cfg.access.tls;
        let mut hs = Handshake::new(
            started.into_std(),
            cfg.io_timeout,
            tls.first,
            tls.wanted() || tls.seen.wants_tls(&peer),
            &peer,
        );
        if let Err(e) = c.handshake(&mut hs, started, host, cfg).await {
            c.session.mark_broken();
            return Err(if e.outcome_unknown() {
                NatsError::Handshake {
                    during: hs.during(),
                    error: Box::new(e),
                }
            } else {
                e
            });
        }
        if c.is_tls() {
            cfg.access.tls.seen.spoke_tls(&peer, c.servers());
        }
        Ok(c)
    }

    /// The handshake's steps, each read held to the handshake's deadline.
    async fn handshake(
        &mut self,
        hs: &mut Handshake,
        started: Instant,
        host: &str,
        cfg: &NatsConfig,
    ) -> Result<(), NatsError> {
        let wait = hs.wait();
        let mut started = Some(started);
        loop {
            let step = hs.step(&mut self.session);
            if self.session.pongs_owed() > 0 {
                self.answer_pings().await?;
            }
            match step? {
                HandshakeStep::Read => {
                    let n = poll_fn(|cx| self.poll_read(cx, &mut started, wait)).await?;
                    self.session.received(n);
                }
                HandshakeStep::StartTls => {
                    let mut tls = new_tls(&cfg.access.tls, host)?;
                    self.tls_handshake(&mut tls, &mut started, wait).await?;
                    self.tls = Some(tls);
                    hs.tls_started();
                }
                HandshakeStep::Connect { nonce } => {
                    let signed = sign(&cfg.access, nonce.as_bytes())?;
                    let describe = cfg.access.describe();
                    let creds = cfg.access.credentials(signed.as_ref(), &describe);
                    hs.connect(&mut self.session, &cfg.name, &creds)?;
                }
                HandshakeStep::Write => {
                    let r = write_parts(
                        (&self.stream, self.tls.as_deref_mut()),
                        &mut self.counts,
                        &mut self.deadline,
                        self.session.io_timeout(),
                        [self.session.queued(), &[], &[], &[]],
                    )
                    .await;
                    // The CONNECT line holds the credentials: leave no copy behind.
                    self.session.wipe_queue();
                    r.map_err(NatsError::from)?;
                    hs.written();
                }
                HandshakeStep::Done => return Ok(()),
            }
        }
    }

    /// The TLS handshake by the session's own steps, over the tokio stream.
    async fn tls_handshake(
        &mut self,
        tls: &mut TlsSession,
        started: &mut Option<Instant>,
        wait: Duration,
    ) -> Result<(), NatsError> {
        loop {
            match tls.handshake_step()? {
                TlsStep::Send(records) => write_all(
                    &self.stream,
                    &mut self.counts,
                    &mut self.deadline,
                    self.session.io_timeout(),
                    &mut [IoSlice::new(records)],
                )
                .await
                .map_err(NatsError::from)?,
                TlsStep::Read => {
                    let (stream, counts, deadline) =
                        (&mut self.stream, &mut self.counts, &mut self.deadline);
                    poll_fn(|cx| {
                        let wait = (&mut *started, wait);
                        poll_cipher(stream, tls, counts, deadline, cx, wait)
                    })
                    .await
                    .map_err(|e| match e {
                        ConnectionError::Closed => NatsError::Closed,
                        e => NatsError::from(e),
                    })?;
                }
                TlsStep::Done => return Ok(()),
            }
        }
    }

    /// The server's release as its `INFO` gave it (`2.9.10`).
    pub fn server_version(&self) -> &str {
        self.session.server_version()
    }

    /// The cluster's nodes (`host:port`) as the server last announced them.
    pub fn servers(&self) -> &[String] {
        self.session.servers()
    }

    /// The node's address this connection reached.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }

    /// True when the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Takes over a connected blocking connection: its socket (made
    /// non-blocking and registered with the current runtime), its session
    /// and its TLS session. Errors are of setting the socket up: nothing of
    /// the caller's was sent.
    pub fn adopt(conn: NatsConnection, io_timeout: Duration) -> Result<AsyncNatsConn, NatsError> {
        let parts = conn.into_parts()?;
        parts
            .socket
            .set_nonblocking(true)
            .map_err(NatsError::NotSent)?;
        let stream = TcpStream::from_std(parts.socket).map_err(NatsError::NotSent)?;
        let mut session = parts.session;
        session.set_io_timeout(io_timeout);
        Ok(AsyncNatsConn {
            stream,
            session,
            counts: IoCounts::default(),
            deadline: Deadline::new(),
            writing: false,
            tls: parts.tls,
            api_patience: taskq_proto::defaults::API_PATIENCE,
        })
    }

    /// True once the connection is out of step; it must be replaced.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.session.is_broken() || self.writing
    }

    /// True when the connection is in step and owes nothing: no PubAck,
    /// pull or confirmation. False between calls of a one-request-at-a-time
    /// caller means a call's future was dropped mid-way.
    #[inline]
    pub fn is_idle(&self) -> bool {
        !self.writing && self.session.idle().is_ok()
    }

    /// Marks the connection broken.
    pub fn mark_broken(&mut self) {
        self.session.mark_broken();
    }

    /// System calls that moved bytes (or failed) so far.
    pub fn io_counts(&self) -> IoCounts {
        self.counts
    }

    /// The session under the connection, for a driver that queues its own
    /// operations (a worker's pulls and acks) and reads what comes with
    /// [`poll_fill`](Self::poll_fill); [`flush`](Self::flush) writes them.
    pub fn session_mut(&mut self) -> &mut NatsSession {
        &mut self.session
    }

    /// One read into the session (through TLS when encrypted), with no
    /// deadline of its own: for a driver whose state machine owns the
    /// deadlines and wakes itself at them. `Ready(Ok(n))`: `n` bytes of
    /// plaintext are in the session. After it, a driver answers what the
    /// session read ([`answer_pings`](Self::answer_pings)).
    pub fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, NatsError>> {
        let mut started = None;
        match self.poll_read(cx, &mut started, Duration::MAX) {
            Poll::Ready(Ok(n)) => {
                self.session.received(n);
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    /// Server `PING`s answered so far.
    pub fn pings_answered(&self) -> u64 {
        self.session.pings_answered()
    }

    /// Publishes `body` to `subject` with dedup id `msg_id` (and `extra`
    /// headers) and waits for its PubAck: one write, then reads until the
    /// reply with this put's token, answering `PING`s on the way.
    #[inline]
    pub async fn publish(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<PubAck, NatsError> {
        if self.writing {
            self.session.mark_broken();
        }
        let whole = body.len() <= WHOLE_PUT;
        let io_timeout = self.session.io_timeout();
        let put = if whole {
            self.session.start_put_whole(subject, msg_id, extra, body)?
        } else {
            self.session.start_put(subject, msg_id, extra, body.len())?
        };
        let token = put.token;
        let (queued, head) = (put.queued, put.head);
        let tail: [&[u8]; 2] = if whole { [&[], &[]] } else { [body, b"\r\n"] };
        self.writing = true;
        let r = match self.tls.as_deref_mut() {
            None if whole && queued.is_empty() => {
                // The hot path: one contiguous write, almost always whole at once.
                match self.stream.try_write(head) {
                    Ok(n) if n == head.len() => {
                        self.counts.writes += 1;
                        Ok(())
                    }
                    other => {
                        let sent = match other {
                            Ok(n) => {
                                self.counts.writes += 1;
                                n
                            }
                            // Not writable yet, or interrupted: the loop waits or retries.
                            Err(_) => 0,
                        };
                        let bufs = &mut [IoSlice::new(&head[sent..])];
                        write_rest(
                            &self.stream,
                            &mut self.counts,
                            &mut self.deadline,
                            io_timeout,
                            bufs,
                            sent,
                        )
                        .await
                    }
                }
            }
            tls => {
                write_parts(
                    (&self.stream, tls),
                    &mut self.counts,
                    &mut self.deadline,
                    io_timeout,
                    [queued, head, tail[0], tail[1]],
                )
                .await
            }
        };
        self.sent(r)?;
        let m = self.read_owed(|s| s.poll_reply(token)).await?;
        self.session.puback(m)
    }

    /// After a write: the queue is sent, or the connection is broken.
    fn sent(&mut self, r: Result<(), ConnectionError>) -> Result<(), NatsError> {
        self.writing = false;
        match r {
            Ok(()) => {
                self.session.queue_sent();
                Ok(())
            }
            Err(e) => {
                self.session.clear_queue();
                self.session.mark_broken();
                Err(NatsError::from(e))
            }
        }
    }

    /// Queues a publish for [`flush`](Self::flush) and returns its reply
    /// token; its PubAck is read by [`recv_puback`](Self::recv_puback), in
    /// the order of queueing, or by [`recv_any_puback`](Self::recv_any_puback).
    pub fn queue_publish(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<u64, NatsError> {
        self.session.queue_publish(subject, msg_id, extra, body)
    }

    /// Reads until the PubAck of any owed publish, whichever comes first,
    /// with its token. The deadline is the session's: the oldest PubAck
    /// owed is due the I/O timeout after its write (a future dropped while
    /// waiting and made again keeps it). With nothing owed it reads with
    /// no deadline, answering the server's `PING`s (an idle connection).
    /// Publishes queued and not yet written go out first, as for
    /// [`recv_puback`](Self::recv_puback).
    pub async fn recv_any_puback(&mut self) -> Result<(u64, Result<PubAck, NatsError>), NatsError> {
        self.flush_queued().await?;
        self.read_owed(|s| loop {
            match s.poll_event()? {
                Some(Event::Reply { token, m }) => {
                    if let Some(ack) = s.take_puback_of(token, m) {
                        return Ok(Some((token, ack)));
                    }
                }
                Some(_) => {}
                None => return Ok(None),
            }
        })
        .await
    }

    /// Sends `payload` to `subject` with a reply token and returns the
    /// reply's payload, within the I/O timeout. A `503` status is
    /// [`NatsError::NoResponders`].
    pub async fn request(&mut self, subject: &str, payload: &[u8]) -> Result<Vec<u8>, NatsError> {
        let token = self.session.queue_request(subject.as_bytes(), payload)?;
        self.flush().await?;
        let m = self.read_owed(|s| s.poll_reply(token)).await?;
        self.session.reply_payload(m).map(<[u8]>::to_vec)
    }

    /// The JetStream management API on this connection.
    pub fn js(&mut self) -> JetStream<'_, AsyncNatsConn> {
        JetStream(self)
    }

    /// Sends everything queued with one write.
    pub async fn flush(&mut self) -> Result<(), NatsError> {
        if self.writing {
            self.session.mark_broken();
        }
        let io_timeout = self.session.io_timeout();
        let Some(queued) = self.session.to_flush()? else {
            return Ok(());
        };
        self.writing = true;
        let r = write_parts(
            (&self.stream, self.tls.as_deref_mut()),
            &mut self.counts,
            &mut self.deadline,
            io_timeout,
            [queued, &[], &[], &[]],
        )
        .await;
        self.sent(r)
    }

    /// Reads the PubAck of the oldest queued publish. Anything queued and
    /// not yet written goes out first: a PubAck owed for a publish never
    /// written would be waited for with no deadline (the session starts a
    /// reply's clock at its write).
    pub async fn recv_puback(&mut self) -> Result<PubAck, NatsError> {
        self.flush_queued().await?;
        self.read_owed(NatsSession::poll_puback).await
    }

    /// [`flush`](Self::flush) when something is queued.
    async fn flush_queued(&mut self) -> Result<(), NatsError> {
        if self.session.queued().is_empty() {
            return Ok(());
        }
        self.flush().await
    }

    /// Polls the session with `poll` until it has an answer, reading on
    /// the session's deadlines for what is owed (a PubAck, the reply to a
    /// lone put or a request: see [`poll_read_owed`](Self::poll_read_owed))
    /// and answering `PING`s on the way: the one wait of every read here.
    ///
    /// Cancel-safe: what `poll` took from the session is returned at once,
    /// never held across an await (a future dropped there would lose it,
    /// and its caller would wait for a reply already read). The `PING`s
    /// read with it are answered first thing in the next call.
    #[inline]
    async fn read_owed<T>(
        &mut self,
        mut poll: impl FnMut(&mut NatsSession) -> Result<Option<T>, NatsError>,
    ) -> Result<T, NatsError> {
        loop {
            if self.session.pongs_owed() > 0 || self.tls.as_ref().is_some_and(|t| t.wants_write()) {
                self.answer_pings()
                    .await
                    .map_err(crate::nats::client::not_the_request)?;
            }
            if let Some(v) = poll(&mut self.session)? {
                return Ok(v);
            }
            let n = poll_fn(|cx| self.poll_read_owed(cx)).await?;
            self.session.received(n);
        }
    }

    /// Answers the server's `PING`s read so far, one write of `PONG` each,
    /// and sends the records TLS owes the server (an answer to a key update).
    pub async fn answer_pings(&mut self) -> Result<(), NatsError> {
        if self.writing {
            // A write was cut short (its future dropped mid-write): what
            // follows would land inside it.
            self.session.mark_broken();
            return Err(NatsError::from(ConnectionError::Broken));
        }
        self.writing = true;
        let r = self.write_pongs().await;
        self.writing = false;
        r
    }

    /// [`answer_pings`](Self::answer_pings)' writes.
    async fn write_pongs(&mut self) -> Result<(), NatsError> {
        while let Some(pong) = self.session.pong() {
            let r = write_parts(
                (&self.stream, self.tls.as_deref_mut()),
                &mut self.counts,
                &mut self.deadline,
                self.session.io_timeout(),
                [pong, &[], &[], &[]],
            )
            .await;
            if let Err(e) = r {
                self.session.mark_broken();
                return Err(NatsError::from(e));
            }
        }
        if let Some(tls) = self.tls.as_deref_mut().filter(|t| t.wants_write()) {
            let r = match tls.records() {
                Ok(records) => {
                    let bufs = &mut [IoSlice::new(records)];
                    write_all(
                        &self.stream,
                        &mut self.counts,
                        &mut self.deadline,
                        self.session.io_timeout(),
                        bufs,
                    )
                    .await
                }
                Err(e) => Err(ConnectionError::Io(e)),
            };
            if let Err(e) = r {
                self.session.mark_broken();
                return Err(NatsError::from(e));
            }
        }
        Ok(())
    }

    /// One read into the session, against the session's deadlines for
    /// what it owes (tokio's clock, which tests may pause). A read that has
    /// to wait begins the wait for what was written
    /// (`NatsSession::start_wait`: the clock is read only then, as for a
    /// beanstalkd reply), and the kept timer wakes the task at the
    /// session's next deadline, where the session acts
    /// (`NatsSession::handle_timeout`: a reply overdue breaks the
    /// connection). Nothing owed: no deadline.
    fn poll_read_owed(&mut self, cx: &mut Context<'_>) -> Poll<Result<usize, NatsError>> {
        let mut started = None;
        let r = self.poll_read(cx, &mut started, Duration::MAX);
        if r.is_ready() {
            return r;
        }
        self.session.start_wait(Instant::now().into_std());
        if let Some(due) = self.session.poll_timeout() {
            if self.deadline.passed(Instant::from_std(due), cx) {
                if let Err(e) = self.session.handle_timeout(Instant::now().into_std()) {
                    return Poll::Ready(Err(e));
                }
            }
        }
        Poll::Pending
    }

    /// One read into the session's room, or the deadline (through TLS:
    /// reads of ciphertext until some plaintext comes).
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        started: &mut Option<Instant>,
        wait: Duration,
    ) -> Poll<Result<usize, NatsError>> {
        let room = match self.session.recv_room() {
            Ok(room) => room,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let r = match self.tls.as_deref_mut() {
            None => poll_read_into(
                &mut self.stream,
                room,
                &mut self.counts,
                &mut self.deadline,
                cx,
                (started, wait),
            )
            .map_err(NatsError::from),
            Some(tls) => loop {
                match tls.open(room) {
                    Ok(Some(n)) => break Poll::Ready(Ok(n)),
                    Ok(None) => {}
                    // A record that does not open, after the request went
                    // out: the outcome is unknown.
                    Err(NatsError::Tls(t)) => {
                        break Poll::Ready(Err(NatsError::Io(std::io::Error::other(t.to_string()))))
                    }
                    Err(e) => break Poll::Ready(Err(e)),
                }
                let (stream, counts, deadline) =
                    (&mut self.stream, &mut self.counts, &mut self.deadline);
                match poll_cipher(stream, tls, counts, deadline, cx, (&mut *started, wait)) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => break Poll::Ready(Err(NatsError::from(e))),
                    Poll::Pending => break Poll::Pending,
                }
            },
        };
        if let Poll::Ready(Err(_)) = r {
            self.session.mark_broken();
        }
        r
    }
}

/// One read of ciphertext into the TLS session, or the deadline (as
/// [`poll_read_into`]): for the handshake and for every read after it.
fn poll_cipher(
    stream: &mut TcpStream,
    tls: &mut TlsSession,
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    cx: &mut Context<'_>,
    wait: (&mut Option<Instant>, Duration),
) -> Poll<Result<(), ConnectionError>> {
    let n = std::task::ready!(poll_read_into(
        stream,
        tls.cipher_room(),
        counts,
        deadline,
        cx,
        wait
    ))?;
    tls.cipher_read(n);
    Poll::Ready(Ok(()))
}

/// Writes `parts` in order with one write call (more only on a partial
/// write): vectored on plain TCP, sealed into TLS records when encrypted.
async fn write_parts(
    (stream, tls): (&TcpStream, Option<&mut TlsSession>),
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    timeout: Duration,
    parts: [&[u8]; 4],
) -> Result<(), ConnectionError> {
    match tls {
        None => {
            let mut bufs = parts.map(IoSlice::new);
            write_all(stream, counts, deadline, timeout, &mut bufs).await
        }
        Some(tls) => {
            let records = tls.seal(&parts).map_err(ConnectionError::NotSent)?;
            write_all(
                stream,
                counts,
                deadline,
                timeout,
                &mut [IoSlice::new(records)],
            )
            .await
        }
    }
}

impl ApiLink for AsyncNatsConn {
    fn request(
        &mut self,
        subject: &str,
        payload: &[u8],
    ) -> impl std::future::Future<Output = Result<Vec<u8>, NatsError>> + Send {
        AsyncNatsConn::request(self, subject, payload)
    }

    fn pause(&mut self, pause: Duration) -> impl std::future::Future<Output = ()> + Send {
        tokio::time::sleep(pause)
    }

    fn server_version(&self) -> &str {
        self.session.server_version()
    }

    fn api_patience(&self) -> Duration {
        self.api_patience
    }
}
