//! The raw side of the JetStream benches: a bare `TcpStream` (or a rustls
//! stream over one) speaking just enough NATS to publish, pull and ack,
//! reading whole operations in place (nothing allocated per operation) and
//! answering the server's PINGs.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A rustls client stream over TCP.
pub type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A number from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of the values.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A NATS connection on a bare socket (or TLS over it), subscribed to `_INBOX.raw.*`.
pub struct Raw<S: Read + Write = TcpStream> {
    pub s: S,
    buf: Vec<u8>,
    len: usize,
}

fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

impl Raw<TcpStream> {
    pub fn connect(addr: SocketAddr) -> Raw {
        let mut r = Raw::over(tcp(addr));
        r.op(|_, _| ()); // INFO
        r.hello();
        r
    }
}

impl Raw<TlsStream> {
    /// Reads `INFO` in clear text, then runs the TLS handshake (trusting the
    /// CA in `ca`, checking the name `127.0.0.1`), and says hello encrypted.
    pub fn connect_tls(addr: SocketAddr, ca: &Path) -> Raw<TlsStream> {
        let mut plain = Raw::over(tcp(addr));
        plain.op(|_, _| ()); // INFO, in clear text
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
        let mut r = Raw::over(rustls::StreamOwned::new(conn, plain.s));
        r.hello();
        r
    }
}

impl<S: Read + Write> Raw<S> {
    fn over(s: S) -> Raw<S> {
        Raw {
            s,
            buf: vec![0; 1 << 16],
            len: 0,
        }
    }

    /// CONNECT, the inbox SUB and a PING, in one write; waits for the PONG.
    fn hello(&mut self) {
        let r = self;
        r.s.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.raw.* 1\r\nPING\r\n",
        )
        .unwrap();
        while !r.op(|line, _| line == b"PONG") {}
    }

    fn fill(&mut self) {
        let n = self.s.read(&mut self.buf[self.len..]).expect("read");
        assert!(n > 0, "server closed");
        self.len += n;
    }

    /// Reads the next operation other than PING (which it answers) and hands
    /// `f` its control line (without CRLF) and its payload (empty for none).
    pub fn op<R>(&mut self, f: impl FnOnce(&[u8], &[u8]) -> R) -> R {
        loop {
            let Some(i) = self.buf[..self.len].windows(2).position(|w| w == b"\r\n") else {
                self.fill();
                continue;
            };
            let line = &self.buf[..i];
            if line == b"PING" {
                self.s.write_all(b"PONG\r\n").unwrap();
                self.buf.copy_within(i + 2..self.len, 0);
                self.len -= i + 2;
                continue;
            }
            let mut end = i + 2;
            if line.starts_with(b"MSG ") || line.starts_with(b"HMSG ") {
                let n: usize = std::str::from_utf8(line.rsplit(|&b| b == b' ').next().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                while self.len < end + n + 2 {
                    self.fill();
                }
                end += n + 2;
            }
            let r = f(&self.buf[..i], &self.buf[i + 2..end.max(i + 4) - 2]);
            self.buf.copy_within(end..self.len, 0);
            self.len -= end;
            return r;
        }
    }
}
