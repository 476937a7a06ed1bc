//! The library loop allocates nothing per job: a counting global allocator
//! shows the same allocations for 500 jobs as for 5,000.

mod common;

use std::time::Duration;

use common::put_all;
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Worker};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made while a worker drains `n` jobs already queued.
fn allocations_for(n: usize) -> u64 {
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| vec![b'j'; 1 + i % 700]).collect();
    put_all(server.addr(), "default", 60, &bodies);
    drop(bodies);
    let worker = Worker::new(
        Config {
            servers: vec![server.addr().to_string()],
            concurrency: 2,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            ..Config::default()
        },
        |job: &mut Job<'_>| {
            assert_eq!(job.body()[0], b'j');
            Outcome::Done
        },
    )
    .unwrap();
    let before = alloc::total();
    let counts = worker.run();
    let used = alloc::total() - before;
    assert_eq!(counts.deleted, n as u64);
    used
}

#[test]
fn no_allocation_per_job() {
    let small = allocations_for(500);
    let large = allocations_for(5_000);
    eprintln!("allocations: 500 jobs {small}, 5000 jobs {large}");
    // The counter works: starting threads and connections allocates.
    assert!(small > 0, "the counting allocator saw nothing at all");
    // Setup (threads, connections, buffers) costs the same either way; 4,500
    // more jobs may add no more than a few stray allocations, far below one each.
    assert!(
        large <= small + 20,
        "500 jobs: {small} allocations; 5000 jobs: {large}"
    );
}
