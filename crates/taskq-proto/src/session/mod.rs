//! The session: one connection's protocol state with no socket, and
//! deadlines it keeps on the instants its driver gives it.
//!
//! A [`Session`] encodes requests into its own send buffer (reusing a put line
//! whose numbers repeat), remembers which replies are owed and in what order,
//! takes the bytes a driver read and yields the owed replies in order,
//! borrowed from its receive buffer. A driver (the blocking
//! [`Connection`](crate::Connection), or an async one) owns the socket and
//! reads the clock: it writes what the session encoded with one write, reads
//! into the room the session gives, says when it starts to wait for a reply
//! ([`Session::start_wait`]), and wakes at [`Session::poll_timeout`], where
//! [`Session::handle_timeout`] tells whether the reply is overdue. The rule
//! of that deadline is the session's alone: the I/O timeout plus what the
//! server may take by design (a `reserve-with-timeout`'s seconds), counted
//! from when the wait for the reply began (after its request was written, or
//! after the reply before it came).
//!
//! ```
//! use taskq_proto::{Command, Reply, Request, Session, Limits};
//!
//! let mut s = Session::new(Limits::default());
//! let bytes = match s.encode(&Command::Put { pri: 0, delay: 0, ttr: 60, body: b"hi" }).unwrap() {
//!     Request::Whole(b) => b.to_vec(),
//!     Request::Parts { .. } => unreachable!("small bodies are encoded whole"),
//! };
//! assert_eq!(bytes, b"put 0 0 60 2\r\nhi\r\n");
//! assert_eq!(s.owed(), 1);
//! // The reply arrives in two pieces; the first is not enough.
//! for piece in [&b"INSERTED "[..], b"7\r\n"] {
//!     let room = s.recv_room().unwrap();
//!     room[..piece.len()].copy_from_slice(piece);
//!     s.received(piece.len());
//! }
//! assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 7 }));
//! assert_eq!(s.owed(), 0);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::command::{Command, CommandKind};
use crate::error::{ConnectionError, ReplyError};
use crate::reply::{
    attach, inserted_exact, parse_frame, reserved_line, Limits, Reply, Span, Status,
};
use crate::MAX_LINE;

mod recv_buf;

pub use recv_buf::{Full, RecvBuf, INITIAL_RECV};

/// The earlier of two deadlines, where `None` is none: how a driver combines
/// a session's deadline with its own, and a session its several.
#[inline]
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `from + wait`, or a century on when that overflows: a caller may
/// configure a huge wait (`Duration::MAX`) to mean "wait forever", and an
/// `Instant` cannot hold it.
pub(crate) fn deadline_after(from: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(wait)
        .or_else(|| from.checked_add(CENTURY))
        .unwrap_or(from)
}

/// Bytes of the inline send buffer: a put whose line and body fit is encoded
/// whole there; a larger one is sent as its line and its body.
pub const INLINE_REQUEST: usize = 1024;

/// Replies a session keeps room for without allocating: enough for a worker's
/// pipelined `watch`/`ignore`/settle/reserve and a put with its `stats-tube`.
const OWED_INITIAL: usize = 64;

/// One encoded request, ready for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// The whole request.
    Whole(&'a [u8]),
    /// A put too large for the inline buffer: its line, then its body, then
    /// `\r\n` (a vectored write sends the three at once).
    Parts {
        /// The command line, CRLF included.
        line: &'a [u8],
        /// The job body.
        body: &'a [u8],
    },
}

impl Request<'_> {
    /// The request's length on the wire.
    pub fn len(&self) -> usize {
        match self {
            Request::Whole(b) => b.len(),
            Request::Parts { line, body } => line.len() + body.len() + 2,
        }
    }

    /// True for an empty request (never produced by [`Session::encode`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A put line encoded at the start of the send buffer.
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

/// One connection's protocol state: send buffer, owed replies, receive buffer.
///
/// Once a reply cannot be decoded (or the driver says the transport failed)
/// the session is broken for good: the stream is out of step, and every later
/// call answers [`ConnectionError::Broken`].
pub struct Session {
    limits: Limits,
    line: [u8; INLINE_REQUEST],
    put_line: PutLine,
    pipe: Vec<u8>,
    owed: VecDeque<CommandKind>,
    /// [`LONE_PUT`] and [`BROKEN`]: one byte, so that the hot path tests both at once.
    /// The last `unsent` entries of `owed` belong to queued requests not yet flushed.
    unsent: usize,
    rx: RecvBuf,
    flags: u8,
    /// Take a reserved job larger than the limit as
    /// [`Reply::ReservedTooBig`] ([`skip_large_jobs`](Self::skip_large_jobs)).
    skip_large: bool,
    /// Bytes of such a job's body, and its CRLF, still to drop as they come.
    skip: u64,
    /// The I/O timeout the reply deadline allows.
    io_timeout: Duration,
    /// When the wait for the front owed reply began (`None`: not begun).
    waiting_since: Option<Instant>,
}

/// The enqueue hot path's owed reply: a put sent alone while nothing else was
/// owed is marked by this flag instead of an entry in `owed` (which it then
/// precedes), which saves the put a push and a pop.
const LONE_PUT: u8 = 1;
/// The stream is out of step for good.
const BROKEN: u8 = 2;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("owed", &self.owed.len())
            .field("queued", &self.pipe.len())
            .field("buffered", &self.rx.len())
            .field("broken", &self.is_broken())
            .finish()
    }
}

/// The most a receive buffer ever holds: one reply line and the largest body or YAML.
pub fn recv_capacity(limits: &Limits) -> usize {
    MAX_LINE
        .saturating_add(limits.max_job_size.max(limits.max_yaml_size))
        .saturating_add(2)
}

impl Session {
    /// A fresh session enforcing `limits` on what it sends and receives.
    pub fn new(limits: Limits) -> Session {
        Session {
            limits,
            line: [0; INLINE_REQUEST],
            put_line: PutLine::NONE,
            pipe: Vec::new(),
            owed: VecDeque::with_capacity(OWED_INITIAL),
            unsent: 0,
            rx: RecvBuf::new(INITIAL_RECV, recv_capacity(&limits)),
            flags: 0,
            skip_large: false,
            skip: 0,
            io_timeout: crate::defaults::IO_TIMEOUT,
            waiting_since: None,
        }
    }

    /// Sets the I/O timeout the reply deadline allows (by default
    /// [`defaults::IO_TIMEOUT`](crate::defaults::IO_TIMEOUT)).
    pub fn set_io_timeout(&mut self, io_timeout: Duration) {
        self.io_timeout = io_timeout;
    }

    /// The I/O timeout the reply deadline allows.
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// The driver begins to wait for the front owed reply at `now` (it wrote
    /// what is owed and must read, or the reply before came and the next is
    /// not whole yet). A wait already begun keeps its start, so a driver
    /// whose read was cancelled and made again keeps the same deadline;
    /// taking a reply ends the wait. Nothing owed: nothing to wait for.
    #[inline]
    pub fn start_wait(&mut self, now: Instant) -> Instant {
        if self.owed() == 0 {
            return now;
        }
        *self.waiting_since.get_or_insert(now)
    }

    /// When the wait for the front owed reply began, if it has.
    #[inline]
    pub fn waiting_since(&self) -> Option<Instant> {
        self.waiting_since
    }

    /// When the front owed reply is overdue: its wait's start plus
    /// [`reply_wait`](Self::reply_wait). `None` while no wait has begun (or
    /// nothing is owed), and for a deadline past what an `Instant` holds (an
    /// I/O timeout configured huge, to mean "wait forever").
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_broken() {
            return None;
        }
        let since = self.waiting_since?;
        since.checked_add(self.reply_wait().ok()?)
    }

    /// Acts on the deadline at `now`: the front owed reply overdue breaks
    /// the session, [`ConnectionError::Timeout`] with how long it was
    /// awaited; otherwise `Ok`.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ConnectionError> {
        match (self.waiting_since, self.poll_timeout()) {
            (Some(since), Some(due)) if now >= due => {
                self.mark_broken();
                Err(ConnectionError::Timeout {
                    waited: now.saturating_duration_since(since),
                })
            }
            _ => Ok(()),
        }
    }

    /// The limits this session enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// From now on a `RESERVED` reply whose body is larger than
    /// `max_job_size` is taken as [`Reply::ReservedTooBig`] (the job's id
    /// and size), and its body is dropped as it arrives, never buffered:
    /// the connection holds the job and stays in step, so the caller can
    /// bury it. Without this such a reply is [`ReplyError::BodyTooLarge`]
    /// and breaks the session.
    pub fn skip_large_jobs(&mut self) {
        self.skip_large = true;
    }

    /// Drops what arrived of a skipped body; its last two bytes must be CRLF.
    fn drop_skipped(&mut self) -> Result<(), ReplyError> {
        let k = self.skip.min(self.rx.len() as u64);
        let data = self.rx.data();
        // Where the CRLF lies from the front, when it has come.
        let at = |back: u64| self.skip.checked_sub(back).filter(|&i| i < k);
        let cr = at(2).is_none_or(|i| data[i as usize] == b'\r');
        let lf = at(1).is_none_or(|i| data[i as usize] == b'\n');
        if !(cr && lf) {
            return Err(ReplyError::MissingBodyCrlf);
        }
        self.rx.consume(k as usize);
        self.skip -= k;
        Ok(())
    }

    /// True once the stream is out of step; the connection must be replaced.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.flags & BROKEN != 0
    }

    /// Marks the session broken: the transport failed, or the caller got a
    /// reply it cannot accept (say a `USING` naming another tube).
    pub fn mark_broken(&mut self) {
        self.flags |= BROKEN;
    }

    #[inline]
    fn lone_put(&self) -> bool {
        self.flags & LONE_PUT != 0
    }

    /// Replies owed: requests encoded or queued whose replies were not yet taken.
    #[inline]
    pub fn owed(&self) -> usize {
        self.owed.len() + usize::from(self.lone_put())
    }

    /// The kind of the command whose reply comes next.
    #[inline]
    pub fn next_owed(&self) -> Option<CommandKind> {
        if self.lone_put() {
            return Some(CommandKind::Put);
        }
        self.owed.front().copied()
    }

    /// Moves the hot path's owed put into `owed`, before anything is added behind it.
    #[inline]
    fn settle_lone_put(&mut self) {
        if self.lone_put() {
            self.flags &= !LONE_PUT;
            self.owed.push_front(CommandKind::Put);
        }
    }

    /// How long a driver may wait for the whole of the next owed reply: the
    /// I/O timeout plus what the server may take by design (the seconds of a
    /// `reserve-with-timeout`). [`ConnectionError::Broken`] or
    /// [`ConnectionError::NothingOwed`] when there is no reply to wait for.
    #[inline]
    pub fn reply_wait(&self) -> Result<Duration, ConnectionError> {
        match self.next_owed() {
            Some(kind) => Ok(self
                .io_timeout
                .saturating_add(Duration::from_secs(u64::from(kind.server_wait_secs())))),
            None if self.is_broken() => Err(ConnectionError::Broken),
            None => Err(ConnectionError::NothingOwed),
        }
    }

    /// The queued requests' bytes for one write, or `None` when nothing is
    /// queued. On a broken session the queue is dropped and the answer is
    /// [`ConnectionError::Broken`]: requests queued before it broke must not
    /// reach a server that is out of step. After the write, call
    /// [`queue_sent`](Self::queue_sent).
    pub fn to_flush(&mut self) -> Result<Option<&[u8]>, ConnectionError> {
        if self.is_broken() {
            self.clear_queue();
            return Err(ConnectionError::Broken);
        }
        Ok(Some(self.pipe.as_slice()).filter(|q| !q.is_empty()))
    }

    /// Encodes one request for one write and records the reply it is owed.
    ///
    /// The request is meant to go out now, ahead of any requests gathered by
    /// [`queue`](Self::queue) and not yet sent: its reply is owed before theirs.
    #[inline]
    pub fn encode<'r>(&'r mut self, cmd: &Command<'r>) -> Result<Request<'r>, ConnectionError> {
        if let Command::Put {
            pri,
            delay,
            ttr,
            body,
        } = *cmd
        {
            // Two steps, so that the borrow of the fast path's bytes ends on its own path.
            if self.repeated_put(pri, delay, ttr, body).is_some() {
                let total = self.put_line.head + body.len() + 2;
                return Ok(Request::Whole(&self.line[..total]));
            }
        }
        self.encode_any(cmd)
    }

    /// The enqueue hot path: a put with the numbers of the last one (its line
    /// is still at the start of the send buffer, and its size check passed
    /// then) whose whole request fits the inline buffer, while nothing is owed
    /// or wrong. Copies the body behind the kept line and returns the whole
    /// request; `None` (nothing done) for any other put.
    #[inline]
    pub fn repeated_put(&mut self, pri: u32, delay: u32, ttr: u32, body: &[u8]) -> Option<&[u8]> {
        let l = self.put_line;
        if (l.pri, l.delay, l.ttr, l.len) != (pri, delay, ttr, body.len())
            || self.flags != 0
            || !self.owed.is_empty()
        {
            return None;
        }
        // A slice is at most `isize::MAX` long, so this cannot overflow.
        let total = l.head + body.len() + 2;
        let request = self.line.get_mut(l.head..total)?;
        let (dst, crlf) = request.split_at_mut(body.len());
        dst.copy_from_slice(body);
        crlf.copy_from_slice(b"\r\n");
        self.flags = LONE_PUT;
        Some(&self.line[..total])
    }

    /// [`encode`](Self::encode) for any request.
    fn encode_any<'r>(&'r mut self, cmd: &Command<'r>) -> Result<Request<'r>, ConnectionError> {
        if self.is_broken() {
            return Err(ConnectionError::Broken);
        }
        let head = self.encode_line(cmd)?;
        self.settle_lone_put();
        if matches!(cmd, Command::Put { .. }) && self.owed.is_empty() {
            self.flags |= LONE_PUT;
        } else {
            // Every command is owed an answer (`quit`'s is the close). On the
            // wire this one goes before the queued requests not yet sent.
            self.owed.insert(self.owed.len() - self.unsent, cmd.kind());
        }
        Ok(match *cmd {
            Command::Put { body, .. } if head + body.len() + 2 > INLINE_REQUEST => Request::Parts {
                line: &self.line[..head],
                body,
            },
            Command::Put { body, .. } => {
                let total = head + body.len() + 2;
                self.line[head..total - 2].copy_from_slice(body);
                self.line[total - 2..total].copy_from_slice(b"\r\n");
                Request::Whole(&self.line[..total])
            }
            _ => Request::Whole(&self.line[..head]),
        })
    }

    /// Encodes a command's line at the start of `line`, reusing a put line
    /// whose numbers repeat. Returns the line's length.
    fn encode_line(&mut self, cmd: &Command<'_>) -> Result<usize, ConnectionError> {
        let max = self.limits.max_job_size;
        Ok(match *cmd {
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
        })
    }

    /// Appends a request to the pipeline; [`queued`](Self::queued) then holds
    /// every queued request, for one write.
    pub fn queue(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        if self.is_broken() {
            return Err(ConnectionError::Broken);
        }
        self.put_line = PutLine::NONE;
        let head = cmd.encode_line(&mut self.line, self.limits.max_job_size)?;
        self.settle_lone_put();
        self.pipe.extend_from_slice(&self.line[..head]);
        if let Command::Put { body, .. } = cmd {
            self.pipe.extend_from_slice(body);
            self.pipe.extend_from_slice(b"\r\n");
        }
        self.owed.push_back(cmd.kind());
        self.unsent += 1;
        Ok(())
    }

    /// The queued requests' bytes, for one write.
    #[inline]
    pub fn queued(&self) -> &[u8] {
        &self.pipe
    }

    /// Says that the queued requests were written; their replies are now awaited.
    pub fn queue_sent(&mut self) {
        self.pipe.clear();
        self.unsent = 0;
    }

    /// Drops the queued requests without sending them, and the replies they
    /// would have been owed.
    pub fn clear_queue(&mut self) {
        self.pipe.clear();
        // the lone put is never set while requests are queued.
        let keep = self.owed.len() - self.unsent;
        self.owed.truncate(keep);
        self.unsent = 0;
    }

    /// Records that a request the caller wrote itself (not encoded here) is
    /// owed a reply of `kind`; for tests that send bytes no encoder builds.
    #[cfg(feature = "test-util")]
    pub fn expect_reply(&mut self, kind: CommandKind) {
        self.settle_lone_put();
        self.owed.push_back(kind);
    }

    /// Room for the driver to read into (see [`RecvBuf::spare`]). A buffer at
    /// its cap with no whole reply in it breaks the session.
    #[inline]
    pub fn recv_room(&mut self) -> Result<&mut [u8], ConnectionError> {
        if self.is_broken() {
            return Err(ConnectionError::Broken);
        }
        match self.rx.spare() {
            Ok(room) => Ok(room),
            Err(Full) => {
                // The parser refuses frames larger than the limits before this point.
                self.flags |= BROKEN;
                Err(ConnectionError::Protocol(ReplyError::LineTooLong))
            }
        }
    }

    /// Says that `n` bytes were read into the room [`recv_room`](Self::recv_room) gave.
    #[inline]
    pub fn received(&mut self, n: usize) {
        self.rx.filled(n);
    }

    /// Bytes received and not yet taken as replies.
    #[inline]
    pub fn buffered(&self) -> usize {
        self.rx.len()
    }

    /// The next owed reply when it is whole in the receive buffer; `None` when
    /// more bytes are needed. A reply that cannot be decoded breaks the session.
    #[inline]
    pub fn poll_reply(&mut self) -> Result<Option<Reply<'_>>, ConnectionError> {
        Ok(self.frame_reply()?.map(|f| self.take_reply(f)))
    }

    /// The first half of [`poll_reply`](Self::poll_reply): finds out whether
    /// the next owed reply is whole, without borrowing the buffer, so a driver
    /// can read more in between. [`take_reply`](Self::take_reply) then takes it.
    #[inline]
    pub fn frame_reply(&mut self) -> Result<Option<Framed>, ConnectionError> {
        if self.is_broken() {
            return Err(ConnectionError::Broken);
        }
        let Some(kind) = self.next_owed() else {
            return Err(ConnectionError::NothingOwed);
        };
        if self.skip > 0 {
            if let Err(e) = self.drop_skipped() {
                self.mark_broken();
                return Err(ConnectionError::Protocol(e));
            }
        }
        if self.rx.is_empty() || self.skip > 0 {
            return Ok(None);
        }
        match parse_frame(kind, self.rx.data(), &self.limits) {
            Ok(Status::Complete((reply, span), used)) => Ok(Some(Framed { reply, span, used })),
            Ok(Status::Partial) => Ok(None),
            Err(e) => {
                if let (ReplyError::BodyTooLarge { .. }, true) = (&e, self.skip_large) {
                    // A `RESERVED` line (the parser checked that it answers
                    // a reserve): the job is ours, its body is dropped.
                    if let Some((id, len, used)) = reserved_line(self.rx.data()) {
                        return Ok(Some(Framed {
                            reply: Reply::ReservedTooBig { id, len },
                            span: Span::default(),
                            used,
                        }));
                    }
                }
                self.mark_broken();
                Err(ConnectionError::Protocol(e))
            }
        }
    }

    /// Takes the reply [`frame_reply`](Self::frame_reply) found, borrowed from
    /// the receive buffer, and pays its owed entry.
    #[inline]
    pub fn take_reply(&mut self, f: Framed) -> Reply<'_> {
        let base = self.rx.start();
        self.rx.consume(f.used);
        if let Reply::ReservedTooBig { len, .. } = f.reply {
            // Dropped as it comes, by the next `frame_reply`.
            self.skip = len.saturating_add(2);
        }
        let put = if self.lone_put() {
            self.flags &= !LONE_PUT;
            true
        } else {
            self.owed.pop_front() == Some(CommandKind::Put)
        };
        self.waiting_since = None;
        if put && matches!(f.reply, Reply::BadFormat | Reply::UnknownCommand) {
            // The server refused the put's line before reading its body, and
            // reads the body as commands: their replies would be taken as
            // the next requests'. This reply stands (nothing was queued);
            // the next request reconnects.
            self.mark_broken();
        }
        if self.owed.is_empty() && self.skip == 0 && !self.rx.is_empty() {
            // Bytes past the last reply owed: a server answers only what it
            // is asked, so the stream is out of step (a duplicating proxy,
            // a broken server), and the next request's reply would be read
            // from them. This reply stands; the next request reconnects.
            self.mark_broken();
        }
        // Consumed bytes stay in place until the next read.
        attach(f.reply, f.span, self.rx.from(base))
    }

    /// True when the only owed reply is a put's and nothing is buffered: the
    /// state in which a driver may read straight into
    /// [`put_read_room`](Self::put_read_room) and try [`take_inserted`](Self::take_inserted).
    #[inline]
    pub fn awaits_lone_put(&self) -> bool {
        // the lone put is set only while nothing else is owed, and cleared by
        // anything that adds to `owed`.
        self.flags == LONE_PUT && self.rx.is_empty() && self.skip == 0
    }

    /// The whole receive buffer, when [`awaits_lone_put`](Self::awaits_lone_put).
    #[inline]
    pub fn put_read_room(&mut self) -> &mut [u8] {
        self.rx.empty_spare()
    }

    /// After a read of `n` bytes into [`put_read_room`](Self::put_read_room):
    /// the id when they are exactly one `INSERTED <id>\r\n` (the owed put is
    /// then paid); otherwise the bytes are kept for [`poll_reply`](Self::poll_reply).
    #[inline]
    pub fn take_inserted(&mut self, n: usize) -> Option<u64> {
        if let Some(id) = inserted_exact(self.rx.from(0), n) {
            self.flags = 0;
            self.waiting_since = None;
            return Some(id);
        }
        self.rx.filled(n);
        None
    }
}

/// A whole reply found by [`Session::frame_reply`], not yet taken.
#[derive(Debug, Clone, Copy)]
pub struct Framed {
    reply: Reply<'static>,
    span: Span,
    used: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(s: &mut Session, bytes: &[u8]) {
        let room = s.recv_room().unwrap();
        room[..bytes.len()].copy_from_slice(bytes);
        s.received(bytes.len());
    }

    #[test]
    fn replies_come_in_the_order_their_requests_were_queued() {
        let mut s = Session::new(Limits::default());
        s.queue(&Command::Watch { tube: "a" }).unwrap();
        s.queue(&Command::Ignore { tube: "default" }).unwrap();
        s.queue(&Command::ReserveWithTimeout { timeout: 0 })
            .unwrap();
        assert_eq!(
            s.queued(),
            b"watch a\r\nignore default\r\nreserve-with-timeout 0\r\n"
        );
        s.queue_sent();
        assert_eq!(s.owed(), 3);
        feed(&mut s, b"WATCHING 2\r\nWATCHING 1\r\nTIMED_OUT\r\n");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Watching { count: 2 }));
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Watching { count: 1 }));
        assert_eq!(
            s.next_owed(),
            Some(CommandKind::ReserveWithTimeout { timeout: 0 })
        );
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::TimedOut));
        assert!(matches!(s.poll_reply(), Err(ConnectionError::NothingOwed)));
    }

    #[test]
    fn the_reply_wait_adds_the_servers_wait_and_a_broken_queue_is_dropped() {
        let mut s = Session::new(Limits::default());
        s.set_io_timeout(Duration::from_millis(500));
        assert!(matches!(s.reply_wait(), Err(ConnectionError::NothingOwed)));
        assert_eq!(s.to_flush().unwrap(), None);
        s.queue(&Command::ReserveWithTimeout { timeout: 3 })
            .unwrap();
        assert_eq!(s.reply_wait().unwrap(), Duration::from_millis(3500));
        assert_eq!(
            s.to_flush().unwrap(),
            Some(&b"reserve-with-timeout 3\r\n"[..])
        );
        s.mark_broken();
        assert!(matches!(s.to_flush(), Err(ConnectionError::Broken)));
        assert!(s.queued().is_empty());
        assert_eq!(s.owed(), 0);
        assert!(matches!(s.reply_wait(), Err(ConnectionError::Broken)));
    }

    /// The reply deadline, on given instants: the I/O timeout (plus a
    /// blocking reserve's seconds) from when the wait for the front reply
    /// began; a wait begun again keeps its start; each reply taken ends the
    /// wait, and the next one's starts when the driver waits again.
    #[test]
    fn the_front_reply_is_due_its_wait_after_the_wait_began_and_overdue_breaks() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = Session::new(Limits::default());
        s.set_io_timeout(Duration::from_millis(500));
        // Nothing owed: nothing to wait for, nothing due.
        assert_eq!(s.start_wait(ms(0)), ms(0));
        assert_eq!((s.waiting_since(), s.poll_timeout()), (None, None));
        s.queue(&Command::Stats).unwrap();
        s.queue(&Command::ReserveWithTimeout { timeout: 2 })
            .unwrap();
        s.queue_sent();
        assert_eq!(s.poll_timeout(), None, "no wait begun");
        assert_eq!(s.start_wait(ms(10)), ms(10));
        assert_eq!(s.start_wait(ms(300)), ms(10), "kept across a retried read");
        assert_eq!(s.poll_timeout(), Some(ms(510)));
        assert!(s.handle_timeout(ms(509)).is_ok());
        feed(&mut s, b"OK 4\r\nx: 1\r\n");
        assert!(matches!(s.poll_reply().unwrap(), Some(Reply::Ok { .. })));
        // The reserve's wait begins when the driver waits for it again, and
        // allows the server its two seconds.
        assert_eq!(s.poll_timeout(), None);
        s.start_wait(ms(600));
        assert_eq!(s.poll_timeout(), Some(ms(3_100)));
        let e = s.handle_timeout(ms(3_100)).unwrap_err();
        assert!(
            matches!(e, ConnectionError::Timeout { waited } if waited == Duration::from_millis(2_500)),
            "{e:?}"
        );
        assert!(s.is_broken());
        assert_eq!(s.poll_timeout(), None, "a broken session waits for nothing");
        // A huge I/O timeout means no deadline at all.
        let mut s = Session::new(Limits::default());
        s.set_io_timeout(Duration::MAX);
        s.queue(&Command::Stats).unwrap();
        s.start_wait(ms(0));
        assert_eq!(s.poll_timeout(), None);
        assert!(s.handle_timeout(ms(1_000_000)).is_ok());
    }

    #[test]
    fn a_cleared_queue_owes_nothing() {
        let mut s = Session::new(Limits::default());
        s.queue(&Command::Stats).unwrap();
        s.clear_queue();
        assert_eq!(s.owed(), 0);
        assert!(s.queued().is_empty());
    }

    #[test]
    fn a_request_sent_while_a_queue_waits_is_owed_before_the_queue() {
        let mut s = Session::new(Limits::default());
        s.queue(&Command::Delete { id: 1 }).unwrap();
        // Sent now, so answered first; a put that could take the fast path too.
        s.encode(&Command::Stats).unwrap();
        let put = Command::Put {
            pri: 1,
            delay: 0,
            ttr: 1,
            body: b"x",
        };
        s.encode(&put).unwrap();
        s.encode(&put).unwrap();
        s.queue_sent();
        feed(
            &mut s,
            b"OK 4\r\n---\n\r\nINSERTED 1\r\nINSERTED 2\r\nDELETED\r\n",
        );
        assert!(matches!(s.poll_reply().unwrap(), Some(Reply::Ok { .. })));
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 1 }));
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 2 }));
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Deleted));
        assert_eq!(s.owed(), 0);
    }

    #[test]
    fn a_job_over_the_limit_is_taken_by_id_and_its_body_dropped_as_it_comes() {
        let limits = Limits {
            max_job_size: 4,
            ..Limits::default()
        };
        let body = b"0123456789\r\n0123456789";
        let reply = [&b"RESERVED 7 22\r\n"[..], body, b"\r\n", b"BURIED\r\n"].concat();
        // Whole, and cut at every byte: the same replies, nothing held.
        for cut in 0..reply.len() {
            let mut s = Session::new(limits);
            s.skip_large_jobs();
            s.queue(&Command::Reserve).unwrap();
            s.queue(&Command::Bury { id: 7, pri: 1 }).unwrap();
            s.queue_sent();
            let mut got = Vec::new();
            for piece in [&reply[..cut], &reply[cut..]] {
                feed(&mut s, piece);
                while s.owed() > 0 {
                    match s.poll_reply().unwrap() {
                        Some(r) => got.push(format!("{r:?}")),
                        None => break,
                    }
                }
            }
            assert_eq!(s.buffered(), 0);
            assert_eq!(
                got,
                ["ReservedTooBig { id: 7, len: 22 }", "Buried"],
                "cut {cut}"
            );
        }
        // Without the opt-in, as before: refused, and the session broken.
        let mut s = Session::new(limits);
        s.queue(&Command::Reserve).unwrap();
        s.queue_sent();
        feed(&mut s, &reply);
        assert!(matches!(
            s.poll_reply(),
            Err(ConnectionError::Protocol(ReplyError::BodyTooLarge {
                len: 22,
                max: 4
            }))
        ));
        // A skipped body not followed by CRLF puts the stream out of step.
        let mut s = Session::new(limits);
        s.skip_large_jobs();
        s.queue(&Command::Reserve).unwrap();
        s.queue(&Command::Bury { id: 7, pri: 1 }).unwrap();
        s.queue_sent();
        feed(&mut s, b"RESERVED 7 5\r\n01234XYBURIED\r\n");
        assert!(s.poll_reply().unwrap().is_some());
        assert!(matches!(
            s.poll_reply(),
            Err(ConnectionError::Protocol(ReplyError::MissingBodyCrlf))
        ));
        assert!(s.is_broken());
    }

    #[test]
    fn a_bad_reply_breaks_the_session_for_good() {
        let mut s = Session::new(Limits::default());
        s.encode(&Command::Delete { id: 1 }).unwrap();
        feed(&mut s, b"INSERTED 4\r\n");
        assert!(matches!(
            s.poll_reply(),
            Err(ConnectionError::Protocol(
                ReplyError::UnexpectedReply { .. }
            ))
        ));
        assert!(s.is_broken());
        assert!(matches!(
            s.encode(&Command::Stats),
            Err(ConnectionError::Broken)
        ));
        assert!(matches!(s.recv_room(), Err(ConnectionError::Broken)));
    }

    #[test]
    fn a_repeated_put_reuses_its_line_and_a_big_one_comes_in_parts() {
        let mut s = Session::new(Limits::default());
        let body = [b'x'; 2000];
        for _ in 0..2 {
            match s.encode(&Command::Put {
                pri: 5,
                delay: 0,
                ttr: 9,
                body: b"ab",
            }) {
                Ok(Request::Whole(b)) => assert_eq!(b, b"put 5 0 9 2\r\nab\r\n"),
                other => panic!("{other:?}"),
            }
        }
        match s.encode(&Command::Put {
            pri: 5,
            delay: 0,
            ttr: 9,
            body: &body,
        }) {
            Ok(Request::Parts { line, body: b }) => {
                assert_eq!(line, b"put 5 0 9 2000\r\n");
                assert_eq!(b.len(), 2000);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.owed(), 3);
    }

    #[test]
    fn the_lone_put_path_takes_an_exact_inserted_and_keeps_anything_else() {
        let mut s = Session::new(Limits::default());
        s.encode(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"",
        })
        .unwrap();
        assert!(s.awaits_lone_put());
        let room = s.put_read_room();
        room[..13].copy_from_slice(b"INSERTED 42\r\n");
        assert_eq!(s.take_inserted(13), Some(42));
        assert_eq!(s.owed(), 0);

        s.encode(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"",
        })
        .unwrap();
        let room = s.put_read_room();
        room[..6].copy_from_slice(b"INSERT");
        assert_eq!(s.take_inserted(6), None);
        assert_eq!(s.poll_reply().unwrap(), None);
        feed(&mut s, b"ED 43\r\n");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 43 }));
    }

    #[test]
    fn bytes_past_the_last_reply_owed_break_the_session_never_answer_the_next_request() {
        // A duplicating proxy or a broken server: two replies to one put.
        let mut s = Session::new(Limits::default());
        s.encode(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"a",
        })
        .unwrap();
        let room = s.put_read_room();
        let twice = b"INSERTED 1\r\nINSERTED 2\r\n";
        room[..twice.len()].copy_from_slice(twice);
        assert_eq!(s.take_inserted(twice.len()), None, "not one exact reply");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 1 }));
        assert!(s.is_broken(), "the second reply is nobody's");
        // In a pipeline, bytes left while replies are still owed are theirs.
        let mut s = Session::new(Limits::default());
        s.queue(&Command::Watch { tube: "a" }).unwrap();
        s.queue(&Command::ReserveWithTimeout { timeout: 0 })
            .unwrap();
        s.queue_sent();
        feed(&mut s, b"WATCHING 2\r\nTIMED_OUT\r\n");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Watching { count: 2 }));
        assert!(!s.is_broken());
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::TimedOut));
        assert!(!s.is_broken());
    }

    #[test]
    fn a_put_refused_before_its_body_breaks_the_session_other_refusals_do_not() {
        let put = Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"abc",
        };
        // beanstalkd answers a put line it cannot read with BAD_FORMAT and
        // reads the body as a command (UNKNOWN_COMMAND); the put queued
        // after it then gets its own INSERTED. Pipelined, the second put
        // must not be handed the body's UNKNOWN_COMMAND, nor a third put
        // the second's id.
        for refusal in [&b"BAD_FORMAT\r\n"[..], b"UNKNOWN_COMMAND\r\n"] {
            let mut s = Session::new(Limits::default());
            s.queue(&put).unwrap();
            s.queue(&put).unwrap();
            s.queue_sent();
            feed(&mut s, refusal);
            feed(&mut s, b"UNKNOWN_COMMAND\r\nINSERTED 7\r\n");
            let first = s.poll_reply().unwrap().unwrap();
            assert!(
                matches!(first, Reply::BadFormat | Reply::UnknownCommand),
                "{first:?}"
            );
            assert!(s.is_broken());
            assert!(matches!(s.poll_reply(), Err(ConnectionError::Broken)));
            // The lone put the same.
            let mut s = Session::new(Limits::default());
            s.encode(&put).unwrap();
            feed(&mut s, refusal);
            assert!(s.poll_reply().unwrap().is_some());
            assert!(s.is_broken());
        }
        // Any other command's line is all the server reads: a refusal of
        // it leaves the stream in step.
        let mut s = Session::new(Limits::default());
        s.queue(&Command::Use { tube: "a" }).unwrap();
        s.queue(&Command::Delete { id: 3 }).unwrap();
        s.queue(&put).unwrap();
        s.queue_sent();
        feed(&mut s, b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\nINSERTED 8\r\n");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::BadFormat));
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::UnknownCommand));
        assert!(!s.is_broken());
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 8 }));
        // A put refused after its body was read leaves it in step too.
        let mut s = Session::new(Limits::default());
        s.queue(&put).unwrap();
        s.queue(&put).unwrap();
        s.queue_sent();
        feed(&mut s, b"JOB_TOO_BIG\r\nINSERTED 9\r\n");
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::JobTooBig));
        assert!(!s.is_broken());
        assert_eq!(s.poll_reply().unwrap(), Some(Reply::Inserted { id: 9 }));
    }
}
