//! The socket under one machine: a tokio `TcpStream` and the protocol
//! session, opened and written with taskq-connect's tokio I/O (one write
//! per flush, against the I/O timeout). Reads go straight into the
//! session's room and carry no deadline here: the machine owns the reply
//! deadline, and the driver wakes at it.
//!
//! Not `taskq_connect::tokio::AsyncConn`: the worker needs the session
//! itself (the kind of each owed reply, `WATCHING` replies of tube
//! switches, jobs over the limit skipped unread) and a read that can be
//! polled beside the slots' messages, with the deadline left to the machine.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use taskq_connect::tokio::{open_stream, write_all, Deadline};
use taskq_connect::Address;
use taskq_proto::{ConnectionConfig, ConnectionError, IoCounts, Session};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Config;
use crate::counters::Counters;

/// One connection to one beanstalkd.
pub(super) struct Conn {
    stream: TcpStream,
    pub(super) session: Session,
    counts: IoCounts,
    deadline: Deadline,
    cfg: ConnectionConfig,
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
        // A job over the limit is held by id and buried, its body unread.
        session.skip_large_jobs();
        Ok(Conn {
            stream,
            session,
            counts: IoCounts::default(),
            deadline: Deadline::new(),
            cfg: pcfg,
        })
    }

    /// Writes what the session queued, in one write call when the socket
    /// takes it all (waiting for room against the I/O timeout otherwise).
    pub(super) async fn flush(&mut self, counters: &Counters) -> Result<(), ConnectionError> {
        let Some(queued) = self.session.to_flush()? else {
            return Ok(());
        };
        let before = self.counts.writes;
        let r = write_all(
            &self.stream,
            &mut self.counts,
            &mut self.deadline,
            self.cfg.io_timeout,
            &mut [IoSlice::new(queued)],
        )
        .await;
        self.session.queue_sent();
        counters.writes.fetch_add(
            self.counts.writes - before,
            std::sync::atomic::Ordering::Relaxed,
        );
        if r.is_err() {
            self.session.mark_broken();
        }
        r
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
