//! The socket under one machine: a tokio `TcpStream` (opened with
//! taskq-connect's `open_stream`) and the protocol session. What the
//! session queued goes out in one write when the socket takes it; reads go
//! straight into the session's room. Neither carries a deadline here: the
//! session keeps the reply deadline, and the driver wakes at it.
//!
//! Not `taskq_connect::tokio::AsyncConn`: the worker needs the session
//! itself (the kind of each owed reply, `WATCHING` replies of tube
//! switches, jobs over the limit skipped unread), and reads and writes it
//! can poll together and beside the slots' messages, with the deadline
//! left to the driver's loop.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use taskq_connect::tokio::open_stream;
use taskq_connect::Address;
use taskq_proto::{ConnectionConfig, ConnectionError, Session};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Config;
use crate::counters::Counters;

/// One connection to one beanstalkd.
pub(super) struct Conn {
    stream: TcpStream,
    pub(super) session: Session,
    /// Bytes of the session's queue already written.
    sent: usize,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("session", &self.session)
            .finish()
    }
}

impl Conn {
    /// Connects to `server` (as configured) within the connect timeout.
    pub(super) async fn open(cfg: &Config, server: &str) -> Result<Conn, ConnectionError> {
        let pcfg = ConnectionConfig {
            connect_timeout: cfg.connect_timeout,
            io_timeout: cfg.io_timeout,
            limits: cfg.limits,
            ..ConnectionConfig::default()
        };
        let host = Address::parse(server)
            .ok()
            .and_then(|a| a.hosts().first().cloned())
            .unwrap_or_else(|| server.to_owned());
        let resolve = tokio::net::lookup_host(host.as_str());
        let addrs = match tokio::time::timeout(cfg.connect_timeout, resolve).await {
            Ok(r) => r.map_err(ConnectionError::NotSent)?,
            Err(_) => {
                return Err(ConnectionError::Timeout {
                    waited: cfg.connect_timeout,
                })
            }
        };
        let mut last = None;
        let mut stream = None;
        for addr in addrs {
            match open_stream(addr, cfg.connect_timeout, pcfg.keepalive).await {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = stream.ok_or_else(|| {
            ConnectionError::NotSent(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing")
            }))
        })?;
        let mut session = Session::new(cfg.limits);
        // The reply deadline is the session's, at the worker's I/O timeout.
        session.set_io_timeout(cfg.io_timeout);
        // A job over the limit is held by id and buried, its body unread.
        session.skip_large_jobs();
        Ok(Conn {
            stream,
            session,
            sent: 0,
        })
    }

    /// The server's address this connection reached.
    pub(super) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.stream.peer_addr().ok()
    }

    /// Writes what the session queued: in one write call when the socket
    /// takes it all, else as room comes (`Pending` until then; the
    /// driver reads meanwhile, so that a server blocked writing replies
    /// we do not read can never block our write). No deadline of its own:
    /// requests that do not leave hold up the replies the machine waits
    /// for, and its reply deadline breaks the connection.
    pub(super) fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        counters: &Counters,
    ) -> Poll<Result<(), ConnectionError>> {
        loop {
            let queued = match self.session.to_flush() {
                Ok(Some(q)) => q,
                Ok(None) => {
                    self.sent = 0;
                    return Poll::Ready(Ok(()));
                }
                Err(e) => return Poll::Ready(Err(e)),
            };
            if self.sent >= queued.len() {
                self.session.queue_sent();
                self.sent = 0;
                return Poll::Ready(Ok(()));
            }
            let err = match self.stream.try_write(&queued[self.sent..]) {
                Ok(0) => io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"),
                Ok(n) => {
                    Counters::add(&counters.writes);
                    self.sent += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match self.stream.poll_write_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => e,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => e,
            };
            Counters::add(&counters.writes);
            self.session.mark_broken();
            return Poll::Ready(Err(if self.sent == 0 {
                ConnectionError::NotSent(err)
            } else {
                ConnectionError::Io(err)
            }));
        }
    }

    /// One read into the session's room; the session takes what came. A
    /// read of nothing is the peer's close.
    pub(super) fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        counters: &Counters,
    ) -> Poll<Result<usize, ConnectionError>> {
        let room = match self.session.recv_room() {
            Ok(room) => room,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let mut buf = ReadBuf::new(room);
        let r = match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(())) => match buf.filled().len() {
                0 => Err(ConnectionError::Closed),
                n => Ok(n),
            },
            Poll::Ready(Err(e)) => Err(ConnectionError::Io(e)),
        };
        Counters::add(&counters.reads);
        match r {
            Ok(n) => {
                self.session.received(n);
                Poll::Ready(Ok(n))
            }
            Err(e) => {
                self.session.mark_broken();
                Poll::Ready(Err(e))
            }
        }
    }
}
