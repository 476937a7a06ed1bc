//! The blocking driver: one socket under a [`Session`], and a deadline on every
//! whole reply. The session holds the protocol state (send buffer, owed
//! replies, receive buffer); this driver writes what it encoded with one send
//! call and reads into the room it gives. Sending is in [`send`], receiving in
//! [`recv`]; this module opens the connection.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use socket2::Socket;

use crate::command::Command;
use crate::defaults;
use crate::error::ConnectionError;
use crate::reply::{Limits, Reply};
use crate::session::Session;

mod recv;
mod send;
pub mod sock;

pub use self::sock::IoCounts;
use self::sock::SockIo;

/// Settings of a connection. The defaults are the shared ones of
/// [`defaults`](crate::defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Limit on each connect attempt, per resolved address.
    pub connect_timeout: Duration,
    /// Limit on each whole reply (plus the server's wait for `reserve-with-timeout`),
    /// and on each write.
    pub io_timeout: Duration,
    /// Job and YAML size limits.
    pub limits: Limits,
    /// TCP keepalive idle time; `None` leaves keepalive off.
    pub keepalive: Option<Duration>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            connect_timeout: defaults::CONNECT_TIMEOUT,
            io_timeout: defaults::IO_TIMEOUT,
            limits: Limits::default(),
            keepalive: defaults::KEEPALIVE,
        }
    }
}

/// A blocking connection to a beanstalkd-protocol server.
///
/// Each request goes out in one write; each reply is read against a deadline for
/// the whole reply. After a timeout, an I/O error or a reply it cannot decode the
/// connection is broken for good and refuses further requests with [`ConnectionError::Broken`].
pub struct Connection {
    io: SockIo,
    peer: SocketAddr,
    cfg: ConnectionConfig,
    session: Session,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("session", &self.session)
            .finish()
    }
}

impl Connection {
    /// Connects to the first address of `addr` that accepts within the connect timeout.
    pub fn connect(
        addr: impl ToSocketAddrs,
        cfg: ConnectionConfig,
    ) -> Result<Connection, ConnectionError> {
        let mut last = None;
        for a in addr.to_socket_addrs().map_err(ConnectionError::NotSent)? {
            match Connection::connect_addr(a, cfg) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            ConnectionError::NotSent(io::Error::new(
                io::ErrorKind::InvalidInput,
                "address resolved to nothing",
            ))
        }))
    }

    /// Connects to one address.
    pub fn connect_addr(
        addr: SocketAddr,
        cfg: ConnectionConfig,
    ) -> Result<Connection, ConnectionError> {
        let io = SockIo::open(addr, cfg.connect_timeout, cfg.io_timeout, cfg.keepalive)
            .map_err(ConnectionError::NotSent)?;
        let mut session = Session::new(cfg.limits);
        session.set_io_timeout(cfg.io_timeout);
        Ok(Connection {
            io,
            peer: addr,
            cfg,
            session,
        })
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The settings this connection was opened with.
    pub fn config(&self) -> &ConnectionConfig {
        &self.cfg
    }

    /// True once the connection is out of step; it must be replaced.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.session.is_broken()
    }

    /// Marks the connection broken, for a caller that got a reply it cannot
    /// accept (the stream is then out of step) or gave up on it.
    pub fn mark_broken(&mut self) {
        self.session.mark_broken();
    }

    /// Takes a reserved job larger than `max_job_size` as
    /// [`Reply::ReservedTooBig`], its body read and dropped, instead of
    /// breaking the connection (see [`Session::skip_large_jobs`]).
    pub fn skip_large_jobs(&mut self) {
        self.session.skip_large_jobs();
    }

    /// Replies owed: requests sent or queued whose replies were not yet read.
    pub fn owed(&self) -> usize {
        self.session.owed()
    }

    /// The kind of the command whose reply [`recv`](Self::recv) reads next.
    pub fn next_owed(&self) -> Option<crate::CommandKind> {
        self.session.next_owed()
    }

    /// A handle that can cut this connection from another thread, for example to
    /// end a blocking `reserve` at shutdown. The blocked read then fails with
    /// [`ConnectionError::Closed`] and the server returns any job the connection held.
    pub fn interrupter(&self) -> io::Result<Interrupter> {
        Interrupter::new(&self.io.sock)
    }

    /// System calls made so far.
    pub fn io_counts(&self) -> IoCounts {
        self.io.counts
    }

    /// Sends a request and reads its reply.
    pub fn request(&mut self, cmd: &Command<'_>) -> Result<Reply<'_>, ConnectionError> {
        self.send(cmd)?;
        self.recv()
    }

    /// Sends `quit` and closes.
    pub fn quit(mut self) {
        if !self.is_broken() {
            let _ = self.send(&Command::Quit);
        }
    }
}

/// Cuts a [`Connection`] from another thread (see [`Connection::interrupter`]).
#[derive(Debug)]
pub struct Interrupter(Socket);

impl Interrupter {
    /// A handle on a clone of `sock`.
    pub fn new(sock: &Socket) -> io::Result<Interrupter> {
        Ok(Interrupter(sock.try_clone()?))
    }

    /// Shuts the socket down in both directions; errors (already closed) are ignored.
    pub fn interrupt(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}
