//! JetStream put latency on tokio against a local single-node nats-server,
//! side by side in one run: the async producer, a raw tokio loop, and
//! `async-nats` (what Rust users pick today), each publishing 64-byte jobs
//! with a unique `Nats-Msg-Id` and waiting for the stream's PubAck, one at a
//! time, on a current-thread runtime.
//!
//! `cargo bench --bench nats_async_put` (env `TASKQ_BENCH_ROUNDS`, default
//! 3). Each round runs criterion's samples of every side in turn, rotating
//! who goes first; at the end the ratios of their rates (`async_producer /
//! raw_tokio`, `async_producer / async_nats`) are printed as medians over
//! rounds. The targets: at least 0.95 of the raw loop, at least 1.0 of
//! async-nats.
//!
//! The raw loop is the floor of what a client can cost: pre-built `HPUB`
//! bytes with the message id's digits rewritten in place, one `write_all`
//! per put, and a read to the end of the PubAck (answering the server's PING
//! on the way).
#![allow(missing_docs)] // criterion_group! defines an undocumented public function.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use taskq_connect::nats::{NatsConfig, NatsConnection};
use taskq_producer::{AsyncProducer, Producer, PutOptions};
use taskq_testkit::NatsCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// The blocking raw client is not used here: only the helpers.
#[path = "common/nats_raw.rs"]
mod nats_raw;
use nats_raw::{env_usize, median};

const SUBJECT: &str = "taskq.bench";
const SIZE: usize = 64;

/// The raw side: a bare tokio `TcpStream` speaking just enough NATS to
/// publish and read PubAcks, with one put's bytes built once.
struct RawTokio {
    s: TcpStream,
    buf: Vec<u8>,
    len: usize,
    put: Vec<u8>,
    /// Where the message id's 20 digits are in `put`.
    digits: usize,
    next_id: u64,
}

impl RawTokio {
    async fn connect(addr: SocketAddr) -> RawTokio {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let hdr = format!("NATS/1.0\r\nNats-Msg-Id: raw-{:020}\r\n\r\n", 0);
        let mut put = format!(
            "HPUB {SUBJECT} _INBOX.raw.1 {} {}\r\n",
            hdr.len(),
            hdr.len() + SIZE
        )
        .into_bytes();
        let digits = put.len() + hdr.find("raw-").unwrap() + 4;
        put.extend_from_slice(hdr.as_bytes());
        put.extend_from_slice(&[b'x'; SIZE]);
        put.extend_from_slice(b"\r\n");
        let mut r = RawTokio {
            s,
            buf: vec![0; 1 << 16],
            len: 0,
            put,
            digits,
            next_id: u64::from(std::process::id()) << 32,
        };
        r.op().await; // INFO
        r.s.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.raw.* 1\r\nPING\r\n",
        )
        .await
        .unwrap();
        while !r.op().await.starts_with(b"PONG") {}
        r
    }

    /// One put: the id stamped in place, one write, a read to its PubAck.
    async fn put(&mut self) {
        let mut n = self.next_id;
        self.next_id += 1;
        for i in (0..20).rev() {
            self.put[self.digits + i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        self.s.write_all(&self.put).await.unwrap();
        let line = self.op().await;
        assert!(
            line.starts_with(b"MSG "),
            "{}",
            String::from_utf8_lossy(&line)
        );
    }

    /// Reads the next operation other than PING (which it answers); returns
    /// the first bytes of its control line.
    async fn op(&mut self) -> [u8; 4] {
        loop {
            let Some(i) = self.buf[..self.len].windows(2).position(|w| w == b"\r\n") else {
                let n = self.s.read(&mut self.buf[self.len..]).await.unwrap();
                assert!(n > 0, "server closed");
                self.len += n;
                continue;
            };
            let line = &self.buf[..i];
            let mut head = [0u8; 4];
            let k = line.len().min(4);
            head[..k].copy_from_slice(&line[..k]);
            let ping = line == b"PING";
            let payload = if line.starts_with(b"MSG ") || line.starts_with(b"HMSG ") {
                let n: usize = std::str::from_utf8(line.rsplit(|&b| b == b' ').next().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap();
                n + 2
            } else {
                0
            };
            let end = i + 2 + payload;
            while self.len < end {
                let n = self.s.read(&mut self.buf[self.len..]).await.unwrap();
                assert!(n > 0, "server closed");
                self.len += n;
            }
            self.buf.copy_within(end..self.len, 0);
            self.len -= end;
            if ping {
                self.s.write_all(b"PONG\r\n").await.unwrap();
                continue;
            }
            return head;
        }
    }
}

/// Time spent and puts made by one side, over a round's samples.
#[derive(Default, Clone, Copy)]
struct Tally {
    time: Duration,
    puts: u64,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.puts as f64 / self.time.as_secs_f64()
    }
}

fn purge(addr: SocketAddr) {
    let mut admin = NatsConnection::connect(&[addr.to_string()], NatsConfig::default()).unwrap();
    admin
        .request("$JS.API.STREAM.PURGE.TASKQ", b"", Duration::from_secs(5))
        .unwrap();
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this as a test: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds = env_usize("TASKQ_BENCH_ROUNDS", 3);
    let cluster = NatsCluster::start(1).expect("nats-server must be installed");
    let addr = cluster.addr(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The producer creates the stream (R1, file storage) the others publish to.
    let mut taskq: AsyncProducer = rt
        .block_on(
            Producer::builder()
                .tube("bench")
                .connect_async(&cluster.url()),
        )
        .expect("async producer");
    let mut raw = rt.block_on(RawTokio::connect(addr));
    let (js, tag) = rt.block_on(async {
        let client = async_nats::connect(addr.to_string()).await.unwrap();
        (async_nats::jetstream::new(client), std::process::id())
    });
    let mut an_id = 0u64;
    let body = [b'x'; SIZE];
    let an_body = bytes::Bytes::from_static(&[b'x'; SIZE]);

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    let (mut vs_raw, mut vs_async) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let tallies = RefCell::new([Tally::default(); 3]);
        let mut g = c.benchmark_group("nats_async_put");
        g.throughput(Throughput::Elements(1));
        for k in 0..3 {
            let side = (round + k) % 3;
            let tally = |t: Duration, n: u64| {
                let mut all = tallies.borrow_mut();
                all[side].time += t;
                all[side].puts += n;
            };
            match side {
                0 => g.bench_function("raw_tokio", |b| {
                    b.iter_custom(|iters| {
                        let t = rt.block_on(async {
                            let t = Instant::now();
                            for _ in 0..iters {
                                raw.put().await;
                            }
                            t.elapsed()
                        });
                        tally(t, iters);
                        t
                    })
                }),
                1 => g.bench_function("async_producer", |b| {
                    b.iter_custom(|iters| {
                        let t = rt.block_on(async {
                            let t = Instant::now();
                            for _ in 0..iters {
                                taskq.put(&body, PutOptions::default()).await.unwrap();
                            }
                            t.elapsed()
                        });
                        tally(t, iters);
                        t
                    })
                }),
                _ => g.bench_function("async_nats", |b| {
                    b.iter_custom(|iters| {
                        let t = rt.block_on(async {
                            let t = Instant::now();
                            for _ in 0..iters {
                                let publish =
                                    async_nats::jetstream::message::PublishMessage::build()
                                        .payload(an_body.clone())
                                        .message_id(format!("an-{tag}-{an_id}"));
                                an_id += 1;
                                js.send_publish(SUBJECT, publish)
                                    .await
                                    .expect("publish")
                                    .await
                                    .expect("puback");
                            }
                            t.elapsed()
                        });
                        tally(t, iters);
                        t
                    })
                }),
            };
        }
        g.finish();
        purge(addr);
        let t = tallies.into_inner();
        let (r, p, a) = (t[0].rate(), t[1].rate(), t[2].rate());
        println!(
            "round {round}: raw_tokio {r:.0}/s  async_producer {p:.0}/s  async_nats {a:.0}/s  \
             (async_producer / raw_tokio = {:.3}, / async_nats = {:.3})",
            p / r,
            p / a
        );
        vs_raw.push(p / r);
        vs_async.push(p / a);
    }
    println!(
        "async_producer / raw_tokio = {:.3} (target >= 0.95), async_producer / async_nats = {:.3} \
         (target >= 1.0): medians of {rounds} rounds",
        median(vs_raw),
        median(vs_async)
    );
    c.final_summary();
}
