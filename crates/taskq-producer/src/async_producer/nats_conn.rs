//! The async JetStream driver: one tokio `TcpStream` under a
//! [`NatsSession`], beside the blocking `NatsConnection` over the same
//! session (whose rules it mirrors: one write per put or batch, a deadline
//! on each whole reply, `PING`s answered as they come, broken for good after
//! a timeout, an I/O error, a server `-ERR` or bytes it cannot decode).
//!
//! A connection starts as a blocking one (handshake, credentials, the
//! stream's setup: the cold path, run on tokio's blocking pool) and is then
//! taken over here with its session: the hot path is all tokio.

use std::future::poll_fn;
use std::io::IoSlice;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::nats::{MsgFrame, NatsConnection, NatsError, NatsSession, PubAck};
use taskq_proto::{ConnectionError, IoCounts};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::io::{poll_read_into, write_all, write_rest, Deadline};

/// Bodies up to this size are copied behind their header block and sent
/// from one buffer; larger ones go out as a vectored write of three parts.
const WHOLE_PUT: usize = 16 * 1024;

/// A JetStream connection over tokio.
pub(crate) struct AsyncNatsConn {
    stream: TcpStream,
    session: NatsSession,
    counts: IoCounts,
    io_timeout: Duration,
    deadline: Deadline,
    /// A write began and has not ended: a put dropped in the middle of its
    /// write leaves the stream out of step.
    writing: bool,
}

impl std::fmt::Debug for AsyncNatsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncNatsConn")
            .field("session", &self.session)
            .field("counts", &self.counts)
            .finish()
    }
}

/// Why a connection could not be taken over.
#[derive(Debug)]
pub(crate) enum Adopt {
    /// It is encrypted: this driver has no TLS.
    Tls,
    /// Making the socket non-blocking, or registering it with tokio, failed.
    Io(std::io::Error),
}

impl AsyncNatsConn {
    /// Takes over a connected blocking connection: its socket (made
    /// non-blocking and registered with the current runtime) and its session.
    pub(crate) fn adopt(
        conn: NatsConnection,
        io_timeout: Duration,
    ) -> Result<AsyncNatsConn, Adopt> {
        let (sock, session) = conn.into_session().map_err(|_| Adopt::Tls)?;
        sock.set_nonblocking(true).map_err(Adopt::Io)?;
        let stream = TcpStream::from_std(sock).map_err(Adopt::Io)?;
        Ok(AsyncNatsConn {
            stream,
            session,
            counts: IoCounts::default(),
            io_timeout,
            deadline: Deadline::new(),
            writing: false,
        })
    }

    /// True once the connection is out of step; it must be replaced.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        self.session.is_broken() || self.writing
    }

    /// Marks the connection broken.
    pub(crate) fn mark_broken(&mut self) {
        self.session.mark_broken();
    }

    /// System calls that moved bytes (or failed) so far.
    pub(crate) fn io_counts(&self) -> IoCounts {
        self.counts
    }

    /// Server `PING`s answered so far.
    pub(crate) fn pings_answered(&self) -> u64 {
        self.session.pings_answered()
    }

    /// Publishes `body` to `subject` with dedup id `msg_id` (and `extra`
    /// headers) and waits for its PubAck: one write, then reads until the
    /// reply with this put's token, answering `PING`s on the way.
    #[inline]
    pub(crate) async fn publish(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<PubAck, NatsError> {
        if self.writing {
            self.session.mark_broken();
        }
        let whole = body.len() <= WHOLE_PUT;
        let put = if whole {
            self.session.start_put_whole(subject, msg_id, extra, body)?
        } else {
            self.session.start_put(subject, msg_id, extra, body.len())?
        };
        let token = put.token;
        self.writing = true;
        let r = if whole && put.queued.is_empty() {
            // The hot path: one contiguous write, almost always whole at once.
            match self.stream.try_write(put.head) {
                Ok(n) if n == put.head.len() => {
                    self.counts.writes += 1;
                    Ok(())
                }
                other => {
                    let sent = match other {
                        Ok(n) => {
                            self.counts.writes += 1;
                            n
                        }
                        // Not writable yet, or interrupted: the loop waits or retries.
                        Err(_) => 0,
                    };
                    let bufs = &mut [IoSlice::new(&put.head[sent..])];
                    write_rest(
                        &self.stream,
                        &mut self.counts,
                        &mut self.deadline,
                        self.io_timeout,
                        bufs,
                        sent,
                    )
                    .await
                }
            }
        } else {
            let (queued, head) = (IoSlice::new(put.queued), IoSlice::new(put.head));
            let (body, end) = if whole {
                (IoSlice::new(&[]), IoSlice::new(&[]))
            } else {
                (IoSlice::new(body), IoSlice::new(b"\r\n"))
            };
            write_all(
                &self.stream,
                &mut self.counts,
                &mut self.deadline,
                self.io_timeout,
                &mut [queued, head, body, end],
            )
            .await
        };
        self.sent(r)?;
        let m = self.wait_reply(token).await?;
        self.session.puback(m)
    }

    /// After a write: the queue is sent, or the connection is broken.
    fn sent(&mut self, r: Result<(), ConnectionError>) -> Result<(), NatsError> {
        self.writing = false;
        match r {
            Ok(()) => {
                self.session.queue_sent();
                Ok(())
            }
            Err(e) => {
                self.session.clear_queue();
                self.session.mark_broken();
                Err(NatsError::from(e))
            }
        }
    }

    /// Queues a publish for [`flush`](Self::flush); its PubAck is read by
    /// [`recv_puback`](Self::recv_puback), in the order of queueing.
    pub(crate) fn queue_publish(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<(), NatsError> {
        self.session.queue_publish(subject, msg_id, extra, body)
    }

    /// Sends everything queued with one write.
    pub(crate) async fn flush(&mut self) -> Result<(), NatsError> {
        if self.writing {
            self.session.mark_broken();
        }
        let Some(queued) = self.session.to_flush()? else {
            return Ok(());
        };
        self.writing = true;
        let r = write_all(
            &self.stream,
            &mut self.counts,
            &mut self.deadline,
            self.io_timeout,
            &mut [IoSlice::new(queued)],
        )
        .await;
        self.sent(r)
    }

    /// Reads the PubAck of the oldest queued publish (after [`flush`](Self::flush)).
    pub(crate) async fn recv_puback(&mut self) -> Result<PubAck, NatsError> {
        let token = self.session.next_puback()?;
        let m = self.wait_reply(token).await?;
        self.session.take_puback(m)
    }

    /// Reads until the reply to request `token`, against one deadline for
    /// the whole of it, answering `PING`s on the way.
    #[inline]
    async fn wait_reply(&mut self, token: u64) -> Result<MsgFrame, NatsError> {
        let wait = self.io_timeout;
        let mut started = None;
        loop {
            let r = self.session.poll_reply(token);
            if self.session.pongs_owed() > 0 {
                self.answer_pings().await?;
            }
            if let Some(m) = r? {
                return Ok(m);
            }
            let n = poll_fn(|cx| self.poll_read(cx, &mut started, wait)).await?;
            self.session.received(n);
        }
    }

    /// Answers the server's `PING`s read so far, one write of `PONG` each.
    async fn answer_pings(&mut self) -> Result<(), NatsError> {
        while let Some(pong) = self.session.pong() {
            let r = write_all(
                &self.stream,
                &mut self.counts,
                &mut self.deadline,
                self.io_timeout,
                &mut [IoSlice::new(pong)],
            )
            .await;
            if let Err(e) = r {
                self.session.mark_broken();
                return Err(NatsError::from(e));
            }
        }
        Ok(())
    }

    /// One read into the session's room, or the deadline.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        started: &mut Option<Instant>,
        wait: Duration,
    ) -> Poll<Result<usize, NatsError>> {
        let room = match self.session.recv_room() {
            Ok(room) => room,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match poll_read_into(
            &mut self.stream,
            room,
            &mut self.counts,
            &mut self.deadline,
            cx,
            (started, wait),
        ) {
            Poll::Ready(Ok(n)) => Poll::Ready(Ok(n)),
            Poll::Ready(Err(e)) => {
                self.session.mark_broken();
                Poll::Ready(Err(NatsError::from(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
