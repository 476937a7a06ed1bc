//! The blocking connection: one socket, one reused send buffer, one receive
//! buffer, and a deadline on every whole reply.

use std::io::{self, IoSlice, Read};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::command::{Command, CommandKind};
use crate::error::Error;
use crate::reply::{attach, inserted_exact, parse_frame, Limits, Reply, Status};
use crate::MAX_LINE;

/// Bytes of the inline send buffer: a put whose line and body fit is sent from
/// here with one plain write; a larger one goes out as one vectored write.
pub const INLINE_REQUEST: usize = 1024;

/// The receive buffer's first size; it grows only when a reply needs more.
const INITIAL_RECV: usize = 4096;

/// How far a lowered socket timeout may run past the deadline before it is
/// worth a `setsockopt` to shorten it.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: i32 = 0x4000; // MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: i32 = 0;

/// Settings of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Limit on each connect attempt, per resolved address.
    pub connect_timeout: Duration,
    /// Limit on each whole reply (plus the server's wait for `reserve-with-timeout`),
    /// and on each write.
    pub io_timeout: Duration,
    /// Job and YAML size limits.
    pub limits: Limits,
    /// TCP keepalive idle time; `None` leaves keepalive off.
    pub keepalive: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(1),
            limits: Limits::default(),
            keepalive: Some(Duration::from_secs(30)),
        }
    }
}

/// System calls made by a connection, for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoCounts {
    /// `send` calls (plain or vectored).
    pub writes: u64,
    /// `recv` calls.
    pub reads: u64,
}

/// A blocking connection to a beanstalkd-protocol server.
///
/// Each request goes out in one write; each reply is read against a deadline for
/// the whole reply. After a timeout, an I/O error or a reply it cannot decode the
/// connection is broken for good and refuses further requests with [`Error::Broken`].
pub struct Connection {
    sock: Socket,
    peer: SocketAddr,
    cfg: Config,
    line: [u8; INLINE_REQUEST],
    pipe: Vec<u8>,
    rbuf: Vec<u8>,
    start: usize,
    end: usize,
    rcv_timeout: Duration,
    /// True while a deadline has the socket timeout below the I/O timeout; the
    /// next reply's first read restores it.
    rcv_lowered: bool,
    broken: bool,
    counts: IoCounts,
    /// The put line now at the start of `line`: a put with the same four
    /// numbers reuses it instead of encoding it again.
    put_line: PutLine,
}

/// A put line encoded at the start of a connection's send buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PutLine {
    pri: u32,
    delay: u32,
    ttr: u32,
    /// The body length; `usize::MAX`, which no slice has, when there is no line.
    len: usize,
    /// The line's length, CRLF included.
    head: usize,
}

impl PutLine {
    /// No reusable line (a slice is never `usize::MAX` long, so no put matches):
    /// a sentinel rather than an `Option` saves the hot path a test.
    const NONE: PutLine = PutLine {
        pri: 0,
        delay: 0,
        ttr: 0,
        len: usize::MAX,
        head: 0,
    };
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("broken", &self.broken)
            .field("buffered", &(self.end - self.start))
            .finish()
    }
}

impl Connection {
    /// Connects to the first address of `addr` that accepts within the connect timeout.
    pub fn connect(addr: impl ToSocketAddrs, cfg: Config) -> Result<Connection, Error> {
        let mut last = None;
        for a in addr.to_socket_addrs().map_err(Error::NotSent)? {
            match Connection::connect_addr(a, cfg) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            Error::NotSent(io::Error::new(
                io::ErrorKind::InvalidInput,
                "address resolved to nothing",
            ))
        }))
    }

    /// Connects to one address.
    pub fn connect_addr(addr: SocketAddr, cfg: Config) -> Result<Connection, Error> {
        let setup = || -> io::Result<Socket> {
            let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            sock.set_tcp_nodelay(true)?;
            if let Some(idle) = cfg.keepalive {
                sock.set_keepalive(true)?;
                sock.set_tcp_keepalive(
                    &TcpKeepalive::new()
                        .with_time(idle)
                        .with_interval(Duration::from_secs(5)),
                )?;
            }
            #[cfg(any(target_os = "macos", target_os = "ios"))]
            sock.set_nosigpipe(true)?;
            sock.connect_timeout(
                &addr.into(),
                cfg.connect_timeout.max(Duration::from_millis(1)),
            )?;
            sock.set_read_timeout(Some(positive(cfg.io_timeout)))?;
            sock.set_write_timeout(Some(positive(cfg.io_timeout)))?;
            Ok(sock)
        };
        let sock = setup().map_err(Error::NotSent)?;
        let cap = INITIAL_RECV.min(recv_capacity(&cfg.limits));
        Ok(Connection {
            sock,
            peer: addr,
            cfg,
            line: [0; INLINE_REQUEST],
            pipe: Vec::new(),
            rbuf: vec![0; cap],
            start: 0,
            end: 0,
            rcv_timeout: positive(cfg.io_timeout),
            rcv_lowered: false,
            broken: false,
            counts: IoCounts::default(),
            put_line: PutLine::NONE,
        })
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The settings this connection was opened with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// True once the connection is out of step; it must be replaced.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks the connection broken, for a caller that gave up on it.
    pub fn mark_broken(&mut self) {
        self.broken = true;
    }

    /// A handle that can cut this connection from another thread, for example to
    /// end a blocking `reserve` at shutdown. The blocked read then fails with
    /// [`Error::Closed`] and the server returns any job the connection held.
    pub fn interrupter(&self) -> io::Result<Interrupter> {
        Ok(Interrupter(self.sock.try_clone()?))
    }

    /// System calls made so far.
    pub fn io_counts(&self) -> IoCounts {
        self.counts
    }

    /// Sends one request with a single write call (looping only on a partial write).
    ///
    /// Requests gathered by [`queue`](Self::queue) are not sent first: flush them
    /// before, or their replies will be read out of order.
    #[inline]
    pub fn send(&mut self, cmd: &Command<'_>) -> Result<(), Error> {
        // The enqueue hot path: a put with the numbers of the last one (its line
        // is still encoded at the start of `line`, and its size check passed
        // then) whose whole request fits the inline buffer.
        if let Command::Put {
            pri,
            delay,
            ttr,
            body,
        } = *cmd
        {
            let line = self.put_line;
            if (line.pri, line.delay, line.ttr, line.len) == (pri, delay, ttr, body.len())
                && !self.broken
            {
                // A slice is at most `isize::MAX` long, so this cannot overflow.
                let total = line.head + body.len() + 2;
                if let Some(request) = self.line.get_mut(line.head..total) {
                    let (dst, crlf) = request.split_at_mut(body.len());
                    dst.copy_from_slice(body);
                    crlf.copy_from_slice(b"\r\n");
                    return self.send_inline(total);
                }
            }
        }
        self.send_any(cmd)
    }

    /// Sends the first `total` bytes of `line`; one call unless the socket takes less.
    #[inline]
    fn send_inline(&mut self, total: usize) -> Result<(), Error> {
        let r = self.sock.send_with_flags(&self.line[..total], SEND_FLAGS);
        self.counts.writes += 1;
        match r {
            Ok(n) if n == total => Ok(()),
            other => self.send_inline_rest(total, other),
        }
    }

    /// A partial or failed first send of `line[..total]`: goes on as `write_all` would.
    #[cold]
    fn send_inline_rest(&mut self, total: usize, first: io::Result<usize>) -> Result<(), Error> {
        let r = match first {
            Ok(n) if n > 0 => write_rest(
                &self.sock,
                &mut self.counts,
                &mut [IoSlice::new(&self.line[n..total])],
                n,
            ),
            Ok(_) => Err(Error::NotSent(write_zero())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => write_all(
                &self.sock,
                &mut self.counts,
                &mut [IoSlice::new(&self.line[..total])],
            ),
            Err(e) => Err(Error::NotSent(e)),
        };
        self.broken |= r.is_err();
        r
    }

    /// [`send`](Self::send) for any request: encodes its line (reusing a put
    /// line whose numbers repeat), then writes the request.
    fn send_any(&mut self, cmd: &Command<'_>) -> Result<(), Error> {
        if self.broken {
            return Err(Error::Broken);
        }
        let max = self.cfg.limits.max_job_size;
        let head = match *cmd {
            Command::Put {
                pri,
                delay,
                ttr,
                body,
            } => {
                let l = self.put_line;
                if (l.pri, l.delay, l.ttr, l.len) == (pri, delay, ttr, body.len()) {
                    // Same numbers, same line (and the same size check passed before).
                    l.head
                } else {
                    self.put_line = PutLine::NONE;
                    let head = cmd.encode_line(&mut self.line, max)?;
                    self.put_line = PutLine {
                        pri,
                        delay,
                        ttr,
                        len: body.len(),
                        head,
                    };
                    head
                }
            }
            _ => {
                self.put_line = PutLine::NONE;
                cmd.encode_line(&mut self.line, max)?
            }
        };
        let r = match *cmd {
            Command::Put { body, .. } if head + body.len() + 2 > INLINE_REQUEST => write_all(
                &self.sock,
                &mut self.counts,
                &mut [
                    IoSlice::new(&self.line[..head]),
                    IoSlice::new(body),
                    IoSlice::new(b"\r\n"),
                ],
            ),
            Command::Put { body, .. } => {
                let total = head + body.len() + 2;
                self.line[head..total - 2].copy_from_slice(body);
                self.line[total - 2..total].copy_from_slice(b"\r\n");
                write_all(
                    &self.sock,
                    &mut self.counts,
                    &mut [IoSlice::new(&self.line[..total])],
                )
            }
            _ => write_all(
                &self.sock,
                &mut self.counts,
                &mut [IoSlice::new(&self.line[..head])],
            ),
        };
        self.broken |= r.is_err();
        r
    }

    /// Appends a request to the pipeline buffer; [`flush`](Self::flush) sends all of them in one write.
    pub fn queue(&mut self, cmd: &Command<'_>) -> Result<(), Error> {
        if self.broken {
            return Err(Error::Broken);
        }
        self.put_line = PutLine::NONE;
        let head = cmd.encode_line(&mut self.line, self.cfg.limits.max_job_size)?;
        self.pipe.extend_from_slice(&self.line[..head]);
        if let Command::Put { body, .. } = cmd {
            self.pipe.extend_from_slice(body);
            self.pipe.extend_from_slice(b"\r\n");
        }
        Ok(())
    }

    /// Bytes waiting in the pipeline buffer.
    pub fn queued_len(&self) -> usize {
        self.pipe.len()
    }

    /// Drops what [`queue`](Self::queue) gathered without sending it.
    pub fn clear_queue(&mut self) {
        self.pipe.clear();
    }

    /// Sends everything queued with one write call. The buffer keeps its capacity.
    ///
    /// On a broken connection nothing is sent, the queue is dropped and the
    /// answer is [`Error::Broken`]: requests queued before it broke must not reach
    /// a server that is out of step with this client.
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.broken {
            self.pipe.clear();
            return Err(Error::Broken);
        }
        if self.pipe.is_empty() {
            return Ok(());
        }
        let r = write_all(
            &self.sock,
            &mut self.counts,
            &mut [IoSlice::new(&self.pipe)],
        );
        self.pipe.clear();
        self.broken |= r.is_err();
        r
    }

    /// Sends bytes as they are, for tests that need a request no encoder would build.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), Error> {
        if self.broken {
            return Err(Error::Broken);
        }
        let r = write_all(&self.sock, &mut self.counts, &mut [IoSlice::new(bytes)]);
        self.broken |= r.is_err();
        r
    }

    /// Sends a request and reads its reply.
    pub fn request(&mut self, cmd: &Command<'_>) -> Result<Reply<'_>, Error> {
        self.send(cmd)?;
        self.recv(cmd.kind())
    }

    /// Reads the next reply, decoded as an answer to a command of `kind`.
    ///
    /// The deadline covers the whole reply: the I/O timeout plus, for
    /// `reserve-with-timeout`, the seconds the server may wait.
    #[inline]
    pub fn recv(&mut self, kind: CommandKind) -> Result<Reply<'_>, Error> {
        // The enqueue hot path: the reply to a put on an empty buffer (`end` is
        // reset to 0 whenever the buffer drains) is almost always one whole
        // `INSERTED <id>\r\n` from one read.
        if kind == CommandKind::Put && self.end == 0 && !(self.broken | self.rcv_lowered) {
            // The one clock read of a put: should this read bring only part of
            // the reply, the deadline for the rest counts from here.
            let started = Instant::now();
            let r = (&self.sock).read(&mut self.rbuf);
            self.counts.reads += 1;
            if let Ok(n) = r {
                if let Some(id) = inserted_exact(&self.rbuf, n) {
                    return Ok(Reply::Inserted { id });
                }
            }
            return self.recv_after_first_read(kind, started, r);
        }
        self.recv_any(kind, None)
    }

    /// The hot path's read did not bring a whole `INSERTED`: account for it and
    /// go on as [`recv`](Self::recv) would after its first read.
    fn recv_after_first_read(
        &mut self,
        kind: CommandKind,
        started: Instant,
        r: io::Result<usize>,
    ) -> Result<Reply<'_>, Error> {
        self.took(r)?;
        self.recv_any(kind, Some(started))
    }

    /// [`recv`](Self::recv) for any reply. `started` is when the wait for this
    /// reply began, when a read for it was already made.
    fn recv_any(
        &mut self,
        kind: CommandKind,
        started: Option<Instant>,
    ) -> Result<Reply<'_>, Error> {
        if self.broken {
            return Err(Error::Broken);
        }
        // The whole wait: the I/O timeout plus what the server may take by design.
        let wait = self
            .cfg
            .io_timeout
            .saturating_add(Duration::from_secs(u64::from(kind.server_wait_secs())));
        // The clock is read only before the first read that may wait: a reply
        // already in the buffer (the rest of a pipeline) costs no clock at all.
        let mut first_read = started.is_none();
        let mut started = started;
        let limits = self.cfg.limits;
        let (reply, span, used) = loop {
            if self.start < self.end {
                match parse_frame(kind, &self.rbuf[self.start..self.end], &limits) {
                    Ok(Status::Complete((r, s), n)) => break (r, s, n),
                    Ok(Status::Partial) => {}
                    Err(e) => {
                        self.broken = true;
                        return Err(Error::Protocol(e));
                    }
                }
            }
            let t0 = *started.get_or_insert_with(Instant::now);
            self.fill(t0, wait, &mut first_read)?;
        };
        let base = self.start;
        self.start += used;
        if self.start == self.end {
            // The bytes stay in place until the next fill, which needs `&mut self`
            // and so cannot run while the reply borrows them.
            self.start = 0;
            self.end = 0;
        }
        Ok(attach(reply, span, &self.rbuf[base..]))
    }

    /// Sends `quit` and closes.
    pub fn quit(mut self) {
        if !self.broken {
            let _ = self.send(&Command::Quit);
        }
    }

    fn fill(
        &mut self,
        started: Instant,
        wait: Duration,
        first_read: &mut bool,
    ) -> Result<(), Error> {
        if self.end == self.rbuf.len() {
            self.make_room()?;
        }
        if self.rcv_lowered && *first_read {
            self.set_rcv_timeout(positive(self.cfg.io_timeout))?;
        }
        loop {
            if !*first_read {
                // The socket timeout never exceeds the whole wait, so the first read
                // needs no clock; later ones check what is left of the deadline.
                let now = Instant::now();
                // Checked: a caller may configure a huge I/O timeout to mean "wait forever".
                let deadline = started
                    .checked_add(wait)
                    .unwrap_or_else(|| far_future(started));
                if now + DEADLINE_SLACK >= deadline {
                    self.broken = true;
                    return Err(Error::Timeout {
                        waited: now - started,
                    });
                }
                let left = deadline - now;
                if self.rcv_timeout > left + DEADLINE_SLACK {
                    self.set_rcv_timeout(left)?;
                }
            }
            *first_read = false;
            let r = (&self.sock).read(&mut self.rbuf[self.end..]);
            self.counts.reads += 1;
            if self.took(r)? {
                return Ok(());
            }
        }
    }

    /// Accounts for one read into `rbuf[end..]`: true when bytes arrived, false
    /// when the read timed out or was interrupted (the caller checks the deadline
    /// and reads again); an end of stream or another error breaks the connection.
    fn took(&mut self, r: io::Result<usize>) -> Result<bool, Error> {
        match r {
            Ok(0) => {
                self.broken = true;
                Err(Error::Closed)
            }
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(false)
            }
            Err(e) => {
                self.broken = true;
                Err(Error::Io(e))
            }
        }
    }

    fn make_room(&mut self) -> Result<(), Error> {
        if self.start > 0 {
            self.rbuf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            return Ok(());
        }
        let cap = recv_capacity(&self.cfg.limits);
        if self.rbuf.len() >= cap {
            // The parser refuses frames larger than the limits before this point.
            self.broken = true;
            return Err(Error::Protocol(crate::ReplyError::LineTooLong));
        }
        // Double, but never past the cap (which may be below INITIAL_RECV).
        let grown = self.rbuf.len().saturating_mul(2).max(INITIAL_RECV).min(cap);
        self.rbuf.resize(grown, 0);
        Ok(())
    }

    fn set_rcv_timeout(&mut self, t: Duration) -> Result<(), Error> {
        let t = positive(t);
        if let Err(e) = self.sock.set_read_timeout(Some(t)) {
            self.broken = true;
            return Err(Error::Io(e));
        }
        self.rcv_timeout = t;
        self.rcv_lowered = t != positive(self.cfg.io_timeout);
        Ok(())
    }
}

/// Cuts a [`Connection`] from another thread (see [`Connection::interrupter`]).
#[derive(Debug)]
pub struct Interrupter(Socket);

impl Interrupter {
    /// Shuts the socket down in both directions; errors (already closed) are ignored.
    pub fn interrupt(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// Writes every byte, one send call per attempt; a partial write continues where it stopped.
fn write_all(sock: &Socket, counts: &mut IoCounts, bufs: &mut [IoSlice<'_>]) -> Result<(), Error> {
    write_rest(sock, counts, bufs, 0)
}

/// [`write_all`] for a request of which `sent` bytes already left.
fn write_rest(
    sock: &Socket,
    counts: &mut IoCounts,
    mut bufs: &mut [IoSlice<'_>],
    mut sent: usize,
) -> Result<(), Error> {
    while !bufs.is_empty() {
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
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => e,
        };
        return Err(if sent == 0 {
            Error::NotSent(err)
        } else {
            Error::Io(err)
        });
    }
    Ok(())
}

fn write_zero() -> io::Error {
    io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")
}

/// The most a receive buffer ever holds: one reply line and the largest body or YAML.
fn recv_capacity(limits: &Limits) -> usize {
    MAX_LINE
        .saturating_add(limits.max_job_size.max(limits.max_yaml_size))
        .saturating_add(2)
}

/// A deadline so far away that it stands for "no deadline".
fn far_future(from: Instant) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(CENTURY).unwrap_or(from)
}

/// Socket timeouts of zero mean "forever"; never let a short wait become that.
fn positive(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}
