//! The async producer on beanstalkd: the same puts, batches, outcomes and
//! reconnect rule as the blocking [`Producer`](crate::Producer), on one tokio
//! `TcpStream`.

use std::net::SocketAddr;
use std::time::Instant;

use taskq_proto::{Command, ConnectionConfig, IoCounts, Reply};

use crate::builder::Builder;
use crate::classify::Chunk;
use crate::classify::{
    check_tube, chunk_write_failed, not_inserted, too_big, use_failed_on_reconnect, using,
    Attempts, BatchRetry, Replies, Rule,
};
use crate::error::{Error, NotSent};
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::reconnects::Reconnects;
use crate::{JobId, PutOptions};

use taskq_connect::tokio::AsyncConn;

/// The async producer's engine on beanstalkd: one connection, its tube, the
/// reconnect rule (see [`AsyncProducer`](super::AsyncProducer)).
#[derive(Debug)]
pub(crate) struct AsyncBeanstalkd {
    addrs: Vec<SocketAddr>,
    cfg: ConnectionConfig,
    reconnects: Reconnects,
    retries: u32,
    /// The tube in use; `None` is `default`, which a new connection starts with.
    tube: Option<String>,
    conn: Option<AsyncConn>,
}

impl AsyncBeanstalkd {
    /// Connects with the settings of `b` (resolving `addr` without blocking
    /// the runtime); fails with [`Error::NotSent`] when the server cannot be reached.
    pub(crate) async fn connect(b: Builder, addr: &str) -> Result<AsyncBeanstalkd, Error> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| Error::NotSent(NotSent::Io(e)))?
            .collect();
        let tube = b.checked_tube(&addrs, false)?;
        let mut p = AsyncBeanstalkd {
            addrs,
            cfg: b.cfg,
            reconnects: Reconnects::new(b.backoff),
            retries: b.retries,
            tube,
            conn: None,
        };
        p.connected().await?;
        Ok(p)
    }

    /// Puts later jobs into `tube`. Refused before sending when the name is invalid.
    pub(crate) async fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        check_tube(tube, false)?;
        let wanted = (tube != "default").then_some(tube);
        if self.tube.as_deref() == wanted && self.is_connected() {
            return Ok(());
        }
        self.tube = wanted.map(str::to_owned);
        if !self.is_connected() {
            // A fresh connection issues the `use` itself.
            return self.connected().await.map(|_| ());
        }
        let conn = self.conn.as_mut().expect("checked above");
        let r = use_on(conn, tube).await;
        if r.is_err() {
            self.broke();
        }
        r
    }

    /// The tube puts go to.
    pub(crate) fn tube(&self) -> &str {
        self.tube.as_deref().unwrap_or("default")
    }

    /// The largest body this producer sends.
    pub(crate) fn max_job_size(&self) -> usize {
        self.cfg.limits.max_job_size
    }

    /// Puts one job: one write, one read.
    #[inline]
    pub(crate) async fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let cmd = opts.command(body);
        // Steady state: a live connection and nothing to recover from. (A body
        // over the maximum is refused by the session before sending, with the
        // same error `put_cold` gives.)
        if self.reconnects.made_progress() {
            if let Some(conn) = self.conn.as_mut().filter(|c| ready(c)) {
                let e = match conn.send(&cmd).await {
                    Ok(()) => match conn.recv().await {
                        Ok(Reply::Inserted { id }) => return Ok(JobId::new(id)),
                        other => not_inserted(other),
                    },
                    Err(e) => Error::from_conn(e),
                };
                // Boxed: the cold paths (reconnect, retry) would otherwise
                // make every put's future several kilobytes, which tokio
                // itself boxes when it is spawned or passed to `block_on`.
                return Box::pin(self.put_failed(&cmd, e)).await;
            }
        }
        Box::pin(self.put_cold(&cmd)).await
    }

    /// The hot path's put did not come back `INSERTED`: a rejection is the
    /// answer; an unknown or not-sent outcome drops a broken connection and is
    /// retried in at-least-once mode.
    async fn put_failed(&mut self, cmd: &Command<'_>, e: Error) -> Result<JobId, Error> {
        let r = Err(e);
        if let Some(conn) = self.conn.as_mut() {
            mark_if_out_of_step(conn, &r);
        }
        if !matches!(r, Err(Error::Unknown(_) | Error::NotSent(_))) {
            return r;
        }
        self.drop_if_broken();
        self.put_again(cmd, r).await
    }

    /// A put that needs a connection first (or a body refused before that).
    async fn put_cold(&mut self, cmd: &Command<'_>) -> Result<JobId, Error> {
        let len = cmd.body().len();
        if len > self.cfg.limits.max_job_size {
            return Err(too_big(len, self.cfg.limits.max_job_size));
        }
        let r = self.put_once(cmd).await;
        self.put_again(cmd, r).await
    }

    /// Sends the put again while the one put rule ([`Attempts`]) says so:
    /// at-least-once mode's retries.
    async fn put_again(
        &mut self,
        cmd: &Command<'_>,
        mut r: Result<JobId, Error>,
    ) -> Result<JobId, Error> {
        let mut attempts = Attempts::new(Rule::Retries(self.retries));
        while let Some(again) = attempts.again(&r, Instant::now()) {
            if let Some(pause) = again.pause() {
                tokio::time::sleep(pause).await;
            }
            r = self.put_once(cmd).await;
        }
        attempts.outcome(r)
    }

    /// One attempt at a put, reconnecting first if needed.
    async fn put_once(&mut self, cmd: &Command<'_>) -> Result<JobId, Error> {
        let conn = self.connected().await?;
        let r = match conn.send(cmd).await {
            Ok(()) => put_reply(conn).await,
            Err(e) => Err(Error::from_conn(e)),
        };
        match &r {
            Ok(_) | Err(Error::Rejected(_)) => self.reconnects.progress(),
            Err(_) => self.drop_if_broken(),
        }
        r
    }

    /// When a batch's chunk goes again: in at-least-once mode, up to its
    /// retries.
    pub(crate) fn batch_retry(&self) -> BatchRetry {
        BatchRetry::new(self.retries, None)
    }

    /// Sends `chunk` in one write and reads its replies; returns where the
    /// next chunk starts. (The batch's loop is `AsyncProducer::put_batch`.)
    pub(crate) async fn batch_chunk<B: AsRef<[u8]>>(
        &mut self,
        chunk: Chunk<'_, B>,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<usize, BatchError> {
        let conn = match self.connected().await {
            Ok(c) => c,
            Err(e) => return Err(chunk.not_sent(e)),
        };
        if let Err(e) = chunk.queue_puts(|cmd| conn.queue(cmd)) {
            conn.clear_queue();
            return Err(e);
        }
        if let Err(e) = conn.flush().await {
            let e = chunk_write_failed(Error::from_conn(e), out, chunk.span());
            self.drop_if_broken();
            return Err(e);
        }
        let mut replies = Replies::new(out, report, chunk.span());
        while replies.owed() {
            if let Err(e) = replies.take(put_reply(conn).await) {
                self.drop_if_broken();
                return Err(e);
            }
        }
        self.reconnects.progress();
        Ok(chunk.span().1)
    }

    /// True while a connection is open (it may still turn out broken on
    /// the next call) and owes no reply.
    pub(crate) fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(ready)
    }

    /// Connections opened so far (1 after `connect`, more after reconnects).
    pub(crate) fn connects(&self) -> u64 {
        self.reconnects.count()
    }

    /// System calls on the current connection, for tests and benchmarks:
    /// writes and reads that moved bytes or failed.
    pub(crate) fn io_counts(&self) -> Option<IoCounts> {
        self.conn.as_ref().map(AsyncConn::io_counts)
    }

    /// The open connection, opening one (and restoring the tube) if needed,
    /// after waiting out the reconnect backoff.
    async fn connected(&mut self) -> Result<&mut AsyncConn, Error> {
        if self.is_connected() {
            return Ok(self.conn.as_mut().expect("checked above"));
        }
        // Boxed, so that a batch's future stays small (see `put`).
        Box::pin(self.reconnect()).await
    }

    /// Opens a connection (waiting out the backoff) and restores the tube.
    async fn reconnect(&mut self) -> Result<&mut AsyncConn, Error> {
        self.conn = None;
        if let Some(left) = self.reconnects.wait_left() {
            tokio::time::sleep(left).await;
        }
        let opened = match AsyncConn::connect(&self.addrs, &self.cfg).await {
            Ok(mut c) => match &self.tube {
                Some(t) => match use_on(&mut c, t).await {
                    Ok(()) => Ok(c),
                    Err(e) => Err(use_failed_on_reconnect(t, e)),
                },
                None => Ok(c),
            },
            Err(e) => Err(Error::from_conn(e)),
        };
        self.reconnects.opened(&mut self.conn, opened)
    }

    /// The shared producer's driver: the open connection, opened first
    /// (the tube restored) if needed.
    pub(crate) async fn link(&mut self) -> Result<&mut AsyncConn, Error> {
        self.connected().await
    }

    /// The shared producer's driver: the connection, if one is open.
    pub(crate) fn conn_mut(&mut self) -> Option<&mut AsyncConn> {
        self.conn.as_mut().filter(|c| !c.is_broken())
    }

    /// The shared producer's driver: the tube the next connection `use`s
    /// when it opens (nothing is sent now).
    pub(crate) fn set_tube(&mut self, tube: &str) {
        let wanted = (tube != "default").then_some(tube);
        if self.tube.as_deref() != wanted {
            self.tube = wanted.map(str::to_owned);
        }
    }

    /// The shared producer's driver: a reply came.
    pub(crate) fn progress(&mut self) {
        self.reconnects.progress();
    }

    /// The shared producer's driver: the connection broke; the next
    /// [`link`](Self::link) opens another (at once after a healthy spell).
    pub(crate) fn lost(&mut self) {
        self.broke();
    }

    /// Forgets a connection that broke so the next call opens a new one.
    fn drop_if_broken(&mut self) {
        if self.conn.as_ref().is_some_and(AsyncConn::is_broken) {
            self.broke();
        }
    }

    fn broke(&mut self) {
        // The first reconnect after a healthy spell is immediate; repeated breaks back off.
        self.reconnects.broke(&mut self.conn);
    }
}

async fn use_on(conn: &mut AsyncConn, tube: &str) -> Result<(), Error> {
    let r = match conn.send(&Command::Use { tube }).await {
        Ok(()) => using(conn.recv().await, tube),
        Err(e) => Err(Error::from_conn(e)),
    };
    mark_if_out_of_step(conn, &r);
    r
}

/// Reads a put's reply: the id, or the rejection.
#[inline]
async fn put_reply(conn: &mut AsyncConn) -> Result<JobId, Error> {
    let r = match conn.recv().await {
        Ok(Reply::Inserted { id }) => return Ok(JobId::new(id)),
        other => Err(not_inserted(other)),
    };
    mark_if_out_of_step(conn, &r);
    r
}

fn mark_if_out_of_step<T>(conn: &mut AsyncConn, r: &Result<T, Error>) {
    if matches!(r, Err(Error::Unknown(_))) {
        conn.mark_broken();
    }
}

/// A connection the next call may use: in step, and owing no reply. A put
/// or batch whose future was dropped mid-way leaves replies owed (or half a
/// request written): the next call's reply would be read as the old one's,
/// so such a connection is replaced, as a broken one is.
fn ready(c: &AsyncConn) -> bool {
    !c.is_broken() && c.owed() == 0
}
