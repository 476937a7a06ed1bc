//! The write side of a [`Connection`]: each request in one send call, with a
//! fast path for a put whose line repeats; the pipeline buffer and its flush.

use std::io::{self, IoSlice};

use socket2::Socket;

use super::{Connection, IoCounts, INLINE_REQUEST};
use crate::command::Command;
use crate::error::Error;

#[cfg(any(target_os = "linux", target_os = "android"))]
const SEND_FLAGS: i32 = 0x4000; // MSG_NOSIGNAL: a reset peer gives EPIPE, not SIGPIPE.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const SEND_FLAGS: i32 = 0;

/// A put line encoded at the start of a connection's send buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PutLine {
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
    pub(super) const NONE: PutLine = PutLine {
        pri: 0,
        delay: 0,
        ttr: 0,
        len: usize::MAX,
        head: 0,
    };
}

impl Connection {
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
