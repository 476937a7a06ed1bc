//! No handler and no job can stop a worker, against a real beanstalkd and a
//! real nats-server on loopback: a handler that panics is a failed attempt
//! (retried, then buried) and its thread goes on working.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use taskq_connect::nats::MsgSelect;
use taskq_producer::{Producer, PutOptions};
use taskq_proto::{Backoff, Command as Cmd, Jitter, Reply};
use taskq_testkit::{Beanstalkd, NatsCluster};
use taskq_worker::{Config, JetStreamConfig, Job, Outcome, Snapshot, Worker};

/// Jobs, threads, and one job in how many panicking, for the panic tests.
const JOBS: usize = 2_000;
const THREADS: usize = 8;
const POISON_EVERY: usize = 100;
const MAX_ATTEMPTS: u32 = 3;

/// A rendezvous of `n` threads that fails the test (instead of hanging it)
/// when they do not all come within `limit`.
struct Rendezvous {
    came: Mutex<HashSet<String>>,
    all: Condvar,
    n: usize,
    limit: Duration,
}

impl Rendezvous {
    fn new(n: usize, limit: Duration) -> Rendezvous {
        Rendezvous {
            came: Mutex::new(HashSet::new()),
            all: Condvar::new(),
            n,
            limit,
        }
    }

    /// Waits until `n` distinct threads are here. A thread holds its job
    /// while it waits, so it cannot come twice: only `n` live threads, each
    /// holding one of the last `n` jobs at once, can meet.
    fn meet(&self) -> bool {
        let me = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        let mut came = self.came.lock().unwrap();
        assert!(came.insert(me), "a thread came twice");
        self.all.notify_all();
        let (came, timeout) = self
            .all
            .wait_timeout_while(came, self.limit, |c| c.len() < self.n)
            .unwrap();
        !timeout.timed_out() && came.len() == self.n
    }
}

/// The body of job `i` of the panic test: one in [`POISON_EVERY`] panics.
fn panic_body(i: usize) -> Vec<u8> {
    if i % POISON_EVERY == POISON_EVERY / 2 {
        format!("poison-{i}").into_bytes()
    } else {
        format!("good-{i}").into_bytes()
    }
}

/// What the panic test's handler saw: good jobs done, poison runs, and
/// whether the last jobs met on every thread.
#[derive(Default)]
struct Seen {
    done: HashSet<Vec<u8>>,
    poison_runs: usize,
    twice: usize,
    met: Vec<bool>,
}

/// The handler of the panic test: a poison job panics in the closure; a
/// `last` job waits for all the threads to hold one (see [`Rendezvous`]).
fn panicking(
    seen: &Arc<Mutex<Seen>>,
    meet: &Arc<Rendezvous>,
) -> impl Fn(&mut Job<'_>) -> Outcome + Send + Sync + 'static {
    let (seen, meet) = (seen.clone(), meet.clone());
    move |job: &mut Job<'_>| {
        let body = job.body().to_vec();
        if body.starts_with(b"poison") {
            seen.lock().unwrap().poison_runs += 1;
            panic!("poison job {}", job.id());
        }
        if body.starts_with(b"last") {
            let met = meet.meet();
            seen.lock().unwrap().met.push(met);
        }
        // Not an assert: a panic here would be caught as the handler's.
        let mut seen = seen.lock().unwrap();
        if !seen.done.insert(body) {
            seen.twice += 1;
        }
        Outcome::Done
    }
}

fn panic_cfg(servers: Vec<String>, good: usize) -> Config {
    Config {
        servers,
        concurrency: THREADS,
        max_attempts: MAX_ATTEMPTS,
        // Released for the next attempt at once: the test waits for nothing.
        retry_backoff: Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            jitter: Jitter::None,
        },
        io_timeout: Duration::from_secs(2),
        max_jobs: Some(good as u64),
        ..Config::default()
    }
}

/// What both engines' panic tests check of the worker's counts and of what
/// its handler saw.
fn check_panics(counts: &Snapshot, seen: &Seen, poison: usize, good: usize) {
    eprintln!("{counts}");
    assert_eq!(seen.done.len(), good, "every good job done");
    assert_eq!(seen.twice, 0, "no good job ran twice");
    assert_eq!(counts.deleted, good as u64);
    assert_eq!(counts.buried, poison as u64, "each poison job buried");
    let runs = poison * MAX_ATTEMPTS as usize;
    assert_eq!(
        seen.poison_runs, runs,
        "each poison job ran max_attempts times"
    );
    assert_eq!(counts.panicked, runs as u64);
    assert_eq!(
        counts.released,
        (poison * (MAX_ATTEMPTS as usize - 1)) as u64
    );
    assert_eq!(counts.reserved, counts.settled());
    assert_eq!(counts.reconnects + counts.unexpected_replies, 0, "{counts}");
    // Full concurrency to the end: the last jobs met on every thread at once.
    assert_eq!(
        seen.met,
        vec![true; THREADS],
        "all the threads alive at the end"
    );
}

/// The panic test's bodies: `JOBS` jobs, one in a hundred poison, then the
/// `THREADS` last ones. Returns them with the poison and good counts.
fn panic_jobs() -> (Vec<Vec<u8>>, Vec<Vec<u8>>, usize, usize) {
    let bodies: Vec<Vec<u8>> = (0..JOBS).map(panic_body).collect();
    let last: Vec<Vec<u8>> = (0..THREADS)
        .map(|i| format!("last-{i}").into_bytes())
        .collect();
    let poison = bodies.iter().filter(|b| b.starts_with(b"poison")).count();
    let good = JOBS - poison + THREADS;
    (bodies, last, poison, good)
}

/// Puts `bodies` into `tube` with priority `pri`.
fn put_pri(addr: std::net::SocketAddr, tube: &str, pri: u32, bodies: &[Vec<u8>]) {
    let mut c = connect(addr);
    assert!(matches!(
        c.request(&Cmd::Use { tube }).unwrap(),
        Reply::Using { .. }
    ));
    for body in bodies {
        match c
            .request(&Cmd::Put {
                pri,
                delay: 0,
                ttr: 60,
                body,
            })
            .unwrap()
        {
            Reply::Inserted { .. } => {}
            r => panic!("put: {r:?}"),
        }
    }
}

#[test]
fn a_panicking_handler_is_a_failed_attempt_and_every_thread_goes_on_beanstalkd() {
    log_from_env();
    let server = Beanstalkd::start().unwrap();
    let (bodies, last, poison, good) = panic_jobs();
    put_pri(server.addr(), "default", 100, &bodies);
    // The last jobs are taken only when nothing else is ready: a poison job
    // goes back ready at once (no backoff), ahead of them.
    put_pri(server.addr(), "default", 1000, &last);
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let meet = Arc::new(Rendezvous::new(THREADS, Duration::from_secs(30)));
    let worker = Worker::new(
        panic_cfg(vec![server.addr().to_string()], good),
        panicking(&seen, &meet),
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(120));
    check_panics(&counts, &seen.lock().unwrap(), poison, good);
    let r = record(server.addr());
    assert_eq!(r.buried, poison as u64, "the server's record: {r:?}");
    assert_eq!((r.ready, r.reserved, r.delayed), (0, 0, 0));
}

#[test]
fn a_panicking_handler_is_a_failed_attempt_and_every_thread_goes_on_jetstream() {
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    let (bodies, last, poison, good) = panic_jobs();
    let mut p = Producer::builder().tube("work").connect(c.url()).unwrap();
    // No priorities on JetStream: the last jobs are put last.
    for b in bodies.iter().chain(&last) {
        p.put(b, PutOptions::default()).unwrap();
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let meet = Arc::new(Rendezvous::new(THREADS, Duration::from_secs(30)));
    let worker = Worker::new(
        Config {
            tubes: vec!["work".into()],
            jetstream: JetStreamConfig {
                ack_wait: Duration::from_secs(60),
                ..JetStreamConfig::default()
            },
            ..panic_cfg(vec![c.url()], good)
        },
        panicking(&seen, &meet),
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(180));
    check_panics(&counts, &seen.lock().unwrap(), poison, good);
    // The stream's record: the poison jobs' copies on the buried subject,
    // nothing else.
    let mut ad = js_admin(&c);
    assert_eq!(ad.stream_info("TASKQ").unwrap().messages, poison as u64);
    let m = ad
        .msg_get(
            "TASKQ",
            MsgSelect::NextBySubject {
                subject: "taskq.work.buried",
                seq: 1,
            },
        )
        .unwrap();
    assert!(m.data.starts_with(b"poison"));
    let ci = js_consumer(&c, "work");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
}

/// The big job of the oversized tests: over the worker's default limit
/// (65,535 bytes), under the server's.
const BIG: usize = 200_000;
const SMALL: usize = 50;

fn small_bodies() -> Vec<Vec<u8>> {
    (0..SMALL)
        .map(|i| format!("small-{i}").into_bytes())
        .collect()
}

/// A handler that records each body it ran.
fn recorder(ran: &Arc<Mutex<Vec<Vec<u8>>>>) -> impl Fn(&mut Job<'_>) -> Outcome + Send + Sync {
    let ran = ran.clone();
    move |job: &mut Job<'_>| {
        ran.lock().unwrap().push(job.body().to_vec());
        Outcome::Done
    }
}

/// What both engines' oversized tests check: the big job settled once and
/// never run, every small job done once, no reconnect.
fn check_oversized(counts: &Snapshot, ran: &[Vec<u8>]) {
    eprintln!("{counts}");
    assert_eq!(counts.too_big, 1, "{counts}");
    assert_eq!(counts.buried, 1, "{counts}");
    assert_eq!(counts.deleted, SMALL as u64);
    assert_eq!(counts.reserved, SMALL as u64 + 1, "the big job taken once");
    assert_eq!(counts.reserved, counts.settled());
    assert_eq!(
        (
            counts.reconnects,
            counts.unexpected_replies,
            counts.io_timeouts
        ),
        (0, 0, 0),
        "{counts}"
    );
    let mut ran = ran.to_vec();
    ran.sort();
    let mut want = small_bodies();
    want.sort();
    assert_eq!(
        ran, want,
        "every small job done once, the big one never run"
    );
}

/// Runs a worker on `cfg` (two threads, the default limits) until the small
/// jobs are done, and checks what [`check_oversized`] checks.
fn run_oversized(cfg: Config) {
    let ran: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let cfg = Config {
        concurrency: 2,
        io_timeout: Duration::from_secs(2),
        max_jobs: Some(SMALL as u64),
        ..cfg
    };
    let counts = run_bounded(
        Worker::new(cfg, recorder(&ran)).unwrap(),
        Duration::from_secs(60),
    );
    check_oversized(&counts, &ran.lock().unwrap());
}

fn oversized_on_beanstalkd(prefetch: usize) {
    let server = Beanstalkd::start_with(&["-z", "1048576"]).unwrap();
    let big = put_all(server.addr(), "default", 60, &[vec![7u8; BIG]])[0];
    put_all(server.addr(), "default", 60, &small_bodies());
    run_oversized(Config {
        servers: vec![server.addr().to_string()],
        prefetch,
        ..Config::default()
    });
    // The server's record: buried, reserved once, and nothing else left.
    let (state, reserves, timeouts, releases) = job_state(server.addr(), big).unwrap();
    assert_eq!(
        (state.as_str(), reserves, timeouts, releases),
        ("buried", 1, 0, 0)
    );
    let r = record(server.addr());
    assert_eq!((r.buried, r.ready, r.reserved), (1, 0, 0), "{r:?}");
}

#[test]
fn a_job_over_the_limit_is_buried_once_and_the_rest_done_on_beanstalkd() {
    log_from_env();
    oversized_on_beanstalkd(1);
}

#[test]
fn a_job_over_the_limit_is_buried_once_from_a_prefetch_window_on_beanstalkd() {
    log_from_env();
    oversized_on_beanstalkd(4);
}

#[test]
fn a_job_over_the_limit_is_terminated_once_and_the_rest_done_on_jetstream() {
    log_from_env();
    // The server's max_payload is its default, 1 MiB: above the worker's limit.
    let c = NatsCluster::start(1).unwrap();
    let mut p = Producer::builder()
        .tube("work")
        .max_job_size(1 << 20)
        .connect(c.url())
        .unwrap();
    let big = p.put(&vec![7u8; BIG], PutOptions::default()).unwrap();
    for b in small_bodies() {
        p.put(&b, PutOptions::default()).unwrap();
    }
    run_oversized(Config {
        servers: vec![c.url()],
        tubes: vec!["work".into()],
        ..Config::default()
    });
    // Terminated: gone from the work queue, not copied, not redelivered.
    let mut ad = js_admin(&c);
    assert_eq!(ad.stream_info("TASKQ").unwrap().messages, 0);
    assert!(ad.msg_get("TASKQ", MsgSelect::Seq(big.get())).is_err());
    let ci = js_consumer(&c, "work");
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
}

/// Each run's body, tube and attempt number, as the handler saw them.
type Told = Arc<Mutex<Vec<(Vec<u8>, String, u32)>>>;

/// Runs a worker on `cfg` over jobs `x` (tube `b`) and `y` (tube `a`) that
/// fail their first attempt, and checks what the handler was told.
fn told_tube_and_attempt(cfg: Config) {
    let told: Told = Arc::default();
    let t2 = told.clone();
    let cfg = Config {
        tubes: vec!["a".into(), "b".into()],
        max_attempts: 3,
        retry_backoff: Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
            jitter: Jitter::None,
        },
        io_timeout: Duration::from_secs(2),
        max_jobs: Some(2),
        ..cfg
    };
    let worker = Worker::new(cfg, move |job: &mut Job<'_>| {
        let (tube, attempt) = (job.tube().to_owned(), job.attempt());
        t2.lock()
            .unwrap()
            .push((job.body().to_vec(), tube, attempt));
        if attempt == 1 {
            Outcome::Fail
        } else {
            Outcome::Done
        }
    })
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(60));
    assert_eq!((counts.deleted, counts.released), (2, 2), "{counts}");
    let mut told = told.lock().unwrap().clone();
    told.sort();
    let run = |b: &[u8], t: &str, n| (b.to_vec(), t.to_owned(), n);
    assert_eq!(
        told,
        [
            run(b"x", "b", 1),
            run(b"x", "b", 2),
            run(b"y", "a", 1),
            run(b"y", "a", 2)
        ]
    );
}

#[test]
fn a_handler_is_told_the_tube_and_the_attempt_on_beanstalkd() {
    log_from_env();
    let server = Beanstalkd::start().unwrap();
    put_all(server.addr(), "b", 60, &[b"x".to_vec()]);
    put_all(server.addr(), "a", 60, &[b"y".to_vec()]);
    told_tube_and_attempt(Config {
        servers: vec![server.addr().to_string()],
        ..Config::default()
    });
}

#[test]
fn a_handler_is_told_the_tube_and_the_attempt_on_jetstream() {
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    for (tube, body) in [("b", b"x"), ("a", b"y")] {
        let mut p = Producer::builder().tube(tube).connect(c.url()).unwrap();
        p.put(body, PutOptions::default()).unwrap();
    }
    told_tube_and_attempt(Config {
        servers: vec![c.url()],
        ..Config::default()
    });
}

/// A body that decodes is the handler's typed value; one that does not is
/// buried (the handler returns the error as its outcome), never a panic.
#[cfg(feature = "serde")]
#[test]
fn a_json_body_decodes_and_one_that_does_not_is_buried() {
    #[derive(serde::Deserialize)]
    struct Order {
        id: u32,
    }
    log_from_env();
    let server = Beanstalkd::start().unwrap();
    let bodies: [&[u8]; 3] = [br#"{"id": 7}"#, br#"{"id": "seven"}"#, b"not json"];
    let ids = put_all(server.addr(), "default", 60, &bodies.map(<[u8]>::to_vec));
    let got: Arc<Mutex<Vec<u32>>> = Arc::default();
    let g2 = got.clone();
    let worker = Worker::new(
        Config {
            servers: vec![server.addr().to_string()],
            io_timeout: Duration::from_secs(2),
            exit_when_idle: Some(Duration::from_millis(1500)),
            ..Config::default()
        },
        move |job: &mut Job<'_>| {
            let order: Order = match job.json() {
                Ok(o) => o,
                Err(e) => return e.into(),
            };
            g2.lock().unwrap().push(order.id);
            Outcome::Done
        },
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(30));
    assert_eq!(*got.lock().unwrap(), [7]);
    assert_eq!((counts.deleted, counts.buried, counts.panicked), (1, 2, 0));
    assert_eq!((counts.released, counts.reserved), (0, 3), "buried at once");
    for &id in &ids[1..] {
        assert_eq!(job_state(server.addr(), id).unwrap().0, "buried");
    }
}

/// A handler sees the headers a job was published with on JetStream, and
/// none on beanstalkd.
#[test]
fn a_handler_sees_the_jobs_headers_on_jetstream_and_none_on_beanstalkd() {
    log_from_env();
    type Seen = Arc<Mutex<Vec<Option<Vec<u8>>>>>;
    let trace = |seen: &Seen| {
        let seen = seen.clone();
        move |job: &mut Job<'_>| {
            let h = job
                .headers()
                .map(|h| h.get(b"Trace-Id").unwrap_or(b"").to_vec());
            seen.lock().unwrap().push(h);
            Outcome::Done
        }
    };
    let c = NatsCluster::start(1).unwrap();
    js_setup(&c, "work", None);
    let mut ad = js_admin(&c);
    ad.publish_with("taskq.work", b"m-1", &[(b"Trace-Id", b"t-42")], b"x")
        .unwrap();
    let seen: Seen = Arc::default();
    let cfg = Config {
        servers: vec![c.url()],
        tubes: vec!["work".into()],
        max_jobs: Some(1),
        ..Config::default()
    };
    run_bounded(
        Worker::new(cfg, trace(&seen)).unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(*seen.lock().unwrap(), [Some(b"t-42".to_vec())]);

    let server = Beanstalkd::start().unwrap();
    put_all(server.addr(), "default", 60, &[b"y".to_vec()]);
    let seen: Seen = Arc::default();
    let cfg = Config {
        servers: vec![server.addr().to_string()],
        max_jobs: Some(1),
        ..Config::default()
    };
    run_bounded(
        Worker::new(cfg, trace(&seen)).unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(*seen.lock().unwrap(), [None]);
}
