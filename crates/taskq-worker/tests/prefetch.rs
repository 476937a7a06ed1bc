//! Prefetch: a window of K jobs per connection. Counts equal the server's
//! record, no lease is lost while jobs wait, a stop gives the waiting jobs
//! back at once, a crash loses nothing, and `max_jobs` bounds what is reserved.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, ConfigError, Job, Outcome, Worker};

fn cfg(addr: std::net::SocketAddr, prefetch: usize) -> Config {
    Config {
        servers: vec![addr.to_string()],
        io_timeout: Duration::from_secs(2),
        prefetch,
        ..Config::default()
    }
}

/// Runs of each job id, recorded by the handler.
type Runs = Arc<Mutex<HashMap<u64, u32>>>;

fn counting(runs: &Runs, pause: Duration) -> impl Fn(&mut Job<'_>) -> Outcome + Send + Sync {
    let runs = runs.clone();
    move |job: &mut Job<'_>| {
        *runs.lock().unwrap().entry(job.id().get()).or_default() += 1;
        std::thread::sleep(pause);
        Outcome::Done
    }
}

#[test]
fn a_window_of_zero_is_refused() {
    let err = Worker::new(
        Config {
            prefetch: 0,
            ..Config::default()
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap_err();
    assert_eq!(err, ConfigError::ZeroPrefetch);
}

#[test]
fn ten_thousand_jobs_four_threads_window_32_counts_equal_the_ledger() {
    let n = 10_000;
    let counts = ten_thousand_jobs_four_threads(32);
    // The window is filled ahead: about one write per job (the settle with
    // its refill), where one job at a time costs the same with a read each.
    assert!(counts.writes < n * 11 / 10, "writes {}", counts.writes);
    assert!(counts.reads < n / 4, "reads {}", counts.reads);
}

#[test]
fn jobs_waiting_in_the_window_keep_their_leases_ttr_2_handler_1s() {
    let server = Beanstalkd::start().unwrap();
    let n = 10;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("{i}").into_bytes()).collect();
    let ids = put_all(server.addr(), "default", 2, &bodies);
    let runs = Runs::default();
    let worker = Worker::new(
        Config {
            max_jobs: Some(n as u64),
            ..cfg(server.addr(), 8)
        },
        counting(&runs, Duration::from_secs(1)),
    )
    .unwrap();
    let t = Instant::now();
    let counts = run_bounded(worker, Duration::from_secs(60));
    let after = record(server.addr());
    eprintln!("{:?}: {counts}; server {after:?}", t.elapsed());
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), n);
    assert!(ids.iter().all(|id| runs.get(id) == Some(&1)), "{runs:?}");
    assert_eq!(counts.deleted, n as u64);
    assert_eq!(after.job_timeouts, 0, "a lease ran out: {counts}");
    assert_eq!(
        counts.lost_lease + counts.lost_lease_on_release,
        0,
        "{counts}"
    );
    // Eight jobs waited behind one-second jobs: their leases were restarted.
    assert!(counts.touched >= 7, "{counts}");
    assert_eq!(after.ready + after.reserved, 0);
}

#[test]
fn jobs_waiting_behind_a_job_longer_than_their_ttr_keep_their_leases() {
    // TTR 2 s and a 2.5 s handler that touches its own job twice a second:
    // the second job waits longer than its lease, kept by touches from the
    // worker while the first one runs.
    let server = Beanstalkd::start().unwrap();
    let ids = put_all(server.addr(), "default", 2, &[b"a".to_vec(), b"b".to_vec()]);
    let runs = Runs::default();
    let runs2 = runs.clone();
    let worker = Worker::new(
        Config {
            max_jobs: Some(2),
            ..cfg(server.addr(), 4)
        },
        move |job: &mut Job<'_>| {
            *runs2.lock().unwrap().entry(job.id().get()).or_default() += 1;
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(500));
                job.touch().expect("touch in time");
            }
            Outcome::Done
        },
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(60));
    let after = record(server.addr());
    eprintln!("{counts}; server {after:?}");
    assert_eq!(counts.deleted, 2, "{counts}");
    assert_eq!(after.job_timeouts, 0, "a lease ran out: {counts}");
    assert!(counts.touched >= 2, "{counts}");
    assert_eq!(
        counts.lost_lease + counts.lost_lease_on_release,
        0,
        "{counts}"
    );
    let runs = runs.lock().unwrap();
    assert!(ids.iter().all(|id| runs.get(id) == Some(&1)), "{runs:?}");
}

#[test]
fn deadline_soon_on_a_refill_touches_the_waiting_jobs_ttr_1() {
    // TTR 1 s: a job is within beanstalkd's one-second margin from the
    // start, so a refill that finds nothing ready is answered DEADLINE_SOON.
    // The third job starts 0.8 s in and runs 0.4 s: past its first lease,
    // kept only by the touches that DEADLINE_SOON calls for.
    let server = Beanstalkd::start().unwrap();
    let ids = put_all(
        server.addr(),
        "default",
        1,
        &[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
    );
    let runs = Runs::default();
    let worker = Worker::new(
        Config {
            // No max_jobs: it would bound the window to the three jobs.
            exit_when_idle: Some(Duration::from_millis(1500)),
            ..cfg(server.addr(), 4)
        },
        counting(&runs, Duration::from_millis(400)),
    )
    .unwrap();
    let counts = worker.run();
    let after = record(server.addr());
    eprintln!("{counts}; server {after:?}");
    assert!(counts.deadline_soon >= 1, "{counts}");
    assert!(counts.touched >= 2, "{counts}");
    assert_eq!(counts.deleted, 3, "{counts}");
    assert_eq!(after.job_timeouts, 0, "a lease ran out: {counts}");
    assert_eq!(
        counts.lost_lease
            + counts.lost_lease_on_release
            + counts.unexpected_replies
            + counts.reconnects,
        0,
        "{counts}"
    );
    let runs = runs.lock().unwrap();
    assert!(ids.iter().all(|id| runs.get(id) == Some(&1)), "{runs:?}");
}

#[test]
fn max_jobs_bounds_what_the_window_reserves() {
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = (0..100).map(|i| format!("{i}").into_bytes()).collect();
    put_all(server.addr(), "default", 60, &bodies);
    let runs = Runs::default();
    let worker = Worker::new(
        Config {
            concurrency: 2,
            max_jobs: Some(10),
            ..cfg(server.addr(), 32)
        },
        counting(&runs, Duration::ZERO),
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(30));
    let after = record(server.addr());
    assert_eq!((counts.reserved, counts.deleted), (10, 10), "{counts}");
    assert_eq!((after.ready, after.reserved), (90, 0));
    assert_eq!(runs.lock().unwrap().len(), 10);
}

#[test]
fn an_empty_queue_costs_one_blocking_reserve_per_slice() {
    let server = Beanstalkd::start().unwrap();
    let before = record(server.addr());
    let worker = Worker::new(
        Config {
            exit_when_idle: Some(Duration::from_millis(3500)),
            ..cfg(server.addr(), 16)
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let counts = worker.run();
    let reserves = record(server.addr()).cmd_reserve_with_timeout - before.cmd_reserve_with_timeout;
    eprintln!("{reserves} reserves in 3.5 s idle: {counts}");
    // A window of 16 first (nothing ready), then one blocking reserve a second.
    assert!(reserves <= 16 + 5, "{reserves} reserves");
    assert!(counts.reserve_timeouts >= 2, "{counts}");
}

#[test]
fn sigterm_with_a_full_window_gives_the_waiting_jobs_back_at_once() {
    let server = Beanstalkd::start().unwrap();
    let n = 20;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("{i}").into_bytes()).collect();
    put_all(server.addr(), "default", 60, &bodies);
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(&["--addr", &addr, "--prefetch", "8"], "sleep 2");
    // One job running and seven waiting.
    assert!(
        wait_until(Duration::from_secs(5), || record(server.addr()).reserved
            == 8),
        "window not full: {:?}",
        record(server.addr())
    );
    w.signal("TERM");
    let t = Instant::now();
    let back = wait_until(Duration::from_secs(2), || {
        let r = record(server.addr());
        r.reserved == 1 && r.ready == n - 1
    });
    let waited = t.elapsed();
    assert!(back, "waiting jobs not back: {:?}", record(server.addr()));
    assert!(
        waited <= Duration::from_millis(500),
        "back after {waited:?}"
    );
    let st = w.wait(Duration::from_secs(10));
    assert!(st.success(), "exit {st:?}: {}", w.stderr());
    let c = w.counters();
    assert_eq!(get(&c, "deleted"), 1, "{c:?}");
    assert_eq!(get(&c, "released"), 7, "{c:?}");
    let after = record(server.addr());
    assert_eq!(
        (after.ready, after.reserved, after.cmd_delete),
        (n - 1, 0, 1)
    );
}

#[test]
fn kill_9_with_a_full_window_loses_nothing() {
    let server = Beanstalkd::start().unwrap();
    let n = 30usize;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("{i}").into_bytes()).collect();
    let ids: HashSet<u64> = put_all(server.addr(), "default", 2, &bodies)
        .into_iter()
        .collect();
    let addr = server.addr().to_string();
    let dir = TempDir::new("prefetch-kill9");
    // The command records its process group (its own) and hangs.
    let script = format!("echo $$ > {}/pgid; sleep 30", dir.0.display());
    let mut crashed = WorkerProc::start(&["--addr", &addr, "--prefetch", "16"], &script);
    crashed.kill_groups_on_drop(dir.0.join("pgid"));
    let full = wait_until(Duration::from_secs(5), || {
        record(server.addr()).reserved == 16 && !lines(&dir.0.join("pgid")).is_empty()
    });
    crashed.signal("KILL");
    let _ = crashed.wait(Duration::from_secs(5));
    if let Some(pgid) = lines(&dir.0.join("pgid")).first() {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .status();
    }
    assert!(full, "window not full: {:?}", record(server.addr()));
    let runs = Runs::default();
    let worker = Worker::new(
        Config {
            max_jobs: Some(n as u64),
            ..cfg(server.addr(), 4)
        },
        counting(&runs, Duration::ZERO),
    )
    .unwrap();
    let control = worker.control();
    let running = worker.start();
    let done = wait_until(Duration::from_secs(10), || {
        let r = record(server.addr());
        r.ready + r.reserved == 0
    });
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    assert!(done, "not drained: {:?}", record(server.addr()));
    let runs = runs.lock().unwrap();
    let lost = ids.iter().filter(|id| !runs.contains_key(id)).count();
    assert_eq!(lost, 0, "{counts}");
    assert_eq!(counts.deleted, n as u64);
    assert!(runs.values().all(|&k| k == 1));
}

#[test]
fn the_binary_refuses_a_window_of_zero() {
    let out = output_bounded(
        std::process::Command::new(env!("CARGO_BIN_EXE_taskq-worker")).args([
            "--prefetch",
            "0",
            "--",
            "true",
        ]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--prefetch"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
