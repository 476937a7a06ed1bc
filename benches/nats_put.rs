//! JetStream put throughput on a real 3-node cluster, side by side in one run:
//! taskq's producer, a raw socket loop, and `async-nats` (what Rust users pick
//! today), each publishing 64-byte jobs with a unique `Nats-Msg-Id` and waiting
//! for the stream's PubAck, one at a time, then in batches of 64.
//!
//! `cargo bench --bench nats_put` (env `TASKQ_BENCH_JOBS`, default 5000 per
//! side and round; `TASKQ_BENCH_ROUNDS`, default 5). Each round runs every
//! side once, in turn, on the same cluster; the ratios are medians over rounds.
//!
//! The raw loop is the floor of what a client can cost: pre-built `HPUB` bytes
//! with the message id's digits rewritten in place, one write per put, and a
//! read to the end of the PubAck (answering the server's PING on the way).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::NatsCluster;

const SUBJECT: &str = "taskq.bench";
const BATCH: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A NATS connection on a bare TcpStream: just enough protocol for the loop.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    len: usize,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = Raw {
            s,
            buf: vec![0; 1 << 16],
            len: 0,
        };
        r.line(); // INFO
        r.s.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.raw.* 1\r\nPING\r\n",
        )
        .unwrap();
        while r.line() != b"PONG" {}
        r
    }

    /// Reads one control line (without CRLF), answering PINGs.
    fn line(&mut self) -> Vec<u8> {
        loop {
            if let Some(i) = self.buf[..self.len].windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.consume(i + 2);
                if line == b"PING" {
                    self.s.write_all(b"PONG\r\n").unwrap();
                    continue;
                }
                return line;
            }
            self.fill();
        }
    }

    fn fill(&mut self) {
        let n = self.s.read(&mut self.buf[self.len..]).expect("read");
        assert!(n > 0, "server closed");
        self.len += n;
    }

    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Reads to the end of the next MSG (a PubAck) and checks it is one.
    fn puback(&mut self) {
        let line = self.line();
        assert!(
            line.starts_with(b"MSG "),
            "{}",
            String::from_utf8_lossy(&line)
        );
        let n: usize = std::str::from_utf8(line.rsplit(|&b| b == b' ').next().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        while self.len < n + 2 {
            self.fill();
        }
        assert!(
            self.buf[..n].windows(5).any(|w| w == b"\"seq\""),
            "not a PubAck: {}",
            String::from_utf8_lossy(&self.buf[..n])
        );
        self.consume(n + 2);
    }
}

/// `HPUB` bytes for one put with a 20-digit message id, and where the digits are.
fn template(body: &[u8]) -> (Vec<u8>, usize) {
    let hdr = format!("NATS/1.0\r\nNats-Msg-Id: raw-{:020}\r\n\r\n", 0);
    let mut t = format!(
        "HPUB {SUBJECT} _INBOX.raw.1 {} {}\r\n",
        hdr.len(),
        hdr.len() + body.len()
    )
    .into_bytes();
    let at = t.len() + hdr.find("raw-").unwrap() + 4;
    t.extend_from_slice(hdr.as_bytes());
    t.extend_from_slice(body);
    t.extend_from_slice(b"\r\n");
    (t, at)
}

fn stamp(t: &mut [u8], at: usize, mut n: u64) {
    for i in (0..20).rev() {
        t[at + i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

fn raw_puts(addr: SocketAddr, jobs: usize, first: u64, batch: usize) -> f64 {
    let mut r = Raw::connect(addr);
    let (mut t, at) = template(&[b'x'; 64]);
    let mut out = Vec::with_capacity(t.len() * batch);
    let start = Instant::now();
    let mut id = first;
    for _ in 0..jobs / batch {
        out.clear();
        for _ in 0..batch {
            stamp(&mut t, at, id);
            id += 1;
            out.extend_from_slice(&t);
        }
        r.s.write_all(&out).unwrap();
        for _ in 0..batch {
            r.puback();
        }
    }
    (jobs / batch * batch) as f64 / start.elapsed().as_secs_f64()
}

fn taskq_puts(url: &str, jobs: usize, batch: usize) -> f64 {
    let mut p = Producer::builder()
        .tube("bench")
        .connect(url)
        .expect("taskq connect");
    let body = [b'x'; 64];
    let bodies = vec![&body[..]; batch];
    let mut out = vec![PutOutcome::NotSent; batch];
    let start = Instant::now();
    if batch == 1 {
        for _ in 0..jobs {
            p.put(&body, PutOptions::default()).expect("put");
        }
    } else {
        for _ in 0..jobs / batch {
            let r = p
                .put_batch(&bodies, PutOptions::default(), &mut out)
                .expect("batch");
            assert_eq!(r.inserted, batch);
        }
    }
    (jobs / batch * batch) as f64 / start.elapsed().as_secs_f64()
}

fn async_nats_puts(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    jobs: usize,
    batch: usize,
    tag: u64,
) -> f64 {
    rt.block_on(async {
        let client = async_nats::connect(addr.to_string())
            .await
            .expect("async-nats connect");
        let js = async_nats::jetstream::new(client);
        let body = bytes::Bytes::from_static(&[b'x'; 64]);
        let start = Instant::now();
        let mut acks = Vec::with_capacity(batch);
        for i in 0..jobs / batch {
            for k in 0..batch {
                let id = format!("an-{tag}-{i}-{k}");
                let publish = async_nats::jetstream::message::PublishMessage::build()
                    .payload(body.clone())
                    .message_id(id);
                acks.push(js.send_publish(SUBJECT, publish).await.expect("publish"));
            }
            for a in acks.drain(..) {
                a.await.expect("puback");
            }
        }
        (jobs / batch * batch) as f64 / start.elapsed().as_secs_f64()
    })
}

fn ensure_stream(rt: &tokio::runtime::Runtime, addr: SocketAddr) {
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    rt.block_on(async {
        let client = async_nats::connect(addr.to_string()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let r = js
                .get_or_create_stream(Config {
                    name: "TASKQ".into(),
                    subjects: vec!["taskq.>".into()],
                    retention: RetentionPolicy::WorkQueue,
                    num_replicas: 3,
                    ..Default::default()
                })
                .await;
            match r {
                Ok(_) => break,
                Err(e) if Instant::now() < until => {
                    eprintln!("stream not created yet: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("stream: {e}"),
            }
        }
    });
}

fn purge(rt: &tokio::runtime::Runtime, addr: SocketAddr) {
    rt.block_on(async {
        let client = async_nats::connect(addr.to_string()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.get_stream("TASKQ").await.unwrap().purge().await.unwrap();
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this as a test: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let jobs = env_usize("TASKQ_BENCH_JOBS", 5000);
    let rounds = env_usize("TASKQ_BENCH_ROUNDS", 5);
    let cluster = NatsCluster::start(3).expect("nats cluster");
    let addr = cluster.addr(0);
    let url = cluster.node_url(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    ensure_stream(&rt, addr);
    println!("{jobs} puts of 64 B per side and round, {rounds} rounds, 3-node cluster, node 0");
    for batch in [1, BATCH] {
        let (mut vs_raw, mut vs_async) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let raw = raw_puts(
                addr,
                jobs,
                (round as u64 + 1) << 40 | (batch as u64) << 32,
                batch,
            );
            purge(&rt, addr);
            let taskq = taskq_puts(&url, jobs, batch);
            purge(&rt, addr);
            let an = async_nats_puts(&rt, addr, jobs, batch, (round * 100 + batch) as u64);
            purge(&rt, addr);
            println!(
                "batch {batch:>2} round {round}: raw {raw:>8.0}/s  taskq {taskq:>8.0}/s  async-nats {an:>8.0}/s"
            );
            vs_raw.push(taskq / raw);
            vs_async.push(taskq / an);
        }
        println!(
            "batch {batch:>2}: taskq / raw loop = {:.3}, taskq / async-nats = {:.3} (medians)",
            median(vs_raw),
            median(vs_async)
        );
    }
}
