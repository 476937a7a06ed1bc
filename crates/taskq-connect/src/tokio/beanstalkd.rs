//! The async driver: one tokio `TcpStream` under a [`Session`], the second
//! driver over the same core as the blocking `Connection` (whose rules it
//! mirrors: one write per request, a deadline on each whole reply, broken for
//! good after a timeout, an I/O error or a reply it cannot decode).
//!
//! The reply deadline is the connection's one kept timer ([`Deadline`]).

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::{Command, ConnectionConfig, ConnectionError, IoCounts, Reply, Request, Session};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::io::{open_stream, poll_read_into, write_all, write_rest, Deadline};

/// A connection to a beanstalkd-protocol server over tokio.
pub struct AsyncConn {
    stream: TcpStream,
    session: Session,
    counts: IoCounts,
    io_timeout: Duration,
    deadline: Deadline,
}

impl std::fmt::Debug for AsyncConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncConn")
            .field("session", &self.session)
            .field("counts", &self.counts)
            .finish()
    }
}

impl AsyncConn {
    /// Connects to the first of `addrs` that accepts within the connect timeout.
    pub async fn connect(
        addrs: &[SocketAddr],
        cfg: &ConnectionConfig,
    ) -> Result<AsyncConn, ConnectionError> {
        let mut last = None;
        for &addr in addrs {
            match open_stream(addr, cfg.connect_timeout, cfg.keepalive).await {
                Ok(stream) => {
                    let mut session = Session::new(cfg.limits);
                    session.set_io_timeout(cfg.io_timeout);
                    return Ok(AsyncConn {
                        stream,
                        session,
                        counts: IoCounts::default(),
                        io_timeout: cfg.io_timeout,
                        deadline: Deadline::new(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(ConnectionError::NotSent(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing")
        })))
    }

    /// True once the connection is out of step; it must be replaced.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.session.is_broken()
    }

    /// Replies owed: requests sent (or queued) whose replies were not read.
    /// Nonzero between calls of a one-request-at-a-time caller means a
    /// call's future was dropped mid-way, and the next reply read would be
    /// that call's.
    #[inline]
    pub fn owed(&self) -> usize {
        self.session.owed()
    }

    /// Marks the connection broken (a reply the caller cannot accept).
    pub fn mark_broken(&mut self) {
        self.session.mark_broken();
    }

    /// System calls that moved bytes (or failed) so far.
    pub fn io_counts(&self) -> IoCounts {
        self.counts
    }

    /// Sends one request with one write (looping only on a partial write).
    #[inline]
    pub async fn send(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        // The enqueue hot path: a put whose line repeats goes out whole from
        // the session's inline buffer.
        if let Command::Put {
            pri,
            delay,
            ttr,
            body,
        } = *cmd
        {
            if let Some(bytes) = self.session.repeated_put(pri, delay, ttr, body) {
                let sent = match self.stream.try_write(bytes) {
                    Ok(n) if n == bytes.len() => {
                        self.counts.writes += 1;
                        return Ok(());
                    }
                    Ok(n) => {
                        self.counts.writes += 1;
                        n
                    }
                    // Not writable yet, or interrupted: the loop waits or retries.
                    Err(_) => 0,
                };
                let r = write_rest(
                    &self.stream,
                    &mut self.counts,
                    &mut self.deadline,
                    self.io_timeout,
                    &mut [IoSlice::new(&bytes[sent..])],
                    sent,
                )
                .await;
                return self.sent(r);
            }
        }
        self.send_any(cmd).await
    }

    /// [`send`](Self::send) for any request.
    async fn send_any(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        let r = match self.session.encode(cmd)? {
            Request::Whole(bytes) => {
                write_all(
                    &self.stream,
                    &mut self.counts,
                    &mut self.deadline,
                    self.io_timeout,
                    &mut [IoSlice::new(bytes)],
                )
                .await
            }
            Request::Parts { line, body } => {
                write_all(
                    &self.stream,
                    &mut self.counts,
                    &mut self.deadline,
                    self.io_timeout,
                    &mut [
                        IoSlice::new(line),
                        IoSlice::new(body),
                        IoSlice::new(b"\r\n"),
                    ],
                )
                .await
            }
        };
        self.sent(r)
    }

    /// A failed write breaks the session.
    fn sent(&mut self, r: Result<(), ConnectionError>) -> Result<(), ConnectionError> {
        if r.is_err() {
            self.session.mark_broken();
        }
        r
    }

    /// Appends a request to the pipeline; [`flush`](Self::flush) sends all of them in one write.
    pub fn queue(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        self.session.queue(cmd)
    }

    /// Drops what [`queue`](Self::queue) gathered without sending it.
    pub fn clear_queue(&mut self) {
        self.session.clear_queue();
    }

    /// Sends everything queued with one write; on a broken connection drops
    /// the queue and sends nothing.
    pub async fn flush(&mut self) -> Result<(), ConnectionError> {
        let Some(queued) = self.session.to_flush()? else {
            return Ok(());
        };
        let r = write_all(
            &self.stream,
            &mut self.counts,
            &mut self.deadline,
            self.io_timeout,
            &mut [IoSlice::new(queued)],
        )
        .await;
        self.session.queue_sent();
        self.sent(r)
    }

    /// Reads the next owed reply, against one deadline for the whole of it:
    /// the session's (`Session::poll_timeout`), from when a read first had
    /// to wait for it. The wait's start is the session's, so a future
    /// dropped while waiting and made again keeps the same deadline.
    #[inline]
    pub async fn recv(&mut self) -> Result<Reply<'_>, ConnectionError> {
        // The enqueue hot path: a lone put's reply is almost always one whole
        // `INSERTED <id>\r\n` from one read straight into the empty buffer.
        if self.session.awaits_lone_put() {
            let n = poll_fn(|cx| self.poll_read(cx, true)).await?;
            if let Some(id) = self.session.take_inserted(n) {
                return Ok(Reply::Inserted { id });
            }
        }
        loop {
            if let Some(f) = self.session.frame_reply()? {
                return Ok(self.session.take_reply(f));
            }
            let n = poll_fn(|cx| self.poll_read(cx, false)).await?;
            self.session.received(n);
        }
    }

    /// One read into the session's room (the whole buffer for the lone-put
    /// path), or the session's reply deadline.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        lone_put: bool,
    ) -> Poll<Result<usize, ConnectionError>> {
        let wait = match self.session.reply_wait() {
            Ok(wait) => wait,
            Err(e) => return Poll::Ready(Err(e)),
        };
        // The wait begins at the first read that has to wait (tokio's clock,
        // which tests may pause).
        let mut started = self.session.waiting_since().map(Instant::from_std);
        let room = if lone_put {
            self.session.put_read_room()
        } else {
            match self.session.recv_room() {
                Ok(room) => room,
                Err(e) => return Poll::Ready(Err(e)),
            }
        };
        let r = poll_read_into(
            &mut self.stream,
            room,
            &mut self.counts,
            &mut self.deadline,
            cx,
            (&mut started, wait),
        );
        if let Some(t) = started {
            self.session.start_wait(t.into_std());
        }
        if let Poll::Ready(Err(_)) = r {
            self.session.mark_broken();
        }
        r
    }
}
