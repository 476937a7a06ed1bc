//! The shared producer allocates nothing per put in steady state, on either
//! engine: 64 tasks on a current-thread runtime put 10,048 jobs after a
//! warm-up, counted by a counting global allocator (the runtime, the
//! callers and the driver all run on this thread).
#![cfg(feature = "tokio")]

use std::sync::Arc;
use std::time::Duration;

use taskq_producer::{PutOptions, SharedProducer};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::{Beanstalkd, NatsCluster};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const TASKS: usize = 64;
const PER_TASK: usize = 157;

/// Allocations made while 64 tasks sharing a producer of `addr` put
/// `TASKS * PER_TASK` jobs, after each put 200 to warm up.
fn allocations_in_steady_state(addr: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let done = Arc::new(Semaphore::new(0));
    let p = rt.block_on(async {
        let p = SharedProducer::connect(addr).await.unwrap();
        for t in 0..TASKS {
            let (p, gate, done) = (p.clone(), gate.clone(), done.clone());
            tokio::spawn(async move {
                let body = [b'x'; 64];
                let tube = if t % 2 == 0 { "even" } else { "odd" };
                for _ in 0..200 {
                    p.put(tube, &body, PutOptions::default()).await.unwrap();
                }
                done.add_permits(1);
                gate.acquire().await.unwrap().forget();
                for _ in 0..PER_TASK {
                    p.put(tube, &body, PutOptions::default()).await.unwrap();
                }
                done.add_permits(1);
            });
        }
        let warmed = tokio::time::timeout(Duration::from_secs(60), done.acquire_many(TASKS as u32));
        warmed.await.expect("warm-up within 60 s").unwrap().forget();
        p
    });
    let ((), n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            gate.add_permits(TASKS);
            let finished =
                tokio::time::timeout(Duration::from_secs(60), done.acquire_many(TASKS as u32));
            finished.await.expect("puts within 60 s").unwrap().forget();
        })
    });
    drop(p);
    n
}

#[test]
fn ten_thousand_puts_from_64_tasks_allocate_nothing_on_beanstalkd() {
    let server = Beanstalkd::start().unwrap();
    let n = allocations_in_steady_state(&server.addr().to_string());
    assert_eq!(n, 0, "allocations in {} puts", TASKS * PER_TASK);
    // The counter itself works: an allocation is seen.
    assert!(alloc::in_this_thread(|| drop(std::hint::black_box(vec![1u8; 10]))).1 >= 1);
}

#[test]
fn ten_thousand_puts_from_64_tasks_allocate_nothing_on_jetstream() {
    let c = NatsCluster::start(1).unwrap();
    let n = allocations_in_steady_state(&c.url());
    assert_eq!(n, 0, "allocations in {} puts", TASKS * PER_TASK);
}
