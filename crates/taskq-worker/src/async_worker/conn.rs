//! The socket under one machine: a tokio `TcpStream` and the protocol
//! session, with one write per flush and reads into the session's room.
//! It keeps no deadline of its own: the machine owns the reply deadline,
//! and the driver wakes at it (writes alone wait against the I/O timeout).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use taskq_proto::{Address, ConnectionError, Session};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Config;
use crate::counters::Counters;

/// One connection to one beanstalkd.
#[derive(Debug)]
pub(super) struct Conn {
    stream: TcpStream,
    pub(super) session: Session,
}

impl Conn {
    /// Connects to `server` (as configured) within the connect timeout.
    pub(super) async fn open(cfg: &Config, server: &str) -> Result<Conn, ConnectionError> {
        let not_sent = ConnectionError::NotSent;
        let host = Address::parse(server)
            .ok()
            .and_then(|a| a.hosts().first().cloned())
            .unwrap_or_else(|| server.to_owned());
        let attempt = async {
            let mut last = None;
            for addr in tokio::net::lookup_host(host.as_str()).await? {
                match TcpStream::connect(addr).await {
                    Ok(s) => return Ok(s),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "address resolved to nothing")
            }))
        };
        let stream = match tokio::time::timeout(cfg.connect_timeout, attempt).await {
            Ok(r) => r.map_err(not_sent)?,
            Err(_) => {
                return Err(ConnectionError::Timeout {
                    waited: cfg.connect_timeout,
                })
            }
        };
        // Each write is a whole pipeline of requests.
        stream.set_nodelay(true).map_err(not_sent)?;
        let mut session = Session::new(cfg.limits);
        // A job over the limit is held by id and buried, its body unread.
        session.skip_large_jobs();
        Ok(Conn { stream, session })
    }

    /// Writes what the session queued, in one write call when the socket
    /// takes it all; waits for room against `timeout` otherwise.
    pub(super) async fn flush(
        &mut self,
        counters: &Counters,
        timeout: Duration,
    ) -> Result<(), ConnectionError> {
        let mut sent = 0;
        loop {
            let Some(queued) = self.session.to_flush()? else {
                return Ok(());
            };
            if sent == queued.len() {
                self.session.queue_sent();
                return Ok(());
            }
            let err = match self.stream.try_write(&queued[sent..]) {
                Ok(0) => io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"),
                Ok(n) => {
                    Counters::add(&counters.writes);
                    sent += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match tokio::time::timeout(timeout, self.stream.writable()).await {
                        Ok(Ok(())) => continue,
                        Ok(Err(e)) => e,
                        Err(_) => io::Error::new(io::ErrorKind::TimedOut, "write timed out"),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => e,
            };
            self.session.mark_broken();
            return Err(if sent == 0 {
                ConnectionError::NotSent(err)
            } else {
                ConnectionError::Io(err)
            });
        }
    }

    /// One read into the session's room. `Ok(n)`: `n` bytes came (the
    /// session took them); a read of nothing is the peer's close.
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
