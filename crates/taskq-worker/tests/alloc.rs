//! The library loop allocates nothing per job: a counting global allocator
//! shows the same allocations for 500 jobs as for 5,000.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{put_all, run_bounded};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Worker};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made while a worker of `concurrency` threads, whose
/// connections hold up to `prefetch` jobs, drains `n` jobs already queued.
fn allocations_for(n: usize, concurrency: usize, prefetch: usize) -> u64 {
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| vec![b'j'; 1 + i % 700]).collect();
    put_all(server.addr(), "default", 60, &bodies);
    drop(bodies);
    drain_counted(server.addr().to_string(), n, concurrency, prefetch)
}

/// Allocations while a worker on `server` of `concurrency` threads, whose
/// connections hold up to `prefetch` jobs, drains the `n` jobs queued there
/// (each a body of `j`s).
fn drain_counted(server: String, n: usize, concurrency: usize, prefetch: usize) -> u64 {
    // A panic in the handler would be a failed attempt, not a failed test:
    // the bodies that are not `j`s are counted, and checked after the run.
    let wrong_bodies = Arc::new(AtomicU64::new(0));
    let wrong2 = wrong_bodies.clone();
    let worker = Worker::new(
        Config {
            servers: vec![server],
            concurrency,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            prefetch,
            ..Config::default()
        },
        move |job: &mut Job<'_>| {
            if job.body().first() != Some(&b'j') {
                wrong2.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Done
        },
    )
    .unwrap();
    let before = alloc::total();
    let counts = run_bounded(worker, Duration::from_secs(120));
    let used = alloc::total() - before;
    assert_eq!(
        wrong_bodies.load(Ordering::Relaxed),
        0,
        "bodies not of `j`s"
    );
    assert_eq!(counts.deleted, n as u64);
    used
}

#[test]
fn no_allocation_per_job() {
    no_allocation_per_job_with(2, 1, 500);
}

#[test]
fn no_allocation_per_job_with_a_window_of_32() {
    // Each of the window's 33 body buffers is made, and grows to the largest
    // body, as the window first fills: that is setup too, done within 2,000
    // jobs. One thread: with two, how full each one's window gets first (so
    // how many buffers it makes) depends on timing, from run to run.
    no_allocation_per_job_with(1, 32, 2_000);
}

/// Allocations while a worker drains `n` jobs from a one-node JetStream.
fn allocations_for_nats(n: usize, prefetch: usize) -> u64 {
    let cluster = taskq_testkit::NatsCluster::start(1).unwrap();
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| vec![b'j'; 1 + i % 700]).collect();
    let mut p = taskq_producer::Producer::connect(cluster.url()).unwrap();
    let mut out = vec![taskq_producer::PutOutcome::NotSent; 64];
    for chunk in bodies.chunks(64) {
        p.put_batch(
            chunk,
            taskq_producer::PutOptions::default(),
            &mut out[..chunk.len()],
        )
        .unwrap();
    }
    drop((bodies, p));
    // The consumer exists before the worker starts, so that every connection
    // sets up the same way (who creates it, and how often the API is asked
    // while it is created, would vary the setup's allocations).
    common::js_setup(&cluster, "default", Some(Duration::from_secs(60)));
    drain_counted(cluster.url(), n, 2, prefetch)
}

#[test]
fn no_allocation_per_job_on_jetstream() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The buffers of jobs read ahead grow until each has held a body of every
    // size (up to 700 bytes): setup too, done within the smaller run.
    for prefetch in [1, 16, 64] {
        let (small_n, large_n) = (2_000, 20_000);
        let small = allocations_for_nats(small_n, prefetch);
        let large = allocations_for_nats(large_n, prefetch);
        eprintln!(
            "JetStream, prefetch {prefetch}: allocations: {small_n} jobs {small}, {large_n} jobs {large}"
        );
        assert!(small > 0, "the counting allocator saw nothing at all");
        assert!(
            large <= small + 20,
            "prefetch {prefetch}: {small_n} jobs {small} allocations; {large_n} jobs {large}"
        );
    }
}

/// The count is global: one measurement at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `small_n` jobs and ten times as many cost the same allocations.
fn no_allocation_per_job_with(concurrency: usize, prefetch: usize, small_n: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let large_n = 10 * small_n;
    let small = allocations_for(small_n, concurrency, prefetch);
    let large = allocations_for(large_n, concurrency, prefetch);
    eprintln!(
        "{concurrency} threads, prefetch {prefetch}: allocations: {small_n} jobs {small}, {large_n} jobs {large}"
    );
    // The counter works: starting threads and connections allocates.
    assert!(small > 0, "the counting allocator saw nothing at all");
    // Setup (threads, connections, buffers) costs the same either way; nine
    // times as many more jobs may add no more than a few stray allocations,
    // far below one each.
    assert!(
        large <= small + 20,
        "{small_n} jobs: {small} allocations; {large_n} jobs: {large}"
    );
}
