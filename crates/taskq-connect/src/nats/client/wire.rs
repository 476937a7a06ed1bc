//! [`Wire`]: the NATS driver's byte stream, plain TCP (the shared
//! [`SockIo`]) or TLS over it. Plain TCP costs one branch per call.

use std::io::IoSlice;
use std::time::{Duration, Instant};

use taskq_proto::IoCounts;
use taskq_proto::SockIo;

use super::NatsError;

#[cfg(feature = "secure")]
pub use super::tls::TlsSession;

/// A TLS session (there is none without feature `secure`).
#[cfg(not(feature = "secure"))]
#[derive(Debug)]
pub enum TlsSession {}

/// The socket and, once started, its TLS session.
pub(crate) struct Wire {
    pub(crate) sock: SockIo,
    #[cfg(feature = "secure")]
    tls: Option<Box<TlsSession>>,
}

impl Wire {
    /// A plain connection over `sock`.
    pub(crate) fn plain(sock: SockIo) -> Wire {
        Wire {
            sock,
            #[cfg(feature = "secure")]
            tls: None,
        }
    }

    /// True once TLS is on.
    pub(crate) fn is_tls(&self) -> bool {
        #[cfg(feature = "secure")]
        return self.tls.is_some();
        #[cfg(not(feature = "secure"))]
        false
    }

    /// Runs the TLS handshake (within `wait` of `started`); from then on
    /// every byte is encrypted.
    #[cfg(feature = "secure")]
    pub(crate) fn start_tls(
        &mut self,
        mut tls: Box<TlsSession>,
        started: Instant,
        wait: Duration,
    ) -> Result<(), NatsError> {
        tls.handshake(&mut self.sock, started, wait)?;
        self.tls = Some(tls);
        Ok(())
    }

    /// The socket and, once started, the TLS session, for another driver.
    pub(crate) fn into_parts(self) -> (socket2::Socket, Option<Box<TlsSession>>) {
        #[cfg(feature = "secure")]
        return (self.sock.sock, self.tls);
        #[cfg(not(feature = "secure"))]
        (self.sock.sock, None)
    }

    /// System calls made so far.
    pub(crate) fn counts(&self) -> IoCounts {
        self.sock.counts
    }

    /// Writes every byte of `bufs` with one send call (more only on a partial write).
    #[inline]
    pub(crate) fn write_all(&mut self, bufs: &mut [IoSlice<'_>]) -> Result<(), NatsError> {
        #[cfg(feature = "secure")]
        if let Some(t) = self.tls.as_mut() {
            return t.write_all(&mut self.sock, bufs);
        }
        self.sock.write_all(bufs).map_err(NatsError::from)
    }

    /// Sends `bytes` with one send call.
    #[inline]
    pub(crate) fn send(&mut self, bytes: &[u8]) -> Result<(), NatsError> {
        #[cfg(feature = "secure")]
        if let Some(t) = self.tls.as_mut() {
            return t.write_all(&mut self.sock, &[IoSlice::new(bytes)]);
        }
        self.sock.send(bytes).map_err(NatsError::from)
    }

    /// Reads into `room` until bytes arrive or the deadline passes (see
    /// [`SockIo::fill`]).
    #[inline]
    pub(crate) fn fill(
        &mut self,
        room: &mut [u8],
        started: Instant,
        wait: Duration,
        first: &mut bool,
    ) -> Result<usize, NatsError> {
        #[cfg(feature = "secure")]
        if let Some(t) = self.tls.as_mut() {
            return t.fill(&mut self.sock, room, started, wait, first);
        }
        self.sock
            .fill(room, started, wait, first)
            .map_err(NatsError::from)
    }
}
