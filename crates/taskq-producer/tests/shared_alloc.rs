//! The shared producer allocates nothing per put in steady state, on either
//! engine: 64 tasks on a current-thread runtime put 10,048 jobs after a
//! warm-up of the same shape, counted by a counting global allocator (the runtime, the
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
/// `TASKS * PER_TASK` jobs, after warming up the same way: every round
/// starts with all 64 tasks let go at once (so the driver's first write of
/// a round carries a put from each), and two rounds of 300 puts a task come
/// before the counted one, so every buffer, queue and run queue has met its
/// largest burst before counting starts.
fn allocations_in_steady_state(addr: &str) -> u64 {
    // One engine at a time: the counts are this thread's alone either way,
    // but the two runs need not contend for the machine's two cores.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const WARM_ROUNDS: u32 = 2;
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
                for round in 0..=WARM_ROUNDS {
                    gate.acquire().await.unwrap().forget();
                    let n = if round < WARM_ROUNDS { 300 } else { PER_TASK };
                    for _ in 0..n {
                        p.put(tube, &body, PutOptions::default()).await.unwrap();
                    }
                    done.add_permits(1);
                }
            });
        }
        // The runtime's own run queue grows (once) the first time more
        // tasks are ready at once than it has room for: 64 callers, the
        // driver and an I/O or timer wake-up can all be ready together on a
        // loaded machine. Have it meet more than that before counting.
        let fill: Vec<_> = (0..4 * TASKS)
            .map(|_| tokio::spawn(tokio::task::yield_now()))
            .collect();
        for h in fill {
            h.await.unwrap();
        }
        for _ in 0..WARM_ROUNDS {
            gate.add_permits(TASKS);
            let warmed =
                tokio::time::timeout(Duration::from_secs(60), done.acquire_many(TASKS as u32));
            warmed.await.expect("warm-up within 60 s").unwrap().forget();
        }
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
