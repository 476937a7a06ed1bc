//! `AsyncWorker` allocates nothing per job: a counting global allocator
//! shows the same allocations for 1,000 jobs as for 10,000 (beanstalkd).

mod common;

use std::time::Duration;

use common::put_all;
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;
use taskq_worker::{AsyncJob, AsyncWorker, Config, Outcome};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations while an async worker at concurrency 64 drains `n` queued
/// jobs (bodies of 1 to 700 bytes) on a runtime made beforehand.
fn allocations_for(n: usize) -> u64 {
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| vec![b'j'; 1 + i % 700]).collect();
    put_all(server.addr(), "default", 60, &bodies);
    drop(bodies);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = Config {
        servers: vec![server.addr().to_string()],
        concurrency: 64,
        max_jobs: Some(n as u64),
        io_timeout: Duration::from_secs(2),
        ..Config::default()
    };
    let worker = AsyncWorker::new(cfg, |job: AsyncJob| async move {
        assert_eq!(job.body()[0], b'j');
        tokio::task::yield_now().await;
        Outcome::Done
    })
    .unwrap();
    let before = alloc::total();
    let counts = rt.block_on(worker.run());
    let used = alloc::total() - before;
    assert_eq!(counts.deleted, n as u64, "{counts}");
    used
}

#[test]
fn no_allocation_per_job() {
    let (small_n, large_n) = (1_000, 10_000);
    let small = allocations_for(small_n);
    let large = allocations_for(large_n);
    eprintln!(
        "async worker, concurrency 64: allocations: {small_n} jobs {small}, {large_n} jobs {large}"
    );
    assert!(small > 0, "the counting allocator saw nothing at all");
    // Setup (tasks, the connection, buffers grown to the largest body) is
    // the same either way; 9,000 more jobs may add a few stray allocations,
    // far below one each.
    assert!(
        large <= small + 20,
        "{small_n} jobs: {small} allocations; {large_n} jobs: {large}"
    );
}
