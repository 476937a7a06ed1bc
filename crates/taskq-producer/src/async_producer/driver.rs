//! The async driver: one tokio `TcpStream` under a [`Session`], the second
//! driver over the same core as the blocking `Connection` (whose rules it
//! mirrors: one write per request, a deadline on each whole reply, broken for
//! good after a timeout, an I/O error or a reply it cannot decode).
//!
//! # The reply deadline without a timer operation per reply
//!
//! A fresh `tokio::time::timeout` around each reply registers and cancels a
//! timer every time. Instead each connection keeps one [`Sleep`], pinned once
//! when it opens, and the real deadline of the reply being awaited is a plain
//! [`Instant`] (read from the clock once, when the first read has to wait).
//! The rule, in [`Deadline::passed`]:
//!
//! - the kept sleep may be armed *earlier* than the real deadline (at an
//!   earlier reply's deadline): it is then left alone. While replies keep
//!   arriving, a put touches no timer at all;
//! - when it fires, the real deadline is checked: passed means the reply timed
//!   out; not passed means it fired early, and it is re-armed at exactly the
//!   current reply's deadline (one timer operation per I/O timeout at most);
//! - armed *later* than the real deadline (only before its first use, or
//!   after a longer wait) it is re-armed at the real deadline at once.
//!
//! So a silent server is caught when the current reply's own deadline passes
//! (plus the timer's millisecond granularity), never a whole period late.

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::{Command, ConnectionConfig, ConnectionError, IoCounts, Reply, Request, Session};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant, Sleep};

/// A connection to a beanstalkd-protocol server over tokio.
pub(crate) struct AsyncConn {
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

/// The kept timer of a connection (see the module docs for the rule).
struct Deadline {
    sleep: Pin<Box<Sleep>>,
}

impl Deadline {
    fn new() -> Deadline {
        // Elapsed from the start: the first wait arms it at its own deadline.
        Deadline {
            sleep: Box::pin(sleep_until(Instant::now())),
        }
    }

    /// True once `due` has passed; otherwise the task is woken at `due` at
    /// the latest (the kept sleep is registered with this context's waker).
    fn passed(&mut self, due: Instant, cx: &mut Context<'_>) -> bool {
        if self.sleep.deadline() > due {
            self.sleep.as_mut().reset(due);
        }
        // The timer rounds up to its next tick, so once it fires at `due`
        // the clock has passed `due`: the loop runs at most twice.
        while self.sleep.as_mut().poll(cx).is_ready() {
            if Instant::now() >= due {
                return true;
            }
            self.sleep.as_mut().reset(due);
        }
        false
    }
}

/// The wait started at `started` ends `wait` later (a wait too long for the
/// clock to represent stands for "no deadline").
fn due(started: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    started
        .checked_add(wait)
        .or_else(|| started.checked_add(CENTURY))
        .unwrap_or(started)
}

impl AsyncConn {
    /// Connects to the first of `addrs` that accepts within the connect timeout.
    pub(crate) async fn connect(
        addrs: &[SocketAddr],
        cfg: &ConnectionConfig,
    ) -> Result<AsyncConn, ConnectionError> {
        let mut last = None;
        for &addr in addrs {
            let attempt = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr));
            let r = match attempt.await {
                Ok(r) => r.and_then(|s| setup(s, cfg)),
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
            };
            match r {
                Ok(stream) => {
                    return Ok(AsyncConn {
                        stream,
                        session: Session::new(cfg.limits),
                        counts: IoCounts::default(),
                        io_timeout: cfg.io_timeout,
                        deadline: Deadline::new(),
                    })
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
    pub(crate) fn is_broken(&self) -> bool {
        self.session.is_broken()
    }

    /// Marks the connection broken (a reply the caller cannot accept).
    pub(crate) fn mark_broken(&mut self) {
        self.session.mark_broken();
    }

    /// System calls that moved bytes (or failed) so far.
    pub(crate) fn io_counts(&self) -> IoCounts {
        self.counts
    }

    /// Sends one request with one write (looping only on a partial write).
    #[inline]
    pub(crate) async fn send(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
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
    pub(crate) fn queue(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        self.session.queue(cmd)
    }

    /// Drops what [`queue`](Self::queue) gathered without sending it.
    pub(crate) fn clear_queue(&mut self) {
        self.session.clear_queue();
    }

    /// Sends everything queued with one write; on a broken connection drops
    /// the queue and sends nothing.
    pub(crate) async fn flush(&mut self) -> Result<(), ConnectionError> {
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

    /// Reads the next owed reply, against one deadline for the whole of it.
    #[inline]
    pub(crate) async fn recv(&mut self) -> Result<Reply<'_>, ConnectionError> {
        let wait = self.session.reply_wait(self.io_timeout)?;
        let mut started = None;
        // The enqueue hot path: a lone put's reply is almost always one whole
        // `INSERTED <id>\r\n` from one read straight into the empty buffer.
        if self.session.awaits_lone_put() {
            let n = poll_fn(|cx| self.poll_read(cx, true, &mut started, wait)).await?;
            if let Some(id) = self.session.take_inserted(n) {
                return Ok(Reply::Inserted { id });
            }
        }
        loop {
            if let Some(f) = self.session.frame_reply()? {
                return Ok(self.session.take_reply(f));
            }
            let n = poll_fn(|cx| self.poll_read(cx, false, &mut started, wait)).await?;
            self.session.received(n);
        }
    }

    /// One read into the session's room (the whole buffer for the lone-put
    /// path), or the deadline: `started + wait`, where `started` is when the
    /// first read of this reply had to wait.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        lone_put: bool,
        started: &mut Option<Instant>,
        wait: Duration,
    ) -> Poll<Result<usize, ConnectionError>> {
        loop {
            let room = if lone_put {
                self.session.put_read_room()
            } else {
                self.session.recv_room()?
            };
            let mut buf = ReadBuf::new(room);
            let err = match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => {
                    self.counts.reads += 1;
                    match buf.filled().len() {
                        0 => ConnectionError::Closed,
                        n => return Poll::Ready(Ok(n)),
                    }
                }
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Poll::Ready(Err(e)) => {
                    self.counts.reads += 1;
                    ConnectionError::Io(e)
                }
                Poll::Pending => {
                    let t0 = *started.get_or_insert_with(Instant::now);
                    if !self.deadline.passed(due(t0, wait), cx) {
                        return Poll::Pending;
                    }
                    ConnectionError::Timeout {
                        waited: t0.elapsed(),
                    }
                }
            };
            self.session.mark_broken();
            return Poll::Ready(Err(err));
        }
    }
}

/// TCP_NODELAY (each request is one whole write) and keepalive.
fn setup(stream: TcpStream, cfg: &ConnectionConfig) -> io::Result<TcpStream> {
    stream.set_nodelay(true)?;
    if let Some(idle) = cfg.keepalive {
        socket2::SockRef::from(&stream).set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(idle)
                .with_interval(Duration::from_secs(5)),
        )?;
    }
    Ok(stream)
}

/// Writes every byte, one write call per attempt; a partial write continues
/// where it stopped, waiting (against the I/O timeout) for room. The counts
/// take each call that moved bytes or failed.
async fn write_all(
    stream: &TcpStream,
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    timeout: Duration,
    bufs: &mut [IoSlice<'_>],
) -> Result<(), ConnectionError> {
    write_rest(stream, counts, deadline, timeout, bufs, 0).await
}

/// [`write_all`] for a request of which `sent` bytes already left.
async fn write_rest(
    stream: &TcpStream,
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    timeout: Duration,
    mut bufs: &mut [IoSlice<'_>],
    mut sent: usize,
) -> Result<(), ConnectionError> {
    let mut started = None;
    while !bufs.is_empty() {
        let r = if bufs.len() == 1 {
            stream.try_write(&bufs[0])
        } else {
            stream.try_write_vectored(bufs)
        };
        let err = match r {
            Ok(0) => {
                counts.writes += 1;
                io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")
            }
            Ok(n) => {
                counts.writes += 1;
                sent += n;
                IoSlice::advance_slices(&mut bufs, n);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let t0 = *started.get_or_insert_with(Instant::now);
                let due = due(t0, timeout);
                let ready = poll_fn(|cx| match stream.poll_write_ready(cx) {
                    Poll::Pending if deadline.passed(due, cx) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "write timed out",
                    ))),
                    other => other,
                });
                match ready.await {
                    Ok(()) => continue,
                    Err(e) => e,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                counts.writes += 1;
                e
            }
        };
        return Err(if sent == 0 {
            ConnectionError::NotSent(err)
        } else {
            ConnectionError::Io(err)
        });
    }
    Ok(())
}
