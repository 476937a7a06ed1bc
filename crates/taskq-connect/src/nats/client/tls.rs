//! TLS under the NATS driver, with rustls: the client configuration built
//! from [`TlsSettings`] (the CA file or the system's roots, a client
//! certificate for mutual TLS), the handshake held to a deadline, and
//! encrypted reads and writes over the shared socket layer.
//!
//! Each flush of plaintext becomes TLS records written with one send call;
//! what one write carries (a put, a batch of 64) is one record when it fits
//! in 16 KiB. rustls allocates per record, so a TLS put is not allocation
//! free as a plain TCP one is.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, ClientConfig, ClientConnection, RootCertStore};

use crate::nats::access::TlsSettings;
use taskq_proto::ConnectionError;
use taskq_proto::SockIo;

use super::NatsError;
use super::{TlsError, TlsFailure};

/// Ciphertext read from the socket in one go: the largest TLS record.
const CIPHER_BUF: usize = 18 * 1024;

/// What a TLS handshake needs next ([`TlsSession::handshake_step`]).
#[derive(Debug)]
pub enum TlsStep<'a> {
    /// Send these records with one write.
    Send(&'a [u8]),
    /// Read ciphertext into [`TlsSession::cipher_room`] and say how much
    /// with [`TlsSession::cipher_read`].
    Read,
    /// The handshake is over.
    Done,
}

/// A TLS session with no socket: rustls's client connection with the
/// ciphertext read and not yet opened, and the records sealed for the next
/// write. The blocking driver runs the handshake and its reads and writes
/// over it; another driver (the async producer's) takes it over with the
/// socket ([`NatsConnection::into_parts`](super::NatsConnection::into_parts)).
pub struct TlsSession {
    conn: ClientConnection,
    /// Ciphertext read but not yet handed to rustls: `inbuf[start..end]`.
    inbuf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Records to send, reused from one write to the next.
    out: Vec<u8>,
    /// The plaintext of a write given in several slices, gathered so that it
    /// becomes one record (per 16 KiB), not one per slice; reused.
    plain: Vec<u8>,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession")
            .field("buffered", &(self.end - self.start))
            .finish_non_exhaustive()
    }
}

/// The rustls client configuration for `settings`.
pub(crate) fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, NatsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| other(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    match &settings.ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| file_error(path, "CA certificates", &e.to_string()))?;
            for cert in certs {
                let cert = cert.map_err(|e| file_error(path, "CA certificates", &e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| file_error(path, "CA certificates", &e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(file_error(path, "CA certificates", "no certificate in it"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let builder = builder.with_root_certificates(roots);
    let config = match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error(cert, "client certificate", &e.to_string()))?;
            if chain.is_empty() {
                return Err(file_error(
                    cert,
                    "client certificate",
                    "no certificate in it",
                ));
            }
            // The key's own error could quote the file; say only what failed.
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|_| file_error(key, "client key", "no PEM private key in it"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| NatsError::Credentials(format!("client certificate and key: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(NatsError::Credentials(
                "a client certificate needs both --tls-cert and --tls-key".into(),
            ))
        }
    };
    Ok(Arc::new(config))
}

fn file_error(path: &std::path::Path, what: &str, why: &str) -> NatsError {
    NatsError::Credentials(format!("{what} file {}: {why}", path.display()))
}

fn other(detail: String) -> NatsError {
    NatsError::Tls(TlsError {
        failure: TlsFailure::Other,
        detail,
    })
}

/// Sorts a rustls error into what a user can act on.
pub(crate) fn tls_error(e: &rustls::Error) -> NatsError {
    let failure = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                TlsFailure::UnknownIssuer
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::NameMismatch
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsFailure::Expired,
            _ => TlsFailure::Other,
        },
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown,
        ) => TlsFailure::ClientCertificate,
        _ => TlsFailure::Other,
    };
    NatsError::Tls(TlsError {
        failure,
        detail: e.to_string(),
    })
}

impl TlsSession {
    /// Starts a session with the server named `host` (a DNS name or an IP address).
    pub(crate) fn new(config: Arc<ClientConfig>, host: &str) -> Result<TlsSession, NatsError> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| other(format!("{host:?} is not a name a certificate can hold")))?;
        let mut conn = ClientConnection::new(config, name).map_err(|e| tls_error(&e))?;
        // Every write's records are sent before the call returns, so nothing
        // piles up; rustls's default 64 KiB limit would refuse a larger put.
        conn.set_buffer_limit(None);
        Ok(TlsSession {
            conn,
            inbuf: vec![0; CIPHER_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            out: Vec::with_capacity(CIPHER_BUF),
            plain: Vec::new(),
        })
    }

    /// Encrypts `parts`, in order, into records for one write.
    pub fn seal(&mut self, parts: &[&[u8]]) -> io::Result<&[u8]> {
        let mut w = self.conn.writer();
        for p in parts {
            w.write_all(p)?;
        }
        self.records()
    }

    /// The records rustls wants sent: sealed plaintext, the handshake's, or
    /// an answer to a key update.
    pub fn records(&mut self) -> io::Result<&[u8]> {
        self.out.clear();
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.out)?;
        }
        Ok(&self.out)
    }

    /// True when rustls has records to send.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Plaintext into `room`, opening the ciphertext read earlier as needed;
    /// `None` when more ciphertext must be read first (into
    /// [`cipher_room`](Self::cipher_room)). A record that does not open is
    /// [`NatsError::Tls`]; the server's close is [`NatsError::Closed`].
    pub fn open(&mut self, room: &mut [u8]) -> Result<Option<usize>, NatsError> {
        loop {
            match self.conn.reader().read(room) {
                Ok(0) => return Err(NatsError::Closed),
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(NatsError::Closed)
                }
                Err(e) => return Err(NatsError::Io(e)),
            }
            if !self.feed()? {
                return Ok(None);
            }
        }
    }

    /// Hands the ciphertext read earlier to rustls; false when there is none.
    fn feed(&mut self) -> Result<bool, NatsError> {
        if self.start == self.end {
            return Ok(false);
        }
        let mut pending = &self.inbuf[self.start..self.end];
        let n = self.conn.read_tls(&mut pending).map_err(NatsError::Io)?;
        self.start += n;
        self.conn.process_new_packets().map_err(|e| tls_error(&e))?;
        Ok(true)
    }

    /// Room to read ciphertext into, once all read before was handed over.
    pub fn cipher_room(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.start, self.end);
        self.start = 0;
        self.end = 0;
        &mut self.inbuf
    }

    /// Says that `n` bytes of ciphertext were read into the cipher room.
    pub fn cipher_read(&mut self, n: usize) {
        self.end = n.min(self.inbuf.len());
    }

    /// The TLS handshake's next step, with no socket: records to send,
    /// ciphertext to read (into [`cipher_room`](Self::cipher_room)), or the
    /// end. Both drivers run the handshake by this rule; the client's
    /// Finished (and any ticket request) is sent before the end.
    pub fn handshake_step(&mut self) -> Result<TlsStep<'_>, NatsError> {
        loop {
            if self.conn.wants_write() {
                return Ok(TlsStep::Send(self.records().map_err(NatsError::NotSent)?));
            }
            if !self.conn.is_handshaking() {
                return Ok(TlsStep::Done);
            }
            if !self.feed()? {
                return Ok(TlsStep::Read);
            }
        }
    }

    /// Runs the handshake over `sock` to its end within `wait` of `started`.
    pub(crate) fn handshake(
        &mut self,
        sock: &mut SockIo,
        started: Instant,
        wait: Duration,
    ) -> Result<(), NatsError> {
        let mut first = false;
        loop {
            match self.handshake_step()? {
                TlsStep::Send(records) => sock.send(records).map_err(NatsError::from)?,
                TlsStep::Read => self.read_cipher(sock, started, wait, &mut first)?,
                TlsStep::Done => return Ok(()),
            }
        }
    }

    /// Encrypts `bufs` as one plaintext (a put's head, body and end make
    /// one record, not three) and sends the records with one send call.
    pub(crate) fn write_all(
        &mut self,
        sock: &mut SockIo,
        bufs: &[io::IoSlice<'_>],
    ) -> Result<(), NatsError> {
        let plain: &[u8] = match bufs {
            [one] => one,
            _ => {
                self.plain.clear();
                for b in bufs {
                    self.plain.extend_from_slice(b);
                }
                &self.plain
            }
        };
        self.conn
            .writer()
            .write_all(plain)
            .map_err(NatsError::NotSent)?;
        self.send_records(sock)
    }

    fn send_records(&mut self, sock: &mut SockIo) -> Result<(), NatsError> {
        let records = self.records().map_err(NatsError::NotSent)?;
        sock.send(records).map_err(NatsError::from)
    }

    /// Reads plaintext into `room` over `sock`, reading and opening records
    /// until some arrives or the deadline passes.
    pub(crate) fn fill(
        &mut self,
        sock: &mut SockIo,
        room: &mut [u8],
        started: Instant,
        wait: Duration,
        first: &mut bool,
    ) -> Result<usize, NatsError> {
        loop {
            if let Some(n) = self.open(room)? {
                return Ok(n);
            }
            self.read_cipher(sock, started, wait, first)?;
            self.feed()?;
            // A key update or an alert may want an answer.
            if self.conn.wants_write() {
                self.send_records(sock)?;
            }
        }
    }

    /// Reads ciphertext from `sock` before the deadline.
    fn read_cipher(
        &mut self,
        sock: &mut SockIo,
        started: Instant,
        wait: Duration,
        first: &mut bool,
    ) -> Result<(), NatsError> {
        let n = sock
            .fill(self.cipher_room(), started, wait, first)
            .map_err(|e| match e {
                ConnectionError::Closed => NatsError::Closed,
                e => NatsError::from(e),
            })?;
        self.cipher_read(n);
        Ok(())
    }
}
