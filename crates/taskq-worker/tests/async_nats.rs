//! `AsyncWorker` on NATS JetStream, against real nats-server nodes on
//! loopback: throughput at concurrency 1,000 on each tested release, on the
//! worker's two connections and the runtime's threads alone; TLS with a
//! password in the address, which shows nowhere;
//! connection resets at fixed byte counts and a silence through the chaos
//! proxy; a worker
//! killed with SIGKILL; the stream's leader killed under the worker; a job
//! kept past its ack wait by touches; the two stops; weighted tubes;
//! panicking handlers; an oversized job; a consumer paused before any
//! worker ran; a job's headers, tube and attempt; the idle exit. Every count
//! is checked against the stream's and the consumer's own record.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use taskq_connect::nats::{ConsumerInfo, MsgSelect, NatsConnection};
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_proto::nats::{Delivery, NatsError};
use taskq_proto::Limits;
use taskq_testkit::{ChaosProxy, Direction, NatsCluster, Toxic};
use taskq_worker::{
    AsyncJob, AsyncWorker, Backoff, Config, JetStreamConfig, Jitter, Outcome, Snapshot,
};

/// A multi-thread runtime of two workers (the machine has two cores).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A worker on `url` for `tube`, `concurrency` jobs in flight, making the
/// tube's consumer (when it has none) with `ack_wait`; short deadlines and
/// reconnect backoff.
fn cfg(url: &str, tube: &str, concurrency: usize, ack_wait: Duration) -> Config {
    Config {
        servers: vec![url.to_owned()],
        tubes: vec![tube.into()],
        concurrency,
        io_timeout: Duration::from_secs(2),
        reserve_timeout: Duration::from_secs(1),
        reconnect_backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(100),
            jitter: Jitter::Full,
        },
        jetstream: JetStreamConfig {
            ack_wait,
            ..JetStreamConfig::default()
        },
        ..Config::default()
    }
}

/// The ack wait of the tests whose jobs must never come back by themselves.
const LONG: Duration = Duration::from_secs(60);

/// Puts `bodies` on `tube`, 64 to a batch; returns their ids (stream
/// sequences) in order.
fn put_all(c: &NatsCluster, tube: &str, bodies: &[Vec<u8>]) -> Vec<u64> {
    let mut p = Producer::builder()
        .tube(tube)
        .io_timeout(Duration::from_secs(5))
        .connect(c.url())
        .unwrap();
    let mut out = vec![PutOutcome::NotSent; bodies.len()];
    for (chunk, o) in bodies.chunks(64).zip(out.chunks_mut(64)) {
        p.put_batch(chunk, PutOptions::default(), o).unwrap();
    }
    out.iter().map(|o| o.id().unwrap().get()).collect()
}

/// Bodies `0`, `1`, ... `n - 1`.
fn numbered(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{i}").into_bytes()).collect()
}

/// The server's record, read on one admin connection kept across polls
/// (opened again after a failure).
struct Record<'a> {
    c: &'a NatsCluster,
    a: Option<NatsConnection>,
}

impl<'a> Record<'a> {
    fn new(c: &'a NatsCluster) -> Record<'a> {
        Record { c, a: None }
    }

    fn ask<T>(&mut self, f: impl FnOnce(&mut NatsConnection) -> Result<T, NatsError>) -> Option<T> {
        let c = self.c;
        let a = self.a.get_or_insert_with(|| js_admin(c));
        match f(a) {
            Ok(v) => Some(v),
            Err(_) => {
                self.a = None;
                None
            }
        }
    }

    /// Consumer `taskq-TUBE`'s info; `None` while it does not exist.
    fn consumer(&mut self, tube: &str) -> Option<ConsumerInfo> {
        let name = format!("taskq-{tube}");
        self.ask(|a| a.consumer_info("TASKQ", &name))
    }

    /// The stream's messages on each subject.
    fn subjects(&mut self) -> Option<HashMap<String, u64>> {
        self.ask(js_subjects_on)
    }

    /// Tube `tube` is done, by the server's record: its consumer has nothing
    /// left to deliver and nothing awaiting acknowledgment, and the stream
    /// holds nothing on the tube's subject.
    fn tube_done(&mut self, tube: &str) -> bool {
        let Some(ci) = self.consumer(tube) else {
            return false;
        };
        let subject = format!("taskq.{tube}");
        ci.num_pending == 0
            && ci.num_ack_pending == 0
            && self.subjects().is_some_and(|s| !s.contains_key(&subject))
    }
}

/// Runs `worker` on `rt` until `done` holds (polled from this thread), then
/// stops it and returns its counters; bounded by `limit`.
fn run_until_drained(
    rt: &tokio::runtime::Runtime,
    worker: AsyncWorker,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Snapshot {
    let control = worker.control();
    let h = rt.spawn(worker.run());
    let drained = wait_until(limit, &mut done);
    let at_stop = control.counters();
    control.shutdown();
    let counts = rt.block_on(async {
        match tokio::time::timeout(Duration::from_secs(10), h).await {
            Ok(r) => r.unwrap(),
            Err(_) => panic!(
                "no end after a stop; drained {drained}; at the stop {at_stop}; now {}",
                control.counters()
            ),
        }
    });
    assert!(drained, "not drained within {limit:?}: {counts}");
    counts
}

/// Each job's runs, by id (its stream sequence).
type Runs = Arc<Mutex<HashMap<u64, u32>>>;

/// A worker with `config` whose handler notes each job's runs and takes `ms`
/// milliseconds.
fn counted_worker(config: Config, ms: u64) -> (AsyncWorker, Runs) {
    let runs: Runs = Arc::default();
    let r2 = runs.clone();
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        *r2.lock().unwrap().entry(job.id().get()).or_default() += 1;
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Outcome::Done
        }
    })
    .unwrap();
    (worker, runs)
}

/// A cluster of `nodes` nodes of `binary`, or `None` (the test skips, saying
/// why) when that binary is not here.
fn cluster_of(binary: std::io::Result<PathBuf>, nodes: usize) -> Option<NatsCluster> {
    match binary {
        Ok(bin) if bin.is_file() => Some(
            NatsCluster::builder()
                .nodes(nodes)
                .binary(bin)
                .start()
                .expect("the cluster starts"),
        ),
        Ok(bin) => {
            eprintln!("skipped: {} is not installed", bin.display());
            None
        }
        Err(e) => {
            eprintln!("skipped: the current nats-server is not available: {e}");
            None
        }
    }
}

#[test]
fn on_2_9_10_ten_thousand_jobs_of_50_ms_at_concurrency_1000_on_one_connection_and_the_runtimes_threads(
) {
    let _one = heavy();
    log_from_env();
    let debian = Path::new(taskq_testkit::DEBIAN_SERVER).to_path_buf();
    let Some(c) = cluster_of(Ok(debian), 1) else {
        return;
    };
    ten_thousand_jobs_at_1000(&c);
}

#[test]
fn on_a_current_server_ten_thousand_jobs_of_50_ms_at_concurrency_1000_on_one_connection_and_the_runtimes_threads(
) {
    let _one = heavy();
    log_from_env();
    let Some(c) = cluster_of(taskq_testkit::current_server_binary(), 1) else {
        return;
    };
    ten_thousand_jobs_at_1000(&c);
}

/// 10,000 jobs of 50 ms at concurrency 1,000 on server `c`: every job
/// done once by the stream's and the consumer's record, in at most 1.3
/// times the ideal 0.5 s from the first job's start, through at most two
/// connections, on no thread beyond the runtime's two.
///
/// One node, as the beanstalkd test has one server: the bound is on the
/// worker. Three nodes replicating every ack, beside the worker, on this
/// two-core machine measured 1.12-1.48 of the ideal (the cluster's CPU,
/// not the worker's: the same run in release measured alike); the
/// cluster's faults are the leader-kill and reset tests'.
fn ten_thousand_jobs_at_1000(c: &NatsCluster) {
    let tube = "bulk";
    let n = 10_000u64;
    js_setup(c, tube, None);
    put_all(c, tube, &numbered(n as usize));

    let sampling = AtomicBool::new(true);
    // The largest thread count, and each node's largest count of open client
    // connections, seen while the worker runs.
    let peak_threads = AtomicUsize::new(0);
    let peak_open: Vec<AtomicU64> = (0..c.len()).map(|_| AtomicU64::new(0)).collect();
    let (counts, took, before_threads, opened) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut k = 0u32;
            while sampling.load(Ordering::SeqCst) {
                peak_threads.fetch_max(threads(), Ordering::SeqCst);
                if k.is_multiple_of(10) {
                    for (i, peak) in peak_open.iter().enumerate() {
                        peak.fetch_max(open_connections(c, i), Ordering::SeqCst);
                    }
                }
                k += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        let before_threads = threads();
        let total_before: Vec<u64> = (0..c.len()).map(|i| total_connections(c, i)).collect();

        let rt = runtime();
        let first: Arc<OnceLock<Instant>> = Arc::default();
        let f2 = first.clone();
        let config = Config {
            max_jobs: Some(n),
            ..cfg(&c.url(), tube, 1000, LONG)
        };
        let worker = AsyncWorker::new(config, move |_job: AsyncJob| {
            f2.get_or_init(Instant::now);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Outcome::Done
            }
        })
        .unwrap();
        let counts = run_within(&rt, worker.run(), Duration::from_secs(60));
        let took = first.get().expect("a job ran").elapsed();
        sampling.store(false, Ordering::SeqCst);
        let opened: Vec<u64> = (0..c.len())
            .map(|i| total_connections(c, i) - total_before[i])
            .collect();
        drop(rt);
        (counts, took, before_threads, opened)
    });

    let ideal = Duration::from_millis(50) * (n / 1000) as u32;
    let ratio = took.as_secs_f64() / ideal.as_secs_f64();
    let peak_threads = peak_threads.load(Ordering::SeqCst);
    let peak_open: Vec<u64> = peak_open.iter().map(|p| p.load(Ordering::SeqCst)).collect();
    let s = js_admin(c).stream_info("TASKQ").unwrap();
    let ci = js_consumer(c, tube);
    eprintln!(
        "nats-server {:?}: {n} jobs of 50 ms at 1,000: {took:?} from the first job's start ({ratio:.2} of ideal); \
         connections opened per node {opened:?}, open at most {peak_open:?}; threads {before_threads} before, {peak_threads} at most; \
         consumer delivered {}; {counts}",
        nats_version(c),
        ci.delivered
    );
    assert_eq!(counts.deleted, n, "{counts}");
    // The stream's record: n jobs put, every one acked away.
    assert_eq!((s.last_seq, s.messages), (n, 0), "{s:?}");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0), "{ci:?}");
    if counts.reconnects == 0 {
        // Each job delivered once, and taken once.
        assert_eq!(ci.delivered, n, "{ci:?}");
        assert_eq!(counts.reserved, n, "{counts}");
    }
    assert!(
        ratio <= 1.3,
        "{ratio:.2} of the ideal time (load average {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let opened_all: u64 = opened.iter().sum();
    assert!(
        (1..=2).contains(&opened_all),
        "{opened:?} connections opened"
    );
    assert!(
        peak_open.iter().all(|&k| k <= 2),
        "{peak_open:?} open at once"
    );
    assert!(
        peak_threads <= before_threads + 2,
        "{peak_threads} threads: more than the runtime's 2 beyond {before_threads}"
    );
}

#[test]
fn resets_of_replies_at_fixed_byte_counts_lose_nothing_and_counts_equal_the_streams_record() {
    // Each job done took at least 100 bytes of replies (its delivery, whose
    // ack subject alone is over 50 bytes, and its ack's confirmation):
    // 200,000 bytes, cut every 8,000, at least 25 connections. A connection's
    // own setup (INFO, the stream's and the consumer's info) is under 2,500
    // bytes, so each one gets jobs done before its cut.
    resets("resetsd", Direction::Downstream, 8000, 24);
}

#[test]
fn resets_of_requests_at_fixed_byte_counts_lose_nothing_and_counts_equal_the_streams_record() {
    // Each job done took at least 60 bytes of requests (its ack, published to
    // its ack subject with a reply subject): 120,000 bytes, cut every 3,000,
    // at least 40 connections. Their setup (CONNECT, the stream's and the
    // consumer's lookups) is under 1,200 bytes.
    resets("resetsu", Direction::Upstream, 3000, 39);
}

/// 2,000 jobs at concurrency 10 through the chaos proxy to one node, every
/// connection reset once `bytes` bytes went `direction`: wherever the cut
/// falls (a delivery, an ack or its confirmation cut short, jobs held and
/// running), nothing is lost, no job runs twice unless a cut hit it while
/// held, and the worker's `deleted` is the stream's count of jobs acked away.
fn resets(tube: &str, direction: Direction, bytes: u64, min_reconnects: u64) {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let ack_wait = Duration::from_secs(5);
    js_setup(&c, tube, Some(ack_wait));
    let n = 2000u64;
    let ids: HashSet<u64> = put_all(&c, tube, &numbered(n as usize))
        .into_iter()
        .collect();
    let proxy = ChaosProxy::start_seeded(c.addr(0), 7).unwrap();
    proxy.add(Toxic::ResetAfterData { bytes }, direction, 1.0);
    let config = Config {
        io_timeout: Duration::from_secs(1),
        // Once drained and every ack confirmed (an ack a cut left without its
        // confirmation is sent again on the next connection).
        exit_when_idle: Some(Duration::from_secs(2)),
        ..cfg(&format!("nats://{}", proxy.addr()), tube, 10, ack_wait)
    };
    let (worker, runs) = counted_worker(config, 1);
    let control = worker.control();
    let rt = runtime();
    let h = rt.spawn(worker.run());
    let mut rec = Record::new(&c);
    let drained = wait_until(Duration::from_secs(90), || rec.tube_done(tube));
    proxy.clear();
    if !drained {
        control.abort();
    }
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(30));
    let s = js_admin(&c).stream_info("TASKQ").unwrap();
    let ci = js_consumer(&c, tube);
    let floor = js_ack_floor(&c, tube);
    let runs = runs.lock().unwrap();
    let what = format!(
        "{direction:?} every {bytes} bytes, {} reconnects, {} connections through the proxy, consumer delivered {}",
        counts.reconnects,
        proxy.opened(),
        ci.delivered
    );
    assert!(drained, "{what}: not drained: {counts}");
    // The jobs the stream no longer holds: each was acked away once.
    let removed = s.last_seq - s.messages;
    let duplicates = check_ledger(&ids, &runs, &counts, removed, &what);
    assert!(counts.reconnects >= min_reconnects, "{what}: {counts}");
    assert_eq!(
        counts.ack_unknown, 0,
        "{what}: every ack confirmed, sent again if need be"
    );
    assert_eq!((s.last_seq, s.messages), (n, 0), "{what}");
    assert_eq!(counts.deleted, removed, "{what}: {counts}");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0), "{what}");
    assert_eq!(floor, n, "{what}: the ack floor is the last job");
    // Every run was a delivery.
    let total_runs = n + duplicates;
    assert!(
        ci.delivered >= total_runs && ci.delivered >= counts.reserved,
        "{what}: {counts}"
    );
}

/// Replies stop coming through the proxy (on the worker's connection and on
/// every one it opens until the silence ends) while jobs are delivered, run
/// and acked: the worker notices by its reply deadline alone (the oldest
/// ack confirmation or pull owed), closes the connection, and once replies
/// flow again does every job, each ack confirmed, nothing lost and the
/// counts those of the stream's own record. Deliveries the silence swallowed
/// come back after the ack wait.
#[test]
fn silence_is_a_broken_connection_detected_by_the_reply_deadline_then_work_resumes() {
    let _one = heavy();
    log_from_env();
    let tube = "silence";
    let c = NatsCluster::start(1).unwrap();
    let ack_wait = Duration::from_secs(5);
    js_setup(&c, tube, Some(ack_wait));
    let n = 400u64;
    let ids: HashSet<u64> = put_all(&c, tube, &numbered(n as usize))
        .into_iter()
        .collect();
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let config = Config {
        io_timeout: Duration::from_secs(1),
        ..cfg(&format!("nats://{}", proxy.addr()), tube, 10, ack_wait)
    };
    let (worker, runs) = counted_worker(config, 5);
    let control = worker.control();
    let rt = runtime();
    let h = rt.spawn(worker.run());
    assert!(
        wait_until(Duration::from_secs(20), || control.counters().deleted >= 50),
        "{}",
        control.counters()
    );
    let detected = silence_until_detected(&proxy, || control.counters());
    proxy.clear();
    // The deadline of a waiting pull is the longest: the reserve slice (1 s)
    // plus the I/O timeout (1 s); an ack's confirmation is due within 1 s.
    assert!(detected <= Duration::from_millis(3000), "{detected:?}");
    let mut rec = Record::new(&c);
    let drained = wait_until(Duration::from_secs(60), || rec.tube_done(tube));
    control.shutdown();
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(30));
    let s = js_admin(&c).stream_info("TASKQ").unwrap();
    let runs = runs.lock().unwrap();
    let what = format!(
        "silence detected after {detected:?}, {} connections through the proxy",
        proxy.opened()
    );
    assert!(drained, "{what}: not drained: {counts}");
    let removed = s.last_seq - s.messages;
    check_ledger(&ids, &runs, &counts, removed, &what);
    assert!(
        counts.io_timeouts >= 1 && counts.reconnects >= 1,
        "{what}: {counts}"
    );
    assert_eq!(
        counts.ack_unknown, 0,
        "{what}: every ack confirmed: {counts}"
    );
    assert_eq!((s.last_seq, s.messages), (n, 0), "{what}");
    assert_eq!(counts.deleted, n, "{what}: {counts}");
}

/// Set in the child process of the kill -9 test: the cluster's address.
const CHILD: &str = "TASKQ_ASYNC_NATS_CHILD";
/// The ack wait the child's worker makes the consumer with.
const KILL_ACK_WAIT: Duration = Duration::from_secs(2);

#[test]
fn kill_9_mid_run_the_jobs_come_back_after_the_ack_wait_and_a_second_worker_does_them() {
    let tube = "kill9";
    if let Ok(url) = std::env::var(CHILD) {
        // The child: a worker whose handlers hold their jobs until killed.
        let worker = AsyncWorker::new(cfg(&url, tube, 8, KILL_ACK_WAIT), |_job: AsyncJob| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Outcome::Done
        })
        .unwrap();
        runtime().block_on(worker.run());
        return;
    }
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    // The stream alone: the child's worker makes the consumer, with its ack wait.
    js_setup(&c, tube, None);
    let ids = put_all(&c, tube, &numbered(20));
    let spawned = Instant::now();
    let mut child = KillOnDrop(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "kill_9_mid_run_the_jobs_come_back_after_the_ack_wait_and_a_second_worker_does_them",
                "--test-threads=1",
            ])
            .env(CHILD, c.url())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut rec = Record::new(&c);
    let held = wait_until(Duration::from_secs(15), || {
        rec.consumer(tube)
            .is_some_and(|ci| (ci.num_ack_pending, ci.num_pending) == (8, 12))
    });
    child.kill_9();
    assert!(
        held,
        "the child never held 8 jobs: {:?}",
        rec.consumer(tube)
    );
    let ci = js_consumer(&c, tube);
    assert_eq!(ci.ack_wait, KILL_ACK_WAIT, "made by the child's worker");
    assert_eq!((ci.delivered, ci.num_ack_pending), (8, 8), "{ci:?}");

    // A second worker: JetStream does not take the jobs back when the
    // connection closes; they come back when their ack wait ends.
    let ran: Arc<Mutex<HashMap<u64, Vec<Instant>>>> = Arc::default();
    let r2 = ran.clone();
    let worker = AsyncWorker::new(cfg(&c.url(), tube, 10, LONG), move |job: AsyncJob| {
        r2.lock()
            .unwrap()
            .entry(job.id().get())
            .or_default()
            .push(Instant::now());
        async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let counts = run_until_drained(&rt, worker, Duration::from_secs(20), || rec.tube_done(tube));
    let ran = ran.lock().unwrap();
    let ci = js_consumer(&c, tube);
    eprintln!(
        "the child's 8 jobs redone {:?} after it started; {counts}",
        ids[..8]
            .iter()
            .filter_map(|id| ran.get(id).map(|t| t[0] - spawned))
            .max()
    );
    assert_eq!((counts.deleted, counts.reserved), (20, 20), "{counts}");
    // Each job ran once here: the child's 8 never finished there.
    assert!(
        ids.iter().all(|id| ran.get(id).map(Vec::len) == Some(1)),
        "{ran:?}"
    );
    // The child's pulls took the first 8 in the stream's order; they came
    // back no sooner than their ack wait after the child could take them.
    for id in &ids[..8] {
        let back = ran[id][0] - spawned;
        assert!(back >= KILL_ACK_WAIT, "job {id} back after {back:?}");
    }
    assert_eq!(ci.delivered, 28, "20 here, 8 to the child: {ci:?}");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

/// A producer thread puts 3,000 jobs over about 10 s on a 3-node cluster of
/// the current release while the worker (16 in flight) drains them; after
/// 300 are done the stream's leader, leading the consumer too, is killed
/// with SIGKILL and restarted 3 s later. The worker rides the election out,
/// sends again every ack the election left unconfirmed, and exits by itself
/// once nothing is left: every acknowledged put done, nothing left on the
/// stream or the consumer. (Both releases behave alike here: run once, on
/// the current one.)
#[test]
fn on_a_current_server_the_stream_leader_killed_under_the_worker_loses_no_acknowledged_put() {
    let _one = heavy();
    log_from_env();
    let Some(mut c) = cluster_of(taskq_testkit::current_server_binary(), 3) else {
        return;
    };
    let tube = "elect";
    js_setup(&c, tube, None);
    let n = 3000;
    let bodies: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("job-{i}\r\n\0").into_bytes())
        .collect();
    let runs = SharedRuns::default();
    let config = Config {
        concurrency: 16,
        // Outlasts the election (4 to 9 s) and the reconnects: no ack may end unknown.
        jetstream: JetStreamConfig {
            ack_wait: Duration::from_secs(20),
            ..JetStreamConfig::default()
        },
        ..js_cfg(&c.url(), tube)
    };
    let r2 = runs.clone();
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        let mut r = r2.lock().unwrap();
        *r.count.entry(job.body().to_vec()).or_default() += 1;
        r.times.push(Instant::now());
        async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let started = Instant::now();
    let h = rt.spawn(worker.run());
    let p = {
        let (url, bodies) = (c.url(), bodies.clone());
        std::thread::spawn(move || produce(&url, tube, &bodies, Duration::from_millis(3)))
    };
    assert!(wait_until(Duration::from_secs(30), || runs_done(&runs) >= 300));
    let (leader, consumer_leader, meta) =
        place_consumer_leader(&c, &format!("taskq-{tube}"), |s, k, _| s == k);
    let done_at_kill = runs_done(&runs);
    let killed = Instant::now();
    c.kill(leader).unwrap();
    let mut restarted = false;
    let mut elected = None;
    while elected.is_none() && killed.elapsed() < Duration::from_secs(30) {
        if !restarted && killed.elapsed() >= Duration::from_secs(3) {
            c.restart(leader).unwrap();
            restarted = true;
        }
        // The survivors name the dead leader for a while; once it is back it
        // may win again.
        if c.stream_leader("TASKQ")
            .is_some_and(|l| l != leader || restarted)
        {
            elected = Some(killed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !restarted {
        std::thread::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed()));
        c.restart(leader).unwrap();
    }
    let produced = p.join().unwrap();
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(150));
    let runs = runs.lock().unwrap();
    let duplicates: u64 = runs.count.values().map(|&k| u64::from(k - 1)).sum();
    let lost: Vec<String> = produced
        .acked
        .iter()
        .filter(|b| !runs.count.contains_key(*b))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let s = js_admin(&c).stream_info("TASKQ").unwrap();
    let ci = js_consumer(&c, tube);
    eprintln!(
        "nats-server {:?}: killed n{} (stream leader; consumer leader n{}, meta leader n{}) after {done_at_kill} jobs; \
         a new stream leader after {elected:?}; {} puts acked, {} failed; lost {}, duplicates {duplicates}; \
         worker ran {:?}: {counts}",
        nats_version(&c),
        leader + 1,
        consumer_leader + 1,
        meta + 1,
        produced.acked.len(),
        produced.failed,
        lost.len(),
        started.elapsed(),
    );
    assert!(elected.is_some(), "no new stream leader within 30 s");
    assert!(
        done_at_kill < produced.acked.len(),
        "the kill came with jobs left to do"
    );
    assert!(
        lost.is_empty(),
        "lost {}, first {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let put: HashSet<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    assert!(
        runs.count.keys().all(|b| put.contains(b.as_slice())),
        "a body that was never put"
    );
    assert_eq!(
        counts.ack_unknown, 0,
        "every ack confirmed within the ack wait, sent again if need be: {counts}"
    );
    assert!(
        duplicates <= counts.lease_dropped + counts.reconnects,
        "{duplicates} duplicates beyond the faults: {counts}"
    );
    // The stream's and the consumer's record: nothing left.
    assert_eq!(s.messages, 0, "nothing left in the stream: {s:?}");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0), "{ci:?}");
}

#[test]
fn a_job_three_times_its_ack_wait_is_kept_by_touches() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "touch";
    let ack_wait = Duration::from_secs(2);
    js_setup(&c, tube, None);
    put_all(&c, tube, &[b"long".to_vec()]);
    let touches = Arc::new(AtomicU64::new(0));
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (t2, a2) = (touches.clone(), attempts.clone());
    // Two slots: a redelivery would find the second one free.
    let worker = AsyncWorker::new(cfg(&c.url(), tube, 2, ack_wait), move |job: AsyncJob| {
        a2.lock().unwrap().push(job.attempt());
        let t2 = t2.clone();
        async move {
            let end = Instant::now() + 3 * ack_wait;
            while Instant::now() < end {
                tokio::time::sleep(ack_wait / 3).await;
                job.touch().await.expect("touch");
                t2.fetch_add(1, Ordering::SeqCst);
            }
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let mut rec = Record::new(&c);
    let counts = run_until_drained(&rt, worker, Duration::from_secs(30), || rec.tube_done(tube));
    let ci = js_consumer(&c, tube);
    eprintln!("a 6 s job under a 2 s ack wait: {counts}; consumer {ci:?}");
    assert_eq!(
        *attempts.lock().unwrap(),
        [1],
        "run once, its first attempt"
    );
    assert_eq!((counts.deleted, counts.reserved), (1, 1), "{counts}");
    assert!(counts.touched >= 8, "{counts}");
    assert_eq!(counts.touched, touches.load(Ordering::SeqCst));
    assert_eq!(
        counts.lost_lease + counts.lost_lease_on_release + counts.lease_dropped,
        0,
        "{counts}"
    );
    // The consumer's record: made with the worker's ack wait, delivered once.
    assert_eq!(ci.ack_wait, ack_wait);
    assert_eq!(
        (ci.delivered, ci.num_redelivered, ci.num_ack_pending),
        (1, 0, 0),
        "{ci:?}"
    );
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

/// `prefetch` beyond `concurrency` on JetStream: one handler, a window of
/// 8. While the first job runs twice the 2 s ack wait (touched by its
/// handler), the other seven are pulled and held, their leases kept by the
/// worker's `+WPI`s; then each runs in turn, one at a time, none delivered
/// again.
#[test]
fn with_prefetch_one_handler_holds_a_window_and_keeps_the_waiting_jobs_leases() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "window";
    let ack_wait = Duration::from_secs(2);
    js_setup(&c, tube, None);
    put_all(&c, tube, &numbered(8));
    let overlap = Arc::new(Overlap::default());
    let o2 = overlap.clone();
    let config = Config {
        prefetch: 8,
        ..cfg(&c.url(), tube, 1, ack_wait)
    };
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        let o2 = o2.clone();
        async move {
            o2.enter();
            if job.body() == b"0" {
                for _ in 0..6 {
                    tokio::time::sleep(ack_wait / 3).await;
                    job.touch().await.expect("touch");
                }
            }
            o2.leave();
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let mut rec = Record::new(&c);
    let mut window = 0;
    let counts = run_until_drained(&rt, worker, Duration::from_secs(30), || {
        if let Some(ci) = rec.consumer(tube) {
            window = window.max(ci.num_ack_pending);
        }
        rec.tube_done(tube)
    });
    let ci = js_consumer(&c, tube);
    eprintln!("{counts}; consumer {ci:?}");
    assert_eq!(window, 8, "the whole window out at once: {counts}");
    assert_eq!(overlap.most(), 1, "one handler at a time");
    assert_eq!((counts.reserved, counts.deleted), (8, 8), "{counts}");
    assert_eq!(
        (ci.delivered, ci.num_redelivered, ci.num_ack_pending),
        (8, 0, 0),
        "no lease ran out: {ci:?}"
    );
    assert!(counts.touched >= 6 + 7, "{counts}");
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn a_first_stop_takes_nothing_more_and_lets_running_jobs_finish() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "stop1";
    js_setup(&c, tube, None);
    put_all(&c, tube, &numbered(20));
    let started: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let ended = Arc::new(AtomicU64::new(0));
    let (s, e) = (started.clone(), ended.clone());
    let worker = AsyncWorker::new(cfg(&c.url(), tube, 4, LONG), move |_job: AsyncJob| {
        s.lock().unwrap().push(Instant::now());
        let e = e.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            e.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let h = {
        let (stop, at) = (stop.clone(), stopped_at.clone());
        rt.spawn(worker.run_until(async move {
            stop.notified().await;
            *at.lock().unwrap() = Some(Instant::now());
        }))
    };
    assert!(wait_until(Duration::from_secs(10), || started
        .lock()
        .unwrap()
        .len()
        == 4));
    stop.notify_one();
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(5));
    let at = stopped_at.lock().unwrap().unwrap();
    let started = started.lock().unwrap();
    assert_eq!(started.len(), 4, "no job started after the stop");
    assert!(started.iter().all(|&t| t < at));
    assert_eq!(ended.load(Ordering::SeqCst), 4, "the running jobs finished");
    assert_eq!(counts.deleted, 4, "{counts}");
    // The stream's record: the 4 acked away, 16 left, none held.
    let subjects = js_subjects(&c);
    assert_eq!(subjects.get("taskq.stop1"), Some(&16), "{subjects:?}");
    assert_eq!(js_consumer(&c, tube).num_ack_pending, 0);
}

#[test]
fn a_second_stop_gives_running_jobs_back_at_once() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "stop2";
    js_setup(&c, tube, None);
    put_all(&c, tube, &numbered(20));
    let started = Arc::new(AtomicU64::new(0));
    let s = started.clone();
    let worker = AsyncWorker::new(cfg(&c.url(), tube, 4, LONG), move |_job: AsyncJob| {
        s.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Outcome::Done
        }
    })
    .unwrap();
    let control = worker.control();
    let rt = runtime();
    let h = rt.spawn(worker.run());
    assert!(wait_until(Duration::from_secs(10), || started
        .load(Ordering::SeqCst)
        == 4));
    control.shutdown();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        js_consumer(&c, tube).num_ack_pending,
        4,
        "the first stop waits"
    );
    let t = Instant::now();
    control.abort();
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(5));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!((counts.deleted, counts.released), (0, 4), "{counts}");
    assert_eq!(started.load(Ordering::SeqCst), 4);
    // Nothing acked; the 4 given back with a NAK. The consumer counts a
    // NAKed delivery as awaiting acknowledgment until it is delivered again:
    // what shows it was given back, not left to its 60 s ack wait, is that
    // it comes back at once.
    let ci = js_consumer(&c, tube);
    assert_eq!((ci.delivered, ci.num_pending), (4, 16), "{ci:?}");
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 20);
    let given_back = Instant::now();
    let (worker, runs) = counted_worker(cfg(&c.url(), tube, 10, LONG), 1);
    let mut rec = Record::new(&c);
    let counts = run_until_drained(&rt, worker, Duration::from_secs(10), || rec.tube_done(tube));
    eprintln!(
        "a second worker did all 20 {:?} after the abort: {counts}",
        given_back.elapsed()
    );
    assert_eq!(counts.deleted, 20, "{counts}");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 20);
    assert!(runs.values().all(|&k| k == 1), "{runs:?}");
    let ci = js_consumer(&c, tube);
    assert_eq!(
        ci.delivered, 24,
        "the 4 delivered again, the 16 once: {ci:?}"
    );
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
}

#[test]
fn weighted_tubes_four_to_one_give_standard_its_share_on_one_connection() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    js_setup(&c, "vip", None);
    put_all(&c, "vip", &numbered(1000));
    put_all(&c, "standard", &numbered(1000));
    let mut config = Config {
        max_jobs: Some(1000),
        ..cfg(&c.url(), "vip", 10, LONG)
    };
    config.set_tubes(&["vip:4", "standard:1"]).unwrap();
    let tubes: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let t2 = tubes.clone();
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        *t2.lock().unwrap().entry(job.tube().to_owned()).or_default() += 1;
        async { Outcome::Done }
    })
    .unwrap();
    let rt = runtime();
    let counts = run_within(&rt, worker.run(), Duration::from_secs(60));
    assert_eq!(counts.deleted, 1000, "{counts}");
    let tubes = tubes.lock().unwrap();
    let standard = tubes.get("standard").copied().unwrap_or(0);
    let vip = tubes.get("vip").copied().unwrap_or(0);
    assert_eq!(standard + vip, 1000, "{tubes:?}");
    let share = standard as f64 / 1000.0;
    eprintln!("standard's share {share:.3}: {tubes:?}");
    assert!(
        (0.15..=0.25).contains(&share),
        "standard's share {share}: {tubes:?}"
    );
    // The stream's record: what each tube has left is what the handler did not take.
    let left = js_subjects(&c);
    let left_on = |t: &str| left.get(&format!("taskq.{t}")).copied().unwrap_or(0);
    assert_eq!(
        (left_on("vip"), left_on("standard")),
        (1000 - vip, 1000 - standard),
        "{left:?}"
    );
    for t in ["vip", "standard"] {
        assert_eq!(js_consumer(&c, t).num_ack_pending, 0, "{t}");
    }
}

/// The panic hook stays the program's (the worker leaves it alone), but the
/// 60 panics this test makes on purpose are not printed; any other panic is.
fn quiet_poison_panics() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if !msg.starts_with("poison ") {
            hook(info);
        }
    }));
}

#[test]
fn a_panic_in_the_closure_or_its_future_is_a_failed_attempt_and_poison_jobs_are_buried() {
    let _one = heavy();
    log_from_env();
    quiet_poison_panics();
    let c = NatsCluster::start(1).unwrap();
    let tube = "poison";
    js_setup(&c, tube, None);
    let n = 2000;
    let bodies = numbered(n);
    put_all(&c, tube, &bodies);
    let poison: HashSet<Vec<u8>> = (0..n)
        .filter(|i| i.is_multiple_of(100))
        .map(|i| bodies[i].clone())
        .collect();
    let concurrency = 8;
    let config = Config {
        max_attempts: 3,
        retry_backoff: Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            jitter: Jitter::None,
        },
        ..cfg(&c.url(), tube, concurrency, LONG)
    };
    let panics = Arc::new(AtomicU64::new(0));
    let done_good = Arc::new(AtomicU64::new(0));
    // The last jobs, put once every poison job is buried: how many are
    // running, and whether each saw all the slots hold one at once.
    let arrived = Arc::new(AtomicUsize::new(0));
    let met: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (p, dg, ar, m) = (
        panics.clone(),
        done_good.clone(),
        arrived.clone(),
        met.clone(),
    );
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        let body = String::from_utf8_lossy(job.body()).into_owned();
        // None for the last jobs.
        let i: Option<usize> = body.parse().ok();
        if i.is_some_and(|i| i.is_multiple_of(200)) {
            // In the closure itself.
            p.fetch_add(1, Ordering::SeqCst);
            panic!("poison {body} in the closure");
        }
        let (p, dg, ar, m) = (p.clone(), dg.clone(), ar.clone(), m.clone());
        async move {
            let Some(i) = i else {
                // Waits (20 s at most) until every slot holds one of the last jobs.
                let all = rendezvous(&ar, concurrency, Duration::from_secs(20)).await;
                m.lock().unwrap().push(all);
                return Outcome::Done;
            };
            tokio::time::sleep(Duration::from_millis(2)).await;
            if i.is_multiple_of(100) {
                // In the future, after an await.
                p.fetch_add(1, Ordering::SeqCst);
                panic!("poison {i} in the future");
            }
            dg.fetch_add(1, Ordering::SeqCst);
            Outcome::Done
        }
    })
    .unwrap();
    let control = worker.control();
    let rt = runtime();
    let h = rt.spawn(worker.run());
    // Every good job acked away and every poison job buried, by the stream's
    // record: the last panic is behind.
    let mut rec = Record::new(&c);
    let settled = wait_until(Duration::from_secs(60), || {
        rec.subjects().is_some_and(|s| {
            !s.contains_key("taskq.poison") && s.get("taskq.poison.buried") == Some(&20)
        }) && rec.consumer(tube).is_some_and(|ci| ci.num_ack_pending == 0)
    });
    let panics_before_last = panics.load(Ordering::SeqCst);
    // Then one job per slot: all must run at once.
    let last: Vec<Vec<u8>> = (0..concurrency)
        .map(|k| format!("last-{k}").into_bytes())
        .collect();
    if settled {
        put_all(&c, tube, &last);
    }
    let counts = end_panic_run(
        (&rt, h),
        &control,
        settled,
        [panics_before_last, panics.load(Ordering::SeqCst)],
        &met,
        &done_good,
        concurrency,
    );
    assert_eq!((counts.released, counts.buried), (40, 20), "{counts}");
    // The stream's record: the poison jobs' copies on the buried subject,
    // byte-exact, nothing else; each poison job delivered three times.
    let subjects = js_subjects(&c);
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects.get("taskq.poison.buried"), Some(&20));
    let mut ad = js_admin(&c);
    let mut buried = HashSet::new();
    let mut seq = 1;
    while let Ok(m) = ad.msg_get(
        "TASKQ",
        MsgSelect::NextBySubject {
            subject: "taskq.poison.buried",
            seq,
        },
    ) {
        buried.insert(m.data.clone());
        seq = m.seq + 1;
    }
    assert_eq!(buried, poison);
    let ci = js_consumer(&c, tube);
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
    assert_eq!(ci.delivered, 1980 + concurrency as u64 + 60, "{ci:?}");
    assert_eq!(counts.reserved, ci.delivered, "{counts}");
}

#[test]
fn a_job_over_the_limit_is_terminated_once_and_the_small_ones_are_done() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "big";
    js_setup(&c, tube, None);
    // Under the server's max_payload (1 MiB), over the worker's limit.
    let mut p = Producer::builder()
        .tube(tube)
        .max_job_size(1 << 20)
        .connect(c.url())
        .unwrap();
    let big = p
        .put(&vec![7u8; 200_000], PutOptions::default())
        .unwrap()
        .get();
    let small = numbered(5);
    for b in &small {
        p.put(b, PutOptions::default()).unwrap();
    }
    // Each run's job id and body.
    type Ran = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
    let ran: Ran = Arc::default();
    let r = ran.clone();
    let config = Config {
        limits: Limits {
            max_job_size: 100_000,
            ..Limits::default()
        },
        ..cfg(&c.url(), tube, 4, LONG)
    };
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        r.lock()
            .unwrap()
            .push((job.id().get(), job.body().to_vec()));
        async { Outcome::Done }
    })
    .unwrap();
    let rt = runtime();
    let mut rec = Record::new(&c);
    let counts = run_until_drained(&rt, worker, Duration::from_secs(15), || rec.tube_done(tube));
    assert_eq!(
        (counts.too_big, counts.buried, counts.deleted),
        (1, 1, 5),
        "{counts}"
    );
    let ran = ran.lock().unwrap();
    assert!(ran.iter().all(|(id, _)| *id != big), "never run");
    let mut bodies: Vec<Vec<u8>> = ran.iter().map(|(_, b)| b.clone()).collect();
    bodies.sort();
    assert_eq!(bodies, small, "each small job done once");
    // Terminated: delivered once, not redelivered, not copied, gone.
    let ci = js_consumer(&c, tube);
    assert_eq!(
        (ci.delivered, ci.num_pending, ci.num_ack_pending),
        (6, 0, 0),
        "{ci:?}"
    );
    let mut ad = js_admin(&c);
    assert_eq!(ad.stream_info("TASKQ").unwrap().messages, 0);
    assert!(ad.msg_get("TASKQ", MsgSelect::Seq(big)).is_err());
}

#[test]
fn a_job_near_max_payload_is_buried_whole_though_its_copy_is_read_in_base64() {
    // JetStream's API hands a stored message back in base64 inside JSON,
    // a third larger than the message: a job of 900 kB is a reply of
    // 1.2 MB on a server whose max_payload is 1 MiB. The bury copy reads
    // it so.
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "near";
    js_setup(&c, tube, None);
    let body: Vec<u8> = (0..900_000u32).map(|i| (i % 251) as u8).collect();
    let mut p = Producer::builder()
        .tube(tube)
        .max_job_size(1 << 20)
        .connect(c.url())
        .unwrap();
    let id = p.put(&body, PutOptions::default()).unwrap().get();
    let config = Config {
        limits: Limits {
            max_job_size: 1 << 20,
            ..Limits::default()
        },
        max_attempts: 1,
        ..cfg(&c.url(), tube, 1, LONG)
    };
    let worker = AsyncWorker::new(config, |_job: AsyncJob| async { Outcome::Fail }).unwrap();
    let rt = runtime();
    let mut rec = Record::new(&c);
    let buried = format!("taskq.{tube}.buried");
    let counts = run_until_drained(&rt, worker, Duration::from_secs(20), || {
        rec.tube_done(tube) && rec.subjects().is_some_and(|s| s.get(&buried) == Some(&1))
    });
    assert_eq!((counts.buried, counts.deleted), (1, 0), "{counts}");
    // The copy holds the job's body byte for byte (read on a connection
    // that takes such replies, as the worker's own).
    let mut ad = js_admin(&c);
    let copy = ad
        .msg_get(
            "TASKQ",
            MsgSelect::NextBySubject {
                subject: &buried,
                seq: id,
            },
        )
        .unwrap();
    assert!(copy.data == body, "the copy is the job's body");
}

/// `taskq pause --tube TUBE SECS` on `c` (30 s at most): its standard output.
fn taskq_pause(c: &NatsCluster, tube: &str, secs: u32) -> String {
    let out = std::process::Command::new("timeout")
        .arg("30")
        .arg(taskq_cli())
        .args(["pause", "--addr", &c.url(), "--tube", tube])
        .arg(secs.to_string())
        .args(["--io-timeout", "5000"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "taskq pause: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Before any worker has run, on a current server: `taskq pause` creates the
/// tube's consumer paused; an `AsyncWorker` started then takes nothing and
/// leaves the pause as it was while it runs; once the pause ends, the same
/// worker does the jobs.
#[test]
fn on_a_current_server_a_pause_before_any_worker_holds_the_jobs_and_the_worker_keeps_it() {
    let _one = heavy();
    log_from_env();
    let Some(c) = taskq_testkit::current_node() else {
        return;
    };
    let tube = "p";
    put_all(&c, tube, &[b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]);
    assert!(
        js_admin(&c).consumer_info("TASKQ", "taskq-p").is_err(),
        "no consumer yet"
    );
    assert_eq!(taskq_pause(&c, tube, 30), "paused p for 30 s\n");
    let info = js_consumer_json(&c, tube);
    assert_eq!(info["paused"], true, "{info}");
    let until = info["config"]["pause_until"].clone();
    assert!(until.is_string(), "{info}");

    let taken = Arc::new(AtomicU64::new(0));
    let t2 = taken.clone();
    let worker = AsyncWorker::new(cfg(&c.url(), tube, 4, LONG), move |_job: AsyncJob| {
        t2.fetch_add(1, Ordering::SeqCst);
        async { Outcome::Done }
    })
    .unwrap();
    let control = worker.control();
    let rt = runtime();
    let h = rt.spawn(worker.run());
    // Three seconds of the worker's pulls: the pause holds, as it was.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(500));
        let v = js_consumer_json(&c, tube);
        assert_eq!(v["paused"], true, "the worker undid the pause: {v}");
        assert_eq!(v["config"]["pause_until"], until, "the same pause: {v}");
        assert_eq!(v["num_pending"], 3, "{v}");
    }
    let during = control.counters();
    assert_eq!(
        taken.load(Ordering::SeqCst),
        0,
        "a paused consumer's job ran"
    );
    assert_eq!((during.reserved, during.deleted), (0, 0), "{during}");
    // Resumed: the same worker does the three jobs.
    assert_eq!(taskq_pause(&c, tube, 0), "resumed p\n");
    let done = wait_until(Duration::from_secs(10), || control.counters().deleted == 3);
    control.shutdown();
    let counts = run_within(&rt, async { h.await.unwrap() }, Duration::from_secs(10));
    assert!(done, "not done once resumed: {counts}");
    assert_eq!((counts.deleted, taken.load(Ordering::SeqCst)), (3, 3));
    let ci = js_consumer(&c, tube);
    assert_eq!(
        (ci.num_pending, ci.num_ack_pending, ci.delivered),
        (0, 0, 3)
    );
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

/// What the handler of the headers test saw of each run: body, tube,
/// attempt, and the `Trace-Id`, `Tenant` and `Nats-Msg-Id` headers.
type Told = Vec<(Vec<u8>, String, u32, [Option<Vec<u8>>; 3])>;

#[test]
fn a_handler_is_told_the_headers_the_tube_and_the_attempt_on_a_redelivery() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    js_setup(&c, "a", None);
    // Job x on tube b, published by another client with headers of its own.
    js_admin(&c)
        .publish_with(
            "taskq.b",
            b"m-x",
            &[(b"Trace-Id", b"t-42"), (b"Tenant", b"acme")],
            b"x",
        )
        .unwrap();
    // Job y on tube a, put by taskq's producer: its own Nats-Msg-Id only.
    put_all(&c, "a", &[b"y".to_vec()]);
    let told: Arc<Mutex<Told>> = Arc::default();
    let t2 = told.clone();
    // What each run's `stats()` said: (body, reserves).
    type Reserves = Arc<Mutex<Vec<(Vec<u8>, u64)>>>;
    let stats: Reserves = Arc::default();
    let s2 = stats.clone();
    let config = Config {
        tubes: vec!["a".into(), "b".into()],
        max_attempts: 3,
        retry_backoff: Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            jitter: Jitter::None,
        },
        max_jobs: Some(2),
        ..cfg(&c.url(), "a", 2, LONG)
    };
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        let h = job.headers();
        let header = |name: &[u8]| h.and_then(|h| h.get(name)).map(<[u8]>::to_vec);
        let seen = [
            header(b"Trace-Id"),
            header(b"Tenant"),
            header(b"Nats-Msg-Id"),
        ];
        let mut told = t2.lock().unwrap();
        let first = !told.iter().any(|r| r.0 == job.body());
        told.push((
            job.body().to_vec(),
            job.tube().to_owned(),
            job.attempt(),
            seen,
        ));
        let outcome = match (job.body(), first) {
            // A failed attempt: the next run is attempt 2.
            (b"x", true) => Outcome::Fail,
            // Given back: not an attempt (Config::max_attempts counts failures).
            (b"y", true) => Outcome::Retry {
                delay: Duration::ZERO,
            },
            _ => Outcome::Done,
        };
        let s2 = s2.clone();
        async move {
            // From the delivery, without a request.
            let reserves = job.stats().await.expect("the job is held").reserves;
            s2.lock().unwrap().push((job.body().to_vec(), reserves));
            outcome
        }
    })
    .unwrap();
    let rt = runtime();
    let counts = run_within(&rt, worker.run(), Duration::from_secs(30));
    assert_eq!((counts.deleted, counts.released), (2, 2), "{counts}");
    let mut stats = stats.lock().unwrap().clone();
    stats.sort();
    assert_eq!(
        stats,
        [
            (b"x".to_vec(), 1),
            (b"x".to_vec(), 2),
            (b"y".to_vec(), 1),
            (b"y".to_vec(), 2)
        ],
        "each run's stats() counts its delivery"
    );
    let mut told = told.lock().unwrap().clone();
    told.sort();
    let x = [
        Some(b"t-42".to_vec()),
        Some(b"acme".to_vec()),
        Some(b"m-x".to_vec()),
    ];
    assert_eq!(
        told[..2],
        [
            (b"x".to_vec(), "b".to_owned(), 1, x.clone()),
            (b"x".to_vec(), "b".to_owned(), 2, x),
        ]
    );
    assert_eq!(told.len(), 4, "{told:?}");
    let y_id = told[2].3[2].clone();
    assert!(y_id.as_ref().is_some_and(|v| !v.is_empty()), "{told:?}");
    let y = [None, None, y_id];
    assert_eq!(
        told[2..],
        [
            (b"y".to_vec(), "a".to_owned(), 1, y.clone()),
            (b"y".to_vec(), "a".to_owned(), 1, y),
        ]
    );
    // Each delivered twice, by the consumers' record; nothing left.
    for t in ["a", "b"] {
        let ci = js_consumer(&c, t);
        assert_eq!(
            (ci.delivered, ci.num_pending, ci.num_ack_pending),
            (2, 0, 0),
            "{t}: {ci:?}"
        );
    }
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn an_idle_worker_exits_once_the_queue_is_empty_and_nothing_is_ack_pending() {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let tube = "idle";
    let ack_wait = Duration::from_secs(5);
    js_setup(&c, tube, Some(ack_wait));
    let ids = put_all(&c, tube, &numbered(50));
    // Another client takes the first job and never acks it: the worker's
    // pulls find the tube empty long before its ack wait gives it back.
    let mut a = js_admin(&c);
    let pulled = Instant::now();
    a.pull("TASKQ", "taskq-idle", 1, Duration::from_secs(1), None)
        .unwrap();
    assert!(matches!(a.next_delivery().unwrap(), Delivery::Msg { .. }));
    // Each job's runs, by id: when each started and ended.
    type Spans = Arc<Mutex<HashMap<u64, Vec<(Instant, Instant)>>>>;
    let runs: Spans = Arc::default();
    let r2 = runs.clone();
    let config = Config {
        exit_when_idle: Some(Duration::from_millis(300)),
        ..cfg(&c.url(), tube, 8, ack_wait)
    };
    let worker = AsyncWorker::new(config, move |job: AsyncJob| {
        let (r2, id, start) = (r2.clone(), job.id().get(), Instant::now());
        async move {
            // Longer than the idle spell: a running job is not idle time.
            tokio::time::sleep(Duration::from_millis(400)).await;
            r2.lock()
                .unwrap()
                .entry(id)
                .or_default()
                .push((start, Instant::now()));
            Outcome::Done
        }
    })
    .unwrap();
    let rt = runtime();
    let t = Instant::now();
    let counts = run_within(&rt, worker.run(), Duration::from_secs(30));
    let exited = Instant::now();
    let took = t.elapsed();
    let runs = runs.lock().unwrap();
    let held = runs.get(&ids[0]).cloned().unwrap_or_default();
    eprintln!(
        "exited {took:?} after starting; the held job ran {:?} after it was pulled; {counts}",
        held.first().map(|r| r.0 - pulled)
    );
    assert_eq!(counts.deleted, 50, "{counts}");
    assert!(runs.values().all(|r| r.len() == 1), "each job once");
    assert_eq!(held.len(), 1, "the held job came back and was done");
    // It came back when its ack wait ended, and the worker waited for it.
    assert!(held[0].0 - pulled >= ack_wait);
    assert!(exited >= held[0].1);
    // Its ack wait, the job, then an empty pull and the idle spell.
    assert!(took < Duration::from_secs(12), "{took:?}");
    let ci = js_consumer(&c, tube);
    assert_eq!(
        (ci.delivered, ci.num_pending, ci.num_ack_pending),
        (51, 0, 0),
        "{ci:?}"
    );
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

/// A `Write` into a shared buffer: the captured log.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Runs `f` on a current-thread runtime (every task of the worker on this
/// thread) with every log event, down to trace, written to `log`.
fn logged<T>(log: &Captured, f: impl std::future::Future<Output = T>) -> T {
    let log = log.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || log.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(sub, || rt.block_on(f))
}

#[test]
fn over_tls_with_a_password_in_the_address_jobs_are_done_and_no_secret_shows() {
    let _one = heavy();
    let pki = |n: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../taskq-producer/tests/tls")
            .join(n)
    };
    let c = NatsCluster::builder()
        .config(format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\n\
             authorization {{ users = [ {{ user: alice, password: \"s3cret-pw\" }} ] }}",
            pki("server.pem").display(),
            pki("server-key.pem").display()
        ))
        .start()
        .unwrap();
    let host = c.addr(0).to_string();
    let access = taskq_worker::NatsAccess {
        tls: taskq_worker::TlsSettings {
            ca_file: Some(pki("ca.pem")),
            ..taskq_worker::TlsSettings::default()
        },
        ..taskq_worker::NatsAccess::default()
    };
    let mut p = Producer::builder()
        .nats_access(access.clone())
        .connect(format!("tls://alice:s3cret-pw@{host}").as_str())
        .unwrap();
    for i in 0..20 {
        p.put(format!("sealed {i}").as_bytes(), PutOptions::default())
            .unwrap();
    }
    let worker_cfg = |password: &str| Config {
        servers: vec![format!("tls://alice:{password}@{host}")],
        concurrency: 8,
        max_jobs: Some(20),
        io_timeout: Duration::from_secs(2),
        reconnect_backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
            jitter: Jitter::Full,
        },
        jetstream: JetStreamConfig {
            access: access.clone(),
            ..JetStreamConfig::default()
        },
        ..Config::default()
    };
    let log = Captured::default();
    let worker = AsyncWorker::new(worker_cfg("s3cret-pw"), |job: AsyncJob| async move {
        assert!(job.body().starts_with(b"sealed"));
        Outcome::Done
    })
    .unwrap();
    let shown = format!("{worker:?}");
    let counts = logged(&log, async {
        tokio::time::timeout(Duration::from_secs(30), worker.run())
            .await
            .expect("the worker ends within 30 s")
    });
    assert_eq!(counts.deleted, 20, "{counts}");
    assert_eq!(
        js_admin_tls(&host, &access)
            .stream_info("TASKQ")
            .unwrap()
            .messages,
        0
    );
    // A wrong password: refused, tried again with the backoff, and shown
    // nowhere either.
    let refused = Captured::default();
    let worker = AsyncWorker::new(worker_cfg("wr0ng-pw"), |_job: AsyncJob| async {
        Outcome::Done
    })
    .unwrap();
    let shown_too = format!("{worker:?}");
    let failed = logged(&refused, async {
        worker
            .run_until(tokio::time::sleep(Duration::from_millis(1500)))
            .await
    });
    assert!(failed.connect_failures >= 1, "{failed}");
    assert_eq!(failed.deleted, 0, "{failed}");
    let logs = (log.text(), refused.text());
    assert!(
        logs.1.contains("cannot connect") && logs.1.contains("Authorization Violation"),
        "the refusal is logged with the server's reason: {}",
        logs.1
    );
    // Nothing of a job was sent: no outcome is unknown.
    assert!(!logs.1.contains("outcome unknown"), "{}", logs.1);
    for text in [
        shown,
        shown_too,
        counts.to_string(),
        failed.to_string(),
        logs.0,
        logs.1,
    ] {
        for secret in ["s3cret-pw", "wr0ng-pw"] {
            assert!(!text.contains(secret), "{secret} shown in: {text}");
        }
    }
}

/// An admin connection over TLS with alice's password.
fn js_admin_tls(host: &str, access: &taskq_worker::NatsAccess) -> NatsConnection {
    let mut a = access.clone();
    a.user = Some(("alice".into(), taskq_worker::Secret::new("s3cret-pw")));
    NatsConnection::connect(
        &[host],
        taskq_connect::nats::NatsConfig {
            access: a,
            ..taskq_connect::nats::NatsConfig::default()
        },
    )
    .unwrap()
}
