//! The read side of a [`Connection`]: each owed reply read against one
//! deadline for the whole of it, with a fast path for `INSERTED` after a put.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use super::{positive, Connection};
use crate::error::ConnectionError;
use crate::reply::Reply;

/// How far a lowered socket timeout may run past the deadline before it is
/// worth a `setsockopt` to shorten it.
const DEADLINE_SLACK: Duration = Duration::from_millis(20);

impl Connection {
    /// Reads the next owed reply (the one to the oldest request whose reply was
    /// not read yet), decoded as an answer to that request.
    ///
    /// The deadline covers the whole reply: the I/O timeout plus, for
    /// `reserve-with-timeout`, the seconds the server may wait.
    #[inline]
    pub fn recv(&mut self) -> Result<Reply<'_>, ConnectionError> {
        // The enqueue hot path: the reply to a lone put on an empty buffer is
        // almost always one whole `INSERTED <id>\r\n` from one read.
        if self.session.awaits_lone_put() && !self.rcv_lowered {
            // The one clock read of a put: should this read bring only part of
            // the reply, the deadline for the rest counts from here.
            let started = Instant::now();
            let r = (&self.sock).read(self.session.put_read_room());
            self.counts.reads += 1;
            if let Ok(n) = r {
                if let Some(id) = self.session.take_inserted(n) {
                    return Ok(Reply::Inserted { id });
                }
            }
            return self.recv_after_first_read(started, r);
        }
        self.recv_any(None)
    }

    /// The hot path's read did not bring a whole `INSERTED` (its bytes, if
    /// any, are in the session's buffer already): account for a failed read
    /// and go on as [`recv`](Self::recv) would after its first read.
    #[cold]
    fn recv_after_first_read(
        &mut self,
        started: Instant,
        r: io::Result<usize>,
    ) -> Result<Reply<'_>, ConnectionError> {
        // Bytes that arrived are in the buffer already; an end of stream or
        // an error is accounted for here.
        if !matches!(r, Ok(n) if n > 0) {
            self.took(r)?;
        }
        self.recv_any(Some(started))
    }

    /// [`recv`](Self::recv) for any reply. `started` is when the wait for this
    /// reply began, when a read for it was already made.
    fn recv_any(&mut self, started: Option<Instant>) -> Result<Reply<'_>, ConnectionError> {
        // The whole wait: the I/O timeout plus what the server may take by design.
        let wait = self.session.reply_wait(self.cfg.io_timeout)?;
        // The clock is read only before the first read that may wait: a reply
        // already in the buffer (the rest of a pipeline) costs no clock at all.
        let mut first_read = started.is_none();
        let mut started = started;
        loop {
            if let Some(f) = self.session.frame_reply()? {
                return Ok(self.session.take_reply(f));
            }
            let t0 = *started.get_or_insert_with(Instant::now);
            self.fill(t0, wait, &mut first_read)?;
        }
    }

    fn fill(
        &mut self,
        started: Instant,
        wait: Duration,
        first_read: &mut bool,
    ) -> Result<(), ConnectionError> {
        // Make room first: a buffer full at its cap breaks the session.
        self.session.recv_room()?;
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
                    self.session.mark_broken();
                    return Err(ConnectionError::Timeout {
                        waited: now - started,
                    });
                }
                let left = deadline - now;
                if self.rcv_timeout > left + DEADLINE_SLACK {
                    self.set_rcv_timeout(left)?;
                }
            }
            *first_read = false;
            let r = (&self.sock).read(self.session.recv_room()?);
            self.counts.reads += 1;
            if self.took(r)? {
                return Ok(());
            }
        }
    }

    /// Accounts for one read into the session's room: true when bytes arrived,
    /// false when the read timed out or was interrupted (the caller checks the
    /// deadline and reads again); an end of stream or another error breaks the
    /// connection.
    fn took(&mut self, r: io::Result<usize>) -> Result<bool, ConnectionError> {
        match r {
            Ok(0) => {
                self.session.mark_broken();
                Err(ConnectionError::Closed)
            }
            Ok(n) => {
                self.session.received(n);
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
                self.session.mark_broken();
                Err(ConnectionError::Io(e))
            }
        }
    }

    fn set_rcv_timeout(&mut self, t: Duration) -> Result<(), ConnectionError> {
        let t = positive(t);
        if let Err(e) = self.sock.set_read_timeout(Some(t)) {
            self.session.mark_broken();
            return Err(ConnectionError::Io(e));
        }
        self.rcv_timeout = t;
        self.rcv_lowered = t != positive(self.cfg.io_timeout);
        Ok(())
    }
}

/// A deadline so far away that it stands for "no deadline".
fn far_future(from: Instant) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(CENTURY).unwrap_or(from)
}
