//! The monitoring port's answers (`/healthz`, `/varz`, `/jsz`), read with a
//! bare HTTP/1.0 GET.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// A GET on the monitoring port, parsed as JSON. Bounded by one second.
pub(super) fn http_json(addr: SocketAddr, path: &str) -> io::Result<Value> {
    let limit = Duration::from_secs(1);
    let mut s = TcpStream::connect_timeout(&addr, limit)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(16 << 20).read_to_end(&mut raw)?;
    let start = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| io::Error::other("no end of HTTP headers"))?;
    // /healthz answers 503 with a JSON body while JetStream is not current.
    serde_json::from_slice(&raw[start + 4..]).map_err(io::Error::other)
}
