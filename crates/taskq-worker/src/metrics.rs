//! The counters in the Prometheus (OpenMetrics) text format, over HTTP.
//!
//! The format comes from the `prometheus-client` crate; the HTTP side is a tiny
//! responder, enough for a scraper: a `GET` of `/metrics` (or `/`) is
//! answered with the current counters, any other path with 404, and the
//! connection closed, each connection on a thread of its
//! own with a deadline for its request.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

use crate::counters::COUNTER_HELP;
use crate::Control;

/// Largest request head read from a scraper.
const MAX_REQUEST: usize = 8 * 1024;

#[derive(Debug)]
struct WorkerCollector {
    control: Control,
}

impl Collector for WorkerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snap = self.control.counters();
        for ((name, value), (_, help)) in snap.pairs().iter().zip(COUNTER_HELP.iter()) {
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            let counter = ConstCounter::new(*value);
            let metric = encoder.encode_descriptor(name, &help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

/// The text a scrape returns now: every counter as `taskq_worker_<name>_total`.
pub fn render(control: &Control) -> String {
    let mut registry = Registry::with_prefix("taskq_worker");
    registry.register_collector(Box::new(WorkerCollector {
        control: control.clone(),
    }));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// An HTTP endpoint serving a worker's counters; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` and serves the counters of `control`'s worker.
    pub fn start(addr: &str, control: Control) -> io::Result<MetricsServer> {
        MetricsServer::serve(addr, move || render(&control))
    }

    /// Listens on `addr` and answers each scrape with what `render` returns
    /// then. Each connection is answered on a thread of its own (up to
    /// [`MAX_CLIENTS`] at once; past that a connection is closed at once),
    /// and has [`REQUEST_TIME`] in all to send its request: a client that
    /// sends slowly, or not at all, holds up no other scrape.
    pub fn serve(
        addr: &str,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(render);
        let clients = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("taskq-worker-metrics".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    match stream {
                        Ok(s) => {
                            if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                                clients.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            let (render, done) = (render.clone(), clients.clone());
                            let spawned = std::thread::Builder::new()
                                .name("taskq-metrics-client".into())
                                .spawn(move || {
                                    if let Err(e) = answer(s, &*render) {
                                        tracing::debug!(error = %e, "metrics request failed");
                                    }
                                    done.fetch_sub(1, Ordering::SeqCst);
                                });
                            if let Err(e) = spawned {
                                // Its place is free again: no thread holds it.
                                clients.fetch_sub(1, Ordering::SeqCst);
                                tracing::debug!(error = %e, "metrics: no thread for a client");
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "metrics accept failed");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connections answered at once.
pub const MAX_CLIENTS: usize = 16;

/// The time a client has to send its whole request head.
pub const REQUEST_TIME: Duration = Duration::from_secs(2);

/// The time a client has to take its whole answer, as Prometheus' own
/// scrape timeout: a client that reads slowly is cut off then, so it holds
/// its thread (one of [`MAX_CLIENTS`]) no longer.
pub const RESPONSE_TIME: Duration = Duration::from_secs(10);

/// Reads a request head (bounded in size, and in time as a whole) and
/// answers it (in time as a whole too).
fn answer(mut s: TcpStream, render: &dyn Fn() -> String) -> io::Result<()> {
    let until = Instant::now() + REQUEST_TIME;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
        if head.len() > MAX_REQUEST {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            );
        }
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    if method != b"GET" && method != b"HEAD" {
        return respond(&mut s, "405 Method Not Allowed", "text/plain", "");
    }
    if path != b"/metrics" && path != b"/" {
        return respond(&mut s, "404 Not Found", "text/plain", "try /metrics\n");
    }
    let body = render();
    let body = if method == b"HEAD" { "" } else { body.as_str() };
    respond(
        &mut s,
        "200 OK",
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body,
    )
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> io::Result<()> {
    let until = Instant::now() + RESPONSE_TIME;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let r = write_by(s, head.as_bytes(), until).and_then(|()| write_by(s, body.as_bytes(), until));
    if r.is_err() {
        // Reset rather than close: what the client has not taken yet is
        // dropped, not sent on after the cut.
        let _ = socket2::SockRef::from(&*s).set_linger(Some(Duration::ZERO));
    }
    r
}

/// Writes all of `bytes` by `until`: each write waits only what is left,
/// so a client taking a little at a time cannot stretch it.
fn write_by(s: &mut TcpStream, mut bytes: &[u8], until: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        match s.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
