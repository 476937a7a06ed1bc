//! The tokio I/O both async drivers share (beanstalkd's and JetStream's):
//! the kept deadline timer, socket setup, and writes of one call per request.
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
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::{ConnectionError, IoCounts};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant, Sleep};

/// The kept timer of a connection (see the module docs for the rule).
pub struct Deadline {
    sleep: Pin<Box<Sleep>>,
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline::new()
    }
}

impl Deadline {
    /// A kept timer, due at once: the first wait arms it at its own deadline.
    pub fn new() -> Deadline {
        // Elapsed from the start: the first wait arms it at its own deadline.
        Deadline {
            sleep: Box::pin(sleep_until(Instant::now())),
        }
    }

    /// True once `due` has passed; otherwise the task is woken at `due` at
    /// the latest (the kept sleep is registered with this context's waker).
    pub fn passed(&mut self, due: Instant, cx: &mut Context<'_>) -> bool {
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
pub fn due(started: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    started
        .checked_add(wait)
        .or_else(|| started.checked_add(CENTURY))
        .unwrap_or(started)
}

/// One read into `room`, or the deadline: `started + wait`, where `started`
/// is when the first read of the reply had to wait (set here then); none
/// for a `wait` of `Duration::MAX`. The
/// counts take each read that moved bytes or failed; a read of nothing is
/// the peer's close.
pub fn poll_read_into(
    stream: &mut TcpStream,
    room: &mut [u8],
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    cx: &mut Context<'_>,
    (started, wait): (&mut Option<Instant>, Duration),
) -> Poll<Result<usize, ConnectionError>> {
    let mut buf = ReadBuf::new(room);
    loop {
        let err = match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                counts.reads += 1;
                match buf.filled().len() {
                    0 => ConnectionError::Closed,
                    n => return Poll::Ready(Ok(n)),
                }
            }
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Poll::Ready(Err(e)) => {
                counts.reads += 1;
                ConnectionError::Io(e)
            }
            // No deadline of its own (`Duration::MAX`): the caller keeps
            // its deadlines, and neither the clock nor the timer is touched.
            Poll::Pending if wait == Duration::MAX => return Poll::Pending,
            Poll::Pending => {
                let t0 = *started.get_or_insert_with(Instant::now);
                if !deadline.passed(due(t0, wait), cx) {
                    return Poll::Pending;
                }
                ConnectionError::Timeout {
                    waited: t0.elapsed(),
                }
            }
        };
        return Poll::Ready(Err(err));
    }
}

/// Opens a TCP connection to `addr` within `connect_timeout`, with
/// TCP_NODELAY and keepalive as [`setup`] sets them.
pub async fn open_stream(
    addr: std::net::SocketAddr,
    connect_timeout: Duration,
    keepalive: Option<Duration>,
) -> io::Result<TcpStream> {
    match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
        Ok(r) => r.and_then(|s| setup(s, keepalive)),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// TCP_NODELAY (each request is one whole write) and keepalive.
pub fn setup(stream: TcpStream, keepalive: Option<Duration>) -> io::Result<TcpStream> {
    stream.set_nodelay(true)?;
    if let Some(idle) = keepalive {
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
pub async fn write_all(
    stream: &TcpStream,
    counts: &mut IoCounts,
    deadline: &mut Deadline,
    timeout: Duration,
    bufs: &mut [IoSlice<'_>],
) -> Result<(), ConnectionError> {
    write_rest(stream, counts, deadline, timeout, bufs, 0).await
}

/// [`write_all`] for a request of which `sent` bytes already left.
pub async fn write_rest(
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
