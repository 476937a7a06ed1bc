//! The socket under a blocking driver, shared by the beanstalkd
//! [`Connection`](crate::Connection) and the NATS driver of `taskq-connect`: socket setup, reads held
//! to a whole-reply deadline, and writes of one send call per request, all
//! counted in [`IoCounts`].

use std::io::{self, IoSlice, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::error::ConnectionError;

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: i32 = 0x4000; // MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: i32 = 0;

/// How far a lowered socket timeout may run past the deadline before it is
/// worth a `setsockopt` to shorten it.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

/// System calls made by a connection, for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCounts {
    /// `send` calls (plain or vectored).
    pub writes: u64,
    /// `recv` calls.
    pub reads: u64,
}

/// A connected socket with its read-timeout state and its system-call counts:
/// the blocking socket under both engines' blocking drivers (the beanstalkd
/// [`Connection`](crate::Connection) here, the NATS one in `taskq-connect`).
pub struct SockIo {
    /// The socket.
    pub sock: Socket,
    io_timeout: Duration,
    rcv_timeout: Duration,
    /// True while a deadline has the socket timeout below the I/O timeout; the
    /// next reply's first read restores it.
    rcv_lowered: bool,
    /// The system calls made on it.
    pub counts: IoCounts,
}

impl SockIo {
    /// Connects to `addr` within `connect_timeout`, with no Nagle delay,
    /// optional keepalive, and socket timeouts of `io_timeout`.
    pub fn open(
        addr: SocketAddr,
        connect_timeout: Duration,
        io_timeout: Duration,
        keepalive: Option<Duration>,
    ) -> io::Result<SockIo> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        sock.set_tcp_nodelay(true)?;
        if let Some(idle) = keepalive {
            sock.set_keepalive(true)?;
            sock.set_tcp_keepalive(
                &TcpKeepalive::new()
                    .with_time(idle)
                    .with_interval(Duration::from_secs(5)),
            )?;
        }
        #[cfg(any(target_os = "macos", target_os = "ios"))]
        sock.set_nosigpipe(true)?;
        sock.connect_timeout(&addr.into(), positive(connect_timeout))?;
        sock.set_read_timeout(Some(positive(io_timeout)))?;
        sock.set_write_timeout(Some(positive(io_timeout)))?;
        Ok(SockIo {
            sock,
            io_timeout,
            rcv_timeout: positive(io_timeout),
            rcv_lowered: false,
            counts: IoCounts::default(),
        })
    }

    /// True while the socket timeout is below the I/O timeout.
    #[inline]
    pub fn rcv_lowered(&self) -> bool {
        self.rcv_lowered
    }

    /// One read with no deadline check: the hot path's first read of a reply.
    #[inline]
    pub fn read_once(&mut self, room: &mut [u8]) -> io::Result<usize> {
        self.counts.reads += 1;
        (&self.sock).read(room)
    }

    /// Reads into `room` until bytes arrive or the deadline (`started` +
    /// `wait`) passes. `first_read` is true for a reply's first read, which
    /// needs no clock (the socket timeout never exceeds the whole wait) and
    /// restores a lowered socket timeout; it is false afterwards.
    ///
    /// The caller marks its session broken on any error.
    pub fn fill(
        &mut self,
        room: &mut [u8],
        started: Instant,
        wait: Duration,
        first_read: &mut bool,
    ) -> Result<usize, ConnectionError> {
        if self.rcv_lowered && *first_read {
            self.set_rcv_timeout(positive(self.io_timeout))?;
        }
        loop {
            if !*first_read {
                let now = Instant::now();
                let deadline = crate::session::deadline_after(started, wait);
                if now + DEADLINE_SLACK >= deadline {
                    return Err(ConnectionError::Timeout {
                        waited: now - started,
                    });
                }
                let left = deadline - now;
                if self.rcv_timeout > left + DEADLINE_SLACK {
                    self.set_rcv_timeout(left)?;
                } else if self.rcv_lowered {
                    // Lowered by an earlier wait with less time left: raise it
                    // again, never past the I/O timeout or what is left now.
                    let want = left.min(positive(self.io_timeout));
                    if self.rcv_timeout + DEADLINE_SLACK < want {
                        self.set_rcv_timeout(want)?;
                    }
                }
            }
            *first_read = false;
            let r = self.read_once(room);
            if let Some(n) = took(r)? {
                return Ok(n);
            }
        }
    }

    fn set_rcv_timeout(&mut self, t: Duration) -> Result<(), ConnectionError> {
        let t = positive(t);
        self.sock
            .set_read_timeout(Some(t))
            .map_err(ConnectionError::Io)?;
        self.rcv_timeout = t;
        self.rcv_lowered = t != positive(self.io_timeout);
        Ok(())
    }

    /// Sends `bytes` with one send call (more only on a partial write).
    #[inline]
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), ConnectionError> {
        let r = self.sock.send_with_flags(bytes, SEND_FLAGS);
        self.counts.writes += 1;
        match r {
            Ok(n) if n == bytes.len() => Ok(()),
            first => send_rest(&self.sock, &mut self.counts, self.io_timeout, bytes, first),
        }
    }

    /// Writes every byte of `bufs`, one (vectored) send call per attempt.
    pub fn write_all(&mut self, bufs: &mut [IoSlice<'_>]) -> Result<(), ConnectionError> {
        write_rest(&self.sock, &mut self.counts, self.io_timeout, bufs, 0)
    }
}

/// Accounts for one read: the bytes that arrived, `None` when the read timed
/// out or was interrupted (check the deadline and read again); an end of
/// stream or another error is final.
pub(crate) fn took(r: io::Result<usize>) -> Result<Option<usize>, ConnectionError> {
    match r {
        Ok(0) => Err(ConnectionError::Closed),
        Ok(n) => Ok(Some(n)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(ConnectionError::Io(e)),
    }
}

/// A partial or failed first send of `bytes`: goes on as [`write_rest`] would.
#[cold]
fn send_rest(
    sock: &Socket,
    counts: &mut IoCounts,
    io_timeout: Duration,
    bytes: &[u8],
    first: io::Result<usize>,
) -> Result<(), ConnectionError> {
    match first {
        Ok(n) if n > 0 => write_rest(
            sock,
            counts,
            io_timeout,
            &mut [IoSlice::new(&bytes[n..])],
            n,
        ),
        Ok(_) => Err(ConnectionError::NotSent(write_zero())),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
            write_rest(sock, counts, io_timeout, &mut [IoSlice::new(bytes)], 0)
        }
        Err(e) => Err(ConnectionError::NotSent(e)),
    }
}

/// Writes every byte of a request of which `sent` bytes already left; a
/// partial write continues where it stopped. The socket's send timeout
/// bounds each send; `io_timeout`, from the first partial send on, bounds
/// the rest as a whole, so a peer that takes a few bytes just before each
/// send would time out cannot stretch the write (the clock is read only
/// once a send was partial: a whole write costs none).
fn write_rest(
    sock: &Socket,
    counts: &mut IoCounts,
    io_timeout: Duration,
    mut bufs: &mut [IoSlice<'_>],
    mut sent: usize,
) -> Result<(), ConnectionError> {
    // From the first partial send on.
    let mut partial: Option<Instant> = None;
    while !bufs.is_empty() {
        if partial.is_some_and(|t| t.elapsed() > io_timeout) {
            // Part was sent (a partial send started the clock): unknown.
            return Err(ConnectionError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "the write took longer than the I/O timeout",
            )));
        }
        let r = if bufs.len() == 1 {
            sock.send_with_flags(&bufs[0], SEND_FLAGS)
        } else {
            sock.send_vectored_with_flags(bufs, SEND_FLAGS)
        };
        counts.writes += 1;
        let err = match r {
            Ok(0) => write_zero(),
            Ok(n) => {
                sent += n;
                IoSlice::advance_slices(&mut bufs, n);
                if partial.is_none() && !bufs.is_empty() {
                    partial = Some(Instant::now());
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => e,
        };
        return Err(if sent == 0 {
            ConnectionError::NotSent(err)
        } else {
            ConnectionError::Io(err)
        });
    }
    Ok(())
}

fn write_zero() -> io::Error {
    io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")
}

/// Socket timeouts of zero mean "forever"; never let a short wait become that.
pub(crate) fn positive(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}
