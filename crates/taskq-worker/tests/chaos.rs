//! Faults through the chaos proxy in front of a real beanstalkd: random resets
//! in both directions, and silence during a reserve, a delete and a running job.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::{Beanstalkd, ChaosProxy, Direction, Toxic};
use taskq_worker::{Backoff, Config, Job, Outcome, Worker};

fn cfg(addr: String) -> Config {
    Config {
        servers: vec![addr],
        io_timeout: Duration::from_millis(500),
        reconnect_backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(100),
            jitter: taskq_worker::Jitter::Full,
        },
        ..Config::default()
    }
}

#[test]
fn random_resets_lose_nothing_and_counts_bracket_the_servers() {
    random_resets(1);
}

#[test]
fn random_resets_with_a_window_of_16_lose_nothing_and_counts_bracket_the_servers() {
    random_resets(16);
}

/// Random resets in both directions while four threads, each connection
/// holding up to `prefetch` jobs, drain 4,000 jobs through the chaos proxy.
fn random_resets(prefetch: usize) {
    let server = Beanstalkd::start().unwrap();
    let seed = std::env::var("TASKQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(fastrand_seed);
    eprintln!("chaos seed {seed} (replay with TASKQ_SEED={seed})");
    let proxy = ChaosProxy::start_seeded(server.addr(), seed).unwrap();
    let n = 4000;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("{i}").into_bytes()).collect();
    let ids: HashSet<u64> = put_all(server.addr(), "default", 60, &bodies)
        .into_iter()
        .collect();
    let before = record(server.addr());

    let runs: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let runs2 = runs.clone();
    let worker = Worker::new(
        Config {
            concurrency: 4,
            prefetch,
            ..cfg(proxy.addr().to_string())
        },
        move |job: &mut Job<'_>| {
            *runs2.lock().unwrap().entry(job.id().get()).or_default() += 1;
            std::thread::sleep(Duration::from_millis(1));
            Outcome::Done
        },
    )
    .unwrap();
    let control = worker.control();
    let watch = worker.control();
    let running = worker.start();

    // Faults: every 20 ms, resets at random moments on about half the
    // connections, until the worker has met a hundred of them (counted by
    // its reconnects, not by time: however fast the drain goes, the faults
    // go on, on its idle connections once it is done).
    let rounds = {
        let mut rng_state = seed;
        let proxy = &proxy;
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                let mut rounds = 0u64;
                let until = Instant::now() + Duration::from_secs(60);
                while watch.counters().reconnects < 100 && Instant::now() < until {
                    rng_state = rng_state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let after = Duration::from_millis((rng_state >> 33) % 15);
                    proxy.add(Toxic::Reset { after }, Direction::Both, 0.5);
                    std::thread::sleep(Duration::from_millis(20));
                    proxy.clear();
                    rounds += 1;
                }
                rounds
            });
            let rounds = h.join().unwrap();
            let done = wait_until(Duration::from_secs(60), || {
                let r = record(server.addr());
                r.ready + r.reserved + r.delayed == 0
            });
            assert!(done, "queue not drained; seed {seed}");
            rounds
        })
    };
    proxy.clear();
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    let after = record(server.addr());
    let runs = runs.lock().unwrap();
    let cmd_delete = after.cmd_delete - before.cmd_delete;
    let what = format!(
        "prefetch {prefetch}, seed {seed}: {rounds} fault rounds, {} reconnects",
        counts.reconnects
    );
    check_ledger(&ids, &runs, &counts, cmd_delete, &what);
    assert_eq!(after.buried, 0);
    assert!(
        counts.reconnects >= 100,
        "hundreds of faults wanted: {counts}"
    );
}

#[test]
fn silence_during_reserve_is_detected_then_work_resumes() {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    let worker = Worker::new(cfg(proxy.addr().to_string()), |_: &mut Job<'_>| {
        Outcome::Done
    })
    .unwrap();
    let control = worker.control();
    let running = worker.start();
    assert!(wait_until(Duration::from_secs(5), || record(server.addr())
        .cmd_reserve_with_timeout
        >= 1));
    let detected = silence_until_detected(&proxy, || control.counters());
    // Deadline: the 1 s slice plus the 0.5 s I/O timeout; allowed 0.5 s more.
    assert!(
        detected <= Duration::from_millis(2000),
        "detected after {detected:?}"
    );
    proxy.clear();
    put_all(server.addr(), "default", 60, &[b"after".to_vec()]);
    assert!(wait_until(Duration::from_secs(5), || control
        .counters()
        .deleted
        == 1));
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    assert!(counts.reconnects >= 1);
    eprintln!("silence detected after {detected:?}; {counts}");
}

#[test]
fn silence_during_delete_is_detected_counted_unknown_then_work_resumes() {
    let server = Beanstalkd::start().unwrap();
    let proxy = Arc::new(ChaosProxy::start(server.addr()).unwrap());
    put_all(server.addr(), "default", 60, &[b"first".to_vec()]);
    let before = record(server.addr());
    let returned: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (proxy2, returned2) = (proxy.clone(), returned.clone());
    let worker = Worker::new(cfg(proxy.addr().to_string()), move |job: &mut Job<'_>| {
        if job.body() == b"first" {
            // The server hears the delete; its answer is lost.
            proxy2.add(Toxic::Silence, Direction::Downstream, 1.0);
            settle_toxics();
            *returned2.lock().unwrap() = Some(Instant::now());
        }
        Outcome::Done
    })
    .unwrap();
    let control = worker.control();
    let running = worker.start();
    assert!(wait_until(Duration::from_secs(5), || control
        .counters()
        .ack_unknown
        >= 1));
    let detected = returned.lock().unwrap().unwrap().elapsed();
    // Deadline of a delete's reply: the 0.5 s I/O timeout; allowed 0.5 s more.
    assert!(
        detected <= Duration::from_millis(1000),
        "detected after {detected:?}"
    );
    assert!(control.counters().io_timeouts >= 1);
    proxy.clear();
    put_all(server.addr(), "default", 60, &[b"second".to_vec()]);
    assert!(wait_until(Duration::from_secs(5), || control
        .counters()
        .deleted
        == 1));
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    let after = record(server.addr());
    let cmd_delete = after.cmd_delete - before.cmd_delete;
    eprintln!("silent delete detected after {detected:?}; {counts}; cmd-delete {cmd_delete}");
    assert_eq!((counts.deleted, counts.ack_unknown), (1, 1), "{counts}");
    assert!(counts.reconnects >= 1);
    assert_eq!(after.ready + after.reserved, 0, "both jobs gone");
    assert!(counts.deleted + counts.lost_lease <= cmd_delete);
    assert!(cmd_delete <= counts.deleted + counts.lost_lease + counts.ack_unknown);
}

#[test]
fn silence_during_a_running_job_is_detected_and_the_job_comes_back() {
    let server = Beanstalkd::start().unwrap();
    let proxy = Arc::new(ChaosProxy::start(server.addr()).unwrap());
    // TTR 2 s: the lease the silenced connection held runs out, the job returns.
    let ids = put_all(server.addr(), "default", 2, &[b"job".to_vec()]);
    let runs = Arc::new(Mutex::new(Vec::<(Duration, bool)>::new()));
    let (proxy2, runs2) = (proxy.clone(), runs.clone());
    let worker = Worker::new(cfg(proxy.addr().to_string()), move |job: &mut Job<'_>| {
        let first = runs2.lock().unwrap().is_empty();
        if first {
            proxy2.add(Toxic::Silence, Direction::Downstream, 1.0);
            settle_toxics();
            let t = Instant::now();
            let touch = job.touch();
            let took = t.elapsed();
            // Checked after the run: a panic here would only fail the job.
            runs2.lock().unwrap().push((took, touch.is_err()));
            proxy2.clear();
        } else {
            runs2.lock().unwrap().push((Duration::ZERO, false));
        }
        Outcome::Done
    })
    .unwrap();
    let control = worker.control();
    let running = worker.start();
    assert!(wait_until(Duration::from_secs(10), || control
        .counters()
        .deleted
        == 1));
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    let runs = runs.lock().unwrap();
    eprintln!(
        "silence while running: touch failed after {:?}; {counts}",
        runs[0].0
    );
    assert!(runs[0].1, "a touch on a silent server must fail");
    // Deadline of the touch's reply: the 0.5 s I/O timeout; allowed 0.5 s more.
    assert!(runs[0].0 <= Duration::from_millis(1000), "{:?}", runs[0].0);
    assert_eq!(runs.len(), 2, "the job came back once and was done");
    assert_eq!(counts.lease_dropped, 1, "{counts}");
    assert!(
        counts.io_timeouts >= 1 && counts.reconnects >= 1,
        "{counts}"
    );
    assert!(job_state(server.addr(), ids[0]).is_none());
}

/// The proxy's pumps pick up a new toxic when their 20 ms read poll ends; a
/// chunk already being read when it was added still goes through. Wait them out.
fn settle_toxics() {
    std::thread::sleep(Duration::from_millis(60));
}

fn fastrand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}
