//! JetStream worker drain on a real 3-node cluster (R3 stream), side by side
//! in one run: the taskq worker library (one thread, no-op handler), a raw
//! socket loop, and `async-nats`, each taking one job at a time from the same
//! durable pull consumer and settling it with a confirmed ack; then each with
//! a pull batch of 64 (taskq's `prefetch`).
//!
//! `cargo bench --bench nats_drain` (env `TASKQ_BENCH_JOBS`, default 2000 per
//! side and round; `TASKQ_BENCH_ROUNDS`, default 5). Each round fills the
//! queue before each side's drain (not timed) and rotates who goes first; the
//! ratios are medians over rounds.
//!
//! The raw loop is the floor: the ack of the job just done and the pull for
//! the next one in one write (as taskq sends them), reading to the end of both
//! answers; with a batch, one pull for 64 and 64 acks in one write.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_proto::nats::{ConsumerSpec, NatsConfig, NatsConnection, StreamSpec};
use taskq_testkit::NatsCluster;
use taskq_worker::{Config, Job, Outcome, Worker};

const TUBE: &str = "drain";
const CONSUMER: &str = "taskq-drain";
const BATCH: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A bare NATS connection reading whole operations.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    len: usize,
}

/// One operation read: its control line and its payload.
struct Op {
    line: Vec<u8>,
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
        r.op(); // INFO
        r.s.write_all(
            b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,\"no_responders\":true}\r\nSUB _INBOX.raw.* 1\r\nPING\r\n",
        )
        .unwrap();
        while r.op().line != b"PONG" {}
        r
    }

    fn fill(&mut self) {
        let n = self.s.read(&mut self.buf[self.len..]).expect("read");
        assert!(n > 0, "server closed");
        self.len += n;
    }

    /// Reads the next operation other than PING (answered), payload skipped.
    fn op(&mut self) -> Op {
        loop {
            let Some(i) = self.buf[..self.len].windows(2).position(|w| w == b"\r\n") else {
                self.fill();
                continue;
            };
            let line = self.buf[..i].to_vec();
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
            self.buf.copy_within(end..self.len, 0);
            self.len -= end;
            if line == b"PING" {
                self.s.write_all(b"PONG\r\n").unwrap();
                continue;
            }
            return Op { line };
        }
    }
}

/// The raw loop: `jobs` jobs, `batch` per pull, every ack confirmed.
fn raw_drain(addr: SocketAddr, jobs: usize, batch: usize) -> Duration {
    let mut r = Raw::connect(addr);
    let pull = format!("{{\"batch\":{batch},\"expires\":1000000000}}");
    let pull = format!(
        "PUB $JS.API.CONSUMER.MSG.NEXT.TASKQ.{CONSUMER} _INBOX.raw.p {}\r\n{pull}\r\n",
        pull.len()
    );
    let mut out = Vec::new();
    let mut acks: Vec<Vec<u8>> = Vec::new();
    let start = Instant::now();
    let mut done = 0;
    while done < jobs {
        out.clear();
        let confirms = acks.len();
        for a in acks.drain(..) {
            out.extend_from_slice(b"PUB ");
            out.extend_from_slice(&a);
            out.extend_from_slice(b" _INBOX.raw.a 4\r\n+ACK\r\n");
        }
        out.extend_from_slice(pull.as_bytes());
        r.s.write_all(&out).unwrap();
        let mut got = 0;
        let mut seen_confirms = 0;
        while got < batch.min(jobs - done) || seen_confirms < confirms {
            let op = r.op();
            let words: Vec<&[u8]> = op.line.split(|&b| b == b' ').collect();
            match (words[0], words[1]) {
                (b"MSG", b"_INBOX.raw.a") => seen_confirms += 1,
                (_, b"_INBOX.raw.p") => panic!("status: {}", String::from_utf8_lossy(&op.line)),
                // A job (HMSG: it carries its Nats-Msg-Id): the reply is its ack subject.
                (b"MSG" | b"HMSG", _) => {
                    acks.push(words[3].to_vec());
                    got += 1;
                }
                _ => {}
            }
        }
        done += got;
    }
    // The last acks, confirmed.
    out.clear();
    let n = acks.len();
    for a in acks.drain(..) {
        out.extend_from_slice(b"PUB ");
        out.extend_from_slice(&a);
        out.extend_from_slice(b" _INBOX.raw.a 4\r\n+ACK\r\n");
    }
    r.s.write_all(&out).unwrap();
    for _ in 0..n {
        r.op();
    }
    start.elapsed()
}

fn taskq_drain(url: &str, jobs: usize, prefetch: usize) -> Duration {
    let worker = Worker::new(
        Config {
            servers: vec![url.to_owned()],
            tubes: vec![TUBE.into()],
            prefetch,
            max_jobs: Some(jobs as u64),
            io_timeout: Duration::from_secs(5),
            ..Config::default()
        },
        |_job: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let start = Instant::now();
    let counts = worker.run();
    assert_eq!(counts.deleted, jobs as u64);
    start.elapsed()
}

fn async_nats_drain(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    jobs: usize,
    batch: usize,
) -> Duration {
    rt.block_on(async {
        let client = async_nats::connect(addr.to_string()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream("TASKQ").await.unwrap();
        let consumer: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(CONSUMER).await.unwrap();
        let start = Instant::now();
        let mut done = 0;
        while done < jobs {
            let mut msgs = consumer
                .fetch()
                .max_messages(batch.min(jobs - done))
                .messages()
                .await
                .unwrap();
            while let Some(m) = msgs.next().await {
                m.unwrap().double_ack().await.unwrap();
                done += 1;
            }
        }
        start.elapsed()
    })
}

fn fill(p: &mut Producer, n: usize) {
    let body = [b'x'; 64];
    let bodies = [&body[..]; BATCH];
    let mut out = [PutOutcome::NotSent; BATCH];
    for _ in 0..n / BATCH {
        p.put_batch(&bodies, PutOptions::default(), &mut out)
            .unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let jobs = env_usize("TASKQ_BENCH_JOBS", 2048) / BATCH * BATCH;
    let rounds = env_usize("TASKQ_BENCH_ROUNDS", 5);
    let cluster = NatsCluster::start(3).expect("nats cluster");
    let addr = cluster.addr(0);
    let url = cluster.node_url(0);
    let mut admin = NatsConnection::connect(&[addr.to_string()], NatsConfig::default()).unwrap();
    admin
        .ensure_stream(&StreamSpec {
            name: "TASKQ".into(),
            subjects: vec!["taskq.>".into()],
            replicas: 3,
            duplicate_window: None,
        })
        .unwrap();
    admin
        .ensure_consumer(
            "TASKQ",
            CONSUMER,
            &ConsumerSpec {
                filter_subject: format!("taskq.{TUBE}"),
                ack_wait: Duration::from_secs(60),
                max_deliver: -1,
                max_ack_pending: 20_000,
                max_waiting: 512,
            },
        )
        .unwrap();
    let mut p = Producer::builder()
        .tube(TUBE)
        .connect(url.as_str())
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("{jobs} jobs of 64 B per side and round, {rounds} rounds, R3 stream, 3 nodes, through node 0");
    for batch in [1, BATCH] {
        let (mut vs_raw, mut vs_async) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut secs = [0f64; 3];
            for k in 0..3 {
                let side = (round + k) % 3;
                fill(&mut p, jobs);
                secs[side] = match side {
                    0 => raw_drain(addr, jobs, batch),
                    1 => taskq_drain(&url, jobs, batch),
                    _ => async_nats_drain(&rt, addr, jobs, batch),
                }
                .as_secs_f64();
            }
            let rate = |i: usize| jobs as f64 / secs[i];
            println!(
                "batch {batch:>2} round {round}: raw loop {:>7.0}/s  taskq {:>7.0}/s  async-nats {:>7.0}/s",
                rate(0),
                rate(1),
                rate(2)
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
}
