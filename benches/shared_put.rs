//! A whole service enqueueing at once: the shared producer with 256 tasks
//! (and with 1) on one connection, side by side in one run with what a user
//! would pick instead, 64-byte jobs, everything on one current-thread tokio
//! runtime.
//!
//! `cargo bench --bench shared_put` (needs `beanstalkd` and `nats-server`;
//! env `TASKQ_BENCH_ROUNDS`, default 5). Each round runs criterion's samples
//! of every side in turn, rotating who goes first; the ratios of their rates
//! are printed as medians over the rounds:
//!
//! - beanstalkd: `shared_256 / raw_256_per_write` (a raw tokio loop writing
//!   256 pre-built puts per write on one connection and reading their 256
//!   replies; target >= 0.8), `shared_1 / async_producer_1` (>= 0.95);
//! - JetStream, one node: `shared_256 / async_nats_256` (one shared
//!   `jetstream::Context`, 256 tasks; >= 1.5), `shared_256 /
//!   raw_256_per_write` (256 `HPUB`s with reply subjects and message ids
//!   per write, their 256 PubAcks read; >= 0.8), `shared_1 /
//!   async_producer_1` (>= 0.95), `shared_1 / async_nats_1` (>= 1.0);
//! - then, timed plainly over the same rounds: p50 and p99 put latency with
//!   256 tasks (shared, and async-nats on JetStream), and through the chaos
//!   proxy's Latency toxic (1 ms each way, beanstalkd) `shared_256 /
//!   mutex_async_producer_256` (target >= 100).
#![allow(missing_docs)]

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use taskq_connect::nats::{NatsConfig, NatsConnection};
use taskq_producer::{AsyncProducer, PutOptions, SharedProducer};
use taskq_testkit::{Beanstalkd, ChaosProxy, Direction, NatsCluster, Toxic};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

#[path = "common/nats_raw.rs"]
mod nats_raw;
use nats_raw::{env_usize, median};

const SIZE: usize = 64;
const TASKS: usize = 256;
const SUBJECT: &str = "taskq.bench";

/// Time and puts of one side over a round.
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

/// One side: runs about `n` puts, returns the time and the puts made.
type Side<'a> = (&'static str, Box<dyn FnMut(u64) -> (Duration, u64) + 'a>);

/// Runs every side's samples each round (rotating the order); returns each
/// side's rate per round.
fn rounds(
    c: &mut Criterion,
    group: &str,
    rounds: usize,
    sides: &mut [Side<'_>],
    after_round: &mut dyn FnMut(),
) -> Vec<Vec<f64>> {
    let mut rates = vec![Vec::new(); sides.len()];
    for round in 0..rounds {
        let tallies = RefCell::new(vec![Tally::default(); sides.len()]);
        let mut g = c.benchmark_group(group);
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let (name, run) = &mut sides[i];
            g.bench_function(*name, |b| {
                b.iter_custom(|iters| {
                    let (t, n) = run(iters);
                    let mut all = tallies.borrow_mut();
                    all[i].time += t;
                    all[i].puts += n;
                    // criterion's time per iteration: scaled to the puts asked for.
                    t.mul_f64(iters as f64 / n as f64)
                })
            });
        }
        g.finish();
        after_round();
        let t = tallies.into_inner();
        let line: Vec<String> = sides
            .iter()
            .zip(&t)
            .map(|((name, _), t)| format!("{name} {:.0}/s", t.rate()))
            .collect();
        println!("{group} round {round}: {}", line.join("  "));
        for (r, t) in rates.iter_mut().zip(&t) {
            r.push(t.rate());
        }
    }
    rates
}

/// The median over rounds of side `a`'s rate over side `b`'s.
fn ratio(rates: &[Vec<f64>], a: usize, b: usize) -> f64 {
    median(rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect())
}

/// `tasks` tasks sharing `p`, `per_task` puts each; the time, and each
/// put's latency in microseconds when `latencies` is given.
async fn shared_burst(
    p: &SharedProducer,
    tasks: usize,
    per_task: u64,
    latencies: Option<&mut Vec<u32>>,
) -> Duration {
    let want = latencies.is_some();
    let t = Instant::now();
    let mut hs = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let p = p.clone();
        hs.push(tokio::spawn(async move {
            let body = [b'x'; SIZE];
            let mut lat = Vec::with_capacity(if want { per_task as usize } else { 0 });
            for _ in 0..per_task {
                let t = Instant::now();
                p.put("bench", &body, PutOptions::default()).await.unwrap();
                if want {
                    lat.push(t.elapsed().as_micros() as u32);
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for h in hs {
        all.extend(h.await.unwrap());
    }
    let took = t.elapsed();
    if let Some(l) = latencies {
        l.extend(all);
    }
    took
}

/// The raw beanstalkd side: one connection, 256 pre-built puts a write.
struct RawBeanstalkd {
    s: TcpStream,
    batch: Vec<u8>,
    buf: Vec<u8>,
}

impl RawBeanstalkd {
    async fn connect(addr: SocketAddr) -> RawBeanstalkd {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut one = format!("put 1024 0 60 {SIZE}\r\n").into_bytes();
        one.extend_from_slice(&[b'x'; SIZE]);
        one.extend_from_slice(b"\r\n");
        RawBeanstalkd {
            s,
            batch: one.repeat(TASKS),
            buf: vec![0; 1 << 16],
        }
    }

    /// One write of 256 puts, then reads until 256 replies.
    async fn batch(&mut self) {
        self.s.write_all(&self.batch).await.unwrap();
        let mut lines = 0;
        while lines < TASKS {
            let n = self.s.read(&mut self.buf).await.unwrap();
            assert!(n > 0, "server closed");
            lines += memchr::memchr_iter(b'\n', &self.buf[..n]).count();
        }
        assert_eq!(lines, TASKS);
    }
}

/// The raw JetStream side: one connection, 256 `HPUB`s a write, each with
/// its reply subject and a fresh message id written in place.
struct RawNats {
    s: TcpStream,
    batch: Vec<u8>,
    /// Where each put's id digits start.
    digits: Vec<usize>,
    next_id: u64,
    buf: Vec<u8>,
    len: usize,
}

impl RawNats {
    async fn connect(addr: SocketAddr) -> RawNats {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut batch = Vec::new();
        let mut digits = Vec::new();
        for i in 0..TASKS {
            let hdr = format!("NATS/1.0\r\nNats-Msg-Id: raw-{:020}\r\n\r\n", 0);
            let line = format!(
                "HPUB {SUBJECT} _INBOX.raw.{i} {} {}\r\n",
                hdr.len(),
                hdr.len() + SIZE
            );
            digits.push(batch.len() + line.len() + hdr.find("raw-").unwrap() + 4);
            batch.extend_from_slice(line.as_bytes());
            batch.extend_from_slice(hdr.as_bytes());
            batch.extend_from_slice(&[b'x'; SIZE]);
            batch.extend_from_slice(b"\r\n");
        }
        let mut r = RawNats {
            s,
            batch,
            digits,
            next_id: u64::from(std::process::id()) << 32,
            buf: vec![0; 1 << 20],
            len: 0,
        };
        r.read_ops(1).await; // INFO
        r.s.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.raw.* 1\r\nPING\r\n",
        )
        .await
        .unwrap();
        r.read_ops(1).await; // PONG
        r
    }

    async fn batch(&mut self) {
        for &d in &self.digits {
            let mut n = self.next_id;
            self.next_id += 1;
            for i in (0..20).rev() {
                self.batch[d + i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        }
        self.s.write_all(&self.batch).await.unwrap();
        self.read_ops(TASKS).await;
    }

    /// Reads `n` operations other than PING (answered) and +OK.
    async fn read_ops(&mut self, mut n: usize) {
        let mut at = 0;
        while n > 0 {
            let Some(i) = memchr::memmem::find(&self.buf[at..self.len], b"\r\n") else {
                self.buf.copy_within(at..self.len, 0);
                self.len -= at;
                at = 0;
                let k = self.s.read(&mut self.buf[self.len..]).await.unwrap();
                assert!(k > 0, "server closed");
                self.len += k;
                continue;
            };
            let line = &self.buf[at..at + i];
            let payload = if line.starts_with(b"MSG ") {
                let sz = line.rsplit(|&b| b == b' ').next().unwrap();
                std::str::from_utf8(sz).unwrap().parse::<usize>().unwrap() + 2
            } else {
                0
            };
            if at + i + 2 + payload > self.len {
                self.buf.copy_within(at..self.len, 0);
                self.len -= at;
                at = 0;
                let k = self.s.read(&mut self.buf[self.len..]).await.unwrap();
                assert!(k > 0, "server closed");
                self.len += k;
                continue;
            }
            let ping = line == b"PING";
            let ok = line == b"+OK";
            at += i + 2 + payload;
            if ping {
                self.s.write_all(b"PONG\r\n").await.unwrap();
            } else if !ok {
                n -= 1;
            }
        }
        self.buf.copy_within(at..self.len, 0);
        self.len -= at;
    }
}

/// async-nats: `tasks` tasks sharing one `jetstream::Context`.
async fn async_nats_burst(
    js: &async_nats::jetstream::Context,
    tasks: usize,
    per_task: u64,
    tag: &str,
    latencies: Option<&mut Vec<u32>>,
) -> Duration {
    let want = latencies.is_some();
    let t = Instant::now();
    let mut hs = Vec::with_capacity(tasks);
    for k in 0..tasks {
        let js = js.clone();
        let tag = format!("{tag}-{k}");
        hs.push(tokio::spawn(async move {
            let body = bytes::Bytes::from_static(&[b'x'; SIZE]);
            let mut lat = Vec::new();
            for i in 0..per_task {
                let t = Instant::now();
                let m = async_nats::jetstream::message::PublishMessage::build()
                    .payload(body.clone())
                    .message_id(format!("{tag}-{i}"));
                js.send_publish(SUBJECT, m)
                    .await
                    .expect("publish")
                    .await
                    .expect("puback");
                if want {
                    lat.push(t.elapsed().as_micros() as u32);
                }
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for h in hs {
        all.extend(h.await.unwrap());
    }
    let took = t.elapsed();
    if let Some(l) = latencies {
        l.extend(all);
    }
    took
}

fn percentile(v: &mut [u32], p: f64) -> u32 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize]
}

fn per_task(iters: u64) -> u64 {
    iters.div_ceil(TASKS as u64).max(1)
}

/// The shared producer's sides: 256 tasks, and 1.
fn shared_sides<'a>(rt: &'a Runtime, shared: &'a SharedProducer) -> [Side<'a>; 2] {
    [
        (
            "shared_256",
            Box::new(move |iters| {
                let k = per_task(iters);
                (
                    rt.block_on(shared_burst(shared, TASKS, k, None)),
                    k * TASKS as u64,
                )
            }),
        ),
        (
            "shared_1",
            Box::new(move |iters| {
                // From a spawned task, as a service's handlers call it (and
                // as the async producer's side below runs).
                let p = shared.clone();
                let t = rt.block_on(async move {
                    tokio::spawn(async move {
                        let body = [b'x'; SIZE];
                        let t = Instant::now();
                        for _ in 0..iters {
                            p.put("bench", &body, PutOptions::default()).await.unwrap();
                        }
                        t.elapsed()
                    })
                    .await
                    .unwrap()
                });
                (t, iters)
            }),
        ),
    ]
}

/// The async producer, one put at a time, from a spawned task (it is lent
/// to the task and handed back).
fn async_producer_side<'a>(rt: &'a Runtime, single: &'a mut Option<AsyncProducer>) -> Side<'a> {
    (
        "async_producer_1",
        Box::new(move |iters| {
            let mut p = single.take().expect("the producer is back");
            let (t, p) = rt.block_on(async move {
                tokio::spawn(async move {
                    let body = [b'x'; SIZE];
                    let t = Instant::now();
                    for _ in 0..iters {
                        p.put(&body, PutOptions::default()).await.unwrap();
                    }
                    (t.elapsed(), p)
                })
                .await
                .unwrap()
            });
            *single = Some(p);
            (t, iters)
        }),
    )
}

/// A raw loop of 256 puts a write, on either engine.
trait RawBatch {
    async fn batch(&mut self);
}

impl RawBatch for RawBeanstalkd {
    async fn batch(&mut self) {
        RawBeanstalkd::batch(self).await
    }
}

impl RawBatch for RawNats {
    async fn batch(&mut self) {
        RawNats::batch(self).await
    }
}

fn raw_side<'a, R: RawBatch>(rt: &'a Runtime, raw: &'a mut R) -> Side<'a> {
    (
        "raw_256_per_write",
        Box::new(move |iters| {
            let k = per_task(iters);
            let t = rt.block_on(async {
                let t = Instant::now();
                for _ in 0..k {
                    raw.batch().await;
                }
                t.elapsed()
            });
            (t, k * TASKS as u64)
        }),
    )
}

fn beanstalkd(c: &mut Criterion, rt: &Runtime, n_rounds: usize) {
    let server = Beanstalkd::start().expect("beanstalkd must be installed");
    let addr = server.addr();
    let shared = rt
        .block_on(SharedProducer::connect(&addr.to_string()))
        .unwrap();
    let mut single = rt
        .block_on(AsyncProducer::connect(&addr.to_string()))
        .unwrap();
    rt.block_on(single.use_tube("bench")).unwrap();
    let mut single = Some(single);
    let mut raw = rt.block_on(RawBeanstalkd::connect(addr));
    let [shared_256, shared_1] = shared_sides(rt, &shared);
    let mut sides: Vec<Side<'_>> = vec![
        shared_256,
        raw_side(rt, &mut raw),
        shared_1,
        async_producer_side(rt, &mut single),
    ];
    let rates = rounds(c, "shared_put_beanstalkd", n_rounds, &mut sides, &mut || {});
    drop(sides);
    println!(
        "beanstalkd: shared_256 / raw_256_per_write = {:.3} (target >= 0.8), shared_1 / async_producer_1 = {:.3} (target >= 0.95): medians of {n_rounds} rounds",
        ratio(&rates, 0, 1),
        ratio(&rates, 2, 3)
    );

    // Latency with 256 tasks.
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for _ in 0..n_rounds {
        let mut lat = Vec::new();
        rt.block_on(shared_burst(&shared, TASKS, 100, Some(&mut lat)));
        p50.push(f64::from(percentile(&mut lat, 0.5)));
        p99.push(f64::from(percentile(&mut lat, 0.99)));
    }
    println!(
        "beanstalkd latency, 256 tasks: shared p50 {:.0} us, p99 {:.0} us (medians of {n_rounds} rounds)",
        median(p50),
        median(p99)
    );

    // Through 1 ms of latency each way: pipelining against one put at a time.
    let proxy = ChaosProxy::start(addr).unwrap();
    let delay = Toxic::Latency {
        delay: Duration::from_millis(1),
        jitter: Duration::ZERO,
    };
    proxy.add(delay, Direction::Upstream, 1.0);
    proxy.add(delay, Direction::Downstream, 1.0);
    let url = proxy.addr().to_string();
    let far_shared = rt.block_on(SharedProducer::connect(&url)).unwrap();
    let far_single = rt.block_on(AsyncProducer::connect(&url)).unwrap();
    let far_mutex = Arc::new(tokio::sync::Mutex::new(far_single));
    let mut ratios = Vec::new();
    for round in 0..n_rounds {
        let (t_shared, t_mutex) = rt.block_on(async {
            let t_shared = shared_burst(&far_shared, TASKS, 20, None).await;
            let t = Instant::now();
            let mut hs = Vec::new();
            for _ in 0..TASKS {
                let m = far_mutex.clone();
                hs.push(tokio::spawn(async move {
                    let mut p = m.lock().await;
                    p.use_tube("bench").await.unwrap();
                    p.put(&[b'x'; SIZE], PutOptions::default()).await.unwrap();
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
            (t_shared, t.elapsed())
        });
        let r_shared = (TASKS * 20) as f64 / t_shared.as_secs_f64();
        let r_mutex = TASKS as f64 / t_mutex.as_secs_f64();
        println!("latency toxic round {round}: shared_256 {r_shared:.0}/s  mutex_async_producer_256 {r_mutex:.0}/s");
        ratios.push(r_shared / r_mutex);
    }
    println!(
        "beanstalkd through 1 ms each way: shared_256 / mutex_async_producer_256 = {:.1} (target >= 100): median of {n_rounds} rounds",
        median(ratios)
    );
}

fn purge(addr: SocketAddr) {
    let mut admin = NatsConnection::connect(&[addr.to_string()], NatsConfig::default()).unwrap();
    admin
        .request("$JS.API.STREAM.PURGE.TASKQ", b"", Duration::from_secs(5))
        .unwrap();
}

fn jetstream(c: &mut Criterion, rt: &Runtime, n_rounds: usize) {
    let cluster = NatsCluster::start(1).expect("nats-server must be installed");
    let addr = cluster.addr(0);
    // The producers make the stream (R1) the others publish to.
    let shared = rt
        .block_on(SharedProducer::connect(&cluster.url()))
        .unwrap();
    let single = rt
        .block_on(
            taskq_producer::Producer::builder()
                .tube("bench")
                .connect_async(&cluster.url()),
        )
        .unwrap();
    let mut single = Some(single);
    let mut raw = rt.block_on(RawNats::connect(addr));
    let js = rt.block_on(async {
        let client = async_nats::connect(addr.to_string()).await.unwrap();
        async_nats::jetstream::new(client)
    });
    let tag = format!("an{}", std::process::id());
    let burst = std::cell::Cell::new(0u64);
    let [shared_256, shared_1] = shared_sides(rt, &shared);
    let mut sides: Vec<Side<'_>> = vec![
        shared_256,
        (
            "async_nats_256",
            Box::new(|iters| {
                let k = per_task(iters);
                burst.set(burst.get() + 1);
                let t = rt.block_on(async_nats_burst(
                    &js,
                    TASKS,
                    k,
                    &format!("{tag}-{}", burst.get()),
                    None,
                ));
                (t, k * TASKS as u64)
            }),
        ),
        raw_side(rt, &mut raw),
        shared_1,
        async_producer_side(rt, &mut single),
        (
            "async_nats_1",
            Box::new(|iters| {
                burst.set(burst.get() + 1);
                let t = rt.block_on(async_nats_burst(
                    &js,
                    1,
                    iters,
                    &format!("{tag}-1-{}", burst.get()),
                    None,
                ));
                (t, iters)
            }),
        ),
    ];
    let rates = rounds(c, "shared_put_jetstream", n_rounds, &mut sides, &mut || {
        purge(addr)
    });
    drop(sides);
    println!(
        "JetStream: shared_256 / async_nats_256 = {:.3} (target >= 1.5), shared_256 / raw_256_per_write = {:.3} (target >= 0.8), \
         shared_1 / async_producer_1 = {:.3} (target >= 0.95), shared_1 / async_nats_1 = {:.3} (target >= 1.0): medians of {n_rounds} rounds",
        ratio(&rates, 0, 1),
        ratio(&rates, 0, 2),
        ratio(&rates, 3, 4),
        ratio(&rates, 3, 5)
    );
    let (mut s50, mut s99, mut a50, mut a99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..n_rounds {
        let mut lat = Vec::new();
        rt.block_on(shared_burst(&shared, TASKS, 100, Some(&mut lat)));
        s50.push(f64::from(percentile(&mut lat, 0.5)));
        s99.push(f64::from(percentile(&mut lat, 0.99)));
        let mut lat = Vec::new();
        rt.block_on(async_nats_burst(
            &js,
            TASKS,
            100,
            &format!("{tag}-lat-{round}"),
            Some(&mut lat),
        ));
        a50.push(f64::from(percentile(&mut lat, 0.5)));
        a99.push(f64::from(percentile(&mut lat, 0.99)));
        purge(addr);
    }
    println!(
        "JetStream latency, 256 tasks: shared p50 {:.0} us, p99 {:.0} us; async_nats p50 {:.0} us, p99 {:.0} us (medians of {n_rounds} rounds)",
        median(s50),
        median(s99),
        median(a50),
        median(a99)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this as a test: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n_rounds = env_usize("TASKQ_BENCH_ROUNDS", 5);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
        .configure_from_args();
    beanstalkd(&mut c, &rt, n_rounds);
    jetstream(&mut c, &rt, n_rounds);
    c.final_summary();
}
