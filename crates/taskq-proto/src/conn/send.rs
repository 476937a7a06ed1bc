//! The write side of a [`Connection`]: each request the session encodes goes
//! out in one send call; queued requests go out together in one.

use std::io::{self, IoSlice};

use socket2::Socket;

use super::{Connection, IoCounts};
use crate::command::Command;
use crate::error::ConnectionError;
use crate::session::Request;

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: i32 = 0x4000; // MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: i32 = 0;

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
                let r = self.sock.send_with_flags(bytes, SEND_FLAGS);
                self.counts.writes += 1;
                if let Ok(n) = r {
                    if n == bytes.len() {
                        return Ok(());
                    }
                }
                let r = send_rest(&self.sock, &mut self.counts, bytes, r);
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
            Request::Whole(bytes) => {
                let r = self.sock.send_with_flags(bytes, SEND_FLAGS);
                self.counts.writes += 1;
                match r {
                    Ok(n) if n == bytes.len() => return Ok(()),
                    first => send_rest(&self.sock, &mut self.counts, bytes, first),
                }
            }
            Request::Parts { line, body } => write_all(
                &self.sock,
                &mut self.counts,
                &mut [
                    IoSlice::new(line),
                    IoSlice::new(body),
                    IoSlice::new(b"\r\n"),
                ],
            ),
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
        let r = write_all(&self.sock, &mut self.counts, &mut [IoSlice::new(queued)]);
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
        let r = write_all(&self.sock, &mut self.counts, &mut [IoSlice::new(bytes)]);
        self.session.expect_reply(kind);
        if r.is_err() {
            self.session.mark_broken();
        }
        r
    }
}

/// A partial or failed first send of `bytes`: goes on as [`write_all`] would.
#[cold]
fn send_rest(
    sock: &Socket,
    counts: &mut IoCounts,
    bytes: &[u8],
    first: io::Result<usize>,
) -> Result<(), ConnectionError> {
    match first {
        Ok(n) if n > 0 => write_rest(sock, counts, &mut [IoSlice::new(&bytes[n..])], n),
        Ok(_) => Err(ConnectionError::NotSent(write_zero())),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => {
            write_all(sock, counts, &mut [IoSlice::new(bytes)])
        }
        Err(e) => Err(ConnectionError::NotSent(e)),
    }
}

/// Writes every byte, one send call per attempt; a partial write continues where it stopped.
fn write_all(
    sock: &Socket,
    counts: &mut IoCounts,
    bufs: &mut [IoSlice<'_>],
) -> Result<(), ConnectionError> {
    write_rest(sock, counts, bufs, 0)
}

/// [`write_all`] for a request of which `sent` bytes already left.
fn write_rest(
    sock: &Socket,
    counts: &mut IoCounts,
    mut bufs: &mut [IoSlice<'_>],
    mut sent: usize,
) -> Result<(), ConnectionError> {
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
