//! JetStream worker drain, side by side in one run: the taskq worker library
//! (one thread, no-op handler), a raw socket loop, and `async-nats`, each
//! taking one job at a time from the same durable pull consumer and settling
//! it with a confirmed ack; then each with a pull batch of 64 (taskq's
//! `prefetch`), and beside them taskq's `AsyncWorker` at concurrency 64 (a
//! no-op async handler, 64 jobs in flight on one connection, its pulls
//! asking for the window's free room) on the bench's current-thread tokio
//! runtime: one thread, as the thread worker runs its one handler thread,
//! and what a program that runs its worker on one core builds.
//!
//! `cargo bench --bench nats_drain` (env `TASKQ_BENCH_JOBS`, default 20,000
//! per side and round; `TASKQ_BENCH_ROUNDS`, default 5; `TASKQ_BENCH_NODES`,
//! default 1: one node and an R1 stream, where the client's own cost shows;
//! 3 gives a cluster and an R3 stream). The server runs on CPU 0 and this
//! process on CPU 1 when there are two. Each round fills the queue before
//! each side's drain (not timed) and rotates who goes first; the ratios are
//! medians over rounds.
//!
//! The raw loop is the floor, on one connection: for each batch, the acks it
//! owes (each with a reply subject, each confirmed) and the next
//! `$JS.API.CONSUMER.MSG.NEXT` pull in one write, then every job of the pull
//! and every confirmation read before the next write; with a batch of 1, the
//! ack of the job just done and the pull for the next.
//!
//! The async worker's ratios are to the thread worker at prefetch 64 and to
//! the raw loop with a batch of 64, in the same rounds.
//!
//! Each side is timed from its first job in hand to its last ack confirmed:
//! connecting, looking the stream and the consumer up and starting threads
//! are not draining (with a batch of 64 a round's drain takes about 100 ms,
//! which the worker's setup, a few round trips to the cluster, would
//! otherwise weigh on while the raw loop connects before its clock starts).

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use nats_raw::{env_usize, median, Raw};
use taskq_connect::nats::{ConsumerSpec, NatsConfig, NatsConnection, StreamSpec};
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::NatsCluster;
use taskq_worker::{AsyncJob, AsyncWorker, Config, Job, Outcome, Worker};

#[path = "common/nats_raw.rs"]
mod nats_raw;
#[path = "common/pin.rs"]
mod pin;

const TUBE: &str = "drain";
const CONSUMER: &str = "taskq-drain";
const BATCH: usize = 64;

/// The raw loop: `jobs` jobs, `batch` per pull, every ack confirmed.
fn raw_drain(addr: SocketAddr, jobs: usize, batch: usize) -> Duration {
    let mut r = Raw::connect(addr);
    let pull = format!("{{\"batch\":{batch},\"expires\":1000000000}}");
    let pull = format!(
        "PUB $JS.API.CONSUMER.MSG.NEXT.TASKQ.{CONSUMER} _INBOX.raw.p {}\r\n{pull}\r\n",
        pull.len()
    );
    // The acks of the jobs taken, written with the next pull.
    let mut next = Vec::new();
    let mut acks = 0;
    let mut start = None;
    let mut done = 0;
    while done < jobs {
        let confirms = std::mem::take(&mut acks);
        next.extend_from_slice(pull.as_bytes());
        r.s.write_all(&next).unwrap();
        next.clear();
        let (mut got, mut seen) = (0, 0);
        while got < batch.min(jobs - done) || seen < confirms {
            r.op(|line, _| {
                let mut words = line.split(|&b| b == b' ');
                match (words.next(), words.next()) {
                    (Some(b"MSG"), Some(b"_INBOX.raw.a")) => seen += 1,
                    (_, Some(b"_INBOX.raw.p")) => {
                        panic!("status: {}", String::from_utf8_lossy(line))
                    }
                    // A job (HMSG: it carries its Nats-Msg-Id): the reply
                    // after the sid is its ack subject.
                    (Some(b"MSG" | b"HMSG"), _) => {
                        start.get_or_insert_with(Instant::now);
                        let ack = words.nth(1).expect("an ack subject");
                        next.extend_from_slice(b"PUB ");
                        next.extend_from_slice(ack);
                        next.extend_from_slice(b" _INBOX.raw.a 4\r\n+ACK\r\n");
                        acks += 1;
                        got += 1;
                    }
                    _ => {}
                }
            });
        }
        done += got;
    }
    // The last acks, confirmed.
    r.s.write_all(&next).unwrap();
    for _ in 0..acks {
        r.op(|_, _| ());
    }
    start.expect("a job").elapsed()
}

fn taskq_drain(url: &str, jobs: usize, prefetch: usize) -> Duration {
    let first = std::sync::Arc::new(std::sync::OnceLock::new());
    let first2 = first.clone();
    let worker = Worker::new(
        Config {
            servers: vec![url.to_owned()],
            tubes: vec![TUBE.into()],
            prefetch,
            max_jobs: Some(jobs as u64),
            io_timeout: Duration::from_secs(5),
            ..Config::default()
        },
        move |_job: &mut Job<'_>| {
            first2.get_or_init(Instant::now);
            Outcome::Done
        },
    )
    .unwrap();
    let counts = worker.run();
    let end = Instant::now();
    assert_eq!(counts.deleted, jobs as u64);
    end - *first.get().expect("a job")
}

/// The async worker: `jobs` jobs, `concurrency` in flight on one connection,
/// a no-op handler, on `rt` (the bench's current-thread runtime).
fn async_worker_drain(
    rt: &tokio::runtime::Runtime,
    url: &str,
    jobs: usize,
    concurrency: usize,
) -> Duration {
    let first = std::sync::Arc::new(std::sync::OnceLock::new());
    let first2 = first.clone();
    let worker = AsyncWorker::new(
        Config {
            servers: vec![url.to_owned()],
            tubes: vec![TUBE.into()],
            concurrency,
            max_jobs: Some(jobs as u64),
            io_timeout: Duration::from_secs(5),
            ..Config::default()
        },
        move |_job: AsyncJob| {
            first2.get_or_init(Instant::now);
            async { Outcome::Done }
        },
    )
    .unwrap();
    let counts = rt.block_on(worker.run());
    let end = Instant::now();
    assert_eq!(counts.deleted, jobs as u64);
    end - *first.get().expect("a job")
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
        let mut start = None;
        let mut done = 0;
        while done < jobs {
            let mut msgs = consumer
                .fetch()
                .max_messages(batch.min(jobs - done))
                .messages()
                .await
                .unwrap();
            while let Some(m) = msgs.next().await {
                start.get_or_insert_with(Instant::now);
                m.unwrap().double_ack().await.unwrap();
                done += 1;
            }
        }
        start.expect("a job").elapsed()
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

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let jobs = env_usize("TASKQ_BENCH_JOBS", 20_000) / BATCH * BATCH;
    let rounds = env_usize("TASKQ_BENCH_ROUNDS", 5);
    let nodes = env_usize("TASKQ_BENCH_NODES", 1).clamp(1, 3);
    let cluster = NatsCluster::start(nodes).expect("nats cluster");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinned = cores >= 2
        && cluster.pid(0).is_some_and(|pid| pin::pin(pid, 0))
        && pin::pin(std::process::id(), 1);
    let addr = cluster.addr(0);
    let url = cluster.node_url(0);
    let mut admin = NatsConnection::connect(&[addr.to_string()], NatsConfig::default()).unwrap();
    admin
        .ensure_stream(&StreamSpec {
            name: "TASKQ".into(),
            subjects: vec!["taskq.>".into()],
            replicas: nodes,
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
    println!(
        "{jobs} jobs of 64 B per side and round, {rounds} rounds, R{nodes} stream, {nodes} node(s), through node 0, {}",
        if pinned { "server on CPU 0, bench on CPU 1" } else { "not pinned" }
    );
    for batch in [1, BATCH] {
        let (mut vs_raw, mut vs_async) = (Vec::new(), Vec::new());
        // With a batch of 64, a fourth side: the async worker at concurrency 64.
        let sides = if batch == BATCH { 4 } else { 3 };
        let (mut aw_vs_taskq, mut aw_vs_raw) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut secs = [0f64; 4];
            for k in 0..sides {
                let side = (round + k) % sides;
                fill(&mut p, jobs);
                secs[side] = match side {
                    0 => raw_drain(addr, jobs, batch),
                    1 => taskq_drain(&url, jobs, batch),
                    2 => async_nats_drain(&rt, addr, jobs, batch),
                    _ => async_worker_drain(&rt, &url, jobs, batch),
                }
                .as_secs_f64();
            }
            let rate = |i: usize| jobs as f64 / secs[i];
            let async_worker = if sides == 4 {
                format!("  async worker {:>7.0}/s", rate(3))
            } else {
                String::new()
            };
            println!(
                "batch {batch:>2} round {round}: raw loop {:>7.0}/s  taskq {:>7.0}/s  async-nats {:>7.0}/s{async_worker}",
                rate(0),
                rate(1),
                rate(2)
            );
            vs_raw.push(rate(1) / rate(0));
            vs_async.push(rate(1) / rate(2));
            if sides == 4 {
                aw_vs_taskq.push(rate(3) / rate(1));
                aw_vs_raw.push(rate(3) / rate(0));
            }
        }
        println!(
            "batch {batch:>2}: taskq / raw loop = {:.3}, taskq / async-nats = {:.3} (medians of {rounds} rounds)",
            median(vs_raw),
            median(vs_async)
        );
        if sides == 4 {
            println!(
                "batch {batch:>2}: async worker (concurrency {batch}, current-thread runtime) / taskq prefetch {batch} = {:.3}, async worker / raw loop = {:.3} (medians of {rounds} rounds)",
                median(aw_vs_taskq),
                median(aw_vs_raw)
            );
        }
    }
}
