//! The async producer on JetStream: the outcomes of the blocking
//! [`Producer`](crate::Producer) there (a put is a publish to the tube's
//! subject with a `Nats-Msg-Id`, answered by the stream's PubAck; an unknown
//! outcome is resolved by sending the put again with the same id within
//! `resolve_for`; a batch goes out in one write), over [`AsyncNatsConn`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use taskq_connect::Address;
use taskq_proto::{ConnectionConfig, IoCounts};

use crate::builder::Builder;
use crate::classify::Chunk;
use crate::classify::{
    check_tube, chunk_write_failed, too_big, Attempts, BatchRetry, Replies, Rule,
};
use crate::delays::{Delays, Put, Route, Stamp};
use crate::error::{Error, NotSent};
use crate::nats::{connect_stream_async, from_nats, nats_config, queue_chunk, IdBuf, NatsSetup};
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::reconnects::Reconnects;
use crate::{JobId, PutOptions};

use taskq_connect::tokio::AsyncNatsConn;

/// The async producer's engine on JetStream.
#[derive(Debug)]
pub(crate) struct AsyncJetStream {
    addrs: Vec<SocketAddr>,
    cfg: ConnectionConfig,
    setup: NatsSetup,
    reconnects: Reconnects,
    retries: u32,
    /// The tube in use; `None` is `default`.
    tube: Option<String>,
    /// Who holds delayed jobs on the last connection opened.
    delays: Delays,
    /// Where puts into the tube in use go.
    route: Route,
    conn: Option<AsyncNatsConn>,
}

impl AsyncJetStream {
    /// Connects with the settings of `b` to the cluster of `addr` (a
    /// `nats://` address; its hosts resolved without blocking the runtime).
    pub(crate) async fn connect(b: Builder, addr: Address) -> Result<AsyncJetStream, Error> {
        let mut addrs = Vec::new();
        for h in addr.hosts() {
            let found = tokio::net::lookup_host(h.as_str())
                .await
                .map_err(|e| Error::NotSent(NotSent::Io(e)))?;
            addrs.extend(found);
        }
        let setup = b.nats_setup(Some(&addr))?;
        let tube = b.checked_tube(&addrs, true)?;
        let route = Route::new(
            &setup.layout,
            tube.as_deref().unwrap_or("default"),
            Delays::Client,
        );
        let mut p = AsyncJetStream {
            addrs,
            cfg: b.cfg,
            setup,
            reconnects: Reconnects::new(b.backoff),
            retries: b.retries,
            tube,
            delays: Delays::Client,
            route,
            conn: None,
        };
        p.connected().await?;
        Ok(p)
    }

    /// Puts later jobs into `tube` (only the subject changes). Refused
    /// before sending when the name is not one subject token.
    pub(crate) async fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        check_tube(tube, true)?;
        self.tube = (tube != "default").then(|| tube.to_owned());
        self.route = Route::new(&self.setup.layout, tube, self.delays);
        if !self.is_connected() {
            self.connected().await?;
        }
        Ok(())
    }

    /// The tube puts go to.
    pub(crate) fn tube(&self) -> &str {
        self.tube.as_deref().unwrap_or("default")
    }

    /// The largest body this producer sends.
    pub(crate) fn max_job_size(&self) -> usize {
        self.cfg.limits.max_job_size
    }

    /// Puts one job with a fresh message id: one write, one PubAck.
    #[inline]
    pub(crate) async fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        if self.reconnects.made_progress() {
            if let Some(conn) = self.conn.as_mut().filter(|c| c.is_idle()) {
                let k = self.setup.ids.take(1);
                return match put_as(conn, &self.setup, &mut self.route, k, body, opts).await {
                    Ok(id) => Ok(id),
                    // Boxed: the cold paths would otherwise make every put's future large.
                    Err(e) => Box::pin(self.put_failed(k, body, opts, e)).await,
                };
            }
        }
        Box::pin(self.put_cold(body, opts)).await
    }

    /// The hot path's put did not come back stored: a rejection is the
    /// answer; an unknown or not-sent outcome is resolved by re-sending.
    async fn put_failed(
        &mut self,
        k: u64,
        body: &[u8],
        opts: PutOptions,
        e: Error,
    ) -> Result<JobId, Error> {
        if !matches!(e, Error::Unknown(_) | Error::NotSent(_)) {
            return Err(e);
        }
        self.drop_if_broken();
        self.resolve(k, body, opts, e).await
    }

    /// A put that needs a connection first (or a body refused before that).
    async fn put_cold(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let max = self.cfg.limits.max_job_size;
        if body.len() > max {
            return Err(too_big(body.len(), max));
        }
        let k = self.setup.ids.take(1);
        self.resolve(k, body, opts, Error::NotSent(NotSent::Broken))
            .await
    }

    /// Sends the put of counter `k` again, with the same message id, after
    /// `failed` (unknown or not sent), until the stream answers or
    /// `resolve_for` runs out: the stream stores it once however many copies
    /// reach it. Out of time, the outcome is unknown if any copy may have
    /// reached the stream, even when the last attempt could not connect.
    async fn resolve(
        &mut self,
        k: u64,
        body: &[u8],
        opts: PutOptions,
        failed: Error,
    ) -> Result<JobId, Error> {
        let mut attempts = Attempts::new(Rule::Resolve(self.setup.resolve_for()));
        let mut r = Err(failed);
        while let Some(again) = attempts.again(&r, Instant::now()) {
            if let Some(pause) = again.pause() {
                tokio::time::sleep(pause).await;
            }
            r = match self.connected().await {
                Ok(()) => {
                    let conn = self.conn.as_mut().expect("connected above");
                    put_as(conn, &self.setup, &mut self.route, k, body, opts).await
                }
                Err(e) => Err(e),
            };
            match &r {
                Ok(_) | Err(Error::Rejected(_)) => self.reconnects.progress(),
                Err(_) => self.drop_if_broken(),
            }
        }
        attempts.outcome(r)
    }

    /// When a batch's chunk goes again: within `resolve_for` from now (the
    /// message ids make a chunk sent again stored once), and in
    /// at-least-once mode up to its retries.
    pub(crate) fn batch_retry(&self) -> BatchRetry {
        BatchRetry::new(
            self.retries,
            Some(Instant::now() + self.setup.resolve_for()),
        )
    }

    /// How long an unknown put is re-sent with its id: `resolve_for`,
    /// within the stream's duplicate window.
    pub(crate) fn resolve_for(&self) -> Duration {
        self.setup.resolve_for()
    }

    /// The message-id counters of a batch of `n` jobs, taken before its
    /// first send: the first of them.
    pub(crate) fn batch_ids(&mut self, n: usize) -> u64 {
        self.setup.ids.take(n as u64)
    }

    /// Sends `chunk` in one write (job `i` with the id of counter `first +
    /// i`) and reads its PubAcks; returns where the next chunk starts.
    /// (The batch's loop is `AsyncProducer::put_batch`.)
    pub(crate) async fn batch_chunk<B: AsRef<[u8]>>(
        &mut self,
        chunk: Chunk<'_, B>,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<usize, BatchError> {
        if let Err(e) = self.connected().await {
            return Err(chunk.not_sent(e));
        }
        let conn = self.conn.as_mut().expect("connected above");
        let queued = queue_chunk(
            &self.setup.ids,
            &mut self.route,
            &chunk,
            |s, id, extra, body| {
                conn.queue_publish(s.as_bytes(), id, extra, body)
                    .map(|_| ())
            },
        );
        if let Err(e) = queued {
            // Nothing of the chunk was written yet; PubAcks it queued are owed.
            conn.mark_broken();
            self.drop_if_broken();
            return Err(chunk.not_sent(from_nats(e)));
        }
        if let Err(e) = conn.flush().await {
            let e = chunk_write_failed(from_nats(e), out, chunk.span());
            self.drop_if_broken();
            return Err(e);
        }
        let mut replies = Replies::new(out, report, chunk.span());
        while replies.owed() {
            let r = conn.recv_puback().await;
            if let Err(e) = replies.take(r.map(|a| JobId::new(a.stream_seq)).map_err(from_nats)) {
                // PubAcks still owed would be read as the next chunk's.
                conn.mark_broken();
                self.drop_if_broken();
                return Err(e);
            }
        }
        self.reconnects.progress();
        Ok(chunk.span().1)
    }

    /// True while a connection is open (it may still turn out broken on
    /// the next call) and owes nothing: a batch whose future was dropped
    /// mid-way leaves PubAcks owed, and such a connection is replaced, as
    /// a broken one is.
    pub(crate) fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(AsyncNatsConn::is_idle)
    }

    /// Connections opened so far.
    pub(crate) fn connects(&self) -> u64 {
        self.reconnects.count()
    }

    /// System calls on the current connection.
    pub(crate) fn io_counts(&self) -> Option<IoCounts> {
        self.conn.as_ref().map(AsyncNatsConn::io_counts)
    }

    /// Server `PING`s the current connection answered.
    pub(crate) fn pings_answered(&self) -> Option<u64> {
        self.conn.as_ref().map(AsyncNatsConn::pings_answered)
    }

    /// Makes sure a connection is open, opening one (after waiting out the
    /// reconnect backoff) if needed.
    async fn connected(&mut self) -> Result<(), Error> {
        if self.is_connected() {
            return Ok(());
        }
        Box::pin(self.reconnect()).await
    }

    /// Opens a connection: connects, authenticates, starts TLS and sets the
    /// stream up, all on tokio, as the blocking producer does
    /// ([`connect_stream_async`]).
    async fn reconnect(&mut self) -> Result<(), Error> {
        self.conn = None;
        if let Some(left) = self.reconnects.wait_left() {
            tokio::time::sleep(left).await;
        }
        let cfg = nats_config(&self.cfg);
        let opened = connect_stream_async(&self.addrs, cfg, &mut self.setup)
            .await
            .map(|(c, delays)| {
                if delays != self.delays {
                    self.delays = delays;
                    self.route = Route::new(&self.setup.layout, self.tube(), delays);
                }
                c
            });
        self.reconnects.opened(&mut self.conn, opened).map(|_| ())
    }

    /// The shared producer's driver: the open connection, opened first if
    /// needed.
    pub(crate) async fn link(&mut self) -> Result<&mut AsyncNatsConn, Error> {
        self.connected().await?;
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// The shared producer's driver: the connection, if one is open.
    pub(crate) fn conn_mut(&mut self) -> Option<&mut AsyncNatsConn> {
        self.conn.as_mut().filter(|c| !c.is_broken())
    }

    /// The shared producer's driver: the message ids, the stream's layout
    /// and who holds delays on the connection opened last.
    pub(crate) fn naming(&self) -> (&crate::nats::MsgIds, &taskq_connect::Layout, Delays) {
        (&self.setup.ids, &self.setup.layout, self.delays)
    }

    /// The shared producer's driver: a reply came.
    pub(crate) fn progress(&mut self) {
        self.reconnects.progress();
    }

    /// The shared producer's driver: the connection broke; the next
    /// [`link`](Self::link) opens another (at once after a healthy spell).
    pub(crate) fn lost(&mut self) {
        self.reconnects.broke(&mut self.conn);
    }

    /// Forgets a connection that broke so the next call opens a new one.
    fn drop_if_broken(&mut self) {
        if self.conn.as_ref().is_some_and(AsyncNatsConn::is_broken) {
            // The first reconnect after a healthy spell is immediate; repeated breaks back off.
            self.reconnects.broke(&mut self.conn);
        }
    }
}

/// One put with the id of counter `k` (a fresh one, or a re-send): one
/// write, one PubAck; the job id is the stream sequence.
#[inline]
async fn put_as(
    conn: &mut AsyncNatsConn,
    setup: &NatsSetup,
    route: &mut Route,
    k: u64,
    body: &[u8],
    opts: PutOptions,
) -> Result<JobId, Error> {
    let mut id = IdBuf::new();
    let msg_id = setup.ids.id(k, &mut id);
    let stamp = Stamp::now(opts.delay);
    let put = Put::new(route, stamp.as_ref(), msg_id);
    match conn
        .publish(put.subject().as_bytes(), msg_id, put.extra(), body)
        .await
    {
        Ok(ack) => Ok(JobId::new(ack.stream_seq)),
        Err(e) => Err(from_nats(e)),
    }
}
