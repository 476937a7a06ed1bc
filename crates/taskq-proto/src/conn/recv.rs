//! The read side of a [`Connection`]: each reply read against one deadline
//! for the whole of it, with a fast path for `INSERTED` after a put.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use super::{positive, Connection};
use crate::command::CommandKind;
use crate::error::Error;
use crate::reply::{attach, inserted_exact, parse_frame, Limits, Reply, Status};
use crate::MAX_LINE;

/// The receive buffer's first size; it grows only when a reply needs more.
pub(super) const INITIAL_RECV: usize = 4096;

/// How far a lowered socket timeout may run past the deadline before it is
/// worth a `setsockopt` to shorten it.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

impl Connection {
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

/// The most a receive buffer ever holds: one reply line and the largest body or YAML.
pub(super) fn recv_capacity(limits: &Limits) -> usize {
    MAX_LINE
        .saturating_add(limits.max_job_size.max(limits.max_yaml_size))
        .saturating_add(2)
}

/// A deadline so far away that it stands for "no deadline".
fn far_future(from: Instant) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(CENTURY).unwrap_or(from)
}
