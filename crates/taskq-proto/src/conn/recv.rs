//! The read side of a [`Connection`]: each owed reply read against one
//! deadline for the whole of it, with a fast path for `INSERTED` after a put.

use std::io;
use std::time::Instant;

use super::sock::took;
use super::Connection;
use crate::error::ConnectionError;
use crate::reply::Reply;

impl Connection {
    /// Reads the next owed reply (the one to the oldest request whose reply was
    /// not read yet), decoded as an answer to that request.
    ///
    /// The deadline covers the whole reply: the session's reply deadline
    /// (`Session::poll_timeout`: the I/O timeout plus, for
    /// `reserve-with-timeout`, the seconds the server may wait), from the
    /// first read that waits for it.
    #[inline]
    pub fn recv(&mut self) -> Result<Reply<'_>, ConnectionError> {
        // The enqueue hot path: the reply to a lone put on an empty buffer is
        // almost always one whole `INSERTED <id>\r\n` from one read.
        if self.session.awaits_lone_put() && !self.io.rcv_lowered() {
            // The one clock read of a put: should this read bring only part of
            // the reply, the deadline for the rest counts from here (the
            // session is told only then, off the hot path).
            let started = Instant::now();
            let r = self.io.read_once(self.session.put_read_room());
            if let Ok(n) = r {
                if let Some(id) = self.session.take_inserted(n) {
                    return Ok(Reply::Inserted { id });
                }
            }
            return self.recv_after_first_read(started, r);
        }
        self.recv_any()
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
        self.session.start_wait(started);
        // Bytes that arrived are in the buffer already; an end of stream or
        // an error is accounted for here.
        if !matches!(r, Ok(n) if n > 0) {
            if let Err(e) = took(r) {
                self.session.mark_broken();
                return Err(e);
            }
        }
        self.recv_any()
    }

    /// [`recv`](Self::recv) for any reply (its wait may have begun with the
    /// hot path's read).
    fn recv_any(&mut self) -> Result<Reply<'_>, ConnectionError> {
        // The whole wait: the I/O timeout plus what the server may take by design.
        let wait = self.session.reply_wait()?;
        // The clock is read only before the first read that may wait: a reply
        // already in the buffer (the rest of a pipeline) costs no clock at all.
        let mut first_read = self.session.waiting_since().is_none();
        loop {
            if let Some(f) = self.session.frame_reply()? {
                return Ok(self.session.take_reply(f));
            }
            let t0 = match self.session.waiting_since() {
                Some(t0) => t0,
                None => self.session.start_wait(Instant::now()),
            };
            // Make room first: a buffer full at its cap breaks the session.
            let room = self.session.recv_room()?;
            match self.io.fill(room, t0, wait, &mut first_read) {
                Ok(n) => self.session.received(n),
                Err(e) => {
                    self.session.mark_broken();
                    return Err(e);
                }
            }
        }
    }
}
