//! The worker library against a real beanstalkd: counts, outcomes, touching, several servers, stopping.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Worker};

// Every test takes `heavy()`, one at a time: the CPU of the whole process
// is measured (`server_down_then_up_costs_little_and_resumes`) and some
// times are bounded, while 10,000 jobs on four threads take both cores.

fn cfg(servers: Vec<String>) -> Config {
    Config {
        servers,
        io_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

#[test]
fn ten_thousand_jobs_four_threads_counts_equal_the_servers() {
    let _one = heavy();
    let server = Beanstalkd::start().unwrap();
    let n = 10_000usize;
    let bodies: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("job-{i}\r\n\0").into_bytes())
        .collect();
    let ids = put_all(server.addr(), "default", 60, &bodies);
    let before = record(server.addr());

    let seen: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let seen2 = seen.clone();
    let by_id: HashMap<u64, Vec<u8>> = ids.iter().copied().zip(bodies.iter().cloned()).collect();
    let by_id = Arc::new(by_id);
    let by_id2 = by_id.clone();
    // A panic in the handler is a failed attempt, not a failed test: the
    // bodies that differ are counted, and the count checked after the run.
    let wrong_bodies = Arc::new(AtomicU64::new(0));
    let wrong2 = wrong_bodies.clone();
    let worker = Worker::new(
        Config {
            concurrency: 4,
            max_jobs: Some(n as u64),
            ..cfg(vec![server.addr().to_string()])
        },
        move |job: &mut Job<'_>| {
            if by_id2.get(&job.id().get()).map(Vec::as_slice) != Some(job.body()) {
                wrong2.fetch_add(1, Ordering::SeqCst);
            }
            *seen2.lock().unwrap().entry(job.id().get()).or_default() += 1;
            Outcome::Done
        },
    )
    .unwrap();
    let t = Instant::now();
    let counts = run_bounded(worker, Duration::from_secs(120));
    let after = record(server.addr());
    eprintln!("{n} jobs in {:?}: {counts}", t.elapsed());
    assert_eq!(
        wrong_bodies.load(Ordering::SeqCst),
        0,
        "jobs whose body is not the one put"
    );

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), n, "every job done");
    assert!(seen.values().all(|&k| k == 1), "no job done twice");
    assert_eq!(counts.deleted, n as u64);
    assert_eq!(counts.reserved, n as u64);
    assert_eq!(after.cmd_delete - before.cmd_delete, counts.deleted);
    assert_eq!(counts.lost_lease + counts.ack_unknown + counts.released, 0);
    assert_eq!(
        after.ready + after.reserved + after.delayed + after.buried,
        0
    );
    assert_eq!(counts.reconnects + counts.io_timeouts, 0);
}

#[test]
fn outcomes_release_bury_and_count_attempts() {
    let _one = heavy();
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = ["done", "bury", "fail", "temp", "retry"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let ids = put_all(server.addr(), "work", 60, &bodies);
    let tries: Arc<Mutex<HashMap<Vec<u8>, u32>>> = Arc::default();
    let tries2 = tries.clone();
    let worker = Worker::new(
        Config {
            tubes: vec!["work".into()],
            max_attempts: 2,
            exit_when_idle: Some(Duration::from_millis(2500)),
            ..cfg(vec![server.addr().to_string()])
        },
        move |job: &mut Job<'_>| {
            let mut t = tries2.lock().unwrap();
            let k = t.entry(job.body().to_vec()).or_default();
            *k += 1;
            match (job.body(), *k) {
                (b"done", _) => Outcome::Done,
                (b"bury", _) => Outcome::Bury,
                (b"fail", _) => Outcome::Fail,
                // Two temporary failures, then success: not counted as attempts.
                (b"temp", 1..=2) => Outcome::TempFail,
                (b"retry", 1) => Outcome::Retry {
                    delay: Duration::ZERO,
                },
                _ => Outcome::Done,
            }
        },
    )
    .unwrap();
    let counts = worker.run();
    let tries = tries.lock().unwrap();
    assert_eq!(tries[&b"fail".to_vec()], 2, "failed twice, then buried");
    assert_eq!(tries[&b"temp".to_vec()], 3);
    assert_eq!(tries[&b"retry".to_vec()], 2);
    assert!(job_state(server.addr(), ids[0]).is_none());
    assert_eq!(job_state(server.addr(), ids[1]).unwrap().0, "buried");
    let fail = job_state(server.addr(), ids[2]).unwrap();
    assert_eq!(
        (fail.0.as_str(), fail.3),
        ("buried", 1),
        "one release, then buried"
    );
    assert!(job_state(server.addr(), ids[3]).is_none());
    assert!(job_state(server.addr(), ids[4]).is_none());
    assert_eq!(counts.deleted, 3);
    assert_eq!(counts.buried, 2);
    assert_eq!(counts.released, 1 + 2 + 1);
    assert_eq!(counts.reserved, counts.settled());
}

#[test]
fn a_job_longer_than_its_ttr_is_touched_and_held_once() {
    let _one = heavy();
    let server = Beanstalkd::start().unwrap();
    let ids = put_all(server.addr(), "default", 1, &[b"slow".to_vec()]);
    let runs = Arc::new(AtomicU64::new(0));
    let runs2 = runs.clone();
    let worker = Worker::new(
        Config {
            concurrency: 2,
            exit_when_idle: Some(Duration::from_millis(1500)),
            ..cfg(vec![server.addr().to_string()])
        },
        move |job: &mut Job<'_>| {
            runs2.fetch_add(1, Ordering::SeqCst);
            for _ in 0..7 {
                std::thread::sleep(Duration::from_millis(400));
                job.touch().expect("touch in time");
            }
            Outcome::Done
        },
    )
    .unwrap();
    let counts = worker.run();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the other thread never got it"
    );
    assert_eq!(counts.touched, 7);
    assert_eq!(counts.deleted, 1);
    assert_eq!(record(server.addr()).job_timeouts, 0);
    assert!(job_state(server.addr(), ids[0]).is_none());
}

#[test]
fn several_servers_one_down_all_work_done() {
    let _one = heavy();
    let a = Beanstalkd::start().unwrap();
    let b = Beanstalkd::start().unwrap();
    let dead = format!(
        "127.0.0.1:{}",
        taskq_testkit::beanstalkd::free_port().unwrap()
    );
    let bodies: Vec<Vec<u8>> = (0..50).map(|i| vec![b'x'; i + 1]).collect();
    put_all(a.addr(), "default", 60, &bodies);
    put_all(b.addr(), "default", 60, &bodies);
    let worker = Worker::new(
        Config {
            concurrency: 1,
            max_jobs: Some(100),
            ..cfg(vec![dead, a.addr().to_string(), b.addr().to_string()])
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let running = worker.start();
    let control = running.control();
    let guard = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        control.abort();
    });
    let t = Instant::now();
    let counts = running.join();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(counts.deleted, 100);
    assert!(counts.connect_failures >= 1);
    assert_eq!(record(a.addr()).ready + record(b.addr()).ready, 0);
    drop(guard);
}

#[test]
fn shutdown_cuts_a_waiting_reserve_at_once() {
    let _one = heavy();
    let server = Beanstalkd::start().unwrap();
    let worker = Worker::new(
        Config {
            concurrency: 3,
            reserve_timeout: Duration::from_secs(10),
            ..cfg(vec![server.addr().to_string()])
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let running = worker.start();
    let control = running.control();
    assert!(wait_until(Duration::from_secs(5), || {
        record(server.addr()).cmd_reserve_with_timeout >= 3
    }));
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(5));
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(counts.reserved, 0);
}

#[test]
fn server_down_then_up_costs_little_and_resumes() {
    let _one = heavy();
    let port = taskq_testkit::beanstalkd::free_port().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let worker = Worker::new(
        Config {
            concurrency: 2,
            max_jobs: Some(3),
            ..cfg(vec![addr.clone()])
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let control = worker.control();
    let cpu0 = cpu_ticks();
    let running = worker.start();
    std::thread::sleep(Duration::from_secs(3));
    let down = control.counters();
    let cpu = cpu_ticks() - cpu0;
    // The shared reconnect backoff (50 ms doubling to 2 s, upper-half
    // jitter): at most 9 tries per thread in 3 s, never a tight loop.
    assert!(down.connect_failures <= 2 * 12, "{down}");
    assert!(down.connect_failures >= 2, "{down}");
    assert!(cpu <= 20, "CPU ticks while the server was down: {cpu}");
    let _beanstalkd = KillOnDrop(
        std::process::Command::new("beanstalkd")
            .args(["-l", "127.0.0.1", "-p", &port.to_string()])
            .spawn()
            .unwrap(),
    );
    let sock: std::net::SocketAddr = addr.parse().unwrap();
    assert!(wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(sock).is_ok()
    }));
    put_all(
        sock,
        "default",
        60,
        &[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
    );
    let t = Instant::now();
    let counts = join_bounded(running, Duration::from_secs(20));
    assert_eq!(counts.deleted, 3);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "resumed after {:?}",
        t.elapsed()
    );
}

/// A window larger than its handlers costs no thread: the worker runs one
/// thread for its machines and `concurrency` for its handlers, whatever
/// `prefetch` holds.
#[test]
fn a_window_larger_than_its_handlers_costs_no_thread_of_its_own() {
    let _one = heavy();
    let server = Beanstalkd::start().unwrap();
    put_all(server.addr(), "default", 60, &vec![b"x".to_vec(); 40]);
    let before = threads();
    let peak = Arc::new(AtomicU64::new(0));
    let p2 = peak.clone();
    let cfg = Config {
        servers: vec![server.addr().to_string()],
        concurrency: 2,
        prefetch: 16,
        max_jobs: Some(40),
        ..Config::default()
    };
    let worker = Worker::new(cfg, move |_: &mut Job<'_>| {
        p2.fetch_max(threads() as u64, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        Outcome::Done
    })
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(30));
    assert_eq!(counts.deleted, 40, "{counts}");
    let peak = peak.load(Ordering::SeqCst) as usize;
    // One for the machines, 2 handlers, the test's own joining thread, and
    // one the runtime may start to resolve the server's name: 5 at most, where
    // a thread for each of the window's 16 slots would show 20.
    assert!(
        peak <= before + 5,
        "{peak} threads at most, {before} before: one for the machines, 2 handlers, \
         the joiner and a name lookup"
    );
}
