//! The write side of a [`Connection`]: each request the session encodes goes
//! out in one send call; queued requests go out together in one.

use std::io::IoSlice;

use super::Connection;
use crate::command::Command;
use crate::error::ConnectionError;
use crate::session::Request;

impl Connection {
    /// Sends one request with a single write call (looping only on a partial write).
    ///
    /// The request goes out ahead of any gathered by [`queue`](Self::queue)
    /// and not yet flushed, and its reply is read before theirs.
    #[inline]
    pub fn send(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        // The enqueue hot path: a put whose line repeats goes out whole from
        // the inline buffer.
        if let Command::Put {
            pri,
            delay,
            ttr,
            body,
        } = *cmd
        {
            if let Some(bytes) = self.session.repeated_put(pri, delay, ttr, body) {
                let r = self.io.send(bytes);
                if r.is_err() {
                    self.session.mark_broken();
                }
                return r;
            }
        }
        self.send_any(cmd)
    }

    /// [`send`](Self::send) for any request.
    fn send_any(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        let r = match self.session.encode(cmd)? {
            Request::Whole(bytes) => self.io.send(bytes),
            Request::Parts { line, body } => self.io.write_all(&mut [
                IoSlice::new(line),
                IoSlice::new(body),
                IoSlice::new(b"\r\n"),
            ]),
        };
        if r.is_err() {
            self.session.mark_broken();
        }
        r
    }

    /// Appends a request to the pipeline buffer; [`flush`](Self::flush) sends all of them in one write.
    pub fn queue(&mut self, cmd: &Command<'_>) -> Result<(), ConnectionError> {
        self.session.queue(cmd)
    }

    /// Bytes waiting in the pipeline buffer.
    pub fn queued_len(&self) -> usize {
        self.session.queued().len()
    }

    /// Drops what [`queue`](Self::queue) gathered without sending it.
    pub fn clear_queue(&mut self) {
        self.session.clear_queue();
    }

    /// Sends everything queued with one write call. The buffer keeps its capacity.
    ///
    /// On a broken connection nothing is sent, the queue is dropped and the
    /// answer is [`ConnectionError::Broken`]: requests queued before it broke must not reach
    /// a server that is out of step with this client.
    pub fn flush(&mut self) -> Result<(), ConnectionError> {
        let Some(queued) = self.session.to_flush()? else {
            return Ok(());
        };
        let r = self.io.write_all(&mut [IoSlice::new(queued)]);
        self.session.queue_sent();
        if r.is_err() {
            self.session.mark_broken();
        }
        r
    }

    /// Sends bytes as they are and expects one reply of `kind` to them, for
    /// tests that need a request no encoder would build.
    #[cfg(feature = "test-util")]
    pub fn send_raw(
        &mut self,
        bytes: &[u8],
        kind: crate::CommandKind,
    ) -> Result<(), ConnectionError> {
        if self.session.is_broken() {
            return Err(ConnectionError::Broken);
        }
        let r = self.io.write_all(&mut [IoSlice::new(bytes)]);
        self.session.expect_reply(kind);
        if r.is_err() {
            self.session.mark_broken();
        }
        r
    }
}
