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
//!
//! `TASKQ_BENCH_TLS=1` runs the same over TLS: the cluster's client port
//! requires it (certificates made by the bench), the raw loop is a rustls
//! stream (one write of the pre-built bytes, one TLS record), taskq goes
//! through `tls://` and async-nats with `require_tls`.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use taskq_connect::nats::NatsAccess;
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::pki::TestCerts;
use taskq_testkit::NatsCluster;

#[path = "common/nats_raw.rs"]
mod nats_raw;
use nats_raw::{env_usize, median, Raw};

const SUBJECT: &str = "taskq.bench";
const BATCH: usize = 64;

/// Reads to the end of the next MSG (a PubAck) and checks it is one.
fn puback<S: Read + Write>(r: &mut Raw<S>) {
    r.op(|line, payload| {
        assert!(
            line.starts_with(b"MSG "),
            "{}",
            String::from_utf8_lossy(line)
        );
        assert!(
            payload.windows(5).any(|w| w == b"\"seq\""),
            "not a PubAck: {}",
            String::from_utf8_lossy(payload)
        );
    });
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

/// One client under test: `puts(n, batch)` puts `n` jobs, `batch` per write.
trait Side {
    fn name(&self) -> &'static str;
    fn puts(&mut self, n: usize, batch: usize);
}

struct RawSide<S: Read + Write> {
    r: Raw<S>,
    t: Vec<u8>,
    at: usize,
    out: Vec<u8>,
    id: u64,
}

impl<S: Read + Write> Side for RawSide<S> {
    fn name(&self) -> &'static str {
        "raw loop"
    }

    fn puts(&mut self, n: usize, batch: usize) {
        for _ in 0..n / batch {
            self.out.clear();
            for _ in 0..batch {
                stamp(&mut self.t, self.at, self.id);
                self.id += 1;
                self.out.extend_from_slice(&self.t);
            }
            self.r.s.write_all(&self.out).unwrap();
            for _ in 0..batch {
                puback(&mut self.r);
            }
        }
    }
}

struct TaskqSide {
    p: Producer,
    body: [u8; 64],
    out: Vec<PutOutcome>,
}

impl Side for TaskqSide {
    fn name(&self) -> &'static str {
        "taskq"
    }

    fn puts(&mut self, n: usize, batch: usize) {
        if batch == 1 {
            for _ in 0..n {
                self.p.put(&self.body, PutOptions::default()).expect("put");
            }
            return;
        }
        let bodies = [&self.body[..]; BATCH];
        for _ in 0..n / batch {
            let r = self
                .p
                .put_batch(
                    &bodies[..batch],
                    PutOptions::default(),
                    &mut self.out[..batch],
                )
                .expect("batch");
            assert_eq!(r.inserted, batch);
        }
    }
}

struct AsyncNatsSide<'r> {
    rt: &'r tokio::runtime::Runtime,
    js: async_nats::jetstream::Context,
    tag: u64,
    id: u64,
}

impl Side for AsyncNatsSide<'_> {
    fn name(&self) -> &'static str {
        "async-nats"
    }

    fn puts(&mut self, n: usize, batch: usize) {
        let body = bytes::Bytes::from_static(&[b'x'; 64]);
        let (js, tag, id) = (&self.js, self.tag, &mut self.id);
        self.rt.block_on(async {
            let mut acks = Vec::with_capacity(batch);
            for _ in 0..n / batch {
                for _ in 0..batch {
                    let publish = async_nats::jetstream::message::PublishMessage::build()
                        .payload(body.clone())
                        .message_id(format!("an-{tag}-{id}"));
                    *id += 1;
                    acks.push(js.send_publish(SUBJECT, publish).await.expect("publish"));
                }
                for a in acks.drain(..) {
                    a.await.expect("puback");
                }
            }
        });
    }
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// An async-nats client of `addr`, over TLS trusting `ca` when given.
async fn async_client(addr: SocketAddr, ca: Option<&PathBuf>) -> async_nats::Client {
    let mut o = async_nats::ConnectOptions::new();
    if let Some(ca) = ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    o.connect(addr.to_string()).await.unwrap()
}

fn ensure_stream(rt: &tokio::runtime::Runtime, addr: SocketAddr, ca: Option<&PathBuf>) {
    use async_nats::jetstream::stream::{Config, RetentionPolicy};
    rt.block_on(async {
        let client = async_client(addr, ca).await;
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

fn purge(rt: &tokio::runtime::Runtime, addr: SocketAddr, ca: Option<&PathBuf>) {
    rt.block_on(async {
        let client = async_client(addr, ca).await;
        let js = async_nats::jetstream::new(client);
        js.get_stream("TASKQ").await.unwrap().purge().await.unwrap();
    });
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this as a test: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let jobs = env_usize("TASKQ_BENCH_JOBS", 3200);
    let rounds = env_usize("TASKQ_BENCH_ROUNDS", 5);
    let chunk = BATCH * 4;
    let tls = std::env::var("TASKQ_BENCH_TLS").is_ok_and(|v| v == "1");
    let dir = std::env::temp_dir().join(format!("taskq-bench-tls-{}", std::process::id()));
    let certs = tls.then(|| {
        std::fs::create_dir_all(&dir).unwrap();
        TestCerts::generate(&dir).expect("certificates (openssl)")
    });
    let mut builder = NatsCluster::builder().nodes(3);
    if let Some(c) = &certs {
        builder = builder.config(format!(
            "tls {{ cert_file: {:?}, key_file: {:?} }}",
            c.server_cert, c.server_key
        ));
    }
    let cluster = builder.start().expect("nats cluster");
    let addr = cluster.addr(0);
    let ca = certs.as_ref().map(|c| c.ca.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    ensure_stream(&rt, addr, ca.as_ref());
    let js =
        rt.block_on(async { async_nats::jetstream::new(async_client(addr, ca.as_ref()).await) });
    let (t, at) = template(&[b'x'; 64]);
    let id = u64::from(std::process::id()) << 32;
    let raw: Box<dyn Side> = match &ca {
        None => Box::new(RawSide {
            r: Raw::connect(addr),
            t,
            at,
            out: Vec::new(),
            id,
        }),
        Some(ca) => Box::new(RawSide {
            r: Raw::connect_tls(addr, ca),
            t,
            at,
            out: Vec::new(),
            id,
        }),
    };
    let mut access = NatsAccess::default();
    access.tls.ca_file = ca.clone();
    let url = match &ca {
        None => cluster.node_url(0),
        Some(_) => format!("tls://{addr}"),
    };
    let mut sides: Vec<Box<dyn Side + '_>> = vec![
        raw,
        Box::new(TaskqSide {
            p: Producer::builder()
                .tube("bench")
                .nats_access(access)
                .connect(url)
                .expect("taskq connect"),
            body: [b'x'; 64],
            out: vec![PutOutcome::NotSent; BATCH],
        }),
        Box::new(AsyncNatsSide {
            rt: &rt,
            js,
            tag: u64::from(std::process::id()),
            id: 0,
        }),
    ];
    println!(
        "{jobs} puts of 64 B per side and round, {rounds} rounds, R3 stream on a 3-node cluster, \
         through node 0{}; the sides take turns every {chunk} puts",
        if tls { ", over TLS" } else { "" }
    );
    for batch in [1, BATCH] {
        let (mut vs_raw, mut vs_async) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut wall = [Duration::ZERO; 3];
            let mut cpu = [Duration::ZERO; 3];
            for c in 0..jobs / chunk {
                for k in 0..3 {
                    // Rotate who goes first, so drift in the machine's load
                    // falls on every side alike.
                    let i = (c + k) % 3;
                    let (t0, c0) = (Instant::now(), thread_cpu());
                    sides[i].puts(chunk, batch);
                    wall[i] += t0.elapsed();
                    cpu[i] += thread_cpu() - c0;
                }
            }
            purge(&rt, addr, ca.as_ref());
            let n = (jobs / chunk * chunk) as f64;
            let rate = |i: usize| n / wall[i].as_secs_f64();
            let us = |i: usize| cpu[i].as_secs_f64() * 1e6 / n;
            println!(
                "batch {batch:>2} round {round}: {} {:>7.0}/s ({:.1} us CPU/put)  {} {:>7.0}/s ({:.1})  {} {:>7.0}/s ({:.1})",
                sides[0].name(), rate(0), us(0),
                sides[1].name(), rate(1), us(1),
                sides[2].name(), rate(2), us(2),
            );
            vs_raw.push(rate(1) / rate(0));
            vs_async.push(rate(1) / rate(2));
        }
        println!(
            "batch {batch:>2}: taskq / raw loop = {:.3}, taskq / async-nats = {:.3} (medians of {rounds} rounds)",
            median(vs_raw),
            median(vs_async)
        );
    }
    drop(sides);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
