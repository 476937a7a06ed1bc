//! The library loop allocates nothing per job: a counting global allocator
//! shows the same allocations for 500 jobs as for 5,000.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::put_all;
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Worker};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator; the
// counter is the only addition.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    let before = ALLOCS.load(Ordering::SeqCst);
    let counts = worker.run();
    let used = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(counts.deleted, n as u64);
    used
}

#[test]
fn no_allocation_per_job() {
    let small = allocations_for(500);
    let large = allocations_for(5_000);
    eprintln!("allocations: 500 jobs {small}, 5000 jobs {large}");
    // Setup (threads, connections, buffers) costs the same either way; 4,500
    // more jobs may add no more than a few stray allocations, far below one each.
    assert!(
        large <= small + 20,
        "500 jobs: {small} allocations; 5000 jobs: {large}"
    );
}
